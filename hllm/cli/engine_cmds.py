"""Commands that build inference engines: build (ONNX export → TensorRT plan)."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from hllm.cli.app import app, out, step


@app.command("build")
def build_cmd(
    model: Path = typer.Argument(..., help="Export directory (or its model.onnx) from `hllm export --flavour standard` (fp16: --precision fp16)."),
    plan: Path = typer.Argument(..., help="TensorRT plan to write (sidecar <plan>.json and tokenizer beside it)."),
    profile: Optional[List[str]] = typer.Option(
        None, "--profile", "-p",
        help="Optimization profile BATCH/SEQ/ITEMS, each min:opt:max or one number, e.g. 1:1:8/64:1536:2048/1:50:50. "
             "Repeat for several. Default: batch 1:1:MAX_BATCH, seq 2..prompt max, items 1..K."),
    max_batch: int = typer.Option(8, help="Largest batch of the default profile."),
    timing_cache: Optional[Path] = typer.Option(None, help="Timing cache file: read if present, updated after the build."),
    opt_level: int = typer.Option(3, help="Builder optimization level 0..5 (TensorRT default 3)."),
    hardware_compat: Optional[str] = typer.Option(None, help="none, ampere_plus or same_compute_capability."),
    target: Optional[str] = typer.Option(None, help="Deployment GPU (a100): checks precision, sets hardware compatibility if built elsewhere."),
    workspace_gb: Optional[float] = typer.Option(None, help="Workspace memory-pool limit in GiB."),
    dry_run: bool = typer.Option(False, help="Validate the profiles and options and print them; build nothing (no GPU needed)."),
    overwrite: bool = typer.Option(False, help="Replace PLAN if it exists."),
) -> None:
    """Build a strongly typed TensorRT plan (TensorRT 10.x / 11.x) with optimization profiles and a metadata sidecar."""
    from hllm.formats.plan import target_settings
    from hllm.formats.profiles import Profile, default_profile, validate_profiles
    from hllm.build.tensorrt import check_standard_graph
    from hllm.runtime.artefact import resolve

    art = resolve(model)
    check_standard_graph(art)
    k = art.num_positions
    profiles = [Profile.parse(p) for p in profile] if profile else [default_profile(k, art.prompt.max_seq_len, max_batch)]
    validate_profiles(profiles, k)
    precision = art.precision.value
    if dry_run:
        settings = target_settings(target, None, hardware_compat, precision)
        out.print(f"would build {plan} from {art.path} ({precision}, K={k}), optimization level {opt_level}, "
                  f"hardware compatibility {settings['hardware_compatibility']} (final value depends on the build GPU), "
                  f"target {settings['target']}")
        for i, p in enumerate(profiles):
            out.print(f"  profile {i}: batch {p.batch}  seq {p.seq}  items {p.items}")
        return
    from hllm.build.tensorrt import build_plan

    with step(f"building TensorRT plan ({precision}, {len(profiles)} profile(s))"):
        meta = build_plan(art.path, plan, profiles, timing_cache=timing_cache, opt_level=opt_level,
                          hardware_compat=hardware_compat, target=target, workspace_gb=workspace_gb, overwrite=overwrite)
    out.print(f"plan → {plan} ({meta['plan_bytes'] / 1e6:.1f} MB) built in {meta['build_seconds']} s with TensorRT "
              f"{meta['tensorrt_version']} on {meta['gpu_name']} (sm_{meta['compute_capability'].replace('.', '')}), "
              f"hardware compatibility {meta['hardware_compatibility']}")
