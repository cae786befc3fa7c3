"""Does `--keep auto` give concentrated and diffuse prompts different budgets? (issue 20, item 1)

One early-exit speculator pass per prompt at the model's default scoring (smollm2-135m: self, layer 14,
window 32, pool 31, rows max, chunk 8); from its captured rows the importance pooled as `spcli run` pools it
and unpooled (pool 1), each with the mean and the max over rows. Then keep auto's budget under its criterion,
spcli.stages.select.auto_budget (perplexity: --keep-scale x the effective number of chunks above the median;
`spcli run --keep auto` applies it to the unpooled importance with the model's rows), at several scales, and
under candidates that live only here (median / plain: the fewest best chunks holding a share of the mass
above the chunks' median or of the plain mass, the criteria before; outlier: the chunks z MADs above the
median), within the default --keep-min 0.05 / --keep-max 0.5. Prompts: single needles (niah), eight scattered needles
(niah-scatter) and essays to summarise (no needle: the importance follows the text), ~2k tokens each.

    PYTHONPATH=$PWD .venv/bin/python benches/keep_auto_spread.py --samples 8

Prints the mean kept fraction per group and criterion, the spread (the largest group mean minus the
smallest) and the diffuse gap (essays minus single needles, what issue 20 asks to be >= 0.1); writes the per-prompt rates as JSON with --out.
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import statistics

from spcli.models import profiles
import torch

from spcli.calibrate.layers import window_importance
from spcli.config.scoring import KEEP_SCALE, ScoreConfig, SelectConfig
from spcli.models.capture import QueryCapture
from spcli.models.load import decoder_prefix, load_stack
from spcli.stages.select import auto_budget, budget, chunk_masses, clamp_budget, forced_mask
from spcli.stages.tokenize import tokenize
from spcli.evaluate.tasks import Filler, generate
from spcli.io.records import Record

MASSES = (0.5, 0.6, 0.7, 0.8, 0.9)
SCALES = (1.0, 1.25, 1.5, 2.0, 2.5, 3.0)  # perplexity criterion: tokens = scale x effective chunks x chunk
ZS = (2.0, 3.0, 4.0, 5.0, 6.0)  # outlier criterion: chunks above median + z x MAD


def mass_budget(importance: torch.Tensor, cfg: SelectConfig, mass_share: float, sharpen: bool) -> int:
    """Candidate (keep auto's criterion before this one): the fewest best chunks holding mass_share of the mass,
    above the chunks' median (`sharpen`) or plain."""
    n = importance.shape[0]
    forced = forced_mask(n, cfg)
    mean, sizes, mass = chunk_masses(importance, cfg, forced, sharpen)
    total = float(mass.sum())
    if total <= 0.0:
        return budget(n, cfg.keep_max)
    order = torch.sort(-mean if sharpen else -mass, stable=True).indices
    share = torch.cumsum(mass[order], dim=0) / total
    num_taken = int((share < mass_share - 1e-9).sum()) + 1
    return clamp_budget(n, cfg, int(forced.sum()) + int(sizes[order[:num_taken]].sum()))


def outlier_budget(importance: torch.Tensor, cfg: SelectConfig, z: float) -> int:
    """Candidate: the chunks whose mean stands z median absolute deviations above the median chunk."""
    n = importance.shape[0]
    forced = forced_mask(n, cfg)
    mean, sizes, _ = chunk_masses(importance, cfg, forced, sharpen=False)
    free = mean[sizes > 0]
    median = float(free.median())
    mad = float((free - median).abs().median())
    return clamp_budget(n, cfg, int(forced.sum()) + int(sizes[mean > median + z * mad].sum()))


def diffuse_gap(per_group: dict[str, list[float]]) -> float:
    """The target's measure: the essays' mean kept fraction minus the single needles' (diffuse minus concentrated)."""
    return statistics.mean(per_group["summarise"]) - statistics.mean(per_group["niah"])


def summaries(tokenizer, length: int, num: int, seed: int) -> list[list[dict]]:
    """Essays of ~length tokens with a request to summarise them: no fact stands out."""
    filler = Filler(tokenizer)
    out = []
    for i in range(num):
        text = " ".join(filler.take(random.Random(f"summary:{length}:{seed}:{i}"), length - 40))
        out.append([{"role": "user", "content": f"Summarise the following essay in three sentences.\n\n{text}"}])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--samples", type=int, default=2)
    ap.add_argument("--length", type=int, default=2048)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    m = load_stack(args.model)
    defaults, source = profiles.score_defaults(args.model, m.path, m.speculator_name)
    score = ScoreConfig(**{k: defaults[k] for k in profiles.SCORE_FIELDS})
    select = SelectConfig(keep="auto", chunk=defaults["chunk"])
    groups = {
        "niah": [ex.messages for ex in generate("niah", m.tokenizer, args.length, args.samples, args.seed)],
        "niah-scatter": [ex.messages for ex in generate("niah-scatter", m.tokenizer, args.length, args.samples, args.seed)],
        "summarise": summaries(m.tokenizer, args.length, args.samples, args.seed),
    }
    print(f"{args.model} ({m.dtype}), speculator {m.speculator_name}: {score} chunk {select.chunk} ({source})")
    rates: dict[str, dict[str, list[float]]] = {}
    for group, prompts in groups.items():
        for i, messages in enumerate(prompts):
            ids = tokenize(Record(0, i, f"{group}-{i}", messages=messages), m.tokenizer, 1 << 20, "error")
            layer = score.layers(m.speculator.config.num_hidden_layers)[-1]
            cap = QueryCapture([layer], score.window, len(ids), keep_keys=True)
            with torch.inference_mode():
                decoder_prefix(m.speculator, layer + 1)(input_ids=torch.tensor([ids], device=m.device), use_cache=False,
                                                       spcli_capture=cap)
            both = window_importance(cap.queries()[0, 0], cap.keys[layer][0], (score.window,), (1, score.pool),
                                     ("mean", "max"))[:, :, 0].cpu()  # [pool 1 / pool P, rows mean / max, n]
            for (p, pool), (r, rows) in itertools.product(enumerate(("unpooled", "pooled")), enumerate(("mean", "max"))):
                name, importance = f"{pool}-{rows}-", both[p, r]
                def add(key: str, tokens: int) -> None:
                    rates.setdefault(name + key, {}).setdefault(group, []).append(tokens / len(ids))
                for mass in MASSES:
                    for sharpen in (True, False):
                        add(f"{'median' if sharpen else 'plain'}@{mass}", mass_budget(importance, select, mass, sharpen))
                for scale in SCALES:
                    cfg = SelectConfig(keep="auto", chunk=select.chunk, keep_scale=scale)
                    add(f"perplexity@{scale:g}", auto_budget(importance, cfg))
                for z in ZS:
                    add(f"outlier@{z:g}", outlier_budget(importance, select, z))
            shipped = f"unpooled-{score.rows}-perplexity@{KEEP_SCALE:g}"  # what `spcli run --keep auto` keeps
            print(f"  {group}-{i}: {len(ids)} tokens, {shipped} {rates[shipped][group][-1]:.3f}", flush=True)
    print(f"\n{'criterion@setting':<32}" + "".join(f"{g:>14}" for g in groups) + f"{'spread':>10}{'diffuse':>10}")
    for key, per_group in sorted(rates.items(), key=lambda kv: diffuse_gap(kv[1])):
        means = [statistics.mean(per_group[g]) for g in groups]
        print(f"{key:<32}" + "".join(f"{v:>14.3f}" for v in means) + f"{max(means) - min(means):>10.3f}"
              f"{diffuse_gap(per_group):>10.3f}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"model": args.model, "dtype": m.dtype, "score": str(score), "chunk": select.chunk,
                       "samples": args.samples, "length": args.length, "seed": args.seed, "rates": rates}, f, indent=1)


if __name__ == "__main__":
    main()
