"""Commands that build inference engines: build (ONNX export → TensorRT plan)."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import List, Optional

import typer

from hllm.cli.app import app, out, step
from hllm.cli.io import check_output_file, data_to_stdout, emit_json
from hllm.cli.options import choice_opt, hidden_alias, json_opt, overwrite_opt, pick
from hllm.formats.graph import MAX_BATCH
from hllm.formats.plan import HARDWARE_COMPAT


@app.command("build")
def build_cmd(
    model: Path = typer.Argument(..., help="Export directory (or its model.onnx) from `hllm export --flavour standard` (fp16: --precision fp16)."),
    plan: Path = typer.Argument(..., help="TensorRT plan to write (sidecar <plan>.json and tokenizer beside it)."),
    profile: Optional[List[str]] = typer.Option(
        None, "--profile", "-p",
        help="Optimization profile BATCH/SEQ/ITEMS, each min:opt:max or one number, e.g. 1:1:8/64:1536:2048/1:50:50. "
             "Repeat for several. Default: batch 1:1:BATCH_SIZE, seq 2..prompt max, items 1..K."),
    batch_size: int = typer.Option(8, "--batch-size", "-b", min=1, max=MAX_BATCH, help="Largest batch of the default profile."),
    timing_cache: Optional[Path] = typer.Option(None, help="Timing cache file: read if present, updated after the build."),
    opt_level: int = typer.Option(3, min=0, max=5, help="Builder optimization level 0..5 (TensorRT default 3)."),
    hardware_compat: Optional[str] = choice_opt(None, HARDWARE_COMPAT, "--hardware-compat", help="Hardware compatibility level (default none)."),
    target: Optional[str] = typer.Option(None, help="Deployment GPU (a100): checks precision, sets hardware compatibility if built elsewhere."),
    workspace_gb: Optional[float] = typer.Option(None, min=0.001, max=4096.0, help="Workspace memory-pool limit in GiB."),
    dry_run: bool = typer.Option(False, help="Validate the profiles and options, print them and the equivalent trtexec and "
                                            "polygraphy convert command lines; build nothing (no GPU needed)."),
    overwrite: bool = overwrite_opt("PLAN"),
    json_out: bool = json_opt(),
    max_batch: Optional[int] = hidden_alias("--max-batch", "--batch-size"),
) -> None:
    """Build a strongly typed TensorRT plan (TensorRT 10.x / 11.x) with optimization profiles and a metadata sidecar."""
    from hllm.exporter.plan import check_standard_graph
    from hllm.engines.tensorrt.profiles import default_profile, validate_profiles
    from hllm.formats.profiles import Profile
    from hllm.runtime.artefact import resolve

    batch_size = pick(batch_size, max_batch, 8)
    if not 1 <= batch_size <= MAX_BATCH:
        raise typer.BadParameter(f"--batch-size must be within 1..{MAX_BATCH}, got {batch_size}")
    data_to_stdout(json_out)
    check_output_file(plan, "PLAN")  # before any work, dry runs included: never inside or equal to an input
    check_output_file(timing_cache, "--timing-cache")  # read if present, but rewritten after the build
    art = resolve(model)
    check_standard_graph(art)
    k = art.num_positions
    profiles = [Profile.parse(p) for p in profile] if profile else [default_profile(k, art.prompt.max_seq_len, batch_size)]
    validate_profiles(profiles, k)
    precision = art.precision.value
    if dry_run:
        _dry_run(art, plan, profiles, precision, target, hardware_compat, timing_cache, opt_level, workspace_gb, json_out)
        return
    if plan.exists() and not overwrite:
        raise FileExistsError(f"{plan} already exists (pass --overwrite to replace it)")
    from hllm.exporter.plan import build_plan

    with step(f"building TensorRT plan ({precision}, {len(profiles)} profile(s))"):
        meta = build_plan(art.path, plan, profiles, timing_cache=timing_cache, opt_level=opt_level,
                          hardware_compat=hardware_compat, target=target, workspace_gb=workspace_gb, overwrite=overwrite)
    out.print(f"plan → {plan} ({meta['plan_bytes'] / 1e6:.1f} MB) built in {meta['build_seconds']} s with TensorRT "
              f"{meta['tensorrt_version']} on {meta['gpu_name']} (sm_{meta['compute_capability'].replace('.', '')}), "
              f"hardware compatibility {meta['hardware_compatibility']}")
    if json_out:
        emit_json({"command": "build", "plan": str(plan), **meta})


def _dry_run(art, plan: Path, profiles: list, precision: str, target: Optional[str], hardware_compat: Optional[str],
             timing_cache: Optional[Path], opt_level: int, workspace_gb: Optional[float], json_out: bool) -> None:
    """Print what ``hllm build`` would do and the trtexec / polygraphy convert lines that build the same plan."""
    from hllm.engines.tensorrt.interop import polygraphy_convert_command, trtexec_command
    from hllm.engines.tensorrt.targets import target_settings

    settings = target_settings(target, None, hardware_compat, precision)
    hc = settings["hardware_compatibility"]
    opts = dict(context=art.context, opt_level=opt_level, timing_cache=timing_cache, hardware_compat=hc,
                workspace_gb=workspace_gb)
    trtexec = trtexec_command(art.path, plan, profiles, **opts)
    polygraphy = polygraphy_convert_command(art.path, plan, profiles, **opts)
    out.print(f"would build {plan} from {art.path} ({precision}, K={art.num_positions}), optimization level {opt_level}, "
              f"hardware compatibility {hc} (final value depends on the build GPU), target {settings['target']}")
    for i, p in enumerate(profiles):
        out.print(f"  profile {i}: batch {p.batch}  seq {p.seq}  items {p.items}")
    out.print("equivalent trtexec (no hllm sidecar: `hllm rank` / `serve` need a plan from `hllm build`):")
    out.print("  " + shlex.join(trtexec), highlight=False, markup=False)
    out.print("equivalent polygraphy convert:")
    out.print("  " + shlex.join(polygraphy), highlight=False, markup=False)
    if json_out:
        emit_json({"command": "build", "dry_run": True, "plan": str(plan), "onnx": str(art.path), "precision": precision,
                   "num_positions": art.num_positions, "hardware_compatibility": hc, "target": settings["target"],
                   "profiles": [p.to_dict() for p in profiles], "trtexec": trtexec, "polygraphy": polygraphy})
