"""One row's prompt re-tokenised with the run's tokenizer, each token marked kept, forced or dropped.

Rendering works on runs (maximal stretches of tokens shown alike), never one element per token,
so a 32k-token prompt stays a few hundred spans.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from spcli.config.run import FieldConfig
from spcli.errors import InputError, OutputError, RecordError
from spcli.inspect.outputs import RunOutputs
from spcli.io.read import read_records
from spcli.io.records import Record
from spcli.io.shards import Shard
from spcli.stages.tokenize import tokenize

KEPT, FORCED, DROPPED = "kept", "forced", "dropped"


@dataclass
class TokenView:
    row: dict  # the output row (id, output, num_prompt_tokens, kept_indices, ...)
    pieces: list[str]  # [n] text of each prompt token; "".join(pieces) is the decoded prompt
    is_kept: np.ndarray  # [n] bool
    is_forced: np.ndarray  # [n] bool, the first keep_first / last keep_last tokens of a pruned prompt
    importance: np.ndarray | None  # [n] float32, when the run saved scores for this row
    chunk: int  # tokens per selection chunk
    warning: str | None = None  # e.g. the input changed since the run
    note: str | None = None  # why a prompt selection would prune kept every token (why_whole)

    @property
    def num_tokens(self) -> int:
        return len(self.pieces)


@dataclass
class Run:
    start: int  # first token index
    end: int  # one past the last
    state: str  # KEPT | FORCED | DROPPED
    chunk_index: int | None  # the selection chunk of a kept run (kept runs never cross chunks)
    text: str


def token_runs(view: TokenView) -> list[Run]:
    """Maximal runs of tokens with one state; kept runs split at chunk boundaries, so each kept chunk shows."""
    states = [FORCED if f else (KEPT if k else DROPPED) for f, k in zip(view.is_forced.tolist(), view.is_kept.tolist())]
    keys = [(s, i // view.chunk if s == KEPT else None) for i, s in enumerate(states)]
    return [Run(start, end, keys[start][0], keys[start][1], "".join(view.pieces[start:end]))
            for start, end in split_runs(keys)]


def split_runs(keys: list) -> list[tuple[int, int]]:
    """(start, end) of each maximal stretch of equal keys."""
    bounds, start = [], 0
    for i in range(1, len(keys) + 1):
        if i == len(keys) or keys[i] != keys[start]:
            bounds.append((start, i))
            start = i
    return bounds


def importance_levels(importance: np.ndarray, num_levels: int) -> np.ndarray:
    """[n] int in [0, num_levels): each token's importance quantile within its prompt (robust to the sink's spike)."""
    ranks = np.argsort(np.argsort(importance, kind="stable"), kind="stable")
    return (ranks * num_levels // max(1, len(importance))).astype(np.int64)


def token_pieces(tokenizer, ids: list[int]) -> list[str]:
    """The text each token adds, decoded incrementally so that multi-byte characters and word-initial
    spaces come out right; a character split over tokens belongs to the token that completes it."""
    kw = dict(skip_special_tokens=False, clean_up_tokenization_spaces=False)
    pieces: list[str] = []
    prefix = read = 0
    for i in range(len(ids)):
        before = tokenizer.decode(ids[prefix:read], **kw) if read > prefix else ""
        text = tokenizer.decode(ids[prefix : i + 1], **kw)
        if text.endswith("\ufffd") and i + 1 < len(ids) and i + 1 - read < 8:
            pieces.append("")  # an incomplete UTF-8 sequence: wait for the next token
            continue
        pieces.append(text[len(before) :])
        prefix, read = read, i + 1
    return pieces


def load_tokenizer(run: RunOutputs):
    """The run's tokenizer (transformers only: spcli.models.load would also import the model code)."""
    from transformers import AutoTokenizer

    path = tokenizer_path(run)
    try:
        return AutoTokenizer.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError) as e:
        raise OutputError(f"cannot load the run's tokenizer from {path}: {e}") from e


def tokenizer_path(run: RunOutputs) -> Path:
    from spcli.models import lookup

    path = run.fingerprint_fields.get("model_path")
    if path and (Path(path) / "config.json").is_file():
        return Path(path)
    return lookup.locate(run.config["model"])


def _max_positions(model_dir: Path) -> int:
    try:
        cfg = json.loads((model_dir / "config.json").read_text())
    except (OSError, ValueError):
        return 1 << 30
    cfg = cfg.get("text_config", cfg)
    return int(cfg.get("max_position_embeddings") or 1 << 30)


def _record(run: RunOutputs, row: dict) -> Record:
    known = {f.name for f in dataclasses.fields(FieldConfig)}
    fields = FieldConfig(**{k: v for k, v in run.config.get("fields", {}).items() if k in known})
    try:
        rec = next(read_records(Shard(0, row["shard"]), fields, row["row"]), None)
    except InputError as e:
        raise OutputError(f"cannot re-read the prompt of row {row['id']!r}: {e}") from e
    if rec is None or rec.row != row["row"]:
        raise OutputError(f"{row['shard']}: row {row['row']} (id {row['id']!r}) is no longer in the input file")
    return rec


def _input_changed(run: RunOutputs, shard_path: str) -> bool:
    for s in run.fingerprint_fields.get("inputs", []):
        if s.get("path") == shard_path:
            try:
                st = os.stat(shard_path)
            except OSError:
                return True
            return (st.st_size, st.st_mtime_ns) != (s.get("size"), s.get("mtime_ns"))
    return False


def load_view(run: RunOutputs, row: dict, tokenizer=None) -> TokenView:
    """Re-read and re-tokenise one row's prompt the way the run did, and mark its tokens."""
    model_dir = tokenizer_path(run)
    tokenizer = tokenizer or load_tokenizer(run)
    rec = _record(run, row)
    if rec.error is not None:
        raise OutputError(f"row {row['id']!r} has no prompt to show: {rec.error}")
    gen, select = run.config.get("generate", {}), run.config.get("select", {})
    max_positions, truncate = _max_positions(model_dir), run.config.get("truncate", "error")
    ids_of = lambda r: tokenize(r, tokenizer, max_positions - (r.max_tokens or gen.get("max_tokens", 64)), truncate)
    try:
        ids = ids_of(rec)
    except RecordError as e:
        raise OutputError(f"row {row['id']!r} could not be tokenised: {e}") from e
    n = len(ids)
    warnings = []
    if _input_changed(run, row["shard"]):
        warnings.append(f"{row['shard']} changed since the run: the prompt below may not be what was scored")
    if row.get("num_prompt_tokens") and row["num_prompt_tokens"] != n:
        warnings.append(f"re-tokenised to {n} tokens but the run saw {row['num_prompt_tokens']}: input or tokenizer changed")
    is_kept = np.zeros(n, dtype=bool)
    kept = np.asarray(row.get("kept_indices") or [], dtype=np.int64)
    is_kept[kept[kept < n]] = True
    is_forced = np.zeros(n, dtype=bool)
    if 0 < len(kept) < n:  # a pruned prompt: the first/last tokens were forced in (DESIGN.md step 7)
        is_forced[: select.get("keep_first", 0)] = True
        if select.get("keep_last", 0) > 0:
            is_forced[max(0, n - select["keep_last"]) :] = True
        is_forced &= is_kept
    importance = row.get("importance")
    importance = np.asarray(importance, dtype=np.float32) if importance is not None and len(importance) == n else None
    pieces = token_pieces(tokenizer, ids)
    shared = _group_shared(run, row, ids, ids_of)
    note = "; ".join(n for n in (why_whole(row, select, rec.keep, shared), cut_note(pieces, is_kept)) if n) or None
    return TokenView(row, pieces, is_kept, is_forced, importance, int(select.get("chunk", 32)),
                     "; ".join(warnings) or None, note)


def cut_note(pieces: list[str], is_kept: np.ndarray, shown: int = 5) -> str | None:
    """Numbers, codes, dates and names the row dropped right after a kept word (spcli.stages.units.cut_values: a
    fact cut from its subject), in words; None where there is none or nothing was dropped."""
    from itertools import accumulate

    from spcli.stages.units import cut_values

    if bool(is_kept.all()):
        return None
    ends = list(accumulate(map(len, pieces)))
    offsets = [(e - len(p), e) for p, e in zip(pieces, ends)]
    text = "".join(pieces)
    cut = cut_values(text, offsets, is_kept)
    if not cut:
        return None
    words = [text[offsets[i][0]:].split(None, 1)[0] if text[offsets[i][0]:].strip() else "" for i in cut]
    more = f", ... ({len(cut) - shown} more)" if len(cut) > shown else ""
    return (f"{len(cut)} number{'s' if len(cut) > 1 else ''}, code{'s' if len(cut) > 1 else ''} or name{'s' if len(cut) > 1 else ''} "
            f"dropped right after a kept word (a fact cut from its subject?): " + ", ".join(words[:shown]) + more)


def _group_shared(run: RunOutputs, row: dict, ids: list[int], tokenize_record) -> int | None:
    """How many tokens the prompts of a group prefilled whole share (spcli.stages.share.shared_len), its other rows
    re-read and re-tokenised; None for a row outside a group, a pruned row, or a member that cannot be re-read."""
    from spcli.stages.share import shared_len

    if (row.get("group_size") or 1) < 2 or row.get("num_kept_tokens") != row.get("num_prompt_tokens"):
        return None
    others = [r for r in run.group_rows.get(row["group"], []) if r["id"] != row["id"]]
    try:
        return shared_len([ids, *(tokenize_record(_record(run, r)) for r in others)])
    except (OutputError, RecordError):
        return None


def why_whole(row: dict, select: dict, keep: float | str | None, shared: int | None = None) -> str | None:
    """Why a row kept every token although its keep would prune it, in words: it was shorter than --min-tokens, its
    group's document (`shared`: the tokens the group's prompts share) was, or pruning it (its group, for a row that
    shares its document) would not have paid (spcli.stages.pays, spcli.stages.share.group_pays). None for a pruned
    row, an error row, and a row whose keep is every token."""
    from spcli.config.scoring import SelectConfig
    from spcli.stages.select import is_kept_whole, is_pruned

    n, num_kept = row.get("num_prompt_tokens") or 0, row.get("num_kept_tokens")
    if row.get("error") is not None or not n or num_kept != n:
        return None
    known = {f.name for f in dataclasses.fields(SelectConfig)}
    # a run's config.json holds --max-prune-cost inf as null (JSON has no infinity)
    cfg = SelectConfig(**{k: (math.inf if k == "max_prune_cost" and v is None else v) for k, v in select.items()
                          if k in known})
    keep = cfg.keep if keep is None else keep
    if keep != "auto" and float(keep) >= 1.0:
        return None
    if n < cfg.min_tokens:
        return f"prefilled whole: shorter than --min-tokens {cfg.min_tokens}"
    size = row.get("group_size") or 1
    if size > 1 and shared is not None and shared < cfg.min_tokens and is_pruned(n, cfg, keep):
        return (f"prefilled whole with its group's {size} questions: the document they share ({shared} tokens) is "
                f"under --min-tokens {cfg.min_tokens}, so it is prefilled once (prefix caching), not scored per question")
    if not is_kept_whole(n, num_kept, cfg, keep):
        return None  # its keep (with the first and last tokens) is every token: nothing was to be pruned
    if size > 1:
        return (f"prefilled whole with its group's {size} questions: pruning the group would not beat prefilling "
                f"its document once (--max-prune-cost {cfg.max_prune_cost:g})")
    return (f"prefilled whole: its speculator pass and kept tokens would cost at least --max-prune-cost "
            f"{cfg.max_prune_cost:g} of its full prefill")
