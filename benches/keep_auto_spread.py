"""Does `--keep auto` give concentrated and diffuse prompts different budgets? (issue 20, item 1)

One early-exit speculator pass per prompt at the model's default scoring (smollm2-135m: self, layer 14,
window 32, pool 31, chunk 8); from its captured rows the importance pooled as `spcli run` pools it and
unpooled (pool 1), and pooled with the row max. Then keep auto's budget under both criteria of
spcli.engine.select.auto_budget (the mass relative to the chunks' median, and the plain mass of before) at
several --keep-mass values, and under two candidates that live only here (perplexity: scale x the effective
number of chunks above the median; outlier: the chunks z MADs above the median), within the default
--keep-min 0.05 / --keep-max 0.5. Prompts: single needles (niah), eight scattered needles
(niah-scatter) and essays to summarise (no needle: the importance follows the text), ~2k tokens each.

    PYTHONPATH=$PWD .venv/bin/python benches/keep_auto_spread.py --samples 8

Prints the mean kept fraction per group and criterion, and the spread (the largest group mean minus the
smallest); writes the per-prompt rates as JSON with --out.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics

from spcli import profiles
import torch

from spcli.calibrate.layers import window_importance
from spcli.config import ScoreConfig, SelectConfig
from spcli.engine.capture import QueryCapture
from spcli.engine.load import decoder_prefix, load_stack
from spcli.engine.select import auto_budget, chunk_masses, clamp_budget, forced_mask
from spcli.engine.tokenize import tokenize
from spcli.evaluate.tasks import Filler, generate
from spcli.io.records import Record

MASSES = (0.5, 0.6, 0.7, 0.8, 0.9)
SCALES = (1.0, 1.5, 2.0, 3.0)  # perplexity criterion: tokens = scale x effective chunks x chunk
ZS = (2.0, 3.0, 4.0, 5.0, 6.0)  # outlier criterion: chunks above median + z x MAD


def perplexity_budget(importance: torch.Tensor, cfg: SelectConfig, scale: float) -> int:
    """Candidate: the effective number of chunks, exp(entropy) of the mass above the median, x scale."""
    n = importance.shape[0]
    forced = forced_mask(n, cfg)
    _, _, mass = chunk_masses(importance, cfg, forced)
    p = mass[mass > 0] / float(mass.sum())
    effective = float(torch.exp(-(p * p.log()).sum()))
    return clamp_budget(n, cfg, int(forced.sum()) + int(scale * effective * cfg.chunk))


def outlier_budget(importance: torch.Tensor, cfg: SelectConfig, z: float) -> int:
    """Candidate: the chunks whose mean stands z median absolute deviations above the median chunk."""
    n = importance.shape[0]
    forced = forced_mask(n, cfg)
    mean, sizes, _ = chunk_masses(importance, cfg, forced, sharpen=False)
    free = mean[sizes > 0]
    median = float(free.median())
    mad = float((free - median).abs().median())
    return clamp_budget(n, cfg, int(forced.sum()) + int(sizes[mean > median + z * mad].sum()))


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
            for name, importance in (("", both[1, 0]), ("unpooled-", both[0, 0]), ("rowmax-", both[1, 1])):
                def add(key: str, tokens: int) -> None:
                    rates.setdefault(name + key, {}).setdefault(group, []).append(tokens / len(ids))
                for mass in MASSES:
                    cfg = SelectConfig(keep="auto", chunk=select.chunk, keep_mass=mass)
                    for sharpen in (True, False):
                        add(f"{'median' if sharpen else 'plain'}@{mass}", auto_budget(importance, cfg, sharpen=sharpen))
                for scale in SCALES:
                    add(f"perplexity@{scale:g}", perplexity_budget(importance, select, scale))
                for z in ZS:
                    add(f"outlier@{z:g}", outlier_budget(importance, select, z))
            print(f"  {group}-{i}: {len(ids)} tokens, median@0.9 {rates['median@0.9'][group][-1]:.3f}, "
                  f"plain@0.9 {rates['plain@0.9'][group][-1]:.3f}, unpooled-median@0.9 "
                  f"{rates['unpooled-median@0.9'][group][-1]:.3f}", flush=True)
    print(f"\n{'criterion@mass':<24}" + "".join(f"{g:>14}" for g in groups) + f"{'spread':>10}")
    for key, per_group in rates.items():
        means = [statistics.mean(per_group[g]) for g in groups]
        print(f"{key:<24}" + "".join(f"{v:>14.3f}" for v in means) + f"{max(means) - min(means):>10.3f}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"model": args.model, "dtype": m.dtype, "score": str(score), "chunk": select.chunk,
                       "samples": args.samples, "length": args.length, "seed": args.seed, "rates": rates}, f, indent=1)


if __name__ == "__main__":
    main()
