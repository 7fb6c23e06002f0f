"""PNG chart of the benchmark figures (matplotlib).

Panels, left to right:

* ``stages``: per-stage medians (log scale) at one N and batch size, one bar per contender
  (:func:`hllm.bench.stages.bench_stages` records: PyTorch and any number of ONNX / TensorRT graphs);
* ``versus`` (optional): hLLM single pass vs autoregressive wall time
  (a :func:`hllm.bench.versus_ar.bench_versus_ar` record);
* ``scaling`` (optional): median engine ms against prompt tokens S, one line per contender
  (:func:`hllm.bench.scaling.bench_scaling` records); every point of a contender other than the
  reference (the first one, usually PyTorch) is annotated with ``ratio_to_reference``
  (reference ms / its ms: > 1 is faster).

Contenders are labelled ``backend flavour precision`` (:func:`contender_labels`) and keep one colour
across panels. :func:`write_chart` returns what it drew (:class:`Chart`), read back from the axes.

matplotlib is an optional extra (``pip install 'hllm[bench]'``); without it :func:`write_chart`
raises HllmError saying so.
"""

from __future__ import annotations

import math
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from hllm.errors import HllmError
from hllm.extras import require
from hllm.files import atomic_path

_STAGE_LABELS = (("prompt", "prompt + tokenize"), ("engine", "engine (prefill + head)"),
                 ("lapjv", "LAPJV decode"), ("decode_output", "decode + output"), ("total", "total"))


@dataclass
class Panel:
    """What one panel drew: its title; ``series``: label → ``[(category or x, value)]`` (a bar group
    per contender, categories from the tick labels, or a line's points); ``texts``: its annotations."""

    title: str
    series: dict[str, list[tuple]]
    texts: list[str]


@dataclass
class Chart:
    """The PNG written and its panels by name (``stages``, ``versus``, ``scaling``)."""

    path: Path
    panels: dict[str, Panel]
    clipped: list[str] = field(default_factory=list)


#: Longest text drawn from a record (contender labels, the versus backend, the machine's CPU), characters: a
#: longer one is cut to it with "…" (matplotlib lays out every character: a 3 MB label took minutes and GBs).
MAX_LABEL = 60


def clip_label(text: str, clipped: list[str] | None = None) -> str:
    """``text`` cut to :data:`MAX_LABEL` characters (the last one "…"); a cut text's first characters are
    appended to ``clipped`` when given (what the caller reports)."""
    if len(text) <= MAX_LABEL:
        return text
    if clipped is not None:
        clipped.append(text[:MAX_LABEL])
    return text[: MAX_LABEL - 1] + "…"


def contender_label(rec: dict) -> str:
    """``backend flavour precision`` of a stages or scaling record, e.g. ``onnxruntime ort-cpu int8``
    (a part the record lacks, as a checkpoint's flavour or any part of an older record, is left out)."""
    return " ".join(str(rec[k]) for k in ("backend", "flavour", "precision") if rec.get(k))


def _model_key(rec: dict) -> str:
    return str(rec.get("model") or contender_label(rec))


def _model_name(model: str) -> str:
    p = Path(model)
    return p.parent.name if p.suffix in (".onnx", ".plan") else p.name


def contender_labels(records: list[dict]) -> dict[str, str]:
    """``model`` → label (:func:`contender_label`) for every contender of ``records``, in first-seen
    order; a label shared by different models gets the model's folder name appended."""
    labels: dict[str, str] = {}
    for r in records:
        labels.setdefault(_model_key(r), contender_label(r))
    taken = Counter(labels.values())
    return {m: lbl if taken[lbl] == 1 else f"{lbl} ({_model_name(m)})" for m, lbl in labels.items()}


def _fmt_ms(v: float) -> str:
    return f"{v:,.0f} ms" if v >= 100 else f"{v:.1f} ms" if v >= 1 else f"{v:.3f} ms"


def _pyplot():
    require("matplotlib").use("Agg")
    return require("matplotlib.pyplot")


def write_chart(stage_records: list[dict], out: str | os.PathLike, versus: dict | None = None,
                n_items: int = 50, batch_size: int = 1, scaling: list[dict] | None = None) -> Chart:
    """Write a PNG: the per-stage panel of ``stage_records`` at ``n_items``/``batch_size``, then the
    ``versus`` panel (with a versus-AR record) and the ``scaling`` panel (with scaling records).

    Texts from the records longer than :data:`MAX_LABEL` characters are cut (listed in ``Chart.clipped``).

    Returns: :class:`Chart` (the path, what each panel drew, the texts cut).
    Raises: HllmError if matplotlib is missing or no stage record matches ``n_items``/``batch_size``.
    """
    plt = _pyplot()
    recs = [r for r in stage_records if r["n_items"] == n_items and r["batch_size"] == batch_size]
    if not recs:
        raise HllmError(f"no stage record at N={n_items}, batch {batch_size} to chart")
    scaling = list(scaling or [])
    if scaling:  # one N (bench_scaling runs one); the first record's contender is the reference
        scaling = [r for r in scaling if r.get("n_items") == scaling[0].get("n_items")]
    clipped: list[str] = []
    labels = {m: clip_label(lbl, clipped) for m, lbl in contender_labels(recs + scaling).items()}
    if versus:
        versus = {**versus, "hllm_backends": {clip_label(str(k), clipped): 0 for k in versus.get("hllm_backends") or {}}}
    colours = {lbl: f"C{i}" for i, lbl in enumerate(dict.fromkeys(labels.values()))}
    names = ["stages"] + ["versus"] * bool(versus) + ["scaling"] * bool(scaling)
    height = 3.6 + 0.35 * max(0, len(recs) - 2) + 0.2 * (math.ceil(len(recs) / 2) - 1)  # room for more bars
    fig, axes = plt.subplots(1, len(names), figsize=(6.2 * len(names), height), squeeze=False)
    ax = dict(zip(names, axes[0]))
    _stages_panel(ax["stages"], recs, labels, colours, n_items, batch_size)
    if versus:
        _versus_panel(ax["versus"], versus)
    if scaling:
        _scaling_panel(ax["scaling"], scaling, labels, colours)
    m = recs[0].get("machine") or {}
    if m:
        shared = {True: ", cores shared with other work", False: ", quiet machine"}.get(m.get("shared"), "")
        fig.suptitle(f"{clip_label(str(m.get('cpu', '?')), clipped)}, {clip_label(str(m.get('usable_cpus', '?')), clipped)} "
                     f"cores{shared}", fontsize=9)
    fig.tight_layout()
    out = Path(out)
    with atomic_path(out) as tmp:
        fig.savefig(tmp, format="png", dpi=90)
    chart = Chart(out, {name: _drawn(a) for name, a in ax.items()}, clipped)  # after savefig: tick labels are drawn
    plt.close(fig)
    return chart


def _stages_panel(ax, recs: list[dict], labels: dict[str, str], colours: dict[str, str], n_items: int,
                  batch_size: int) -> None:
    """Grouped horizontal bars: one group per stage, one bar per contender, log scale."""
    height = 0.8 / len(recs)
    fontsize = 7 if len(recs) <= 3 else 6
    for j, r in enumerate(recs):
        label = labels[_model_key(r)]
        ys = [i + j * height for i in range(len(_STAGE_LABELS))]
        vals = [max(r["stage_ms"].get(k, 0.0), 1e-4) for k, _ in _STAGE_LABELS]
        bars = ax.barh(ys, vals, height=height, label=label, color=colours[label])
        for b, v in zip(bars, vals):
            ax.text(v * 1.15, b.get_y() + b.get_height() / 2, _fmt_ms(v), va="center", fontsize=fontsize)
    ax.set_yticks([i + 0.4 - height / 2 for i in range(len(_STAGE_LABELS))], [lbl for _, lbl in _STAGE_LABELS])
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlim(right=max(r["stage_ms"]["total"] for r in recs) * 20)
    ax.set_xlabel("median ms per call (log scale)")
    ax.set_title(f"hLLM stages, N={n_items}, batch {batch_size}", fontsize=10)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=len(recs) if len(recs) <= 2 else 2,
              frameon=False)


def _versus_panel(ax, versus: dict) -> None:
    """hLLM (one pass) vs autoregressive decoding, constrained and (if measured) unconstrained, seconds."""
    backend = next(iter(versus.get("hllm_backends") or {"hllm:?": 0})).split(":", 1)[-1]
    names = [f"hLLM {backend}\n(1 pass)", f"AR constrained\n({versus['ar_decode_passes']:.0f} passes)"]
    vals = [versus["hllm_ms"], versus["ar_ms"]]
    if "ar_unconstrained_ms" in versus:
        names.append(f"AR unconstrained\n({versus['ar_unconstrained_decode_passes']:.0f} passes, "
                     f"{versus['ar_unconstrained_invalid_rate']:.0%} invalid)")
        vals.append(versus["ar_unconstrained_ms"])
    bars = ax.barh(names, [v / 1e3 for v in vals], color=["tab:green", "tab:red", "tab:gray"][: len(vals)])
    for b, v in zip(bars, vals):
        ax.text(b.get_width() * 1.02, b.get_y() + b.get_height() / 2, f"{v / 1e3:.2f} s", va="center", fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(right=max(vals) / 1e3 * 1.25)
    ax.set_xlabel("median wall time per slate (s)")
    ax.set_title(f"single pass vs autoregressive, N={versus['n_items']}: {versus['speedup']:.1f}× faster", fontsize=10)
    ax.tick_params(axis="y", labelsize=8)


def _scaling_panel(ax, recs: list[dict], labels: dict[str, str], colours: dict[str, str]) -> None:
    """Median engine ms against S, a line per contender; the ratio to the reference (the first
    contender of the records, as in :func:`hllm.bench.scaling.bench_scaling`) at each other point."""
    reference = labels[_model_key(recs[0])]
    points: dict[str, list[tuple[int, float, float]]] = {}
    for r in recs:
        points.setdefault(labels[_model_key(r)], []).append(
            (r["seq_len"], r["engine_ms"]["median"], r["ratio_to_reference"]))
    for label, pts in points.items():
        pts.sort()
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label, color=colours[label])
        if label == reference:
            continue
        for s, ms, ratio in pts:  # right of the point; on a log axis a constant ratio is a constant gap
            ax.annotate(f"{ratio:.2f}×", (s, ms), textcoords="offset points", xytext=(5, 0), ha="left",
                        va="center", fontsize=7, color=colours[label])
    from matplotlib.ticker import LogLocator, NullFormatter

    ax.set_yscale("log")
    ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(lambda v, _: f"{v:,.0f}")
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.set_xticks(sorted({r["seq_len"] for r in recs}))
    ax.margins(x=0.12)
    ax.set_xlabel("prompt tokens S")
    ax.set_ylabel("median engine ms per call (log scale)")
    ax.set_title(f"engine time vs prompt length, N={recs[0].get('n_items', '?')}\n"
                 f"(×: speed-up over {reference})", fontsize=10)
    ax.legend(fontsize=7, frameon=False)


def _drawn(ax) -> Panel:
    """What ``ax`` shows: its bar groups (by tick label) and lines, and its text annotations."""
    ticks = [t.get_text() for t in ax.get_yticklabels()]
    series: dict[str, list[tuple]] = {}
    for c in ax.containers:
        series[c.get_label()] = [(ticks[i] if i < len(ticks) else i, float(p.get_width()))
                                 for i, p in enumerate(c.patches)]
    for line in ax.get_lines():
        series[line.get_label()] = [(float(x), float(y)) for x, y in zip(line.get_xdata(), line.get_ydata())]
    return Panel(ax.get_title(), series, [t.get_text() for t in ax.texts])
