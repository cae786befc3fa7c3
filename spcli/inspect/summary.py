"""Run-level numbers for `spcli inspect DIR`: progress, keep rate, prefill work saved, TTFT, errors."""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from spcli.config.sampling import DEFAULT, NAMES
from spcli.errors import OutputError
from spcli.inspect.outputs import RunOutputs
from spcli.io.count import count_rows
from spcli.io.manifest import progress_rows
from spcli.io.shards import Shard
from spcli.ray.pieces import not_started

KEEP_BINS = 10  # keep-rate histogram: [0, 10%), [10%, 20%), ..., [90%, 100%]
# "file.jsonl:row 2 (line 3): " prefixes of error rows (and "file.jsonl:line 3: ", as directories before issue 59 hold)
_WHERE = re.compile(r"^(?:.*?:(?:line|row) \d+(?: \(line \d+\))?: )+")


@dataclass
class ErrorGroup:
    message: str  # the error without its file:line prefix
    count: int
    example: str  # one full message, location included


@dataclass
class ConfigPart:
    """One configuration of the run's history and what it made."""

    num_rows: int
    parts: list[str]
    differences: list[str]  # `key: first -> this` against the first configuration (empty for the first)


@dataclass
class Sharing:
    """What document groups shared (the rows' group columns), and why not, as the runs' ends counted it (manifests)."""

    groups_together: int  # groups pruned together
    rows_together: int
    groups_whole: int  # groups prefilled whole (the document once)
    rows_whole: int
    rows_alone: int  # rows without error in no group
    why: dict[str, int] = field(default_factory=dict)  # "groups whole: short", "rows alone: ...": spcli.stages.share.SHARING

    def lines(self) -> list[str]:
        whole = ", ".join(f"{k.split(': ', 1)[1]} {v}" for k, v in sorted(self.why.items()) if k.startswith("groups whole"))
        alone = ", ".join(f"{k.split(': ', 1)[1]} {v}" for k, v in sorted(self.why.items()) if k.startswith("rows alone"))
        return [f"{self.groups_together} ({self.rows_together} rows) pruned together, {self.groups_whole} "
                f"({self.rows_whole} rows) prefilled whole" + (f" ({whole})" if whole else "")
                + f"; {self.rows_alone} rows alone" + (f" ({alone})" if alone else "")]


def sharing(run: RunOutputs) -> Sharing | None:
    """The document groups of a run's rows (None where its rows have no group column: made before groups)."""
    if "group" not in run.columns or (run.config or {}).get("groups") == "off":
        return None
    t = run.table(["group", "num_prompt_tokens", "num_kept_tokens", "error"])
    ok = [e is None for e in t.column("error").to_pylist()]
    together: set[str] = set()
    whole: set[str] = set()
    rows = Counter()
    for g, n, k, good in zip(t.column("group").to_pylist(), t.column("num_prompt_tokens").to_pylist(),
                             t.column("num_kept_tokens").to_pylist(), ok):
        if not good:
            continue
        kind = "alone" if g is None else ("together" if k < n else "whole")
        rows[kind] += 1
        if g is not None:
            (together if kind == "together" else whole).add(g)
    why = Counter()
    for doc in run.manifests:
        why.update({k: v for k, v in (doc.get("sharing") or {}).items() if k.startswith(("groups whole", "rows alone"))})
    return Sharing(len(together), rows["together"], len(whole - together), rows["whole"], rows["alone"], dict(why))


@dataclass
class Summary:
    out: str
    is_finished: bool
    num_rows: int  # committed rows, failed included
    num_failed: int
    num_pending: int | None  # input rows not yet committed; None when a shard cannot be counted cheaply
    num_shards: int
    num_shards_done: int
    num_prompt_tokens: int  # over rows without error
    num_kept_tokens: int
    num_output_tokens: int  # generated, over rows without error
    keep_mean: float | None  # mean of per-row keep rates
    keep_quantiles: dict[str, float] = field(default_factory=dict)  # min, p10, p50, p90, max
    keep_histogram: list[int] = field(default_factory=list)  # [KEEP_BINS] rows per 10% bin
    ttft_quantiles: dict[str, float] = field(default_factory=dict)  # p50, p90, p99, max, seconds
    speculate_s: float = 0.0  # summed over rows
    prefill_s: float = 0.0  # base prefill, summed over batches
    is_prefill_estimated: bool = False  # manifests from before per-batch sums: prefill_s from the rows (batch_seconds)
    wall_s: float = 0.0
    full_prefill: FullPrefill | None = None  # what a full prefill of these rows took or would take
    config: dict = field(default_factory=dict)  # model, speculator, keep, lookahead, chunk, pool, ...
    errors: list[ErrorGroup] = field(default_factory=list)  # most frequent first
    configs: list[ConfigPart] = field(default_factory=list)  # every configuration that made parts, oldest first
    sharing: Sharing | None = None  # document groups (None: rows made before groups)

    @property
    def keep_by_tokens(self) -> float | None:
        """Kept / prompt tokens over every row: the prefill work actually done."""
        return self.num_kept_tokens / self.num_prompt_tokens if self.num_prompt_tokens else None

    @property
    def prompt_tokens_per_s(self) -> float | None:
        return self.num_prompt_tokens / self.wall_s if self.wall_s > 0 else None

    @property
    def output_tokens_per_s(self) -> float | None:
        return self.num_output_tokens / self.wall_s if self.wall_s > 0 else None

    @property
    def speculator_share(self) -> float | None:
        """The speculator's share of the run's wall time."""
        return self.speculate_s / self.wall_s if self.wall_s > 0 else None

    @property
    def saved_prefill_s(self) -> float | None:
        """The full prefill's time less this run's base prefill: never more than the full prefill itself."""
        if self.full_prefill is None:
            return None
        return max(0.0, self.full_prefill.seconds - self.prefill_s)

    @property
    def num_saved_tokens(self) -> int:
        return self.num_prompt_tokens - self.num_kept_tokens

    @property
    def saved_fraction(self) -> float | None:
        return self.num_saved_tokens / self.num_prompt_tokens if self.num_prompt_tokens else None


@dataclass
class FullPrefill:
    """The base prefill time of the same rows at keep 1.0, and how it was found."""

    seconds: float
    is_measured: bool  # from a keep-1.0 run (--baseline); else extrapolated from this run
    how: str  # one phrase for the summary: where the figure comes from


def estimated_full_prefill(prefill_s: float, num_kept_tokens: int, num_prompt_tokens: int) -> FullPrefill | None:
    """This run's base prefill scaled by prompt / kept tokens: linear in tokens. Fixed costs per forward
    make the real figure smaller (the issue's 8 rows: 2x), attention's quadratic part larger (tiny models
    on long prompts: 8x), so it is labelled an estimate and a keep-1.0 run measures it."""
    if not num_kept_tokens or prefill_s <= 0:
        return None
    return FullPrefill(prefill_s * num_prompt_tokens / num_kept_tokens, False,
                       "estimated: this run's base prefill x prompt / kept tokens")


def measured_full_prefill(run: RunOutputs, baseline: RunOutputs) -> FullPrefill:
    """The base prefill of `baseline`, a keep-1.0 run, over the rows this run completed: all of it when it
    holds the same rows, else its share by prompt tokens (a batch's time is not split per row)."""
    cols = ["id", "num_prompt_tokens", "num_kept_tokens", "error"]
    mine = {r["id"] for r in run.table(cols).to_pylist() if r["error"] is None}
    rows = [r for r in baseline.table(cols).to_pylist() if r["error"] is None]
    if any(r["num_kept_tokens"] != r["num_prompt_tokens"] for r in rows):
        raise OutputError(f"--baseline {baseline.out}: not a full-prefill run (some rows kept fewer tokens than their "
                          f"prompt; its keep is {baseline.config.get('select', {}).get('keep')}); give a run made "
                          "with --keep 1.0")
    have = {r["id"]: r["num_prompt_tokens"] for r in rows}
    missing = sorted(mine - have.keys())
    if missing:
        raise OutputError(f"--baseline {baseline.out}: {len(missing)} of this run's {len(mine)} rows are not among "
                          f"its rows without error (e.g. {missing[0]!r}); run it on the same input")
    total = sum(have.values())
    share = sum(have[i] for i in mine) / total if total else 0.0
    seconds, _ = prefill_seconds(baseline)
    how = f"measured: {baseline.out} at keep 1.0"
    how += ", the same rows" if len(mine) == len(have) else f", {len(mine)} of its {len(have)} rows by prompt tokens"
    return FullPrefill(seconds * share, True, how)


def resolved_config(cfg: dict, fingerprint_fields: dict | None = None) -> dict:
    """The settings that decide what was kept, flattened for display (in this order); the speculator by
    the name it resolved to."""
    from spcli.models.lookup import default_speculator

    select, score, gen = cfg.get("select", {}), cfg.get("score", {}), cfg.get("generate", {})
    speculator = (cfg.get("speculator") or (fingerprint_fields or {}).get("speculator")
                  or default_speculator(cfg.get("model") or ""))
    return {
        "model": cfg.get("model"), "speculator": speculator,
        "engine": cfg.get("engine"), "keep": select.get("keep"), **auto_keep(select), "lookahead": score.get("lookahead"),
        "chunk": select.get("chunk"), "pool": score.get("pool"), "keep_first": select.get("keep_first"),
        "keep_last": select.get("keep_last"), "min_tokens": select.get("min_tokens"),
        "max_tokens": gen.get("max_tokens"), "temperature": gen.get("temperature"), **sampling_flags(gen),
        "save_scores": cfg.get("save_scores"),
    }


def sampling_flags(gen: dict) -> dict:
    """The job's sampling settings that are not their defaults (spcli.config.sampling; none in older manifests)."""
    default = {k: getattr(DEFAULT, k) for k in NAMES} | {"stop": []}  # a manifest holds JSON: a list
    return {k: gen[k] for k in NAMES if k in gen and gen[k] != default[k]}


def auto_keep(select: dict) -> dict:
    """keep = auto: the settings of the per-prompt budget (the rates it chose are the keep-rate distribution)."""
    if select.get("keep") != "auto":
        return {}
    return {k: select.get(k) for k in ("keep_scale", "keep_min", "keep_max")}


def group_errors(messages: list[str]) -> list[ErrorGroup]:
    counts: Counter[str] = Counter()
    examples: dict[str, str] = {}
    for m in messages:
        key = _WHERE.sub("", m)
        counts[key] += 1
        examples.setdefault(key, m)
    return [ErrorGroup(k, n, examples[k]) for k, n in counts.most_common()]


def _quantiles(values: np.ndarray, names: dict[str, float]) -> dict[str, float]:
    if values.size == 0:
        return {}
    return {k: float(np.quantile(values, q)) for k, q in names.items()}


def pending_rows(run: RunOutputs) -> int | None:
    """Input rows not committed yet; None where a shard cannot be counted cheaply."""
    pending = 0
    for s in run.shards:
        if s.get("done"):
            continue
        total = s.get("total_rows")
        if total is None:
            total = count_rows(Shard(0, s["path"], rows=progress_rows(s)))
        if total is None:
            return None
        pending += max(0, total - s.get("rows", 0))
    for shard in not_started(run.manifests):  # a Ray directory's files and row ranges no actor slot started
        if (total := count_rows(shard)) is None:
            return None
        pending += total
    return pending


def prefill_seconds(run: RunOutputs) -> tuple[float, bool]:
    """The base prefill time summed over batches, as the manifests count it at commit (each batch once),
    and whether it is an estimate instead (batch_seconds, for manifests older than that count)."""
    if run.shards and all("prefill_s" in s for s in run.shards):
        return float(sum(s["prefill_s"] for s in run.shards)), False
    return batch_seconds(run), True


def batch_seconds(run: RunOutputs) -> float:
    """An estimate of the base prefill time from the rows, which store it for their whole batch: one value
    per run of equal neighbours inside a part (a batch never spans two parts; two equal batches count once)."""
    from spcli.inspect.outputs import _read_part

    total = 0.0
    for part in run.parts:
        t = _read_part(part, ["prefill_s", "error"], [])
        ok = np.array([e is None for e in t.column("error").to_pylist()], dtype=bool)
        values = np.asarray(t.column("prefill_s").to_numpy(zero_copy_only=False), dtype=np.float64)[ok]
        values = values[~np.isnan(values)]
        if values.size:
            total += float(values[np.concatenate([[True], values[1:] != values[:-1]])].sum())
    return total


def config_parts(run: RunOutputs) -> list[ConfigPart]:
    """Each configuration of every manifest's history, with the rows and parts it made."""
    from spcli.io.manifest import config_history

    return [ConfigPart(c["rows"], c["parts"], c["differences"]) for c in config_history(run.manifests)]


def summarize(run: RunOutputs, baseline: RunOutputs | None = None) -> Summary:
    """baseline: a keep-1.0 run of the same rows, whose base prefill is the full prefill (else estimated)."""
    t = run.table(["num_prompt_tokens", "num_kept_tokens", "num_output_tokens", "keep_rate", "ttft_s", "speculate_s",
                   "error"])
    error = t.column("error").to_pylist()
    ok = np.array([e is None for e in error], dtype=bool)  # [rows]
    prompt = np.asarray(t.column("num_prompt_tokens").to_numpy(zero_copy_only=False), dtype=np.int64)[ok]
    kept = np.asarray(t.column("num_kept_tokens").to_numpy(zero_copy_only=False), dtype=np.int64)[ok]
    output = np.asarray(t.column("num_output_tokens").to_numpy(zero_copy_only=False), dtype=np.float64)[ok]
    keep = np.asarray(t.column("keep_rate").to_numpy(zero_copy_only=False), dtype=np.float64)[ok]
    keep = keep[~np.isnan(keep)]
    ttft = np.asarray(t.column("ttft_s").to_numpy(zero_copy_only=False), dtype=np.float64)[ok]
    ttft = ttft[~np.isnan(ttft)]
    spec = np.asarray(t.column("speculate_s").to_numpy(zero_copy_only=False), dtype=np.float64)
    prefill_s, is_estimated = prefill_seconds(run)
    full = (measured_full_prefill(run, baseline) if baseline is not None
            else estimated_full_prefill(prefill_s, int(kept.sum()), int(prompt.sum())))
    bins = np.minimum((keep * KEEP_BINS).astype(np.int64), KEEP_BINS - 1)
    return Summary(
        out=str(run.out), is_finished=run.is_finished, num_rows=t.num_rows, num_failed=int((~ok).sum()),
        num_pending=pending_rows(run), num_shards=len(run.shards),
        num_shards_done=sum(bool(s.get("done")) for s in run.shards),
        num_prompt_tokens=int(prompt.sum()), num_kept_tokens=int(kept.sum()),
        num_output_tokens=int(np.nansum(output)),
        keep_mean=float(keep.mean()) if keep.size else None,
        keep_quantiles=_quantiles(keep, {"min": 0.0, "p10": 0.1, "p50": 0.5, "p90": 0.9, "max": 1.0}),
        keep_histogram=np.bincount(bins, minlength=KEEP_BINS).tolist(),
        ttft_quantiles=_quantiles(ttft, {"p50": 0.5, "p90": 0.9, "p99": 0.99, "max": 1.0}),
        speculate_s=float(np.nansum(spec)),
        prefill_s=prefill_s, is_prefill_estimated=is_estimated, full_prefill=full,
        wall_s=max((m.get("wall_s", 0.0) for m in run.manifests), default=0.0),
        config=resolved_config(run.config, run.fingerprint_fields),
        errors=group_errors([e for e in error if e is not None]), configs=config_parts(run), sharing=sharing(run),
    )
