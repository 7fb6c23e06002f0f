"""Benchmarks (``hllm bench``): per-stage latency of the runtime, LAP solver comparison, and the
single-pass hLLM vs autoregressive speed-up, each written as JSON under ``results/bench/``.

Modules: :mod:`.peak` (GEMM peak), :mod:`.lapjv` (solver comparison), :mod:`.stages` (per-stage timing
of :class:`hllm.runtime.Ranker`), :mod:`.scaling` (engine time against prompt length), :mod:`.frontier`
(engine × precision speed frontier), :mod:`.versus_ar` (hLLM vs greedy autoregressive ranking,
interleaved), :mod:`.loadtest` (a bounded load test of ``hllm serve``), :mod:`.report` (the JSON
documents), :mod:`.markdown` (tables for the docs), :mod:`.chart` (PNG, needs matplotlib). Timing
statistics and the machine description come from :mod:`hllm.measure`, sub-slates from
:func:`hllm.runtime.slates.subslate`. Importing them does not import torch;
the PyTorch engine and the AR teacher do, when used.

No benchmark result is asserted by a test; the figures are printed and written to JSON with the
machine description and run counts, so they can be checked and re-run (``scripts/bench.sh``).
"""

#: Version of the JSON layout written by the benchmarks (bump when keys change).
SCHEMA_VERSION = 1
