"""PNG chart of the per-stage breakdown and the hLLM vs autoregressive comparison (matplotlib).

matplotlib is an optional extra (``pip install 'hllm[bench]'``); without it :func:`write_chart`
raises HllmError saying so.
"""

from __future__ import annotations

import os
from pathlib import Path

from hllm.errors import HllmError
from hllm.files import atomic_path

_STAGE_LABELS = (("prompt", "prompt + tokenize"), ("engine", "engine (prefill + head)"),
                 ("lapjv", "LAPJV decode"), ("decode_output", "decode + output"), ("total", "total"))


def _fmt_ms(v: float) -> str:
    return f"{v:,.0f} ms" if v >= 100 else f"{v:.1f} ms" if v >= 1 else f"{v:.3f} ms"


def write_chart(stage_records: list[dict], out: str | os.PathLike, versus: dict | None = None,
                n_items: int = 50, batch_size: int = 1) -> Path:
    """Write a PNG: per-stage medians (log scale) per backend at ``n_items``/``batch_size``, and,
    with ``versus`` (a :func:`hllm.bench.versus_ar.bench_versus_ar` record), hLLM vs AR wall time.

    Raises: HllmError if matplotlib is missing or no record matches ``n_items``/``batch_size``.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise HllmError("the chart needs matplotlib: pip install 'hllm[bench]'") from None
    recs = [r for r in stage_records if r["n_items"] == n_items and r["batch_size"] == batch_size]
    if not recs:
        raise HllmError(f"no stage record at N={n_items}, batch {batch_size} to chart")
    ncols = 2 if versus else 1
    fig, axes = plt.subplots(1, ncols, figsize=(6.2 * ncols, 3.6), squeeze=False)
    ax = axes[0][0]
    height = 0.8 / len(recs)
    for j, r in enumerate(recs):
        ys = [i + j * height for i in range(len(_STAGE_LABELS))]
        vals = [max(r["stage_ms"].get(k, 0.0), 1e-4) for k, _ in _STAGE_LABELS]
        bars = ax.barh(ys, vals, height=height, label=r["backend"])
        for b, v in zip(bars, vals):
            ax.text(v * 1.15, b.get_y() + b.get_height() / 2, _fmt_ms(v), va="center", fontsize=7)
    ax.set_yticks([i + 0.4 - height / 2 for i in range(len(_STAGE_LABELS))], [lbl for _, lbl in _STAGE_LABELS])
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlim(right=max(r["stage_ms"]["total"] for r in recs) * 20)
    ax.set_xlabel("median ms per call (log scale)")
    ax.set_title(f"hLLM stages, N={n_items}, batch {batch_size}", fontsize=10)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=len(recs), frameon=False)
    if versus:
        ax2 = axes[0][1]
        backend = next(iter(versus.get("hllm_backends") or {"hllm:?": 0})).split(":", 1)[-1]
        names = [f"hLLM {backend}\n(1 pass)", f"AR constrained\n({versus['ar_decode_passes']:.0f} passes)"]
        vals = [versus["hllm_ms"], versus["ar_ms"]]
        if "ar_unconstrained_ms" in versus:
            names.append(f"AR unconstrained\n({versus['ar_unconstrained_decode_passes']:.0f} passes, "
                         f"{versus['ar_unconstrained_invalid_rate']:.0%} invalid)")
            vals.append(versus["ar_unconstrained_ms"])
        bars = ax2.barh(names, [v / 1e3 for v in vals], color=["tab:green", "tab:red", "tab:gray"][: len(vals)])
        for b, v in zip(bars, vals):
            ax2.text(b.get_width() * 1.02, b.get_y() + b.get_height() / 2, f"{v / 1e3:.2f} s", va="center", fontsize=8)
        ax2.invert_yaxis()
        ax2.set_xlim(right=max(vals) / 1e3 * 1.25)
        ax2.set_xlabel("median wall time per slate (s)")
        ax2.set_title(f"single pass vs autoregressive, N={versus['n_items']}: {versus['speedup']:.1f}× faster",
                      fontsize=10)
        ax2.tick_params(axis="y", labelsize=8)
    m = recs[0].get("machine") or {}
    if m:
        shared = {True: ", cores shared with other work", False: ", quiet machine"}.get(m.get("shared"), "")
        fig.suptitle(f"{m.get('cpu', '?')}, {m.get('usable_cpus', '?')} cores{shared}", fontsize=9)
    fig.tight_layout()
    out = Path(out)
    with atomic_path(out) as tmp:
        fig.savefig(tmp, format="png", dpi=90)
    plt.close(fig)
    return out
