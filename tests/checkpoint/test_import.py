"""``hllm import`` on artefacts made the way other teams make them, ranked by hllm exactly as the team's own
scorer (transformers + peft + plain torch head + scipy) ranks them; unmapped keys refused, exit 2."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from hllm.testing import tiny_backbone, tiny_slates
from examples.bring_your_own import (EncoderHead, MLPHead, PlainHead, make_adapter, save_head, team_ranking, team_scores,
                                   write_prompt)
from tests.cli.conftest import run

K = 8


@pytest.fixture(scope="module")
def team(tmp_path_factory):
    """{family: (backbone, CAUSAL_LM adapter)} for qwen3, qwen2 (q/k/v biases), llama (tied embeddings)."""
    root = tmp_path_factory.mktemp("team")
    out = {}
    for i, fam in enumerate(("qwen3", "qwen2", "llama")):
        bb = tiny_backbone(root / f"bb-{fam}", fam, seed=10 + i)
        out[fam] = (bb, make_adapter(bb, root / f"adapter-{fam}", "CAUSAL_LM", seed=i))
    return out


def _hllm_scores(ckpt, slates):
    from hllm.engines.reference import TorchEngine
    from hllm.formats.checkpoint import load_manifest
    from hllm.runtime.prompt import PromptBuilder, load_tokenizer
    from hllm.verify.scoring import score_slates

    m = load_manifest(ckpt)
    builder = PromptBuilder(load_tokenizer(m.tokenizer_path), m.prompt, max_items=m.num_positions)
    with TorchEngine(ckpt) as eng:
        (scores,) = score_slates([eng], builder, slates)
    return scores


@pytest.mark.parametrize("family", ["qwen3", "qwen2", "llama"])
def test_import_ranks_as_the_team_does(team, family, tmp_path, capsys):
    bb, adapter = team[family]
    torch.manual_seed(3)
    head = EncoderHead(32, K)
    hfile = save_head(head, tmp_path / "head.pt")
    code, out, err = run(["import", str(bb), str(tmp_path / "ck"), "--head", str(hfile), "--head-kind", "self_attention",
                          "--adapter", str(adapter), "--head-map", "inp.=proj.", "--head-map", "encoder.layers.=blocks.",
                          "--head-map", "score.=out.", "--num-heads", "4", "--activation", "relu", "--post-norm",
                          "--prompt", str(write_prompt(tmp_path / "prompt.json")), "--json"], capsys)
    assert code == 0, err
    rep = json.loads(out)
    assert rep["adapter_layout"] == "causal_lm" and rep["adapter_modules"] == 14  # 2 layers × 7 projections
    assert rep["head"]["norm_first"] is False and rep["head"]["final_norm"] is False and rep["head"]["num_layers"] == 2
    slates = tiny_slates(5, (3, K), seed=4)
    ours = _hllm_scores(tmp_path / "ck", slates)
    theirs = team_scores(bb, adapter, head, slates)
    bare = team_scores(bb, None, head, slates)
    for a, b, c in zip(ours, theirs, bare):
        assert np.abs(a - b).max() <= 1e-4
        assert np.abs(b - c).max() > 1e-3  # the adapter matters here: a dropped one could not pass
        assert team_ranking(a) == team_ranking(b)


@pytest.mark.parametrize("task_type", ["CAUSAL_LM", "FEATURE_EXTRACTION", None])
def test_every_task_type_applies(team, task_type, tmp_path, capsys):
    """The silent drop: a CAUSAL_LM-layout adapter with task_type null loaded as nothing (byte-identical
    scores to no adapter); with CAUSAL_LM it crashed. Both now land, and score as peft on the LM does."""
    bb, _ = team["qwen3"]
    adapter = make_adapter(bb, tmp_path / "adapter", task_type, seed=7)
    head = PlainHead(32, K)
    hfile = save_head(head, tmp_path / "head.safetensors")
    args = ["import", str(bb), str(tmp_path / "ck"), "--head", str(hfile), "--head-kind", "probe",
            "--head-map", "classifier.=out.", "--prompt", str(write_prompt(tmp_path / "p.json"))]
    assert run(args + ["--adapter", str(adapter)], capsys)[0] == 0
    assert run([*args[:2], str(tmp_path / "bare"), *args[3:]], capsys)[0] == 0
    slates = tiny_slates(3, (2, K), seed=1)
    with_adapter, without = _hllm_scores(tmp_path / "ck", slates), _hllm_scores(tmp_path / "bare", slates)
    assert all(np.abs(a - b).max() > 1e-3 for a, b in zip(with_adapter, without))
    assert all(np.abs(a - t).max() <= 1e-4 for a, t in zip(with_adapter, team_scores(bb, adapter, head, slates)))


@pytest.mark.parametrize("act", ["relu", "gelu", "silu"])
def test_mlp_head(team, act, tmp_path, capsys):
    bb, _ = team["llama"]
    head = MLPHead(32, K, act=act)
    hfile = save_head(head, tmp_path / "head.safetensors")
    code, _, err = run(["import", str(bb), str(tmp_path / "ck"), "--head", str(hfile), "--head-kind", "linear",
                        "--activation", act, "--head-map", "fc1.=proj.", "--head-map", "fc2.=out.",
                        "--prompt", str(write_prompt(tmp_path / "p.json"))], capsys)
    assert code == 0, err
    slates = tiny_slates(3, (2, K), seed=2)
    for a, b in zip(_hllm_scores(tmp_path / "ck", slates), team_scores(bb, None, head, slates)):
        assert np.abs(a - b).max() <= 1e-4


def test_pre_ln_gelu_encoder_head(team, tmp_path, capsys):
    bb, adapter = team["qwen2"]
    head = EncoderHead(32, K, norm_first=True, activation="gelu")
    hfile = save_head(head, tmp_path / "head.pt")
    code, _, err = run(["import", str(bb), str(tmp_path / "ck"), "--head", str(hfile), "--head-kind", "self_attention",
                        "--adapter", str(adapter), "--head-map", "inp.=proj.", "--head-map", "encoder.layers.=blocks.",
                        "--head-map", "score.=out.", "--num-heads", "4", "--activation", "gelu",
                        "--prompt", str(write_prompt(tmp_path / "p.json"))], capsys)
    assert code == 0, err
    slates = tiny_slates(3, (2, K), seed=5)
    for a, b in zip(_hllm_scores(tmp_path / "ck", slates), team_scores(bb, adapter, head, slates)):
        assert np.abs(a - b).max() <= 1e-4


def test_unmapped_head_keys_are_named(team, tmp_path, capsys):
    bb, _ = team["qwen3"]
    hfile = save_head(EncoderHead(32, K), tmp_path / "head.pt")
    code, _, err = run(["import", str(bb), str(tmp_path / "ck"), "--head", str(hfile), "--head-kind", "self_attention",
                        "--head-map", "inp.=proj.", "--head-map", "score.=out.", "--num-heads", "4"], capsys)
    assert code == 2
    assert "encoder.layers.0" in err and "blocks.0" in err and "--head-map" in err
    assert not (tmp_path / "ck").exists()


def test_adapter_keys_left_over_are_named(team, tmp_path, capsys):
    """A LoRA on lm_head (not part of the graph) is refused, naming the key; nothing is written."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    bb, _ = team["qwen3"]
    lm = AutoModelForCausalLM.from_pretrained(str(bb))
    get_peft_model(lm, LoraConfig(r=2, target_modules=["q_proj", "lm_head"])).save_pretrained(str(tmp_path / "ad"))
    hfile = save_head(PlainHead(32, K), tmp_path / "head.safetensors")
    code, _, err = run(["import", str(bb), str(tmp_path / "ck"), "--head", str(hfile), "--head-kind", "probe",
                        "--head-map", "classifier.=out.", "--adapter", str(tmp_path / "ad")], capsys)
    assert code == 2 and "lm_head" in err
    assert not (tmp_path / "ck").exists()


def test_default_sample_over_k_says_pass_slates(lora_checkpoint, capsys):
    """K = 8 and the packaged 50-candidate sample: the refusal says to pass --slates."""
    code, _, err = run(["parity", str(lora_checkpoint), str(lora_checkpoint), "--allow-non-torch-reference",
                        "--limit", "1"], capsys)
    assert code == 2 and "--slates" in err and "packaged sample" in err


def _probe_args(bb, tmp_path, hfile, *extra):
    return ["import", str(bb), str(tmp_path / "ck"), "--head", str(hfile), "--head-kind", "probe",
            "--head-map", "classifier.=out.", *extra]


def test_adapter_errors_name_the_users_files(team, tmp_path, capsys):
    """A refused adapter was named by its temporary copy (OUT/.ck.….tmp/adapter/…), a path gone by the time
    the user reads it; it is now checked where it is, before anything is written."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    bb, _ = team["qwen3"]
    lm = AutoModelForCausalLM.from_pretrained(str(bb))
    get_peft_model(lm, LoraConfig(r=2, target_modules=["q_proj"], modules_to_save=["norm"])).save_pretrained(
        str(tmp_path / "ad"))
    hfile = save_head(PlainHead(32, K), tmp_path / "head.safetensors")
    code, _, err = run(_probe_args(bb, tmp_path, hfile, "--adapter", str(tmp_path / "ad")), capsys)
    assert code == 2 and str(tmp_path / "ad" / "adapter_model.safetensors") in err and ".tmp" not in err
    assert "layernorm" in err and not (tmp_path / "ck").exists()


def test_colliding_head_map_rules_refused(team, tmp_path, capsys):
    """Two rules for one prefix: the first silently won."""
    bb, _ = team["qwen3"]
    hfile = save_head(PlainHead(32, K), tmp_path / "head.safetensors")
    code, _, err = run(_probe_args(bb, tmp_path, hfile, "--head-map", "classifier.=proj."), capsys)
    assert code == 2 and "collide" in err and "classifier.=proj." in err
    assert not (tmp_path / "ck").exists()


@pytest.mark.parametrize("bad", ["complex", "int", "nan"])
def test_head_tensors_must_be_finite_real_floats(team, bad, tmp_path, capsys):
    """A complex head lost its imaginary part in the cast to float (a warning only), an integer head was cast,
    a NaN head imported and scored NaN."""
    bb, _ = team["qwen3"]
    state = PlainHead(32, K).state_dict()
    w = state["classifier.weight"]
    state["classifier.weight"] = {"complex": w.to(torch.complex64), "int": (w * 100).long(),
                                  "nan": w.masked_fill(torch.rand_like(w) < 0.1, float("nan"))}[bad]
    torch.save(state, tmp_path / "head.pt")
    code, _, err = run(_probe_args(bb, tmp_path, tmp_path / "head.pt"), capsys)
    assert code == 2 and "out.weight" in err
    assert ("NaN" if bad == "nan" else "not real floating point") in err
    assert not (tmp_path / "ck").exists()


def test_pickled_module_refused_saying_what_to_save(team, tmp_path, capsys):
    """torch.save(model): refused by weights_only, but the message was torch's, advising weights_only=False."""
    bb, _ = team["qwen3"]
    torch.save(PlainHead(32, K), tmp_path / "head.pt")
    code, _, err = run(_probe_args(bb, tmp_path, tmp_path / "head.pt"), capsys)
    assert code == 2 and "state_dict()" in err and "weights_only` set to `False" not in err


def test_head_bytes_bounded_and_prefix_reads_only_the_head(team, tmp_path, capsys, monkeypatch):
    """A whole model's state dict was read in full (safetensors load_file, torch.load) before any check; the
    tensors kept are now bounded from the header (the bound lowered here), and --head-prefix reads the head."""
    import hllm.checkpoint.importer as importer
    from safetensors.torch import save_file

    bb, _ = team["qwen3"]
    state = {f"head.{k}": v for k, v in PlainHead(32, K).state_dict().items()}
    save_file({**state, "backbone.huge": torch.zeros(1 << 16)}, str(tmp_path / "model.safetensors"))
    monkeypatch.setattr(importer, "MAX_HEAD_BYTES", 1 << 16, raising=False)
    code, _, err = run(_probe_args(bb, tmp_path, tmp_path / "model.safetensors"), capsys)
    assert code == 2 and "'backbone.huge'" in err and "over the" in err
    code, _, err = run(_probe_args(bb, tmp_path, tmp_path / "model.safetensors", "--head-prefix", "head."), capsys)
    assert code == 0, err


def test_bos_token_checked_at_import(team, tmp_path, capsys):
    """A bos_token the tokenizer lacks was written; every later command failed on the checkpoint."""
    bb, _ = team["qwen3"]
    hfile = save_head(PlainHead(32, K), tmp_path / "head.safetensors")
    (tmp_path / "p.json").write_text(json.dumps({"bos_token": "<no-such-token>"}))
    code, _, err = run(_probe_args(bb, tmp_path, hfile, "--prompt", str(tmp_path / "p.json")), capsys)
    assert code == 2 and "<no-such-token>" in err and not (tmp_path / "ck").exists()


@pytest.mark.parametrize("case", ["yaml_over_limit", "json_huge_template", "budget_over_max_seq"])
def test_prompt_files_bounded(case, tmp_path):
    """A YAML prompt over 1 MiB was cut silently and failed as 'unexpected end of stream'; a 3 MB template
    in JSON was accepted (rendered and tokenised for every candidate); a budget of 10**20 was accepted, and
    no longer bounded how much of a candidate's text is tokenised."""
    from hllm.checkpoint.importer import load_prompt
    from hllm.errors import CheckpointError

    big = "{title}" + "x" * (3 << 20)
    path, text, want = {
        "yaml_over_limit": ("p.yaml", f"candidate_template: '{big}'\n", "over 1 MiB"),
        "json_huge_template": ("p.json", json.dumps({"candidate_template": big}), "limit"),
        "budget_over_max_seq": ("p.yaml", "candidate_token_budget: 100000000000000000000\n", "over the longest sequence"),
    }[case]
    (tmp_path / path).write_text(text)
    with pytest.raises(CheckpointError, match=want):
        load_prompt(tmp_path / path)
    if case == "json_huge_template":
        from hllm.formats.prompt import PromptSpec

        with pytest.raises(CheckpointError, match="over the limit of 65536"):
            PromptSpec(candidate_template="{title}" + "x" * 70000)


def test_embedding_lora_as_peft_saves_it(team, tmp_path, capsys):
    """A LoRA on embed_tokens: peft also saves the whole embedding (``embed_tokens.base_layer.weight``,
    save_embedding_layers="auto"); it lands, and hllm scores as peft on the *ForCausalLM does."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    bb, _ = team["llama"]
    torch.manual_seed(4)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(str(bb)), LoraConfig(r=2, target_modules=["embed_tokens",
                                                                                                          "q_proj"]))
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n or "lora_embedding_B" in n:
                p.normal_(0.0, 0.3)
    model.save_pretrained(str(tmp_path / "ad"))
    head = PlainHead(32, K)
    hfile = save_head(head, tmp_path / "head.safetensors")
    code, _, err = run(["import", str(bb), str(tmp_path / "ck"), "--head", str(hfile), "--head-kind", "probe",
                        "--head-map", "classifier.=out.", "--adapter", str(tmp_path / "ad"),
                        "--prompt", str(write_prompt(tmp_path / "p.json"))], capsys)
    assert code == 0, err
    slates = tiny_slates(3, (2, K), seed=6)
    theirs, bare = team_scores(bb, tmp_path / "ad", head, slates), team_scores(bb, None, head, slates)
    for a, b, c in zip(_hllm_scores(tmp_path / "ck", slates), theirs, bare):
        assert np.abs(a - b).max() <= 1e-5 and np.abs(b - c).max() > 1e-3


def test_a_head_that_reads_the_user_context_imports_and_scores_the_same(context_checkpoint, tmp_path, capsys):
    """A context-reading head (``context.proj`` in its tensors, under a team's own prefix) imports as one: the
    manifest says ``context: true`` and the scores, which depend on context_positions, equal the original's."""
    from safetensors.torch import load_file, save_file

    from hllm.formats.checkpoint import load_manifest

    m = load_manifest(context_checkpoint)
    theirs = {f"ranker.head.{k}": v for k, v in load_file(str(m.head_path)).items()}
    theirs["ranker.backbone.extra"] = torch.zeros(1)  # a whole model's state dict: --head-prefix keeps the head
    save_file(theirs, str(tmp_path / "model.safetensors"))
    (tmp_path / "prompt.json").write_text(json.dumps(m.prompt.to_dict()))
    code, out, err = run(["import", str(m.backbone_path), str(tmp_path / "ck"), "--head", str(tmp_path / "model.safetensors"),
                          "--head-prefix", "ranker.head.", "--head-kind", "self_attention",
                          "--num-heads", str(m.head.num_heads), "--prompt", str(tmp_path / "prompt.json"), "--json"], capsys)
    assert code == 0, err
    assert json.loads(out)["head"]["context"] is True and load_manifest(tmp_path / "ck").head.context
    slates = tiny_slates(3, (2, K), seed=12)
    for a, b in zip(_hllm_scores(tmp_path / "ck", slates), _hllm_scores(context_checkpoint, slates)):
        np.testing.assert_array_equal(a, b)
