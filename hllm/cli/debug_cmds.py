"""``hllm debug precision``: which modules must stay fp32 for a reduced-precision graph to keep the rankings
(:mod:`hllm.calibration.precision_search.precision_debug`)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from hllm.cli.app import app, out, quiet_libraries
from hllm.cli.io import check_output_file, data_to_stdout, finish_report, load_slates, write_json_out
from hllm.cli.options import choice_opt, json_opt, limit_opt, slates_opt, threads_opt
from hllm.runtime.slates import slate_ids

debug_app = typer.Typer(help="Debugging tools judged by rankings (like `polygraphy debug`).", no_args_is_help=True)
app.add_typer(debug_app, name="debug")


def _int_list(text: Optional[str], what: str) -> Optional[list[int]]:
    from hllm.errors import HllmError

    if text is None:
        return None
    try:
        return [int(x) for x in text.split(",")]  # an empty item ("", ",", "1,,2") is refused, not read as "all"
    except ValueError:
        raise HllmError(f"{what} must be a comma list of integers (omit it for all), got {text!r}") from None


@debug_app.command("precision")
def precision_cmd(
    export_dir: Path = typer.Argument(..., help="FP32 export directory (flavour standard for int8)."),
    target: str = choice_opt("fp16", ("fp16", "int8", "bf16"), "--precision", help="fp16 (CPU emulation of the FP16 graph), int8 (NNCF on OpenVINO) or bf16 (bf16 GEMMs: OpenVINO on AVX512_BF16 / AMX CPUs, exact emulation elsewhere)."),
    islands_out: Path = typer.Option(..., "--out", "-o", help="Islands file to write (.json; read by `hllm export --fp32-islands`)."),
    slates: Optional[Path] = slates_opt(help="Real slates the variants are ranked on (default: the packaged sample)."),
    limit: Optional[int] = limit_opt(10, "Use the first LIMIT slates."),
    layers: Optional[str] = typer.Option(None, help="Comma list of decoder layers to try (default: all)."),
    parts: str = typer.Option("mlp,self_attn", help="Module kinds tried per layer: mlp, self_attn."),
    calib_slates: Optional[Path] = typer.Option(None, help="int8: slates to draw calibration data from (e.g. the train split)."),
    calib_count: int = typer.Option(16, min=1, max=10_000, help="int8: calibration slates."),
    gate: str = choice_opt("quality", ("quality", "strict"), "--gate", help="How a variant passes: quality (the gate of `hllm calibrate`: ΔAUC / ΔNDCG@10 / ΔRecall@10 non-inferiority on labelled slates + mean tau ≥ --min-tau, p95 assignment regret ≤ 1e-3, finite scores) or strict (top-1 ≥ --min-top1 and the point |Δ| limits)."),
    min_top1: float = typer.Option(0.97, min=0.0, max=1.0, help="Strict gate: min top-1 agreement with FP32."),
    min_tau: float = typer.Option(0.9, min=-1.0, max=1.0, help="Quality gate: min mean Kendall tau with FP32."),
    max_islands: int = typer.Option(8, min=1, max=1000, help="Most modules the greedy search keeps in fp32."),
    bf16_runner: str = choice_opt("auto", ("auto", "openvino", "emulate"), "--bf16-runner", help="bf16: openvino (real bf16 kernels; AVX512_BF16 / AMX CPUs), emulate (ONNX Runtime, any CPU) or auto."),
    groups: int = typer.Option(4, min=1, max=1000, help="bf16: layer groups searched (consecutive decoder layers)."),
    refine: int = typer.Option(2, min=0, max=8, help="bf16: op classes also tried per layer group (the most helpful ones)."),
    bf16_base: str = typer.Option("head,attention", "--bf16-base", help="bf16: islands every searched set keeps (op classes / module paths; 'none' = none); each but the head is also tried in bf16 as a frontier point."),
    report: Optional[Path] = typer.Option(None, help="Full report JSON (every module's figures)."),
    threads: Optional[int] = threads_opt(),
    json_out: bool = json_opt(),
) -> None:
    """Keep one module at a time in fp32, rank real slates, report each module's ΔM / top-1 / tau, then add
    the most sensitive modules until the rankings match; write the islands file."""
    from hllm.calibration.precision_search.precision_debug import (DebugSettings, VariantRunner, modules_to_try, debug_precision,
                                                  islands_file)
    from hllm.formats.precision import Precision
    from hllm.runtime.artefact import resolve
    from hllm.runtime.prompt import PromptBuilder, load_tokenizer

    quiet_libraries()
    target = Precision.parse(target, "--precision")  # the CLI string, converted once
    check_output_file(islands_out, "--out")
    check_output_file(report, "--report")
    data_to_stdout(json_out, islands_out, report)
    if target is Precision.BF16:  # an unknown island is refused before any work
        from hllm.exporter.bf16 import parse_islands

        base_islands = parse_islands(bf16_base, "--bf16-base")
    layer_list = _int_list(layers, "--layers")  # a malformed list is refused before any work
    art = resolve(export_dir)
    data = load_slates(slates, limit=limit)
    builder = PromptBuilder(load_tokenizer(art.tokenizer_path), art.prompt, max_items=art.num_positions)
    batches = [builder.encode([s]) for s in data]
    calib = None
    if target is Precision.INT8 and calib_slates is not None:
        from hllm.calibration.recipes.openvino_int8 import calibration_feeds
        from hllm.runtime.slates import read_slates

        calib = calibration_feeds(read_slates(calib_slates), builder, calib_count, 0, art.context,
                                  exclude_ids=slate_ids(data))
    n_layers = int((art.meta.get("backbone") or {}).get("num_layers") or 0)
    cands = modules_to_try(n_layers, [p.strip() for p in parts.split(",") if p.strip()],
                              layer_list)
    runner = VariantRunner(export_dir, target, batches, calib, threads, bf16_runner=bf16_runner)
    try:
        if runner.bf16 is not None:  # a base island that keeps nothing in fp32 is refused before the reference run
            from hllm.exporter.bf16 import check_islands

            check_islands(runner.bf16.model(), base_islands)
        ref = runner.reference()
        from hllm.verify.gate import GateThresholds

        settings = DebugSettings(min_top1, min_tau, max_islands, gate=GateThresholds(mode=gate, min_tau=min_tau, min_top1=min_top1))
        if target is Precision.BF16:
            from hllm.calibration.precision_search.bf16_islands import search_islands
            from hllm.exporter.bf16 import fp32_share

            v = runner.bf16
            out.print(f"bf16 variants run on {'OpenVINO (real bf16 kernels)' if v.runner == 'openvino' else 'the exact emulation (ONNX Runtime)'}")
            res = search_islands(runner, ref, data, n_layers, lambda isl: fp32_share(v.model(), v.feeds(), isl),
                                 settings, groups=groups, refine=refine, base=base_islands, say=out.print)
            res["runner"] = v.runner
        elif target is Precision.INT8:  # NNCF accuracy control: the route of calibrate's openvino-int8 recipe
            from hllm.calibration.recipes.accuracy_control import debug_int8
            from hllm.runtime.artefact import open_engine

            res = debug_int8(export_dir, data, ref, runner.calibration, settings,
                             lambda d: runner._scores(open_engine(resolve(d), threads=threads)), runner.tmp,
                             say=out.print)
        else:
            res = debug_precision(runner, ref, data, cands, settings, say=out.print)
    finally:
        runner.close()
    doc = islands_file(target, res, str(export_dir))
    write_json_out(islands_out, doc)
    out.print(f"islands → {islands_out}: {', '.join(res['islands']) or 'none'} "
              f"({'passes' if res['passed'] else 'does NOT pass'} the {gate} gate)")
    from hllm.formats.report import envelope

    finish_report(report, envelope("precision_debug", {**res, "target": target, "slates": len(data),
                                                       "export": str(export_dir)}), json_out)
