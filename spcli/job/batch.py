"""One batch of records -> one output row each: the run layer around an engine.

Records that were already bad become error rows; the rest go through the shared stages
(`engine.prepare.prepare`: tokenize -> speculate -> select) and the engine's base pass. Rows are
built here, not in the engines, which only return Generations or RecordErrors.
"""

from __future__ import annotations

import time
from collections import Counter, deque
from collections.abc import Iterator

from spcli.config.run import RunConfig
from spcli.config.sampling import describe
from spcli.job.banner import group_rule_text
from spcli.errors import RecordError, StopAtSafePoint
from spcli.io.groups import Whole
from spcli.io.records import Record, where
from spcli.io.schema import RowResult
from spcli.io.shards import shard_kind
from spcli.stages.prepare import start_prepare
from spcli.stages.request import Generation, PrunedRequest

STOP_POLL_S = 0.5  # how often a stop is looked for while the loop waits for vLLM to start


def where_of(rec: Record, shard_paths: dict[int, str]) -> str:
    """How an error names a record: `file:row N (line N+1)` (JSONL) or `file:row N` (Parquet); spcli.io.records.where."""
    path = shard_paths[rec.shard]
    return where(path, rec.row, shard_kind(path))


def error_row(rec: Record, shard_paths: dict[int, str], message: str) -> RowResult:
    return RowResult(rec.id, shard_paths[rec.shard], rec.row, error=message,
                     custom_id=rec.custom_id, endpoint=rec.endpoint)


def logprob_rows(gen: Generation, tokenizer) -> list[dict] | None:
    """Generation.logprobs -> the output column's structs, each token id with its decoded text."""
    if gen.logprobs is None:
        return None
    ids = {t.token_id for t in gen.logprobs} | {i for t in gen.logprobs for i, _ in t.top}
    text = {i: tokenizer.decode([i]) for i in ids}
    token = lambda i, lp: {"token_id": i, "token": text[i], "logprob": lp}
    return [token(t.token_id, t.logprob) | {"top": [token(i, lp) for i, lp in t.top]} for t in gen.logprobs]


def output_row(rec: Record, shard_paths: dict[int, str], req: PrunedRequest, gen: Generation, waited_s: float,
               save_scores: bool, tokenizer=None) -> RowResult:
    """The row of a record whose base pass made `gen`; waited_s: batch start -> its base pass start."""
    return RowResult(
        id=rec.id, shard=shard_paths[rec.shard], row=rec.row, output=gen.text, finish_reason=gen.finish_reason,
        num_prompt_tokens=req.num_prompt_tokens, num_kept_tokens=int(req.kept.numel()),
        num_output_tokens=len(gen.token_ids), kept_indices=req.kept.tolist(), ttft_s=waited_s + gen.ttft_s,
        speculate_s=req.speculate_s, prefill_s=gen.prefill_s, decode_s=gen.decode_s,
        importance=req.importance.tolist() if (save_scores and req.importance is not None) else None,
        custom_id=rec.custom_id, endpoint=rec.endpoint,
        logprobs=logprob_rows(gen, tokenizer) if tokenizer is not None else None,
        group=req.group, group_size=req.group_size if req.group is not None else None,
        shared_len=req.shared_len if req.group is not None else 0, shared_kept=req.shared_kept, leads=req.leads,
        sampling=describe(req.temperature, req.seed, req.sampling),
    )


def row_notes(records: list[Record], rows: list[RowResult], select) -> Counter:
    """What the run's end says about these rows: `over_budget`, rows whose forced first/last tokens alone exceed
    their budget (select.is_over_budget); `whole`, rows selection would prune but that were prefilled whole, since
    pruning them would not pay (spcli.stages.pays; their protected text with the target is every token also costs
    more than a full prefill)."""
    from spcli.stages.select import is_kept_whole, is_over_budget

    notes: Counter = Counter()
    for rec, r in zip(records, rows):
        if rec.sharing is not None and (r.error is None or rec.sharing == "error"):
            notes["rows " + rec.sharing] += 1
            notes["groups " + rec.sharing] += rec.leads
        elif r.error is None:
            notes["rows alone: not grouped"] += 1
        if r.error is None and is_over_budget(r.num_prompt_tokens, select, rec.keep):
            notes["over_budget"] += 1
        if r.error is None and is_kept_whole(r.num_prompt_tokens, r.num_kept_tokens, select, rec.keep):
            notes["whole"] += 1
    return notes


def sharing_line(notes: Counter, cfg: RunConfig) -> str | None:
    """What the run's groups shared, for its end: documents and questions (--groups shard's first pass), groups pruned
    together, prefilled whole (and why), records alone that could share (and why): row_notes' and
    reading.order_notes' counts."""
    if cfg.grouped is None:
        return None
    single, no_key = "rows alone: one question", "rows alone: no key"  # rows that could share with none

    def counted(prefix: str, skip: tuple[str, ...] = ()) -> tuple[int, str]:
        items = [(k[len(prefix):], v) for k, v in sorted(notes.items()) if k.startswith(prefix) and k not in skip and v]
        return sum(v for _, v in items), ", ".join(f"{k} {v}" for k, v in items)

    whole, whole_why = counted("groups whole: ")
    whole_rows, _ = counted("rows whole: ")
    alone, alone_why = counted("rows alone: ", skip=(single, no_key))
    head = (f"{notes['documents']} documents, {notes['questions']} records of documents asked more than once; "
            if cfg.order_free else "")
    return (f"groups ({group_rule_text(cfg)}): {head}{notes['groups together']} groups ({notes['rows together']} rows) "
            f"pruned together, {whole} groups ({whole_rows} rows) prefilled whole" + (f" ({whole_why})" if whole else "")
            + f", {alone} rows alone that could share" + (f" ({alone_why})" if alone else "")
            + f", {notes[single]} rows alone as their document's only record"
            + (f", {notes[no_key]} rows without a group key" if notes[no_key] else "")
            + (f", {notes['rows error']} error rows" if notes["rows error"] else ""))


def whole_warning(count: int, num_rows: int, select) -> str:
    return (f"{count} of {num_rows} rows were prefilled whole: pruning them would have cost at least "
            f"--max-prune-cost {select.max_prune_cost} of their full prefill (the speculator pass plus the kept tokens, "
            "in FLOPs: spcli.stages.pays), so they ran as at keep 1.0; a lower --keep prunes them, --max-prune-cost inf "
            "always does")


def note_warnings(notes: Counter, num_rows: int, select) -> list[str]:
    """The run's end: one warning per kind of row `row_notes` counted."""
    out = [over_budget_warning(notes["over_budget"], num_rows, select)] if notes["over_budget"] else []
    return out + ([whole_warning(notes["whole"], num_rows, select)] if notes["whole"] else [])


def over_budget_warning(count: int, num_rows: int, select) -> str:
    forced = f"--keep-first {select.keep_first} + --keep-last {select.keep_last} = {select.keep_first + select.keep_last}"
    return (f"{count} of {num_rows} rows without error kept more than the budget asks: their forced tokens "
            f"({forced}) exceed ceil(keep x prompt tokens), so only those were kept; lower --keep-last "
            "(or --keep-first) or raise --keep for prompts this short")


class Prepared:
    """A window of records on its way to the base pass: their speculator pass may still be running
    (prepare.start_prepare); `finish()` gives, per record in order, its checked request or its error row."""

    def __init__(self, engine, records: list[Record], cfg: RunConfig, shard_paths: dict[int, str],
                 on_stage=lambda text: None, should_stop=lambda: False, overlap: bool = False):
        self.engine, self.records, self.shard_paths = engine, records, shard_paths
        self.out: list[PrunedRequest | RowResult | None] = [
            error_row(rec, shard_paths, rec.error) if rec.error is not None else None for rec in records]
        self.todo = [i for i, rec in enumerate(records) if rec.error is None]
        self.scoring = start_prepare([records[i] for i in self.todo], cfg, engine.stack, on_stage, should_stop,
                                     overlap=overlap)

    def ready(self) -> bool:
        return self.scoring.ready()

    def finish(self) -> list[PrunedRequest | RowResult]:
        for i, req in zip(self.todo, self.scoring.finish()):
            if isinstance(req, PrunedRequest):  # what its group did with it (spcli.stages.share.SHARING)
                self.records[i].sharing, self.records[i].leads = req.sharing or self.records[i].sharing, req.leads
            try:
                if isinstance(req, RecordError):
                    raise req
                self.engine.check(req)
                self.out[i] = req
            except RecordError as e:
                self.out[i] = error_row(self.records[i], self.shard_paths, f"{where_of(self.records[i], self.shard_paths)}: {e}")
        return self.out


def prepared(engine, records: list[Record], cfg: RunConfig, shard_paths: dict[int, str], on_stage=lambda text: None,
             should_stop=lambda: False) -> list[PrunedRequest | RowResult]:
    """Per record, in order: its checked request for the base pass, or its error row (a bad record, a prepare
    RecordError, or one the engine refuses)."""
    return Prepared(engine, records, cfg, shard_paths, on_stage, should_stop).finish()


def stream_rows(stream, engine, records: Iterator[Record], cfg: RunConfig, shard_paths: dict[int, str], window: int | None,
                on_window=lambda records: None, on_stage=lambda text: None, should_stop=lambda: False,
                should_drain=lambda: False, overlap: bool = False, needed=lambda: set(),
                on_settle=lambda finishing, dropped: None) -> Iterator[tuple[Record, RowResult]]:
    """The job loop of an engine that takes requests as they come (`stream`: vllm_stream.VllmStream): records are
    read `window` at a time (None: stream.window, from what vLLM runs and the speculator batches), prepared (tokenize -> speculate -> select: prepare.py) and handed to the base engine at
    once, up to stream.limit(...) in flight (what vLLM's KV cache and max_num_seqs run, twice over); the next
    window is scored whenever fewer than one running set is waiting or being scored. Rows come back as they
    finish, in any order; the caller puts them back in read order. should_stop() (Ctrl-C) is asked between engine
    steps: nothing more is read, scored or submitted, the requests in flight that no finished row waits on are
    aborted (`needed()`: the ids of the records whose rows finished rows wait on, in read order; on_settle(kept,
    aborted) hears the counts) and the loop ends once the others finish, so every finished row can commit; where
    none is needed it raises StopAtSafePoint (the rest in flight are the caller's to abort). Once should_drain() says yes, nothing
    more is read or submitted (scored requests not yet in the engine are dropped) and the loop ends when the
    engine is empty. on_window(records) sees each window before it is prepared.

    `overlap` (--speculator-overlap): a window's speculator pass is submitted to the workers' own threads and
    collected once done, while vLLM steps meanwhile (at most one window scoring at a time); it is waited for
    only when vLLM has nothing else to run. Without it, each window is scored before the loop steps again.

    While vLLM is still starting (`stream.is_ready()` false: a background start, vllm_start.py), windows are
    scored ahead up to stream.head_start() prompts, then the loop waits for vLLM and submits them."""
    pending: deque[tuple[Record, PrunedRequest, float]] = deque()  # prepared, not yet in the engine; the third: its
    # row's time before the engine took it, the wait for vLLM to start left out (`row_wait`)
    scoring: deque[tuple[Prepared, float]] = deque()  # windows whose speculator pass is under way
    started: dict[str, tuple] = {}  # key -> (record, request, its time before the engine took it: row_wait)
    tokens, count = 0, 0  # kept + generated tokens of the requests submitted so far, for the KV-bound limit
    prompt_tokens = 0  # their prompts' tokens, for the speculator window
    is_exhausted = False
    ready_at = None  # when the loop first saw vLLM started
    is_settling = False  # after a Ctrl-C: only the requests that finished rows wait on run on
    records = Whole(records, cfg.group_max, is_on=cfg.grouped is not None)  # windows never cut a group

    def settle() -> None:
        nonlocal is_exhausted, is_settling
        keep = needed()
        drop = [key for key, (rec, _, _) in started.items() if id(rec) not in keep]
        stream.abort(drop)
        for key in drop:
            del started[key]
        pending.clear()
        scoring.clear()
        is_exhausted = is_settling = True
        on_settle(len(started), len(drop))
        if not started:
            raise StopAtSafePoint

    while True:
        if not is_exhausted and should_drain():
            is_exhausted = True
            pending.clear()  # never started: redone on resume
            scoring.clear()  # likewise (a worker finishes its job; nobody collects it)
        size = tokens / count if count else 0
        num_scoring = sum(len(p.records) for p, _ in scoring)
        is_ready = stream.is_ready()  # vLLM has started (a background start: vllm_start.py)
        if is_ready and ready_at is None:
            ready_at = time.perf_counter()
        ahead = stream.capacity(size) if is_ready else stream.head_start()
        if not is_exhausted and not scoring and len(pending) + num_scoring < ahead:
            batch = records.take(window or stream.window(prompt_tokens / count if count else 0, size))
            is_exhausted = not batch
            if batch:
                on_window(batch)
                t_read = time.perf_counter()  # before the window is tokenized and (without overlap) scored
                try:
                    scoring.append((Prepared(engine, batch, cfg, shard_paths, on_stage, should_stop, overlap), t_read))
                except StopAtSafePoint:  # a Ctrl-C while the window was scored
                    settle()
                    continue
        while scoring and (not (stream.num_in_flight or pending) or scoring[0][0].ready()):
            window_of, t0 = scoring.popleft()
            for rec, item in zip(window_of.records, window_of.finish()):
                if isinstance(item, RowResult):
                    yield rec, item
                else:
                    pending.append((rec, item, (t0, time.perf_counter())))
        while pending and is_ready and stream.num_in_flight < stream.limit(size):
            rec, req, (t0, t_scored) = pending.popleft()
            try:
                key = stream.submit(req)
            except RecordError as e:
                yield rec, error_row(rec, shard_paths, f"{where_of(rec, shard_paths)}: {e}")
                continue
            started[key] = (rec, req, row_wait(t0, t_scored, time.perf_counter(), ready_at))
            tokens, count = tokens + int(req.kept.numel()) + req.max_tokens, count + 1
            prompt_tokens += req.num_prompt_tokens
        if not stream.num_in_flight:
            if is_exhausted and not pending and not scoring:
                return
            if not is_ready and not scoring and (is_exhausted or len(pending) >= ahead):
                on_stage(f"waiting for vLLM to start, {len(pending)} rows scored")
                while not stream.wait(STOP_POLL_S):  # nothing more to do before it is up (a failed start: raised
                    if should_stop():  # at the first submit)
                        raise StopAtSafePoint
            continue
        if not is_settling and should_stop():
            settle()
        on_stage(f"base pass: {stream.num_in_flight} rows in vLLM, {len(pending)} scored and waiting"
                 + (f", {num_scoring} being scored" if scoring else ""))
        for key, gen in stream.poll():
            rec, req, waited = started.pop(key)
            if isinstance(gen, RecordError):
                yield rec, error_row(rec, shard_paths, f"{where_of(rec, shard_paths)}: {gen}")
            else:
                yield rec, output_row(rec, shard_paths, req, gen, waited, cfg.save_scores, engine.stack.tokenizer)


def row_wait(read: float, scored: float, submitted: float, ready_at: float | None) -> float:
    """A streamed row's time before the engine took it, for its ttft_s: its window's scoring (read -> scored) and
    its wait after that, less any part of the wait spent before vLLM had started (a row scored ahead while vLLM
    starts does not count vLLM's start-up as its own latency; plain vLLM's TTFT does not count it either)."""
    waited_from = scored if ready_at is None else max(scored, ready_at)
    return (scored - read) + max(0.0, submitted - waited_from)


def run_batch(engine, records: list[Record], cfg: RunConfig, shard_paths: dict[int, str],
              on_stage=lambda text: None, should_stop=lambda: False) -> list[RowResult]:
    """One row per record, in order. `engine`: HFEngine or VllmEngine (stack, check, generate).

    on_stage(text) hears where the batch is; should_stop() is asked at the batch's safe points
    (between speculator groups, before the base pass, between decode steps), and when it says yes
    the batch is dropped with StopAtSafePoint: no row of it is returned.
    """
    t0 = time.perf_counter()
    rows: list[RowResult | None] = [None] * len(records)
    ready: list[tuple[int, PrunedRequest]] = []
    for i, item in enumerate(prepared(engine, records, cfg, shard_paths, on_stage, should_stop)):
        if isinstance(item, RowResult):
            rows[i] = item
        else:
            ready.append((i, item))
    if ready:
        if should_stop():
            raise StopAtSafePoint
        on_stage(f"base pass on {len(ready)} rows")
        waited = time.perf_counter() - t0
        for (i, req), gen in zip(ready, engine.generate([req for _, req in ready], should_stop)):
            rec = records[i]
            if isinstance(gen, RecordError):
                rows[i] = error_row(rec, shard_paths, f"{where_of(rec, shard_paths)}: {gen}")
            else:
                rows[i] = output_row(rec, shard_paths, req, gen, waited, cfg.save_scores, engine.stack.tokenizer)
    return rows  # type: ignore[return-value]
