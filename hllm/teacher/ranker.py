"""The autoregressive listwise teacher (paper §4.3 Phase 1): any Hugging Face causal LM ranks a
slate by generating the candidate numbers, greedily, with a KV cache.

    prompt (user history + numbered candidates + instruction) ──prefill──► KV cache
    ──greedy decode, one token per pass──► "3, 17, 1, …" ──parse/repair──► permutation

The prompt is built by :class:`hllm.runtime.prompt.PromptBuilder` (the one prompt builder) from
:func:`teacher_prompt_spec` plus an instruction suffix. With a ChatML tokenizer (``<|im_start|>`` in
the vocabulary, e.g. SmolLM2-Instruct, Qwen) the prompt is wrapped as a system/user/assistant chat.

Unconstrained mode is plain greedy ``generate``. Constrained mode adds a logits processor
(:class:`OrdinalLogitsProcessor`) that allows only tokens keeping the output inside the ordinal
grammar of :mod:`hllm.teacher.constrain` and forbids end-of-sequence until all N ordinals are out.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterable, Iterator

import torch

from hllm.errors import CheckpointError
from hllm.runtime.prompt import PromptBuilder, load_tokenizer
from hllm.formats.prompt import PromptSpec
from hllm.teacher.constrain import GrammarState, OrdinalGrammar
from hllm.teacher.parse import parse_ordinals

CHATML_SYSTEM = "<|im_start|>system\nYou are a shopping assistant who ranks products for a shopper.<|im_end|>\n<|im_start|>user\n"
USER_CONTEXT = "A shopper bought these products, oldest first:\n{history}Candidate products:\n"
INSTRUCTION = (
    "Rank all {n} candidate products from most to least likely to be bought next by this shopper. "
    "Answer with the candidate numbers only, separated by commas."
)


def teacher_prompt_spec(chatml: bool, candidate_token_budget: int = 24, history_token_budget: int = 256,
                        max_history: int = 10) -> PromptSpec:
    """The teacher's listing: history then ``"{index}. {title}"`` lines (1-based numbers to answer with)."""
    return PromptSpec(
        user_template=(CHATML_SYSTEM if chatml else "") + USER_CONTEXT,
        candidate_template="{index}. {title}",
        separator="\n",
        candidate_token_budget=candidate_token_budget,
        history_token_budget=history_token_budget + (40 if chatml else 0),
        max_history=max_history,
        max_seq_len=8192,
    )


@dataclass
class ArResult:
    """One slate ranked by the autoregressive teacher.

    Attributes:
        slate_id: the slate's id.
        order: repaired permutation, 0-based candidate indices best first.
        valid: the raw output was a complete valid permutation (no repair needed).
        invalid / repeated / missing: counts from :func:`hllm.teacher.parse.parse_ordinals`.
        decode_passes: generated tokens = decoder forward passes after the prefill.
        prefill_tokens: prompt length in tokens.
        wall_s: wall time of prefill + decoding + parsing, seconds.
        raw_text: the decoded generation.
        constrained: whether constrained decoding was used.
    """

    slate_id: str
    order: list[int]
    valid: bool
    invalid: int
    repeated: int
    missing: int
    decode_passes: int
    prefill_tokens: int
    wall_s: float
    raw_text: str
    constrained: bool

    def to_dict(self) -> dict:
        d = asdict(self)
        d["wall_s"] = round(self.wall_s, 4)
        return d


def _token_strings(tokenizer) -> dict[int, str]:
    """Decoded strings of the vocabulary tokens that can appear in an ordinal list (digits, ',', ' ')."""
    keep = set("0123456789, Ġ▁")
    out = {}
    for tok, tid in tokenizer.get_vocab().items():
        if tok and set(tok) <= keep:
            s = tokenizer.decode([tid], skip_special_tokens=False)
            if s and set(s) <= set("0123456789, "):
                out[tid] = s
    return out


def make_logits_processor(grammars: list[OrdinalGrammar], token_strings: dict[int, str], eos_ids: list[int],
                          prompt_len: int):
    """A ``transformers`` logits processor enforcing ``grammars[b]`` on row b's generated suffix.

    ``prompt_len`` is the (left-padded) prompt width shared by the rows. At each step every
    non-allowed logit of a row is set to -inf; allowed = tokens whose string keeps that row's output
    valid, plus end-of-sequence once :meth:`OrdinalGrammar.can_end` holds. If nothing else is
    allowed, EOS is (a finished row, or an inconsistent grammar; avoids an all -inf row).
    """
    from transformers import LogitsProcessor

    class OrdinalLogitsProcessor(LogitsProcessor):
        def __init__(self):
            self.states = [GrammarState() for _ in grammars]
            self.seen = 0

        def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
            mask = torch.full_like(scores, float("-inf"))
            for b, grammar in enumerate(grammars):
                gen = input_ids[b, prompt_len:].tolist()
                for tid in gen[self.seen:]:  # advance by the token chosen at the previous step
                    nxt = grammar.advance(self.states[b], token_strings.get(tid, "\x00"))
                    self.states[b] = nxt if nxt is not None else self.states[b]
                allowed = [t for t, s in token_strings.items() if grammar.advance(self.states[b], s) is not None]
                if grammar.can_end(self.states[b]) or not allowed:
                    allowed = allowed + list(eos_ids)
                mask[b, allowed] = 0.0
            self.seen = input_ids.shape[1] - prompt_len
            return scores + mask

    return OrdinalLogitsProcessor()


class ArRanker:
    """Autoregressive listwise ranker over a Hugging Face causal LM directory.

    Args:
        model_dir: HF causal LM directory (config.json, weights, tokenizer.json); e.g. ``work/smollm2``.
        max_new_tokens: generation cap; None = enough for every ordinal of the slate plus separators
            (:meth:`OrdinalGrammar.max_tokens`).
        threads: torch intra-op threads (None = leave as is).
        candidate_token_budget / history_token_budget: prompt budgets in tokens (see PromptSpec).
    Raises: CheckpointError if the directory cannot be loaded.

    ``rank(slate, constrained)`` → :class:`ArResult`. Decoding is greedy (``do_sample=False``) with
    the KV cache (``use_cache=True``): one prefill pass, then one decoder pass per generated token.
    """

    def __init__(self, model_dir: str | os.PathLike, max_new_tokens: int | None = None, threads: int | None = None,
                 candidate_token_budget: int = 24, history_token_budget: int = 256):
        from transformers import AutoModelForCausalLM

        self.model_dir = Path(model_dir)
        self.threads = threads
        self.tokenizer = load_tokenizer(self.model_dir)
        chatml = self.tokenizer.token_to_id("<|im_start|>") is not None
        self.chatml = chatml
        self.spec = teacher_prompt_spec(chatml, candidate_token_budget, history_token_budget)
        self.builder = PromptBuilder(self.tokenizer, self.spec)
        try:
            self.model = AutoModelForCausalLM.from_pretrained(str(self.model_dir), dtype=torch.float32).eval()
        except (OSError, ValueError) as e:
            raise CheckpointError(f"cannot load causal LM {self.model_dir}: {e}") from None
        eos = self.model.generation_config.eos_token_id
        eos = eos if isinstance(eos, list) else [eos] if eos is not None else []
        for name in ("<|im_end|>", "<|endoftext|>"):
            tid = self.tokenizer.token_to_id(name)
            if tid is not None and (chatml or name == "<|endoftext|>") and tid not in eos:
                eos.append(tid)
        self.eos_ids = [int(e) for e in eos]
        self.max_new_tokens = max_new_tokens
        self._token_strings = _token_strings(self.tokenizer)

    def prompt_ids(self, slate: dict) -> list[int]:
        """Token ids of the teacher prompt for ``slate`` (listing + instruction [+ assistant turn])."""
        ids = self.builder.encode_one(slate).ids
        n = len(slate["candidates"])
        suffix = INSTRUCTION.format(n=n)
        suffix = suffix + "<|im_end|>\n<|im_start|>assistant\n" if self.chatml else "\n" + suffix + "\nAnswer: "
        return ids + self.tokenizer.encode(suffix, add_special_tokens=False).ids

    def rank(self, slate: dict, constrained: bool = True) -> ArResult:
        """Rank one slate. Raises SlateError for a malformed slate (see PromptBuilder)."""
        return self.rank_batch([slate], constrained)[0]

    @torch.inference_mode()
    def rank_batch(self, slates: list[dict], constrained: bool = True) -> list[ArResult]:
        """Rank slates in one ``generate`` call: prompts left-padded to one width (attention mask 0 on
        the padding), each row under its own grammar; a row that is done emits padding until all are.

        ``decode_passes`` of a row counts its tokens up to and including its end-of-sequence, at most
        its own cap (tokens a longer row made it generate beyond are dropped, so each row's output is
        what ranking it alone gives); ``wall_s`` is the batch's wall time divided by its slates.
        Raises SlateError for a malformed slate (see PromptBuilder).
        """
        t0 = time.perf_counter()
        if not slates:
            return []
        ns = [len(s.get("candidates") or []) for s in slates]
        prompts = [self.prompt_ids(s) for s in slates]
        grammars = [OrdinalGrammar(n) for n in ns]
        caps = [self.max_new_tokens or g.max_tokens() for g in grammars]  # per row, as when ranked alone
        width = max(len(p) for p in prompts)
        pad = self.eos_ids[0] if self.eos_ids else 0
        input_ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], dtype=torch.long)
        attention = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], dtype=torch.long)
        kwargs = dict(
            input_ids=input_ids,
            attention_mask=attention,
            max_new_tokens=max(caps),
            do_sample=False,
            use_cache=True,
            eos_token_id=self.eos_ids,
            pad_token_id=pad,
        )
        if constrained:
            from transformers import LogitsProcessorList

            kwargs["logits_processor"] = LogitsProcessorList(
                [make_logits_processor(grammars, self._token_strings, self.eos_ids, width)]
            )
        from hllm.model.threads import torch_threads

        with torch_threads(self.threads):
            out = self.model.generate(**kwargs)
        wall = (time.perf_counter() - t0) / len(slates)
        results = []
        for b, (slate, n, ids) in enumerate(zip(slates, ns, prompts)):
            gen = out[b, width:width + caps[b]].tolist()  # a row stops at its own cap, as alone
            end = next((i for i, t in enumerate(gen) if t in self.eos_ids), None)
            passes = len(gen) if end is None else end + 1
            gen = gen[: passes if end is None else end]
            text = self.tokenizer.decode(gen, skip_special_tokens=True)
            parsed = parse_ordinals(text, n)
            results.append(ArResult(
                slate_id=str(slate.get("slate_id", "")),
                order=parsed.order,
                valid=parsed.valid,
                invalid=parsed.invalid,
                repeated=parsed.repeated,
                missing=parsed.missing,
                decode_passes=passes,
                prefill_tokens=len(ids),
                wall_s=wall,
                raw_text=text,
                constrained=constrained,
            ))
        return results

    def rank_all(self, slates: Iterable[dict], constrained: bool = True, batch_size: int = 1) -> Iterator[ArResult]:
        """Rank slates ``batch_size`` at a time (lazily). Raises ValueError if ``batch_size`` < 1."""
        if batch_size < 1:
            raise ValueError(f"batch_size must be ≥ 1, got {batch_size}")
        batch: list[dict] = []
        for s in slates:
            batch.append(s)
            if len(batch) == batch_size:
                yield from self.rank_batch(batch, constrained)
                batch = []
        if batch:
            yield from self.rank_batch(batch, constrained)


def summarize(results: list[ArResult]) -> dict:
    """Aggregate teacher statistics: slates, valid rate, mean invalid/repeated/missing, decode passes
    (mean), prefill tokens (mean) and wall seconds per slate (mean)."""
    k = max(1, len(results))
    return {
        "slates": len(results),
        "valid_rate": sum(r.valid for r in results) / k,
        "invalid_mean": sum(r.invalid for r in results) / k,
        "repeated_mean": sum(r.repeated for r in results) / k,
        "missing_mean": sum(r.missing for r in results) / k,
        "decode_passes_mean": sum(r.decode_passes for r in results) / k,
        "prefill_tokens_mean": sum(r.prefill_tokens for r in results) / k,
        "wall_s_mean": sum(r.wall_s for r in results) / k,
    }
