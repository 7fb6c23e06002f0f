"""Commands that look at artefacts and inputs for other tools: info (like ``polygraphy inspect model``),
encode (engine inputs as ``polygraphy run --load-inputs`` reads them)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import typer
from rich.table import Table

from hllm.cli.app import app, out
from hllm.cli.io import check_output_file, data_to_stdout, emit_json, load_slates
from hllm.cli.options import batch_opt, json_opt, limit_opt, out_opt, slates_opt


@app.command("info")
def info_cmd(
    artefact: Path = typer.Argument(..., help="Checkpoint dir, export dir / .onnx, .plan, calibration set (.npz/.json), "
                                              "feature cache dir, backbone dir or slates file."),
    json_out: bool = json_opt(),
) -> None:
    """What an artefact is: kind, shapes, precision, flavour, K, prompt spec, sizes and provenance."""
    from hllm.cli.describe import describe

    data_to_stdout(json_out)
    d = describe(artefact)
    t = Table(title=f"{d['kind']}: {d['path']}", show_header=False)
    t.add_column("key", style="bold")
    t.add_column("value", overflow="fold")
    for key, value in _rows(d):
        t.add_row(key, value)
    out.print(t)
    if json_out:
        emit_json(d)


def _rows(d: dict, prefix: str = "") -> list[tuple[str, str]]:
    """Flatten a description for the table: nested dicts as dotted keys, sizes in MB, long lists summarised."""
    rows = []
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v and len(v) <= 24:
            rows += _rows(v, key + ".")
        elif isinstance(v, int) and not isinstance(v, bool) and (k == "bytes" or k.endswith("_bytes")) and v >= 10**5:
            rows.append((key, f"{v:,} ({v / 1e6:.1f} MB)"))
        elif isinstance(v, list) and len(v) > 8:
            rows.append((key, f"{len(v)} entries: {_short(v[:3])} …"))
        elif v is not None:
            rows.append((key, _short(v)))
    return rows


def _short(v: Any) -> str:
    import json

    text = v if isinstance(v, str) and "\n" not in v else json.dumps(v, ensure_ascii=False)
    return text if len(text) <= 400 else text[:400] + " …"


@app.command("encode")
def encode_cmd(
    model: Path = typer.Argument(..., help="Checkpoint dir, export dir / .onnx or .plan: its tokenizer, prompt spec and K."),
    slates: Optional[Path] = slates_opt(),
    out_path: Path = out_opt(required=True, help="Inputs JSON to write, as `polygraphy run --load-inputs` reads it ('-' = stdout)."),
    batch_size: int = batch_opt(1, "Slates per feed (one engine call)."),
    limit: Optional[int] = limit_opt(),
    json_out: bool = json_opt(),
) -> None:
    """Encode slates into engine inputs (input_ids, readout_positions, item_mask[, context_positions]) for
    Polygraphy / trtexec-style debugging: one feed dict per batch, JSON as polygraphy.json.save_json writes it."""
    from hllm.files import atomic_write_text
    from hllm.engines.tensorrt.interop import polygraphy_inputs_json
    from hllm.runtime.artefact import resolve
    from hllm.runtime.prompt import PromptBuilder, load_tokenizer

    check_output_file(out_path)
    data_to_stdout(json_out, out_path)
    art = resolve(model)
    rows = load_slates(slates, limit=limit)
    builder = PromptBuilder(load_tokenizer(art.tokenizer_path), art.prompt, max_items=art.num_positions)
    feeds = [builder.encode(rows[i:i + batch_size]).inputs(art.graph_inputs) for i in range(0, len(rows), batch_size)]
    text = polygraphy_inputs_json(feeds)
    if str(out_path) == "-":
        import sys

        sys.stdout.write(text + "\n")
    else:
        atomic_write_text(out_path, text + "\n")
    shapes = [{name: list(a.shape) for name, a in f.items()} for f in feeds]
    out.print(f"encoded {len(rows)} slates into {len(feeds)} feed(s) ({', '.join(feeds[0])}) → {out_path}")
    if json_out:
        emit_json({"command": "encode", "model": str(model), "slates": len(rows), "feeds": len(feeds),
                   "inputs": list(feeds[0]), "shapes": shapes, "pad_id": builder.pad_id, "out": str(out_path)})
