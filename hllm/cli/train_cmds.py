"""Commands of the paper's method: ``train`` (Sinkhorn distillation), ``teacher`` (autoregressive
listwise ranker), ``eval`` (AUC, Recall@1/10, NDCG@1/10 of several rankers side by side)."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from hllm.cli.app import app, console, out, progress, quiet_libraries
from hllm.cli.io import (check_output_dir, check_output_file, data_to_stdout, emit_json, load_slates, slates_file,
                         slates_source, write_json_out)
from hllm.cli.options import (batch_opt, choice_opt, deprecated, hidden_alias, json_opt, limit_opt, out_opt, pick,
                              positions_opt, slates_opt, threads_opt)
from hllm.formats.graph import MAX_ITEMS, MAX_SEQ
from hllm.errors import HllmError
from hllm.formats.checkpoint import HEAD_KINDS
from hllm.training.choices import AGGREGATIONS, OBJECTIVES
from hllm.training.precision import DEVICES, PRECISIONS

PRECISION_HELP = ("auto: bf16 autocast where the CPU has AVX512_BF16 or AMX-BF16 (or on a GPU), else fp32; "
                  "bf16 is refused without them. Trained tensors are saved in fp32.")
DEVICE_HELP = "auto: CUDA when torch sees a GPU, else the CPU."


def _legacy_positionals(slates: Optional[Path], out: Optional[Path], legacy: List[Path], new_form: str) -> tuple[Path, Path]:
    """The deprecated form with SLATES as a positional argument (``… SLATES OUT``): still accepted, with a note.

    ``out`` is the command's output as parsed by the new form (which, in the old form, holds SLATES).
    """
    if not legacy:
        if slates is None:
            raise typer.BadParameter(f"give the slates with --slates/-s ({new_form})")
        return slates, out
    if slates is not None or len(legacy) != 1:
        raise typer.BadParameter(f"unexpected extra arguments {[str(p) for p in legacy]} ({new_form})")
    deprecated("SLATES as a positional argument", new_form)
    return out, legacy[0]


@app.command("train")
def train_cmd(
    backbone: Path = typer.Argument(..., help="Hugging Face model directory (Qwen3, Qwen2 or Llama) with tokenizer.json."),
    out_dir: Path = typer.Argument(..., help="Checkpoint directory to write (hllm.json format)."),
    legacy: Optional[List[Path]] = typer.Argument(None, hidden=True),
    slates: Optional[Path] = typer.Option(None, "--slates", "-s", help="Training slates (JSONL[.gz]) with labels and/or ids in --teacher. Required."),
    objective: str = choice_opt("clicks", OBJECTIVES, "--objective", help="Training target (see docs/training.md)."),
    teacher: Optional[Path] = typer.Option(None, help="Teacher permutations JSONL (hllm teacher output)."),
    limit: Optional[int] = limit_opt(None, "Use only the first LIMIT training slates."),
    val_slates: int = typer.Option(0, min=0, max=1_000_000, help="Hold out the last this many of them and record AUC/Recall@k on them (learning curve)."),
    val_every: int = typer.Option(50, min=1, max=10_000_000, help="Validate every this many steps (with --val-slates)."),
    sample_items: Optional[int] = typer.Option(None, min=1, max=MAX_ITEMS, help="Train on sub-slates of this many candidates (clicked + random others)."),
    head: str = choice_opt("self_attention", HEAD_KINDS, "--head", help="Head kind (paper §3.3)."),
    positions: int = positions_opt(),
    head_dim: int = typer.Option(512, min=1, max=65536, help="Head width d_model (paper 512)."),
    head_heads: int = typer.Option(8, min=1, max=1024, help="Head attention heads."),
    head_ff: int = typer.Option(1024, min=1, max=262144, help="Head feed-forward width."),
    context_readout: bool = typer.Option(False, "--context-readout/--no-context-readout",
                                         help="The head also reads the user context (last user-context token; beyond the paper)."),
    lora_rank: int = typer.Option(8, min=0, max=4096, help="LoRA rank on all linear projections (paper 64); 0 = frozen backbone (Track 2)."),
    lora_layers: Optional[int] = typer.Option(None, min=1, max=10_000, help="LoRA on the last this many layers only; lower layers are cached once."),
    steps: int = typer.Option(100, min=1, max=10_000_000, help="Optimizer steps."),
    batch_size: int = batch_opt(1, "Slates per forward pass."),
    accum: int = typer.Option(8, min=1, max=100_000, help="Gradient accumulation: forwards per optimizer step."),
    lr: float = typer.Option(1e-4, min=0.0, max=10.0, help="AdamW (peak) learning rate."),
    lr_schedule: str = choice_opt("constant", ("constant", "cosine"), "--lr-schedule", help="constant, or cosine (linear warm-up, then cosine decay)."),
    warmup_steps: int = typer.Option(0, min=0, max=10_000_000, help="Warm-up steps of the cosine schedule."),
    min_lr_ratio: float = typer.Option(0.0, min=0.0, max=1.0, help="Cosine schedule floor, as a fraction of --lr."),
    weight_decay: float = typer.Option(0.0, min=0.0, max=10.0, help="AdamW weight decay."),
    tau: float = typer.Option(1.0, min=1e-6, max=1e6, help="Sinkhorn temperature τ."),
    sinkhorn_iters: int = typer.Option(20, min=1, max=10_000, help="Sinkhorn iterations L."),
    seed: int = typer.Option(0, min=0, max=2**32 - 1, help="Seed of init and data order."),
    save_every: int = typer.Option(50, min=1, max=10_000_000, help="Write the checkpoint every this many steps."),
    candidate_tokens: int = typer.Option(32, min=1, max=MAX_SEQ, help="Per-candidate token budget of the prompt."),
    history_tokens: int = typer.Option(320, min=1, max=MAX_SEQ, help="User-context token budget of the prompt."),
    max_history: int = typer.Option(10, min=0, max=10_000, help="Most recent history items used."),
    threads: Optional[int] = threads_opt("torch intra-op threads."),
    resume: bool = typer.Option(False, help="Continue from OUT_DIR's training state (training_state.json + .safetensors)."),
    features: Optional[Path] = typer.Option(None, help="Feature cache of these slates (hllm features): frozen layers below it are not run."),
    init_head: Optional[Path] = typer.Option(None, help="Start the head from this checkpoint's trained head (same kind and sizes), e.g. a frozen-backbone run, then train LoRA + head."),
    precision: str = choice_opt("auto", PRECISIONS, "--precision", help=PRECISION_HELP),
    device: str = choice_opt("auto", DEVICES, "--device", help=DEVICE_HELP),
    target: Optional[str] = hidden_alias("--target", "--objective"),
    json_out: bool = json_opt(),
    max_slates: Optional[int] = hidden_alias("--max-slates", "--limit"),
) -> None:
    """Train a checkpoint with the Sinkhorn loss (paper §3.3): LoRA or frozen backbone + any head.

    CPU defaults are small on purpose; on a GPU raise --steps, --lora-rank 64, drop --lora-layers.
    """
    from hllm.formats.prompt import PromptSpec
    from hllm.training.trainer import TrainConfig

    quiet_libraries()
    slates, out_dir = _legacy_positionals(slates, out_dir, legacy or [], "hllm train BACKBONE CKPT --slates FILE")
    slates = slates_file(slates)
    data_to_stdout(json_out)
    target = pick(objective, target, "clicks")
    max_slates = pick(limit, max_slates)
    if target not in OBJECTIVES or (max_slates is not None and max_slates < 1):
        raise typer.BadParameter(f"--objective must be one of {', '.join(OBJECTIVES)} and --limit ≥ 1")
    if not backbone.is_dir():
        raise HllmError(f"backbone directory not found: {backbone}")
    check_output_dir(out_dir, what="CKPT", resumable=True)
    if out_dir.exists() and not resume and any(out_dir.iterdir()):
        raise FileExistsError(f"{out_dir} already exists (pass --resume to continue it)")
    spec = PromptSpec(candidate_token_budget=candidate_tokens, history_token_budget=history_tokens, max_history=max_history)
    cfg = TrainConfig(
        backbone=str(backbone.resolve()), slates=str(slates), out_dir=str(out_dir), target=target,
        teacher=str(teacher) if teacher else None, max_slates=max_slates, val_slates=val_slates, val_every=val_every,
        sample_items=sample_items, head_kind=head, num_positions=positions,
        head_kwargs=dict(d_model=head_dim, num_heads=head_heads, ff_dim=head_ff,
                         **({"context": True} if context_readout else {})),
        lora_rank=lora_rank, lora_layers=lora_layers, steps=steps, batch_size=batch_size, accum=accum, lr=lr,
        lr_schedule=lr_schedule, warmup_steps=warmup_steps, min_lr_ratio=min_lr_ratio, weight_decay=weight_decay,
        tau=tau, sinkhorn_iters=sinkhorn_iters, seed=seed, save_every=save_every, prompt=spec.to_dict(), threads=threads,
        features=str(features) if features else None, init_head=str(init_head) if init_head else None,
        precision=precision, device=device,
    )
    from hllm.training.precision import resolve_compute

    compute = resolve_compute(precision, device)  # a bf16 request without bf16 instructions: exit 2 before any work
    console.print(f"compute: {compute.device}, {compute.precision} ({compute.reason})")
    res = _train_with_progress(cfg, resume)
    tail = res.losses[-10:]
    out.print(
        f"trained → {res.out_dir}: {res.steps} steps on {res.train_slates} slates; "
        f"loss {res.losses[0]:.4f} → {sum(tail) / max(1, len(tail)):.4f} (mean of last {len(tail)}); "
        f"cache {res.cache_s:.0f} s, train {res.train_s:.0f} s"
    )
    if json_out:
        emit_json({"command": "train", "out_dir": str(res.out_dir), "steps": res.steps, "train_slates": res.train_slates,
                   "loss_first": res.losses[0], "loss_last10_mean": sum(tail) / max(1, len(tail)),
                   "cache_s": round(res.cache_s, 3), "train_s": round(res.train_s, 3), "validation": res.validation})


def _train_with_progress(cfg, resume: bool):
    """:func:`hllm.training.trainer.train` with progress bars (caching, steps) on a terminal, and a line
    now and then (cached slates, loss, ETA) when the console is a log file; validations are printed."""
    import time

    from hllm.training.trainer import train

    steps = cfg.steps
    with progress() as bar:
        cache_task = bar.add_task("caching frozen layers", total=None, visible=False)
        task = bar.add_task("training", total=steps)

        plain = not console.is_terminal  # a log file: one line now and then instead of a bar

        def on_cache(done: int, total: int) -> None:
            bar.update(cache_task, completed=done, total=total, visible=True)
            if plain and (done % 25 == 0 or done == total):
                console.print(f"cached {done}/{total} slates")

        clock = {"t0": None, "first": 0}

        def on_step(step: int, loss: float) -> None:
            if clock["t0"] is None:
                clock["t0"], clock["first"] = time.perf_counter(), step
            bar.update(task, completed=step, description=f"training loss {loss:.4f}")
            if plain and (step % 5 == 0 or step == steps):
                done = step - clock["first"]
                eta = (time.perf_counter() - clock["t0"]) / max(1, done) * (steps - step)
                console.print(f"step {step}/{steps} loss {loss:.4f} eta {eta / 60:.1f} min")

        def on_validation(rec: dict) -> None:
            console.print(f"step {rec['step']}: held-out AUC {rec['auc']:.4f}  R@10 {rec['recall@10']:.4f}  "
                          f"NDCG@10 {rec['ndcg@10']:.4f} ({rec['slates']} slates)")

        return train(cfg, resume=resume, on_step=on_step, on_cache=on_cache, on_validation=on_validation)


@app.command("train-status")
def train_status_cmd(
    ckpt: Optional[Path] = typer.Argument(None, help="Checkpoint directory of a running or stopped hllm train (its training_state.json)."),
    features: Optional[Path] = typer.Option(None, help="Feature cache directory (hllm features), finished or not."),
    json_out: bool = json_opt(),
) -> None:
    """Progress of a long training job from its files: slates cached and trained, rate and ETA.

    Reads only the files (no process to ask), so it works while the job runs and after it stopped.
    Rates: the median gap between cache files; training seconds (all resumed runs) per step.
    """
    from hllm.training.status import cache_status, hours, training_status

    if ckpt is None and features is None:
        raise typer.BadParameter("give CKPT, --features CACHE_DIR, or both")
    data_to_stdout(json_out)
    rec: dict = {"command": "train-status"}
    if features is not None:
        c = rec["cache"] = cache_status(features)
        total = "?" if c["slates_total"] is None else f"{c['slates_total']:,}"
        out.print(f"cache {c['path']}: {c['slates_done']:,} / {total} slates (layer {c['layer']}, {c['precision']}"
                  f"{', complete' if c['complete'] else ''}); {c['s_per_slate'] or '?'} s per slate "
                  f"({c['slates_per_hour'] or '?'}/h); ETA {hours(c['eta_s'])}; last write {hours(c['last_write_age_s'])} ago", soft_wrap=True)
    if ckpt is not None:
        if features is not None and not (ckpt / "training_state.json").is_file():
            rec["training"] = None
            out.print(f"training {ckpt}: not started (no training_state.json yet)", soft_wrap=True)
        else:
            t = rec["training"] = training_status(ckpt)
            epochs = "" if t["epochs"] is None else f", {t['epochs']} epochs of {t['train_slates']:,}"
            out.print(f"training {t['path']}: step {t['step']:,} / {t['steps']:,} ({t['slates_seen']:,} / "
                      f"{t['slates_planned']:,} slates{epochs}; {t['precision']}); {t['s_per_step'] or '?'} s per step "
                      f"({t['slates_per_hour'] or '?'} slates/h); ETA {hours(t['eta_s'])}; loss (last 10) {t['loss_last10']}", soft_wrap=True)
            if t["validation_last"]:
                v = t["validation_last"]
                out.print(f"  held-out at step {v.get('step')}: AUC {v.get('auc')}, R@10 {v.get('recall@10')}", soft_wrap=True)
    if json_out:
        emit_json(rec)


@app.command("teacher")
def teacher_cmd(
    model_dir: Path = typer.Argument(..., help="--kind ar: Hugging Face causal LM directory (e.g. work/smollm2); "
                                     "--kind embedding: sentence-embedding model directory, or 'minilm' for the packaged all-MiniLM-L6-v2."),
    legacy: Optional[List[Path]] = typer.Argument(None, hidden=True),
    slates: Optional[Path] = typer.Option(None, "--slates", "-s", help="Slates to rank (JSONL[.gz], '-' = stdin). Required."),
    out_file: Optional[Path] = out_opt(help="Teacher permutations JSONL to write (input of hllm train / hllm eval). Required."),
    kind: str = choice_opt("ar", ("ar", "embedding"), "--kind", help="ar: autoregressive listwise LM; embedding: similarity of candidate and history titles."),
    agg: str = choice_opt("max", AGGREGATIONS, "--agg", help="--kind embedding: similarity to the history titles by max, mean or centroid."),
    constrained: bool = typer.Option(True, "--constrained/--free", help="Constrained ordinal decoding, or plain greedy."),
    limit: Optional[int] = limit_opt(None, "Rank only the first LIMIT slates."),
    max_new_tokens: Optional[int] = typer.Option(None, min=1, max=100_000, help="Generation cap (default: enough for all N ordinals)."),
    candidate_tokens: int = typer.Option(24, min=1, max=MAX_SEQ, help="Per-candidate token budget of the teacher prompt."),
    history_tokens: int = typer.Option(256, min=1, max=MAX_SEQ, help="User-context token budget of the teacher prompt."),
    threads: Optional[int] = threads_opt("torch intra-op threads."),
    batch_size: int = batch_opt(1, "--kind ar: slates decoded together (left-padded; wall time is shared)."),
    report: Optional[Path] = typer.Option(None, "--report", help="Also write the summary statistics JSON here."),
    json_out: bool = json_opt(),
    summary: Optional[Path] = hidden_alias("--summary", "--report"),
) -> None:
    """Rank slates with an autoregressive listwise LM (paper §4.3 Phase 1): greedy decoding with KV
    cache, parse + repair; per slate: invalid/repeated/missing ordinals, decode passes, wall time.

    With --kind embedding the ranking is the cosine similarity of each candidate title to the history
    titles (hllm.teacher.embedding); no generation, so no decode statistics.

    --kind ar rewrites OUT_FILE atomically after every batch, so a stopped run keeps what it finished;
    --kind embedding (seconds per 100 slates) writes it once at the end.
    """
    quiet_libraries()
    if legacy:
        if len(legacy) != 2 or slates is not None or out_file is not None:
            raise typer.BadParameter("give MODEL, --slates and --out (hllm teacher MODEL -s SLATES -o OUT.jsonl)")
        deprecated("hllm teacher MODEL SLATES OUT", "hllm teacher MODEL -s SLATES -o OUT")
        slates, out_file = legacy
    if slates is None or out_file is None:
        raise typer.BadParameter("give --slates and --out (hllm teacher MODEL -s SLATES -o OUT.jsonl)")
    summary = pick(report, summary)
    if str(out_file) == "-" or str(summary) == "-":
        raise typer.BadParameter("the teacher writes --out (after every batch) and --report to files: give file names")
    check_output_file(out_file)
    check_output_file(summary, "--report")
    data_to_stdout(json_out)
    if str(model_dir) != "minilm" and not model_dir.is_dir():
        raise HllmError(f"model directory not found: {model_dir}")
    rows = load_slates(slates, limit=limit)
    if kind == "embedding":
        res = _embedding_teacher(model_dir, rows, out_file, agg, threads, summary, slates)
        if json_out:
            emit_json({"command": "teacher", "kind": "embedding", "out": str(out_file), "agg": agg, **res})
        return
    from hllm.teacher import ArRanker
    from hllm.teacher.run import run_ar_teacher

    ranker = ArRanker(model_dir, max_new_tokens=max_new_tokens, threads=threads,
                      candidate_token_budget=candidate_tokens, history_token_budget=history_tokens)
    meta = dict(model=str(model_dir), slates_file=str(slates), constrained=constrained,
                prompt=ranker.spec.to_dict(), threads=threads, batch_size=batch_size)
    plain = not console.is_terminal
    with progress() as bar:
        task = bar.add_task(f"teacher ({'constrained' if constrained else 'free'})", total=len(rows))

        def on_batch(batch: list) -> None:
            bar.update(task, advance=len(batch))
            if plain:
                console.print(f"{len(batch)} slate(s): valid={[r.valid for r in batch]} "
                              f"passes={[r.decode_passes for r in batch]} {sum(r.wall_s for r in batch):.1f} s")

        stats = run_ar_teacher(ranker, rows, out_file, constrained, batch_size, summary, meta, on_batch)
    out.print(
        f"teacher → {out_file}: {stats['slates']} slates, valid {stats['valid_rate']:.0%}, "
        f"missing {stats['missing_mean']:.1f}, repeated {stats['repeated_mean']:.1f}, invalid {stats['invalid_mean']:.1f} per slate; "
        f"{stats['decode_passes_mean']:.0f} decode passes, {stats['wall_s_mean']:.1f} s per slate"
    )
    if json_out:
        emit_json({"command": "teacher", "kind": "ar", "out": str(out_file), **stats})


def _embedding_teacher(model_dir: Path, rows: list[dict], out_file: Path, agg: str, threads: Optional[int],
                       summary: Optional[Path], slates: Path) -> dict:
    """The embedding teacher over ``rows`` → its summary (slates, wall_s, ...)."""
    from hllm.files import atomic_write_json
    from hllm.teacher.embedding import EmbeddingRanker
    from hllm.teacher.run import run_embedding_teacher

    ranker = EmbeddingRanker(None if str(model_dir) == "minilm" else model_dir, agg=agg, threads=threads)
    with progress() as bar:
        task = bar.add_task(f"embedding teacher ({agg})", total=len(rows))
        res = run_embedding_teacher(ranker, rows, out_file, on_progress=lambda n: bar.advance(task, n))
    if summary:
        from hllm.formats.report import envelope

        atomic_write_json(summary, envelope("teacher", {"teacher": "embedding", "model": str(ranker.model_dir),
                                                        "agg": agg, "slates_file": str(slates), "threads": threads, **res}))
    out.print(f"embedding teacher → {out_file}: {res['slates']} slates ranked by {agg} similarity in {res['wall_s']:.0f} s")
    return res


@app.command("features")
def features_cmd(
    backbone: Path = typer.Argument(..., help="Hugging Face model directory (the checkpoints' backbone)."),
    out_dir: Path = typer.Argument(..., help="Cache directory to write (resumes an unfinished one)."),
    legacy: Optional[List[Path]] = typer.Argument(None, hidden=True),
    slates: Optional[Path] = typer.Option(None, "--slates", "-s", help="Slates (JSONL[.gz], '-' = stdin) to cache, in file order. Required."),
    layer: int = typer.Option(..., min=0, max=10_000, help="Cache the hidden state entering this decoder layer (L = all layers)."),
    limit: Optional[int] = limit_opt(None, "Cache only the first LIMIT slates."),
    positions: int = positions_opt(),
    candidate_tokens: int = typer.Option(32, min=1, max=MAX_SEQ, help="Per-candidate token budget of the prompt (as in hllm train)."),
    history_tokens: int = typer.Option(320, min=1, max=MAX_SEQ, help="User-context token budget of the prompt."),
    max_history: int = typer.Option(10, min=0, max=10_000, help="Most recent history items used."),
    threads: Optional[int] = threads_opt("torch intra-op threads."),
    source: Optional[Path] = typer.Option(None, "--from", help="Continue from this cache of the same slates at a lower layer and keep only the readout + context rows (needs --layer L)."),
    precision: str = choice_opt("fp32", PRECISIONS, "--precision", help="fp32 (the default: a cache is also the PyTorch reference of hllm eval --features), or bf16 / auto for a training cache: bf16 autocast where the CPU has AVX512_BF16 or AMX-BF16 (or on a GPU). Stored as float32 either way."),
    device: str = choice_opt("auto", DEVICES, "--device", help=DEVICE_HELP),
    json_out: bool = json_opt(),
) -> None:
    """Cache frozen backbone hidden states of slates once, for hllm train / hllm eval --features.

    Size ≈ tokens × hidden × 4 bytes per slate (about 3 MB for a 50-candidate Beauty slate on SmolLM2).
    """
    from hllm.formats.prompt import PromptSpec
    from hllm.training.features import build_cache

    quiet_libraries()
    slates, out_dir = _legacy_positionals(slates, out_dir, legacy or [], "hllm features BACKBONE CACHE_DIR --slates FILE")
    if not backbone.is_dir():
        raise HllmError(f"backbone directory not found: {backbone}")
    check_output_dir(out_dir, what="CACHE_DIR", resumable=True)
    data_to_stdout(json_out)
    rows = load_slates(slates, limit=limit)
    spec = PromptSpec(candidate_token_budget=candidate_tokens, history_token_budget=history_tokens, max_history=max_history)
    plain = not console.is_terminal
    with progress() as bar:
        task = bar.add_task("caching hidden states", total=len(rows))

        def on_progress(done: int, total: int) -> None:
            bar.update(task, completed=done)
            if plain and (done % 25 == 0 or done == total):
                console.print(f"cached {done}/{total} slates")

        from hllm.training.features import FeatureCache

        src = FeatureCache.open(source) if source is not None else None
        cache = build_cache(backbone, rows, out_dir, layer, spec.to_dict(), positions, threads, on_progress, src,
                            precision=precision, device=device)
    out.print(f"feature cache → {cache.root}: {len(cache)} slates, hidden state entering layer {cache.layer} of "
              f"{cache.num_layers} ({cache.precision})")
    if json_out:
        emit_json({"command": "features", "out_dir": str(cache.root), "slates": len(cache), "layer": cache.layer,
                   "num_layers": cache.num_layers, "precision": cache.precision})


@app.command("eval")
def eval_cmd(
    rankers: List[str] = typer.Argument(..., help="Rankers: 'random', checkpoint dir, export dir / .onnx / .plan, or a JSONL of orders (hllm teacher / hllm rank output); NAME=SPEC names a row. Every ranker after the first is also compared with the first, slate by slate."),
    slates: Optional[Path] = slates_opt(help="Labelled slates (JSONL[.gz], '-' = stdin)."),
    limit: Optional[int] = limit_opt(None, "Evaluate the first LIMIT slates (the same for every ranker)."),
    seed: int = typer.Option(0, min=0, max=2**32 - 1, help="Seed of the random ranker."),
    batch_size: int = batch_opt(),
    out_json: Optional[Path] = out_opt(help="Write the metrics JSON here (atomic, after every ranker; '-' = stdout at the end)."),
    features: Optional[Path] = typer.Option(None, help="Feature cache of these slates (hllm features): checkpoint rankers run only the layers above it."),
    json_out: bool = json_opt(),
) -> None:
    """AUC, Recall@1/10 and NDCG@1/10 (with 95% bootstrap intervals) of several rankers on the same labelled
    slates; every ranker after the first also gets its paired difference to the first (95% paired interval)."""
    from rich.markup import escape
    from rich.table import Table

    from hllm.files import atomic_write_json
    from hllm.formats.report import envelope
    from hllm.measure import describe_machine
    from hllm.training.eval import evaluate_rankers, parse_spec
    from hllm.verify.metrics import METRIC_KEYS, MIN_PAIRED

    quiet_libraries()
    check_output_file(out_json, inputs=[parse_spec(r)[1] for r in rankers])  # NAME=PATH rankers are inputs too
    data_to_stdout(json_out, out_json)
    if features is not None and not features.is_dir():
        raise HllmError(f"--features {features}: not a complete feature cache (no such directory; run `hllm features`)")
    machine = describe_machine()
    rows = load_slates(slates, limit=limit)
    name = "<stdin>" if str(slates) == "-" else (slates.name if slates else "the packaged sample")
    table = Table(title=f"ranking quality on the first {len(rows)} slates of {name} (95% bootstrap interval)")
    table.add_column("ranker")
    for k in METRIC_KEYS:
        table.add_column(k.upper() if k == "auc" else k.replace("recall", "R").replace("ndcg", "NDCG"), justify="right")
    table.add_column("slates", justify="right")

    def on_ranker(name: str, rep: dict, result: dict) -> None:
        ci = rep.get("ci95") or {}
        cell = lambda k: "–" if rep[k] is None else (f"{rep[k]:.4f}" + (f" [{ci[k][0]:.3f}, {ci[k][1]:.3f}]" if k in ci else ""))  # noqa: E731
        table.add_row(escape(name), *(cell(k) for k in METRIC_KEYS), str(rep["slates"]))
        if out_json and str(out_json) != "-":
            atomic_write_json(out_json, envelope("evaluation", result, machine=machine))

    with progress() as bar:
        def bar_for(desc: str, total: int):
            task = bar.add_task(desc, total=total)
            return lambda n: bar.advance(task, n)

        result = evaluate_rankers(rankers, rows, slates_source(slates), seed, batch_size, features, bar_for,
                                  on_ranker)
    out.print(table)
    for name, row in result["rankers"].items():
        pair = row.get("paired_vs_first")
        if not pair:
            continue
        head = f"{escape(name)} − {escape(pair['baseline'])}, paired over {pair['slates']} slates"
        if pair["ci95"]:
            cells = ", ".join(f"Δ{'AUC' if k == 'auc' else k} {pair['delta'][k]:+.4f} [{pair['ci95'][k][0]:+.3f}, {pair['ci95'][k][1]:+.3f}]"
                              for k in ("auc", "recall@10", "ndcg@10"))
            out.print(f"{head} (95% interval): {cells}")
        elif pair["slates"]:
            out.print(f"{head}: ΔAUC {pair['delta']['auc']:+.4f}; no interval below {MIN_PAIRED} slates")
        else:
            out.print(f"{head}: no slate has both a positive and a negative label")
    if str(out_json) == "-":
        write_json_out(out_json, envelope("evaluation", result, machine=machine))
    if json_out:
        emit_json(envelope("evaluation", result, machine=machine))
