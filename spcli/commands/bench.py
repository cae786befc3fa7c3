"""`spcli bench`: TTFT of full prefill vs spcli (speculator included), the ratio and its limit, QPS."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from spcli.config.scoring import MAX_PRUNE_COST, MIN_FREE, SPECULATOR_CHUNK


def _help() -> str:
    from spcli.benchmark.report import COLUMN_HELP, MAX_SPREAD

    columns = "\n\n".join(f"{name}: {text}." for name, text in COLUMN_HELP)
    return ("Measure full-prefill TTFT vs spcli TTFT on the same prompts in one run; ratios, limits, throughput, QPS.\n\n"
            "--warmup untimed repetitions run first (model load, allocator and kernel warm-up), so the first timed "
            "run is comparable. A warning says when the ratio is unreliable: a single timed repetition, or "
            f"per-repetition speedups spread over {100 * MAX_SPREAD:.0f}%. --lengths is checked against the model's "
            "context before anything runs.\n\nColumns:\n\n" + columns)


def register(app: typer.Typer) -> None:
    @app.command(name="bench", help=_help())
    def _cmd(
        model: Annotated[str, typer.Option(help="Base model; random-405b = random weights with the 8B/405B cost ratio.")] = "smollm2-135m",
        speculator: Annotated[Optional[str], typer.Option(help="Speculator model or self:K. Default: the model's (random-8b for random-405b).")] = None,
        keep: Annotated[str, typer.Option(help="Keep rates, comma-separated.")] = "0.1,0.3,0.5",
        lengths: Annotated[str, typer.Option(help="Prompt lengths in tokens, comma-separated.")] = "2048",
        batch: Annotated[int, typer.Option(help="Prompts per batch.")] = 1,
        repeats: Annotated[int, typer.Option(help="Timed repetitions (the best time is reported).")] = 3,
        warmup: Annotated[int, typer.Option(help="Untimed repetitions first.")] = 1,
        max_tokens: Annotated[int, typer.Option(help="Decoded tokens per prompt for end-to-end throughput.")] = 16,
        ttft_limit: Annotated[Optional[float], typer.Option(help="TTFT limit in s for max QPS. Default: 2 x full-prefill TTFT.")] = None,
        seed: Annotated[int, typer.Option(help="Which text windows become the prompts.")] = 0,
        lookahead: Annotated[Optional[int], typer.Option(help="Speculator look-ahead tokens. Default: the model's.")] = None,
        window: Annotated[Optional[int], typer.Option(help="Last W prompt tokens' queries score (causal); 0 = the last only. Default: the model's.")] = None,
        score_layers: Annotated[Optional[str], typer.Option(help="Speculator layers that score: all, I, I-J, I,J,... Default: the model's.")] = None,
        pool: Annotated[Optional[int], typer.Option(help="Average-pool kernel over token scores (odd; 1 = none). Default: the model's (the paper's 13; smollm2-135m: 31).", show_default=False)] = None,
        rows: Annotated[Optional[str], typer.Option(help="How the query rows' scores (each the max over heads and layers) combine: mean (the paper's) or max (a token one row attends to counts). Default: the model's (smollm2-135m: max, measured; otherwise mean).", show_default=False)] = None,
        chunk: Annotated[Optional[int], typer.Option(help="Tokens per selection chunk. Default: the model's (the paper's 32; smollm2-135m: 8).", show_default=False)] = None,
        unit: Annotated[str, typer.Option(help="Selection unit: clause, sentence, word or chunk, as `spcli run --unit` (units read from the prompt ids decoded one by one, timed with the speculator).")] = "clause",
        min_free: Annotated[int, typer.Option(help="At least the forced tokens plus this many chosen ones, as `spcli run --min-free`.")] = MIN_FREE,
        max_prune_cost: Annotated[float, typer.Option(help="Prompts whose pruning would cost this share of a full prefill (FLOPs) are prefilled whole, as `spcli run --max-prune-cost`; inf = always prune.")] = MAX_PRUNE_COST,
        keep_first: Annotated[int, typer.Option(help="First tokens always kept.")] = 4,
        keep_last: Annotated[int, typer.Option(help="Last tokens always kept.")] = 64,
        score_impl: Annotated[str, typer.Option(help="Scoring kernel: auto, torch or triton.")] = "auto",
        speculator_chunk: Annotated[int, typer.Option(help="Tokens per speculator prefill call, as `spcli run --speculator-chunk`.")] = SPECULATOR_CHUNK,
        dtype: Annotated[str, typer.Option(help="auto, bfloat16, float16 or float32. auto: the model's dtype on GPU and on CPUs with AMX, float32 on other CPUs (bf16 is slower there).")] = "auto",
        speculator_dtype: Annotated[str, typer.Option(help="The speculator's: auto, bfloat16, float16 or float32. auto: the run's dtype, except bfloat16 on a CPU running float32 that multiplies bf16 natively (AVX512-BF16, AMX), as spcli run.")] = "auto",
        device: Annotated[str, typer.Option(help="auto, cpu, cuda, cuda:N.")] = "auto",
        json: Annotated[bool, typer.Option("--json", help="Print one JSON object per configuration instead of a table.")] = False,
        out: Annotated[Optional[str], typer.Option(help="Also write bench.json and bench_speedup.png into this directory.")] = None,
    ) -> None:
        from spcli.benchmark.config import BenchConfig
        from spcli.benchmark.report import reliability_warnings, write_outputs
        from spcli.benchmark.run import json_lines, run_bench, text_table
        from spcli.config.scoring import ScoreConfig, SelectConfig
        from spcli.evaluate.config import split_list

        cfg = BenchConfig(
            model=model, speculator=speculator, keeps=split_list(keep, float, "--keep"),
            lengths=split_list(lengths, int, "--lengths"), batch=batch, repeats=repeats, warmup=warmup,
            max_tokens=max_tokens, ttft_limit_s=ttft_limit, seed=seed, dtype=dtype, speculator_dtype=speculator_dtype, device=device, json=json,
            speculator_chunk=speculator_chunk,
            select=SelectConfig(keep=1.0, chunk=chunk, keep_first=keep_first, keep_last=keep_last, min_tokens=0,
                                unit=unit, min_free=min_free, max_prune_cost=max_prune_cost),
            score=ScoreConfig(lookahead=lookahead, window=window, score_layers=score_layers, pool=pool, rows=rows, impl=score_impl),
        )
        results = run_bench(cfg, log=lambda msg: typer.echo(msg, err=True))
        typer.echo(json_lines(results) if cfg.json else text_table(results))
        for warning in reliability_warnings(results):
            typer.echo(f"warning: {warning}", err=True)
        if out:
            write_outputs(out, cfg, results)
