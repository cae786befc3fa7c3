"""`spcli calibrate --keep-for INPUT...`: which keep rate suits the user's own prompts.

No labels: on a seeded sample of the user's records, each keep rate (and `auto`) is compared with full
prefill of the same prompt, on the run's own stages (spcli.stages.prepare tokenizes, speculates and
selects; hf_pass generates). One speculator pass per prompt serves every keep rate. Fidelity per
policy, with 95% bootstrap intervals over the sampled prompts:

    1st-tok   the first generated token equals full prefill's
    EM16      the first `compare_tokens` greedy tokens equal full prefill's (--target-agreement)
    KL        KL(full || pruned) of the first-token distribution, nats (--target-kl)

The recommendation is the policy with the smallest mean kept fraction whose mean meets the target.
"""

from __future__ import annotations

import dataclasses
import random
import shlex
import time
from dataclasses import dataclass, field

import torch

from spcli.config.run import DTYPES, FieldConfig, GenerateConfig, RunConfig
from spcli.config.scoring import AUTO, SPECULATOR_CHUNK, ScoreConfig, SelectConfig, check, check_speculator_chunk
from spcli.engines.hf import base_pass as hf_pass
from spcli.errors import InputError, RecordError
from spcli.evaluate import metrics
from spcli.io.outdir import make_out_dir
from spcli.io.read import read_records
from spcli.io.records import Record
from spcli.io.shards import discover
from spcli.models import load
from spcli.stages.prepare import prepare
from spcli.stages.request import Generation, PrunedRequest
from spcli.stages.select import budget, is_pruned, select_tokens

FULL = "full"


@dataclass(frozen=True)
class KeepForConfig:
    inputs: tuple[str, ...]  # the user's shards, as `spcli run` takes them
    out: str = "out/calibrate"
    model: str = "smollm2-135m"
    speculator: str | None = None
    samples: int = 32  # records drawn (seeded) from all of INPUT
    keeps: tuple[float, ...] = (0.05, 0.1, 0.2, 0.3, 0.5)  # fixed rates swept; `auto` is always swept too
    target_agreement: float | None = None  # mean EM16 to reach; the default target when neither is given: 0.9
    target_kl: float | None = None  # mean first-token KL to stay under
    compare_tokens: int = 16
    batch_size: int = 8
    bootstrap: int = 2000
    seed: int = 0
    dtype: str | None = None
    speculator_dtype: str | None = None  # None or auto: spcli.models.dtype.resolve_speculator_dtype
    device: str = "auto"
    speculator_chunk: int = SPECULATOR_CHUNK  # tokens per speculator prefill call (memory only)
    select: SelectConfig = field(default_factory=lambda: SelectConfig(keep=AUTO))  # auto's scale/min/max; chunking
    score: ScoreConfig = field(default_factory=ScoreConfig)
    fields: FieldConfig = field(default_factory=FieldConfig)

    def __post_init__(self) -> None:
        check(bool(self.inputs), "--keep-for needs INPUT files, globs or directories")
        check(self.samples >= 1, f"--samples must be >= 1, got {self.samples}")
        check(bool(self.keeps) and all(0.0 < k < 1.0 for k in self.keeps), f"--keep values must be in (0, 1), got {self.keeps}")
        check(self.target_agreement is None or self.target_kl is None, "give --target-agreement or --target-kl, not both")
        check(self.target_agreement is None or 0.0 < self.target_agreement <= 1.0,
               f"--target-agreement must be in (0, 1], got {self.target_agreement}")
        check(self.target_kl is None or self.target_kl > 0.0, f"--target-kl must be > 0, got {self.target_kl}")
        check(self.compare_tokens >= 1, f"--compare-tokens must be >= 1, got {self.compare_tokens}")
        check(self.bootstrap >= 100, f"--bootstrap must be >= 100 resamples, got {self.bootstrap}")
        check(self.dtype is None or self.dtype in DTYPES, f"--dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        check_speculator_chunk(self.speculator_chunk)

    @property
    def target(self) -> tuple[str, float]:
        """(metric, value): ("prefix_match", at least) or ("kl", at most)."""
        return ("kl", self.target_kl) if self.target_kl is not None else ("prefix_match", self.target_agreement or 0.9)

    @property
    def policies(self) -> tuple[float | str, ...]:
        return (*sorted(set(self.keeps)), AUTO)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def sample_records(cfg: KeepForConfig, skipped: list[str] | None = None) -> tuple[list[Record], int]:
    """A seeded uniform sample (reservoir) of the valid records of every shard, in input order; and how
    many valid records there were. The bad records' errors (file:line: why) go to `skipped`."""
    rng = random.Random(cfg.seed)
    chosen: list[Record] = []
    seen = 0
    for shard in discover(cfg.inputs):
        for rec in read_records(shard, cfg.fields):
            if rec.error is not None:
                if skipped is not None:
                    skipped.append(rec.error)
                continue
            seen += 1
            if len(chosen) < cfg.samples:
                chosen.append(rec)
            elif (j := rng.randrange(seen)) < cfg.samples:
                chosen[j] = rec
    if not chosen:
        raise InputError(f"{', '.join(cfg.inputs)}: no valid records to calibrate on")
    for rec in chosen:  # calibration chooses keep: the records' own keep and max_tokens do not apply
        rec.keep, rec.max_tokens = None, None
    return sorted(chosen, key=lambda r: (r.shard, r.row)), seen


def kept_for(req: PrunedRequest, select: SelectConfig, policy: float | str) -> torch.Tensor:
    """[m] kept indices of one prompt under a policy, from the importance of its one speculator pass."""
    n = req.num_prompt_tokens
    if policy == FULL or not is_pruned(n, select, policy):
        return torch.arange(n)
    assert req.importance is not None, "prepare ran at the smallest keep, so every pruned prompt has importance"
    return select_tokens(req.importance, select, policy, req.forced, req.unpooled)


def generate_all(stack, requests: list[PrunedRequest], batch_size: int) -> list[Generation]:
    out: list[Generation] = []
    for i in range(0, len(requests), batch_size):
        out += hf_pass.generate(stack.base, requests[i : i + batch_size], stack.tokenizer, stack.eos_ids, stack.pad_id,
                                stack.device, keep_first_logprobs=True)
    return out


def measure(stack, records: list[Record], cfg: KeepForConfig, log=print) -> tuple[list[dict], list[str]]:
    """One row per (record, policy) with its fidelity against full prefill; and the records' errors."""
    smallest = min(min(cfg.keeps), cfg.select.keep_min)  # prunes every prompt any policy prunes
    run_cfg = RunConfig(inputs=cfg.inputs, out=cfg.out, model=cfg.model, speculator=cfg.speculator,
                        select=dataclasses.replace(cfg.select, keep=smallest), score=cfg.score,
                        generate=GenerateConfig(max_tokens=cfg.compare_tokens), fields=cfg.fields,
                        speculator_chunk=cfg.speculator_chunk)
    t0 = time.perf_counter()
    prepared = prepare(records, run_cfg, stack, with_unpooled=True)  # auto is always swept
    errors = [f"{r.id}: {p}" for r, p in zip(records, prepared) if isinstance(p, RecordError)]
    requests = [p for p in prepared if isinstance(p, PrunedRequest)]
    if not requests:
        raise InputError(f"none of the {len(records)} sampled records could be prepared: {errors[0]}")
    log(f"speculator: {len(requests)} prompts in {time.perf_counter() - t0:.1f} s")
    refs = generate_all(stack, [dataclasses.replace(r, kept=torch.arange(r.num_prompt_tokens)) for r in requests],
                        cfg.batch_size)
    rows = []
    for policy in (FULL, *cfg.policies):
        t0 = time.perf_counter()
        kept = [kept_for(r, cfg.select, policy) for r in requests]
        todo = [i for i, k in enumerate(kept) if k.numel() < requests[i].num_prompt_tokens]
        gens = dict(enumerate(refs))  # an unpruned prompt is full prefill itself
        gens.update(zip(todo, generate_all(stack, [dataclasses.replace(requests[i], kept=kept[i]) for i in todo],
                                           cfg.batch_size)))
        for i, req in enumerate(requests):
            ref, gen = refs[i], gens[i]
            rows.append({
                "id": req.record_id, "policy": policy, "num_prompt_tokens": req.num_prompt_tokens,
                "num_kept": int(kept[i].numel()), "is_pruned": i in todo,
                "first_token": metrics.first_token_agrees(ref.token_ids, gen.token_ids),
                "prefix_match": metrics.prefix_matches(ref.token_ids, gen.token_ids, cfg.compare_tokens),
                "kl": metrics.kl_divergence(ref.first_logprobs, gen.first_logprobs),
            })
        if policy != FULL:
            log(f"keep {policy}: {len(todo)} of {len(requests)} prompts pruned, {time.perf_counter() - t0:.1f} s")
    return rows, errors


def summarize(rows: list[dict], cfg: KeepForConfig) -> list[dict]:
    """Per policy (fixed rates ascending, then auto): kept fraction and fidelity, each a mean with its 95% CI."""
    ci = lambda values: metrics.bootstrap(values, cfg.bootstrap, cfg.seed).to_dict()
    out = []
    for policy in cfg.policies:
        group = [r for r in rows if r["policy"] == policy]
        at_max = sum(r["is_pruned"] and r["num_kept"] == budget(r["num_prompt_tokens"], cfg.select.keep_max) for r in group)
        out.append({"policy": policy, "n": len(group), "num_pruned": sum(r["is_pruned"] for r in group),
                    "num_at_keep_max": at_max if policy == AUTO else 0,
                    "kept_fraction": ci([r["num_kept"] / r["num_prompt_tokens"] for r in group]),
                    **{m: ci([r[m] for r in group]) for m in ("first_token", "prefix_match", "kl")}})
    return out


def meets(entry: dict, target: tuple[str, float]) -> bool:
    metric, value = target
    mean = entry[metric]["mean"]
    return mean <= value if metric == "kl" else mean >= value


def recommend(summary: list[dict], cfg: KeepForConfig, target: tuple[str, float] | None = None) -> dict | None:
    """The policy meeting the target (default: cfg's) with the smallest mean kept fraction (None when none does)."""
    ok = [e for e in summary if meets(e, target or cfg.target)]
    return min(ok, key=lambda e: (e["kept_fraction"]["mean"], e["policy"] == AUTO)) if ok else None


DEFAULT_TARGET_KL = 0.05  # the KL line of the recommendations when --target-kl is not given


def closest(summary: list[dict], cfg: KeepForConfig) -> list[dict]:
    """Per criterion (EM16 >= --target-agreement, KL <= --target-kl): the smallest policy meeting it, else the
    policy nearest to it (the best mean); each with its `spcli run` flags."""
    out = []
    for metric, value in (("prefix_match", cfg.target_agreement or 0.9), ("kl", cfg.target_kl or DEFAULT_TARGET_KL)):
        best = recommend(summary, cfg, (metric, value))
        nearest = best or (min if metric == "kl" else max)(summary, key=lambda e: e[metric]["mean"])
        out.append({"metric": metric, "value": value, "is_met": best is not None, "policy": nearest["policy"],
                    "mean": nearest[metric]["mean"], "flags": run_flags(cfg, nearest["policy"])})
    return out


def run_flags(cfg: KeepForConfig, policy: float | str) -> str:
    """The `spcli run` flags that reproduce what was measured for `policy`."""
    flags = [f"--model {cfg.model}"] + ([f"--speculator {cfg.speculator}"] if cfg.speculator else [])
    if policy == AUTO:
        s = cfg.select
        flags.append(f"--keep auto --keep-scale {s.keep_scale:g} --keep-min {s.keep_min:g} --keep-max {s.keep_max:g}")
    else:
        flags.append(f"--keep {policy:g}")
    user_score = {"window": cfg.score.window, "lookahead": cfg.score.lookahead, "score-layers": cfg.score.score_layers,
                  "pool": cfg.score.pool, "rows": cfg.score.rows, "chunk": cfg.select.chunk}
    flags += [f"--{k} {v}" for k, v in user_score.items() if v is not None]
    if cfg.select.min_tokens != SelectConfig().min_tokens:
        flags.append(f"--min-tokens {cfg.select.min_tokens}")
    default = FieldConfig()
    flags += [f"--{name}-field {shlex.quote(getattr(cfg.fields, name))}" for name in ("prompt", "messages", "id", "instruction")
              if getattr(cfg.fields, name) != getattr(default, name)]
    return f"spcli run {' '.join(map(shlex.quote, cfg.inputs))} --out DIR " + " ".join(flags)


def run_keep(cfg: KeepForConfig, log=print) -> dict:
    from spcli.calibrate.keep_report import plot, write_json
    from spcli.models.profiles import resolve

    out = make_out_dir(cfg.out)
    t_start = time.perf_counter()
    skipped: list[str] = []
    records, num_valid = sample_records(cfg, skipped)
    stack = load.load_stack(cfg.model, cfg.speculator, cfg.dtype, cfg.device, speculator_dtype=cfg.speculator_dtype)
    resolved = resolve(cfg, cfg.model, stack.path, stack.speculator_name)  # cfg keeps the user's flags for run_flags
    score = resolved.score
    log(f"calibrate keep: {len(records)} of {num_valid} records, keep {', '.join(map(str, cfg.policies))}, "
        f"speculator {stack.speculator_name} (window {score.window}, look-ahead {score.lookahead}, layers {score.score_layers})")
    rows, errors = measure(stack, records, resolved, log)
    summary = summarize(rows, cfg)
    best = recommend(summary, cfg)
    metric, value = cfg.target
    results = {
        "config": cfg.to_dict(), "speculator": stack.speculator_name, "score": dataclasses.asdict(score),
        "num_valid_records": num_valid, "num_sampled": len(records), "errors": errors,
        "target": {"metric": metric, "value": value}, "summary": summary,
        "recommended": None if best is None else best["policy"],
        "flags": None if best is None else run_flags(cfg, best["policy"]),
        "closest": closest(summary, cfg), "skipped": skipped,
        "wall_s": time.perf_counter() - t_start, "rows": rows,
    }
    write_json(out / "results.json", results)
    results["image"] = str(plot(results, out))
    return results

