"""Precision search: which modules must stay fp32 for a reduced-precision graph to keep the rankings
(``hllm debug precision``: :mod:`.precision_debug`, the bf16 islands search :mod:`.bf16_islands`)."""
