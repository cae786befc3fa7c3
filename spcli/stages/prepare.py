"""The per-record stages every engine shares: tokenize -> speculate -> select, giving PrunedRequests.

The engines differ only in how the base model generates from the result (hf_pass.py, vllm_pass.py).
"""

from __future__ import annotations

import dataclasses
import hashlib
import time
from dataclasses import dataclass, field

import torch

from spcli.config.run import RunConfig
from spcli.config.sampling import unapplied_message
from spcli.config.scoring import AUTO, SPECULATOR_BATCH_TOKENS, SPECULATOR_CHUNK, ScoreConfig, SelectConfig
from spcli.errors import RecordError, StopAtSafePoint
from spcli.io.records import Record
from spcli.models.device import free_memory
from spcli.models.load import ModelStack
from spcli.stages.align import carry
from spcli.stages.batching import length_groups
from spcli.stages.pays import pays, shapes
from spcli.stages.request import PrunedRequest
from spcli.stages.restate import prompt_part, restated_for
from spcli.stages.select import is_pruned, select_tokens
from spcli.stages.share import Group, find_groups, group_pays, keep_whole, mark, unite, unite_document
from spcli.stages.speculate import Speculation, speculate_batch
from spcli.stages.speculate_shared import speculate_shared
from spcli.stages.tokenize import cross_tokenize, tokenize, tokenize_units


def row_seed(seed: int, row_id: str) -> int:
    """A per-row sampling seed: stable across batching, resume and Slurm tasks."""
    return int.from_bytes(hashlib.sha256(f"{seed}:{row_id}".encode()).digest()[:7], "big")


def request_for(rec: Record, cfg: RunConfig, stack: ModelStack) -> PrunedRequest:
    """Tokenize one record into an unpruned request (all tokens kept); a bad record raises RecordError."""
    if rec.unapplied:  # a generation parameter spcli does not apply: never a row generated without it
        raise RecordError(unapplied_message(rec.unapplied, cfg.engine))
    max_tokens = rec.max_tokens or cfg.generate.max_tokens
    keep = rec.keep if rec.keep is not None else cfg.select.keep
    limits = (stack.max_prompt_tokens(max_tokens), cfg.truncate, stack.prompt_limit(max_tokens))
    prunes = keep == AUTO or keep < 1.0
    spec = stack.speculator_tokens if prunes else None  # never read at keep 1.0
    spec_ids = alignment = layout = None
    if not prunes:
        ids = tokenize(rec, stack.tokenizer, *limits)
    elif spec is None:
        ids, layout = tokenize_units(rec, stack.tokenizer, *limits, cfg.select)
    else:  # the speculator has another tokenizer: it reads the same text in its own tokens
        ids, spec_ids, alignment, layout = cross_tokenize(rec, stack.tokenizer, spec.tokenizer, *limits,
                                                          spec.max_positions, cfg.select)
    restated = None
    if prunes and cfg.score.restate and rec.protected and cfg.fields.instruction_at == "before":
        restated = restated_for(stack, rec.protected, len(ids if spec_ids is None else spec_ids))
    temperature = rec.temperature if rec.temperature is not None else cfg.generate.temperature
    seed = rec.seed if rec.seed is not None else row_seed(cfg.generate.seed, rec.id)
    sampling = dataclasses.replace(cfg.generate.sampling_defaults(), **rec.sampling)  # the record's own win
    return PrunedRequest(
        record_id=rec.id, token_ids=ids, kept=torch.arange(len(ids)), max_tokens=max_tokens,
        temperature=temperature, seed=seed, sampling=sampling, keep=keep,
        num_logprobs=cfg.generate.logprobs, speculator_ids=spec_ids, alignment=alignment,
        units=None if layout is None else layout.units, protected=None if layout is None else layout.protected,
        restated=restated,
    )


def prepare(records: list[Record], cfg: RunConfig, stack: ModelStack, on_stage=lambda text: None,
            should_stop=lambda: False, with_unpooled: bool = False) -> list[PrunedRequest | RecordError]:
    """One request per record, in order, or the RecordError that makes it an error row. `with_unpooled`: also
    score at pool 1 where no record asks for keep auto (calibrate's keep sweep selects at auto afterwards)."""
    return start_prepare(records, cfg, stack, on_stage, should_stop, with_unpooled).finish()


def start_prepare(records: list[Record], cfg: RunConfig, stack: ModelStack, on_stage=lambda text: None,
                  should_stop=lambda: False, with_unpooled: bool = False, overlap: bool = False) -> Scoring:
    """`prepare`, with the speculator pass submitted and collected later where `overlap` and the stack's
    speculator can (vLLM's worker replicas: replica_queue.py); `.finish()` gives what `prepare` returns."""
    out: list[PrunedRequest | RecordError] = []
    for rec in records:
        try:
            out.append(request_for(rec, cfg, stack))
        except RecordError as e:
            out.append(e)
    ready = [i for i, r in enumerate(out) if isinstance(r, PrunedRequest)]
    position = {i: k for k, i in enumerate(ready)}
    groups = [dataclasses.replace(g, members=[position[i] for i in g.members])
              for g in find_groups(records, out, cfg.grouped, cfg.select, cfg.group_rule, cfg.order_free)]
    scoring = start_prune([out[i] for i in ready], cfg.select, cfg.score, stack, on_stage, should_stop,
                          cfg.speculator_chunk, with_unpooled, overlap, groups)
    return dataclasses.replace(scoring, prepared=(out, ready))


MAX_PADDING = 1.125  # a group's padded size over its real tokens


def speculator_groups(lengths: list[int], max_tokens: int = SPECULATOR_BATCH_TOKENS) -> list[list[int]]:
    """Indices grouped for batched speculator passes: longest first, each group padded by at most
    MAX_PADDING and at most max_tokens padded tokens (a longer prompt goes alone)."""
    return length_groups(lengths, longest_first=True, max_padding=MAX_PADDING, max_tokens=max_tokens)


class MadePass:
    """A speculator pass already made (the handle of one that ran at once)."""

    def __init__(self, specs: list):
        self.specs = specs

    def ready(self) -> bool:
        return True

    def result(self) -> list:
        return self.specs


@dataclass
class Scoring:
    """Requests whose speculator pass is under way (`speculation`: a MadePass or vllm_engine.WorkerScoring, whose
    ready() and result() give the Speculations of `todo`); `finish()` selects their tokens. `prepared`: (the
    records' requests or errors, the indices of `requests` in it), for start_prepare."""

    requests: list[PrunedRequest]
    todo: list[int]  # indices into requests of the pruned ones, in the pass's order
    select: SelectConfig
    speculation: MadePass  # or vllm_engine.WorkerScoring: the same two methods
    prepared: tuple[list, list[int]] | None = None
    groups: list[Group] = field(default_factory=list)  # documents shared by several requests (spcli.stages.share)
    pair: tuple | None = None  # (base, speculator) shapes, for a group's second look at whether sharing pays
    score: ScoreConfig | None = None

    def ready(self) -> bool:
        return self.speculation.ready()

    def finish(self) -> list:
        out: list[PrunedRequest | RecordError] = list(self.requests)
        specs = self.speculation.result() if self.todo else []
        for i, spec in zip(self.todo, specs, strict=True):
            req = self.requests[i]
            if isinstance(spec, RecordError):
                out[i] = spec
                continue
            t0 = time.perf_counter()
            spec = prompt_part(spec, len(req.speculator_token_ids))
            req.importance = carry(spec.importance, req.alignment)  # [n]: the base's tokens (as is: same tokenizer)
            req.unpooled = None if spec.unpooled is None else carry(spec.unpooled, req.alignment)
            req.kept = select_tokens(req.importance, self.select, req.keep, req.forced, req.unpooled, req.units,
                                     req.protected)
            req.speculate_s = spec.speculate_s + time.perf_counter() - t0
        self._share(out)
        if self.prepared is None:
            return out
        records_out, ready = self.prepared
        for i, r in zip(ready, out):
            records_out[i] = r
        return records_out


    def _share(self, out: list) -> None:
        """Each shared group keeps the union of its questions' selections in its document (or with --group-rule
        document one selection from their scores together; spcli.stages.share), or every token where that would not
        pay; every group's members carry its name and shared part."""
        for g in self.groups:
            if any(isinstance(out[i], RecordError) for i in g.members):
                for i in g.members:  # a member the speculator could not score: the others stand as selected alone
                    if not isinstance(out[i], RecordError):
                        out[i].sharing = "alone: speculator error"
                continue
            if g.is_shared:
                num_kept = unite(g, out) if g.rule == "union" else unite_document(g, out, self.select, self.score.rows)
                if not group_pays(self.pair, self.score, self.select, g, out, num_kept):
                    keep_whole(g, out)
            mark(g, out)


def prune(requests: list[PrunedRequest], select: SelectConfig, score: ScoreConfig, stack: ModelStack,
          on_stage=lambda text: None, should_stop=lambda: False,
          chunk: int = SPECULATOR_CHUNK, with_unpooled: bool = False) -> list[PrunedRequest | RecordError]:
    """Speculate and select the requests whose prompts are pruned (in place); the others keep every token: those
    shorter than min_tokens, at keep 1.0, and those whose pruning would not pay (pays.py).

    The speculator runs where the stack says (`stack.speculate_remote`: vLLM's workers; else here, loaded
    on first use, so a run at keep 1.0 never loads one); selection runs here. should_stop() is asked
    between speculator passes (StopAtSafePoint); chunk: tokens per speculator prefill call. The importance at
    pool 1 (keep auto's budget) is scored too where a request asks for keep auto, or `with_unpooled`.
    """
    return start_prune(requests, select, score, stack, on_stage, should_stop, chunk, with_unpooled).finish()


def start_prune(requests: list[PrunedRequest], select: SelectConfig, score: ScoreConfig, stack: ModelStack,
                on_stage=lambda text: None, should_stop=lambda: False, chunk: int = SPECULATOR_CHUNK,
                with_unpooled: bool = False, overlap: bool = False, groups: list[Group] = ()) -> Scoring:
    """`prune`'s speculator pass begun: submitted to vLLM's worker replicas where `overlap` (collected by
    Scoring.finish, while vLLM steps meanwhile), else run now."""
    pair = shapes(stack.path, stack.speculator_name, stack.located[1] if stack.located else None)
    grouped = {}  # request index -> whether its group prunes (judged for the group as a whole)
    for g in groups:
        if g.is_shared and not group_pays(pair, score, select, g, requests):
            keep = requests[g.members[0]].keep
            keep_whole(g, requests, "pays" if is_pruned(g.shared_len, select, keep) or keep == AUTO else "keep")
        grouped.update(dict.fromkeys(g.members, g.is_shared))
    todo = [i for i, r in enumerate(requests) if grouped.get(i, is_pruned(r.num_prompt_tokens, select, r.keep)
            and pays(pair, score, select, r.keep, r.num_prompt_tokens, num_protected(r), len(r.speculator_prompt)))]
    if not todo:
        return Scoring(list(requests), [], select, MadePass([]), groups=list(groups), pair=pair, score=score)
    prompts = [requests[i].speculator_prompt for i in todo]  # its own tokens (cross-tokenizer), the restated instruction
    at = {i: k for k, i in enumerate(todo)}
    shared = [[at[i] for i in g.members] for g in groups if g.is_shared]  # each read once, here or by a worker
    with_unpooled = with_unpooled or any(requests[i].keep == AUTO for i in todo)
    remote = stack.speculate_remote
    if remote is not None and overlap:
        speculation = remote.submit(prompts, score, chunk, on_stage, should_stop, with_unpooled, shared)
    elif remote is not None:
        speculation = MadePass(remote(prompts, score, chunk, on_stage, should_stop, with_unpooled, shared))
    else:
        speculation = MadePass(speculate_grouped(stack.speculator, prompts, shared, score, stack.speculator_eos_ids,
                                                 stack.device, chunk, on_stage, should_stop, with_unpooled))
    return Scoring(list(requests), todo, select, speculation, groups=list(groups), pair=pair, score=score)


def speculate_grouped(model, prompts: list[list[int]], groups: list[list[int]], score: ScoreConfig, eos_ids: set[int],
                      device: torch.device, chunk: int = SPECULATOR_CHUNK, on_stage=lambda text: None,
                      should_stop=lambda: False, with_unpooled: bool = False,
                      release_cache: bool = True) -> list[Speculation | RecordError]:
    """speculate_prompts, with each of `groups` (indices into prompts: the questions of one document) read once: its
    common prefix prefilled once and each question scored over it (speculate_shared: the importance of each as
    alone); a group that runs out of memory is scored a question at a time. Run here (the hf engine, vLLM's driver
    placement) and by each vLLM worker replica on its share."""
    out: list[Speculation | RecordError | None] = [None] * len(prompts)
    grouped = {i for g in groups for i in g}
    alone = [i for i in range(len(prompts)) if i not in grouped]
    run = lambda idx: speculate_prompts(model, [prompts[i] for i in idx], score, eos_ids, device, chunk,  # noqa: E731
                                        on_stage, should_stop, with_unpooled=with_unpooled, release_cache=release_cache)
    for i, spec in zip(alone, run(alone) if alone else []):
        out[i] = spec
    for g in groups:
        if should_stop():
            raise StopAtSafePoint
        on_stage(f"speculating a document once for its {len(g)} questions")
        try:
            specs = speculate_shared(model, [prompts[i] for i in g], score, eos_ids, device, chunk,
                                     with_unpooled).speculations
        except torch.OutOfMemoryError:
            free_memory(release_cache)
            specs = run(g)  # each question alone (a RecordError for one that still does not fit)
        for i, spec in zip(g, specs):
            out[i] = spec
    return out  # type: ignore[return-value]


def num_protected(req: PrunedRequest) -> int:
    return 0 if req.protected is None else int(req.protected.sum())


def speculate_prompts(model, prompts: list[list[int]], score: ScoreConfig, eos_ids: set[int], device: torch.device,
                      chunk: int = SPECULATOR_CHUNK, on_stage=lambda text: None,
                      should_stop=lambda: False, with_unpooled: bool = False,
                      release_cache: bool = True) -> list[Speculation | RecordError]:
    """One Speculation (or the RecordError of a prompt that ran out of memory alone) per prompt, in order.

    The one speculator loop, run by the hf engine, eval, bench and each vLLM worker replica: prompts of
    similar length share one pass (speculator_groups; importance is the same as alone), prefilled `chunk`
    tokens per call; a pass that runs out of memory is retried one prompt at a time. `with_unpooled`: each
    Speculation also holds the importance at pool 1 (keep auto's budget). `release_cache`: whether an
    out-of-memory pass hands the allocator's cached blocks back to CUDA (not in a vLLM worker: device.free_memory).
    """
    out: list[Speculation | RecordError | None] = [None] * len(prompts)
    done = 0
    for group in speculator_groups(list(map(len, prompts))):
        if should_stop():
            raise StopAtSafePoint
        on_stage(f"speculating {done + 1}-{done + len(group)} of {len(prompts)} prompts")
        done += len(group)
        for i, spec in zip(group, _speculate(model, [prompts[i] for i in group], score, eos_ids, device, chunk,
                                             with_unpooled, release_cache)):
            out[i] = spec
    return out


def _speculate(model, prompts: list[list[int]], score: ScoreConfig, eos_ids: set[int], device: torch.device,
               chunk: int, with_unpooled: bool, release_cache: bool = True) -> list:
    try:
        return speculate_batch(model, prompts, score, eos_ids, device, chunk=chunk, with_unpooled=with_unpooled)
    except torch.OutOfMemoryError:
        free_memory(release_cache)
        if len(prompts) > 1:
            return [s for p in prompts for s in _speculate(model, [p], score, eos_ids, device, chunk, with_unpooled,
                                                           release_cache)]
        return [RecordError(f"the speculator ran out of memory on {len(prompts[0])} tokens")]
