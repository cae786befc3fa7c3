"""Run each example through full prefill and through every selector at every keep rate, in one process.

Per example: one full prefill (the reference: greedy tokens and first-step log-probs), one speculator
pass shared by every speculator-based selector and keep rate, then per keep rate one batched base
pass over all selectors (equal kept lengths, so no padding). Keep 1.0 reuses the full run whenever a
selector keeps every token (it always does: select_tokens returns all indices at keep 1.0).

Timings per row: the selector's own cost (speculator pass for specprefill and self-information, none
for the rest) + its selection + its share (1/rows) of the batched base prefill. They are estimates
for the plots; `spcli bench` measures speed properly.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from spcli.engines.hf import base_pass as hf_pass
from spcli.evaluate import metrics
from spcli.evaluate.config import SELECT_VARIANT_FIELDS, EvalConfig, is_auto, policy_order, policy_select, variant_label
from spcli.evaluate.selectors import (
    USES_SPECULATOR,
    Signals,
    carried,
    prompt_signals,
    random_seed,
    select,
    speculator_signals,
)
from spcli.evaluate.tasks import Example
from spcli.io.records import Record
from spcli.models import load, speculator
from spcli.models.load import ModelStack
from spcli.models.profiles import resolve
from spcli.stages.request import Generation, PrunedRequest
from spcli.stages.restate import restated_for
from spcli.stages.select import is_over_budget
from spcli.stages.tokenize import Layout, cross_tokenize, encode, tokenize, tokenize_units
from spcli.stages.units import cut_values, value_kinds


def load_models(cfg: EvalConfig) -> ModelStack:
    return load.load_stack(cfg.model, cfg.speculator, cfg.dtype, cfg.device, speculator_dtype=cfg.speculator_dtype)


@dataclass(frozen=True)
class OtherSpeculator:
    """A speculator compared with the first one (`--speculator A,B,...`: rows `specprefill@B`), or the first
    with other settings (`--variant rows=max`: rows `specprefill[rows=max]`)."""

    label: str  # the selector name in rows and tables
    stack: ModelStack  # the base's stack with this speculator (base weights and tokenizer shared; a variant's is A's)
    cfg: EvalConfig  # scoring and selection resolved for this pair, selectors ("specprefill",)


def other_speculators(m: ModelStack, cfg: EvalConfig) -> list[OtherSpeculator]:
    """`cfg` before resolution: flags hold for every speculator, the rest resolves per pair (profile, preset or
    fallback), as `spcli run --speculator B` would; a variant's settings override the first speculator's."""
    out = []
    for name in cfg.extra_speculators:
        speculator.check_speculator_attention(m.path, m.name, name, m.max_positions)
        stack = dataclasses.replace(m, speculator_name=name, _speculator=None, _speculator_tokens=None,
                                    _is_tokens_checked=False, speculator_layers=None)  # a self:K loads its own count
        own = resolve(dataclasses.replace(cfg, speculator=name, extra_speculators=(), selectors=("specprefill",)),
                      cfg.model, m.path, name)
        out.append(OtherSpeculator(f"specprefill@{name}", stack, own))
    first = dataclasses.replace(cfg, extra_speculators=(), variants=(), selectors=("specprefill",))
    for variant in cfg.variants:
        changed = dict(variant)
        selection = {k: changed.pop(k) for k in SELECT_VARIANT_FIELDS if k in changed}
        own = dataclasses.replace(first, score=dataclasses.replace(cfg.score, **changed),
                                  select=dataclasses.replace(cfg.select, **selection))
        out.append(OtherSpeculator(variant_label(variant), m, resolve(own, cfg.model, m.path, m.speculator_name)))
    return out


@dataclass
class ExampleResult:
    rows: list[dict] = field(default_factory=list)  # one per (selector, keep), plus the full-prefill row
    overlaps: list[dict] = field(default_factory=list)  # Jaccard of kept sets per selector pair and keep


def needle_spans(tokenizer, example: Example, ids: list[int]) -> list[tuple[int, int]]:
    """Token [start, end) spans of the example's needle sentences (empty when offsets do not line up)."""
    if not example.needles:
        return []
    if example.messages is not None:
        text = tokenizer.apply_chat_template(example.messages, add_generation_prompt=True, tokenize=False)
        enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    else:
        text = example.prompt
        enc = tokenizer(text, add_special_tokens=True, return_offsets_mapping=True)
    if list(enc["input_ids"]) != ids:
        return []
    spans = []
    for needle in example.needles:
        start = text.find(needle)
        if start < 0:
            continue
        end = start + len(needle)
        toks = [i for i, (a, b) in enumerate(enc["offset_mapping"]) if a < end and b > start]
        if toks:
            spans.append((toks[0], toks[-1] + 1))
    return spans


def _row(example, selector, keep, n, kept, gen: Generation, ref: Generation, text, spans, cfg, timing,
         enc=None, kinds=None) -> dict:
    has_answers = bool(example.answers)
    is_kept = np.zeros(n, dtype=np.bool_)
    is_kept[kept.numpy()] = True
    return {
        "id": example.id, "task": example.task, "num_prompt_tokens": n, "selector": selector, "keep": keep,
        "num_kept": int(kept.numel()), "is_over_budget": is_over_budget(n, *policy_select(cfg.select, keep)),
        "first_token": metrics.first_token_agrees(ref.token_ids, gen.token_ids),
        "prefix_match": metrics.prefix_matches(ref.token_ids, gen.token_ids, cfg.compare_tokens),
        "kl": metrics.kl_divergence(ref.first_logprobs, gen.first_logprobs),
        "contains": metrics.contains(text, example.answers, example.require_all) if has_answers else None,
        "exact": metrics.exact_match(text, example.answers, example.require_all) if has_answers else None,
        "f1": metrics.token_f1(text, example.answers, example.require_all) if has_answers else None,
        "needle_kept": metrics.covered(kept, spans), "output": text, **timing,
        # value words (numbers, codes, names) dropped right after a kept word: a fact cut from its subject
        "cut_values": None if enc is None else len(cut_values(enc.text, enc.offsets[:n], is_kept, kinds)),
    }


def prompt_ids(m: ModelStack, example: Example, cfg: EvalConfig) -> tuple[list[int], int]:
    """The example's prompt token ids and the number of tokens generated for it."""
    max_tokens = max(cfg.max_tokens or example.max_tokens, cfg.compare_tokens)
    record = Record(0, 0, example.id, prompt=example.prompt, messages=example.messages)
    return tokenize(record, m.tokenizer, m.max_positions - max_tokens, "error"), max_tokens


def example_signals(m: ModelStack, example: Example, ids: list[int], cfg: EvalConfig) -> Signals | None:
    """The example's one speculator pass, when a selector and a keep rate need it (cfg.score resolved). A
    speculator of another tokenizer reads the example in its own tokens; its signals are carried to `ids`."""
    if not (any(s in USES_SPECULATOR for s in cfg.selectors) and cfg.pruned_keeps and len(ids) >= cfg.select.min_tokens):
        return None
    spec_ids, alignment = ids, None
    if (spec := m.speculator_tokens) is not None:
        record = Record(0, 0, example.id, prompt=example.prompt, messages=example.messages)
        base_ids, spec_ids, alignment, _ = cross_tokenize(record, m.tokenizer, spec.tokenizer, len(ids), "error",
                                                       speculator_max_positions=spec.max_positions)
        assert base_ids == ids, "prompt_ids and cross_tokenize read the example alike"
    restated = None  # the instruction read again after the prompt, as spcli run's request_for does
    if cfg.score.restate and example.protected:
        restated = restated_for(m, example.protected, len(spec_ids))
    signals = speculator_signals(m.speculator, spec_ids + (restated or []), cfg.score, m.speculator_eos_ids, m.device,
                                 with_surprisal="self-information" in cfg.selectors,
                                 with_paper="specprefill-paper" in cfg.selectors, chunk=cfg.speculator_chunk,
                                 with_unpooled=any(is_auto(k) for k in cfg.keeps))
    return carried(prompt_signals(signals, len(spec_ids)), alignment)


def evaluate_example(m: ModelStack, example: Example, cfg: EvalConfig, signals: Signals | None = None,
                     others: list[OtherSpeculator] = ()) -> ExampleResult:
    """`signals`: the example's speculator pass when already made (run.matched_keeps makes them first).
    `others`: more speculators, each scored as SpecPrefill, pruned in the same batched base passes."""
    cfg = resolve(cfg, cfg.model, m.path, m.speculator_name)
    ids, max_tokens = prompt_ids(m, example, cfg)
    n = len(ids)
    spans = needle_spans(m.tokenizer, example, ids)
    run = lambda prompts: hf_pass.generate(m.base, prompts, m.tokenizer, m.eos_ids, m.pad_id, m.device,
                                           keep_first_logprobs=True)
    request = lambda kept: PrunedRequest(example.id, ids, kept, max_tokens)

    everything = torch.arange(n)
    (ref,) = run([request(everything)])
    ref_text = ref.text
    result = ExampleResult()
    enc = encode(Record(0, 0, example.id, prompt=example.prompt, messages=example.messages), m.tokenizer)
    enc = enc if enc.ids[:n] == ids else None  # the text of the ids, where tokenize kept them as they are
    kinds = None if enc is None else value_kinds(enc.text, enc.offsets[:n])  # once: every kept set reads them
    result.rows.append(_row(example, "full", 1.0, n, everything, ref, ref, ref_text, spans, cfg,
                            {"ttft_s": ref.prefill_s, "prefill_s": ref.prefill_s, "selector_s": 0.0, "select_s": 0.0},
                            enc, kinds))

    if signals is None:
        signals = example_signals(m, example, ids, cfg)
    own_cost = {s: 0.0 for s in cfg.selectors}
    if signals is not None:
        own_cost["specprefill"] = signals.speculate_s
        own_cost["self-information"] = signals.speculate_s + signals.surprisal_s
        own_cost["specprefill-paper"] = signals.paper_s
    same_score = lambda score: score == cfg.score or (not example.protected and  # nothing to restate: alike
                                                      dataclasses.replace(score, restate=cfg.score.restate) == cfg.score)
    other_signals = {o.label: (signals if o.stack is m and same_score(o.cfg.score)  # a selection-only variant
                               else example_signals(o.stack, example, ids, o.cfg)) for o in others}
    own_cost.update({label: s.speculate_s for label, s in other_signals.items() if s is not None})
    # (row name, selector, its signals, its selection config): the selectors, then each other speculator
    picks = [(s, s, signals if s in USES_SPECULATOR else None, cfg.select) for s in cfg.selectors]
    picks += [(o.label, "specprefill", other_signals[o.label], o.cfg.select) for o in others]
    names = [name for name, *_ in picks]
    seed = random_seed(cfg.seed, example.id)
    record = Record(0, 0, example.id, prompt=example.prompt, messages=example.messages, protected=example.protected)
    layouts: dict[tuple, Layout] = {}

    def layout_for(select_cfg) -> Layout:
        """The example's selection units and protected tokens under one selection config (spcli run's, from the
        text), made once."""
        key = (select_cfg.unit, select_cfg.chunk, select_cfg.max_unit, select_cfg.protect)
        if key not in layouts:
            layout_ids, layouts[key] = tokenize_units(record, m.tokenizer, n, "error", "", select_cfg)
            assert layout_ids == ids, "prompt_ids and tokenize_units read the example alike"
        return layouts[key]

    for keep in sorted(set(cfg.keeps), key=policy_order):
        chosen: dict[str, torch.Tensor] = {}
        select_s: dict[str, float] = {}
        for name, selector, sig, base in picks:
            select_cfg, rate = policy_select(base, keep)
            t0 = time.perf_counter()
            chosen[name] = select(selector, n, sig, select_cfg, rate, seed, layout_for(select_cfg))
            select_s[name] = time.perf_counter() - t0
        pruned = [s for s in names if chosen[s].numel() < n]
        gens: dict[str, Generation] = {s: ref for s in names if s not in pruned}
        share = {s: ref.prefill_s for s in gens}
        if pruned:
            out = run([request(chosen[s]) for s in pruned])
            gens.update(zip(pruned, out))
            share.update({s: out[0].prefill_s / len(pruned) for s in pruned})
        for s in names:
            cost = own_cost[s] if s in pruned else 0.0
            timing = {"ttft_s": cost + select_s[s] + share[s], "prefill_s": share[s], "selector_s": cost,
                      "select_s": select_s[s]}
            text = gens[s].text
            result.rows.append(_row(example, s, keep, n, chosen[s], gens[s], ref, text, spans, cfg, timing, enc, kinds))
        for i, a in enumerate(names):
            for b in names[i + 1 :]:
                result.overlaps.append({"id": example.id, "task": example.task, "keep": keep, "a": a, "b": b,
                                        "jaccard": metrics.jaccard(chosen[a], chosen[b])})
    return result
