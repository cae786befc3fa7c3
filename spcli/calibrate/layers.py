"""Layer/window calibration: which single speculator layer, observation window, pool, row aggregation and chunk
keep the facts.

Per prompt, one full speculator pass (every layer, no look-ahead, no cache) captures each layer's
last max(W) post-RoPE query rows and its keys; per-layer forward hooks time that same pass. Then,
for every layer l and setting (window W, pool P, rows R, chunk C), without running the model again:

    p[h, s, :] = softmax(q[l, h, s] . K[l]^T / sqrt(D)) over keys j <= pos(s)   (causal rows), fp32
    importance = R (mean or max) over the last W rows of max_h avgpool_P(p)[h, s, :]   (DESIGN.md steps 2-5)

selection as `spcli run` selects (whole units of --unit, long sentences split near C tokens; fixed chunks of
C at --unit chunk) at every keep, and recall (`--metric`) = the fraction of the needle sentences kept
whole (facts, the default: an answer needs the whole fact) or of their tokens kept (tokens). cost(l) = the share of the full forward spent up to the end of layer l (embeddings
included): what an early-exit speculator scoring at layer l pays. The choice (`recommend`): without a
cost cap, the cheapest (layer, setting), ties to the higher mean recall, then the smaller window, whose
mean recall reaches the target on every task at every keep; with `max_cost` C, the (layer, setting) of
cost <= C with the best worst-case recall (the most recall the speed budget buys), ties to the higher
mean recall, then the cheaper, then the smaller window; each task and keep is then checked against the
target.
"""

from __future__ import annotations

import dataclasses
import math
import os
import platform
import time
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from spcli.calibrate import profile, report
from spcli.calibrate.config import CalibrateConfig
from spcli.config.scoring import PAPER_CHUNK, PAPER_SCORE, ScoreConfig, SelectConfig
from spcli.errors import SpcliError
from spcli.evaluate.compare import needle_spans
from spcli.evaluate.metrics import FACT_MEASURES, covered
from spcli.evaluate.tasks import GENERATION_ROOM, Example, task_examples
from spcli.io.outdir import make_out_dir
from spcli.io.records import Record
from spcli.kernels.score import reduce_rows, smooth
from spcli.models import lookup, profiles
from spcli.models.capture import QueryCapture
from spcli.models.device import synchronize
from spcli.models.load import ModelStack, load_stack
from spcli.models.speculator import parse_self
from spcli.stages.select import select_tokens
from spcli.stages.speculate import speculate
from spcli.stages.tokenize import encode, kept_positions, tokenize, units_of


@dataclass(frozen=True)
class Setting:
    """How one layer's window rows become kept tokens: observation window, pool kernel, row aggregation, chunk.
    rows defaults to mean, what results written before --rows hold."""

    window: int
    pool: int
    chunk: int
    rows: str = "mean"


def settings_of(windows: tuple[int, ...], pools: tuple[int, ...], chunks: tuple[int, ...],
                rows: tuple[str, ...] = ("mean",)) -> list[Setting]:
    """Every combination, windows outer, then pools, then row aggregations, then chunks."""
    return [Setting(w, p, c, r) for w in windows for p in pools for r in rows for c in chunks]


def window_importance(query: torch.Tensor, key: torch.Tensor, windows: tuple[int, ...], pools: tuple[int, ...],
                      rows: tuple[str, ...] = ("mean",)) -> torch.Tensor:
    """One layer's importance for each (pool, rows, window). query: [H, R, D], the last R prompt rows (row s sits
    at position n - R + s); key: [KVH, n, D]. Returns [len(pools), len(rows), len(windows), n] float32; the softmax
    is computed once for all of them; a window longer than R uses R rows."""
    num_heads, num_rows, head_dim = query.shape
    num_kv_heads, n, _ = key.shape
    group = num_heads // num_kv_heads
    q = query.float().reshape(num_kv_heads, group * num_rows, head_dim)  # GQA: a key head's query heads together
    logits = torch.bmm(q, key.float().transpose(1, 2)).reshape(num_heads, num_rows, n) * head_dim**-0.5
    positions = torch.arange(n - num_rows, n, device=key.device)  # [R]
    logits.masked_fill_(torch.arange(n, device=key.device)[None, :] > positions[:, None], float("-inf"))
    probs = torch.softmax(logits, dim=-1)  # [H, R, n]
    out = []
    for pool in pools:
        best = smooth(probs, pool).amax(dim=0)  # [R, n]
        out.append(torch.stack([torch.stack([reduce_rows(best[-min(w, num_rows):], r) for w in windows])
                                for r in rows]))
    return torch.stack(out)


def sweep_prompt(queries: torch.Tensor, keys: list[torch.Tensor], spans: list[tuple[int, int]], settings: list[Setting],
                 keeps: tuple[float, ...], select: SelectConfig, measure=covered,
                 units: dict[int, torch.Tensor] | None = None) -> np.ndarray:
    """Recall of one prompt for every (layer, setting, keep): [L, len(settings), len(keeps)], NaN without needle
    spans; `measure(kept, spans)` is a FACT_MEASURES entry. queries: [L, H, R, D]; keys: L x [KVH, n, D].
    units: per chunk setting, the prompt's selection units (`spcli run`'s --unit; None: fixed chunks)."""
    recall = np.full((len(keys), len(settings), len(keeps)), np.nan)
    if not spans:
        return recall
    windows, pools = tuple(sorted({s.window for s in settings})), tuple(sorted({s.pool for s in settings}))
    rows = tuple(sorted({s.rows for s in settings}))
    for layer, key in enumerate(keys):
        importance = window_importance(queries[layer], key, windows, pools, rows).cpu()  # [NP, NR, NW, n]
        for i, s in enumerate(settings):
            scores = importance[pools.index(s.pool), rows.index(s.rows), windows.index(s.window)]
            chunked = dataclasses.replace(select, chunk=s.chunk)
            for k, keep in enumerate(keeps):
                kept = select_tokens(scores, chunked, keep, units=None if units is None else units[s.chunk])
                recall[layer, i, k] = measure(kept, spans)
    return recall


@dataclass
class Choice:
    layer: int
    window: int
    pool: int
    chunk: int
    cost: float  # share of the full speculator forward
    worst: float  # the lowest of the per-task mean recalls over the keeps asked
    meets_target: bool
    rows: str = "mean"
    max_cost: float | None = None  # the speed budget the choice was made under; None = the cheapest meeting target


def recommend(recall: dict[str, np.ndarray], costs: list[float], settings: list[Setting], target: float,
              max_cost: float | None = None) -> Choice:
    """recall: per task, the mean over its prompts [L, NS, NK].

    max_cost None: every task must reach `target` at every keep (a multi-fact task is not outvoted by easy single
    needles); the cheapest such (layer, setting) wins; at equal cost (the settings of one layer) the higher mean
    recall, then the smaller window, then the earlier setting. Where none does, the one with the best worst-case
    recall, marked below target.
    max_cost C: among the (layer, setting) of cost <= C, the best worst-case recall; ties to the higher mean recall,
    then the cheaper, then the smaller window. Where no layer is that cheap, the cheapest layer's best setting
    (its cost shows that it is over the budget)."""
    stacked = np.stack(list(recall.values()))  # [T, L, NS, NK]
    worst = np.nanmin(stacked, axis=(0, 3))  # [L, NS]
    mean = np.nanmean(stacked, axis=(0, 3))  # [L, NS]
    order = sorted((costs[l], -mean[l, i], settings[i].window, i, l) for l in range(worst.shape[0]) for i in range(len(settings)))
    order = [(l, i) for *_, i, l in order]
    if max_cost is not None:
        fits = [c for c in order if costs[c[0]] <= max_cost] or [c for c in order if costs[c[0]] == costs[order[0][0]]]
        l, i = fits[max(range(len(fits)), key=lambda j: (worst[fits[j]], mean[fits[j]], -j))]
    else:
        meeting = [c for c in order if worst[c] >= target]
        if meeting:
            l, i = meeting[0]
        else:  # the best worst case; among equals the first, i.e. the cheapest
            l, i = order[max(range(len(order)), key=lambda j: (worst[order[j]], -j))]
    s = settings[i]
    return Choice(l, s.window, s.pool, s.chunk, costs[l], float(worst[l, i]), bool(worst[l, i] >= target), s.rows,
                  max_cost)


def current_setting(defaults: dict, settings: list[Setting]) -> dict | None:
    """The model's scoring today (its profile or preset: `defaults`) as a grid key {layer, window, pool, rows, chunk},
    where it scores one layer without look-ahead and the sweep holds its setting; else None."""
    layers = str(defaults.get("score_layers"))
    if defaults.get("lookahead") or not layers.isdigit():
        return None
    s = Setting(int(defaults["window"]), int(defaults["pool"]), int(defaults["chunk"]), defaults.get("rows") or "mean")
    return {"layer": int(layers), **dataclasses.asdict(s)} if s in settings else None


def run_flags(cfg: CalibrateConfig, choice: Choice) -> str:
    """The `spcli run` flags that score as the choice does (early exit at its layer, no look-ahead)."""
    flags = [f"--model {cfg.model}"] + ([f"--speculator {cfg.speculator}"] if cfg.speculator else [])
    flags += [f"--score-layers {choice.layer} --window {choice.window} --lookahead 0 --pool {choice.pool} "
              f"--rows {choice.rows} --chunk {choice.chunk}"]
    return "spcli run INPUT... --out DIR " + " ".join(flags)


def timed_pass(model: nn.Module, ids: list[int], cap: QueryCapture, device: torch.device) -> tuple[list[float], float]:
    """Run the whole speculator once (no cache, logits of the last token only) with `cap` recording; return the
    cumulative share of the forward's wall time at the end of each decoder layer [L], and that wall time."""
    sync = lambda: synchronize(device)  # noqa: E731
    marks: list[float] = []

    def mark(*_):
        sync()
        marks.append(time.perf_counter())

    handles = [layer.register_forward_hook(mark) for layer in model.model.layers]
    try:
        sync()
        t0 = time.perf_counter()
        model(input_ids=torch.tensor([ids], device=device), use_cache=False, logits_to_keep=1, spcli_capture=cap)
        sync()
        total = time.perf_counter() - t0
    finally:
        for h in handles:
            h.remove()
    return [(t - t0) / total for t in marks], total


def build_examples(cfg: CalibrateConfig, tokenizer, max_positions: int, log) -> list[Example]:
    return task_examples(cfg.tasks, cfg.lengths, cfg.samples, cfg.seed, tokenizer, max_positions, log)


def _tokens(tokenizer, max_positions: int, example: Example) -> list[int]:
    record = Record(0, 0, example.id, prompt=example.prompt, messages=example.messages)
    return tokenize(record, tokenizer, max_positions - GENERATION_ROOM, "error")


def _units(tokenizer, max_positions: int, example: Example, ids: list[int], cfg: CalibrateConfig):
    """Per chunk setting, the example's selection units as `spcli run` makes them (None at --unit chunk)."""
    if cfg.select.unit == "chunk":
        return None
    enc = encode(Record(0, 0, example.id, prompt=example.prompt, messages=example.messages), tokenizer)  # once
    kept = kept_positions(len(enc.ids), max_positions - GENERATION_ROOM, "error")
    assert [enc.ids[i] for i in kept] == ids, "tokenize and encode read the example alike"
    return {chunk: units_of(enc, kept, dataclasses.replace(cfg.select, chunk=chunk)) for chunk in cfg.chunks}


def _paper_recall(m: ModelStack, ids, spans, cfg: CalibrateConfig) -> tuple[list[float], float]:
    """The paper's recipe (every layer, last token + look-ahead 8, pool 13, chunk 32): recall per keep, and its
    wall time."""
    score = ScoreConfig(**PAPER_SCORE)
    t0 = time.perf_counter()
    spec = speculate(m.speculator, ids, score, m.speculator_eos_ids, m.device)
    wall = time.perf_counter() - t0
    select = dataclasses.replace(cfg.select, chunk=PAPER_CHUNK)
    measure = FACT_MEASURES[cfg.metric]
    recall = [measure(select_tokens(spec.importance, select, keep), spans) for keep in cfg.keeps]
    return [math.nan if r is None else r for r in recall], wall


@torch.inference_mode()
def run_layers(cfg: CalibrateConfig, log=print) -> dict:
    """The sweep over built-in tasks; writes results.json, calibrate.png and (asked) the profile. Returns the results."""
    out = make_out_dir(cfg.out)
    t_start = time.perf_counter()
    speculator = cfg.speculator or lookup.default_speculator(cfg.model)
    m = load_stack(cfg.model, speculator, cfg.dtype, cfg.device, with_base=parse_self(speculator) is not None,
                   speculator_dtype=cfg.speculator_dtype)
    model = m.speculator
    num_layers = model.config.num_hidden_layers
    defaults, _ = profiles.score_defaults(cfg.model, m.path, m.speculator_name)  # unset pools, rows, chunks: the model's
    cfg = dataclasses.replace(cfg, pools=cfg.pools or (defaults["pool"],), chunks=cfg.chunks or (defaults["chunk"],),
                              rows=cfg.rows or (defaults["rows"],))
    settings = settings_of(cfg.windows, cfg.pools, cfg.chunks, cfg.rows)
    # the speculator's layers are measured in its own tokens (another tokenizer than the base's: its own)
    own = m.speculator_tokens
    tokenizer, max_positions = (m.tokenizer, m.max_positions) if own is None else (own.tokenizer, own.max_positions)
    examples = build_examples(cfg, tokenizer, max_positions, log)
    log(f"calibrate: {len(examples)} prompts, speculator {m.speculator_name} ({num_layers} layers), metric {cfg.metric}, windows "
        f"{', '.join(map(str, cfg.windows))}, pools {', '.join(map(str, cfg.pools))}, rows {', '.join(cfg.rows)}, chunks {', '.join(map(str, cfg.chunks))}, keep {', '.join(map(str, cfg.keeps))}, device {m.device}")
    per_task: dict[str, list[np.ndarray]] = {t: [] for t in cfg.tasks}
    paper: dict[str, list[list[float]]] = {t: [] for t in cfg.tasks}
    fractions, paper_ratio, rows = [], [], []
    t_loop = time.perf_counter()
    for i, ex in enumerate(examples):
        t0 = time.perf_counter()
        ids = _tokens(tokenizer, max_positions, ex)
        spans = needle_spans(tokenizer, ex, ids)
        cap = QueryCapture(range(num_layers), cfg.max_window, len(ids), keep_keys=True)
        marks, forward_s = timed_pass(model, ids, cap, m.device)
        fractions.append(marks)
        queries = cap.queries()[:, 0]  # [L, H, R, D]
        keys = [cap.keys[layer][0] for layer in range(num_layers)]  # L x [KVH, n, D]
        t1 = time.perf_counter()
        recall = sweep_prompt(queries, keys, spans, settings, cfg.keeps, cfg.select, FACT_MEASURES[cfg.metric],
                              _units(tokenizer, max_positions, ex, ids, cfg))
        sweep_s = time.perf_counter() - t1
        del cap, queries, keys
        per_task[ex.task].append(recall)
        paper_s = 0.0
        if cfg.paper:
            paper_recall, paper_s = _paper_recall(m, ids, spans, cfg)
            paper[ex.task].append(paper_recall)
            paper_ratio.append(paper_s / forward_s)
        num_fact = sum(e - s for s, e in spans)
        rows.append({"id": ex.id, "task": ex.task, "num_prompt_tokens": len(ids), "num_fact_tokens": num_fact,
                     "forward_s": forward_s, "sweep_s": sweep_s, "paper_s": paper_s})
        eta = (time.perf_counter() - t_loop) / (i + 1) * (len(examples) - i - 1)
        log(f"[{i + 1}/{len(examples)}] {ex.id}: {len(ids)} tokens, {num_fact} fact tokens, {time.perf_counter() - t0:.1f} s "
            f"(forward {forward_s:.1f}, sweep {sweep_s:.1f}" + (f", paper's recipe {paper_s:.1f}" if cfg.paper else "")
            + f"); ETA {eta:.0f} s")
    recall = {t: np.nanmean(np.stack(v), axis=0) for t, v in per_task.items() if v and not np.isnan(np.stack(v)).all()}
    if not recall:
        raise SpcliError("no prompt had a fact whose tokens could be located; use tasks with needles (niah, niah-multi, multidoc-qa)")
    costs = np.median(np.array(fractions), axis=0).tolist()  # per layer; monotone like each pass's marks
    chosen_on = {t: r for t, r in recall.items() if t not in cfg.hold_out}
    if not chosen_on:
        raise SpcliError(f"no task left to choose on: the tasks not held out ({', '.join(t for t in cfg.tasks if t not in cfg.hold_out)}) "
                         "had no fact whose tokens could be located")
    choice = recommend(chosen_on, costs, settings, cfg.target_recall, cfg.max_cost)
    current = current_setting(defaults, settings)
    results = {
        "config": cfg.to_dict(), "model_path": str(m.path), "speculator": m.speculator_name, "scoring": m.scoring,
        "num_layers": num_layers,
        "costs": costs, "settings": [dataclasses.asdict(s) for s in settings], "keeps": list(cfg.keeps),
        "tasks": list(recall), "held_out": [t for t in recall if t in cfg.hold_out],
        "grid": report.grid(recall, costs, settings, cfg.keeps, cfg.hold_out), "current": current,
        "choice": dataclasses.asdict(choice), "run_flags": run_flags(cfg, choice),
        "paper": {"recall": {t: dict(zip(map(str, cfg.keeps), np.nanmean(np.array(v), axis=0).tolist()))
                             for t, v in paper.items() if v},
                  "cost": float(np.median(paper_ratio))} if cfg.paper else None,
        "examples": rows,
        "environment": {"python": platform.python_version(), "torch": torch.__version__, "cpu_count": os.cpu_count(),
                        "torch_threads": torch.get_num_threads(), "load_average": os.getloadavg()},
        "wall_s": time.perf_counter() - t_start, "model_key": profiles.model_key(m.path),
    }
    if cfg.write_profile:
        results["profile"] = str(profile.store(results, out / "results.json", m.path))
        log(f"profile written: {results['profile']}")
    report.write_json(out / "results.json", results)
    report.plot(results, out / "calibrate.png")
    return results
