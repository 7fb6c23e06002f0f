"""Checkpoints in: GGUF → Hugging Face directory (``gguf``), a fresh hLLM checkpoint (``init``) and the peft
LoRA merge with its parity proof (``merge``)."""
