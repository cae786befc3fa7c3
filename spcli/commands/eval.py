"""`spcli eval`: quality of each selector at each keep rate against full prefill, with 95% bootstrap CIs."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from spcli.config.scoring import MAX_UNIT, MIN_FREE, MIN_TOKENS, PROTECT, SPECULATOR_CHUNK


def _help() -> str:
    from spcli.evaluate.report import COLUMN_HELP, MIN_N

    columns = "\n\n".join(f"{name}: {text}." for name, text in COLUMN_HELP)
    return ("Compare selectors at each keep rate with full prefill: fidelity, task scores, CIs, plots.\n\n"
            "The table printed (at most 120 columns) shows acc and acc-full as mean with a 95% bootstrap interval "
            "and the other columns as means; results.json (and report.html with --html) holds every column with its interval. "
            f"With fewer than {MIN_N} examples per row a warning says the intervals are too rough to rank by.\n\n"
            "Columns:\n\n" + columns)


def register(app: typer.Typer) -> None:
    @app.command(name="eval", help=_help())
    def _cmd(
        inputs: Annotated[Optional[list[str]], typer.Argument(metavar="INPUT", help="JSONL/Parquet shards (optional `answer` field: string or list).", show_default=False)] = None,
        out: Annotated[str, typer.Option("--out", "-o", help="Output directory: results.json, quality_<task>.png and speedup_<task>.png; report.html with --html.")] = "out/eval",
        task: Annotated[Optional[list[str]], typer.Option(help="Built-in task (repeat or comma-separate): niah, niah-multi, kv-retrieval, var-tracking, multidoc-qa, niah-scatter, needle-code, needle-name, needle-date, needle-first (needles = these four), needle-facts, essay-qa, facts-inline, facts-long, facts-list, facts-table, facts-bare (shapes = these five).")] = None,
        lengths: Annotated[str, typer.Option(help="Prompt lengths in tokens for built-in tasks, comma-separated.")] = "2048",
        model: Annotated[str, typer.Option(help="Base model name, local folder, GGUF file or cached HF id.")] = "smollm2-135m",
        speculator: Annotated[Optional[str], typer.Option(help="Speculator model or self:K. Default: the model's. A comma list A,B,... also scores with B,... (rows specprefill@B: each pair's own settings, paired against A's specprefill; one full prefill per example for all).")] = None,
        variant: Annotated[Optional[list[str]], typer.Option(help="Also score with the first speculator at other settings, paired (repeatable): KEY=VALUE,... of lookahead, window, score_layers, pool, rows, chunk, unit, max_unit, unit_score, min_free, protect, restate (0/1); rows specprefill[rows=max]. E.g. --variant rows=max.", show_default=False)] = None,
        keep: Annotated[str, typer.Option(help="Keep rates, comma-separated; 1.0 = full prefill; auto:P = keep auto with keep scale P (auto alone: P 1.5, as `spcli run --keep-scale`).")] = "0.1,0.3,0.5,1.0",
        selector: Annotated[str, typer.Option(help="Selectors, comma-separated: specprefill, random, recency, sink-recency, self-information.")] = "specprefill,random,recency,sink-recency,self-information",
        samples: Annotated[int, typer.Option(help="Examples per task and length (or the first N input records).")] = 20,
        seed: Annotated[int, typer.Option(help="Seed of the built-in tasks and the random selector.")] = 0,
        max_tokens: Annotated[Optional[int], typer.Option(help="Tokens to generate. Default: the task's (32-64).")] = None,
        compare_tokens: Annotated[int, typer.Option(help="Greedy tokens compared with full prefill (exact match).")] = 16,
        bootstrap: Annotated[int, typer.Option(help="Bootstrap resamples per confidence interval.")] = 2000,
        lookahead: Annotated[Optional[int], typer.Option(help="Speculator look-ahead tokens. Default: the model's.")] = None,
        window: Annotated[Optional[int], typer.Option(help="Last W prompt tokens' queries score (causal); 0 = the last only. Default: the model's.")] = None,
        score_layers: Annotated[Optional[str], typer.Option(help="Speculator layers that score: all, I, I-J, I,J,... Default: the model's.")] = None,
        pool: Annotated[Optional[int], typer.Option(help="Average-pool kernel over token scores (odd; 1 = none). Default: the model's (the paper's 13; smollm2-135m: 31).", show_default=False)] = None,
        rows: Annotated[Optional[str], typer.Option(help="How the query rows' scores (each the max over heads and layers) combine: mean (the paper's) or max (a token one row attends to counts). Default: the model's (smollm2-135m: max, measured; otherwise mean).", show_default=False)] = None,
        chunk: Annotated[Optional[int], typer.Option(help="Tokens per selection chunk. Default: the model's (the paper's 32; smollm2-135m: 8).", show_default=False)] = None,
        keep_first: Annotated[int, typer.Option(help="First tokens always kept (not by `recency`).")] = 4,
        keep_last: Annotated[int, typer.Option(help="Last tokens always kept.")] = 64,
        min_tokens: Annotated[int, typer.Option(help="Prompts shorter than this are prefilled whole, as `spcli run --min-tokens`.")] = MIN_TOKENS,
        min_free: Annotated[int, typer.Option(help="At least the forced tokens plus this many chosen ones, as `spcli run --min-free`.")] = MIN_FREE,
        unit: Annotated[str, typer.Option(help="Selection unit: clause, sentence, word or chunk, as `spcli run --unit` (the paper's recipe row always selects chunks).")] = "clause",
        max_unit: Annotated[int, typer.Option(help="--unit sentence: the longest sentence kept whole, as `spcli run --max-unit`.")] = MAX_UNIT,
        unit_score: Annotated[str, typer.Option(help="A unit's score: mean, max or topK, as `spcli run --unit-score`.")] = "mean",
        protect: Annotated[str, typer.Option(help="Text never dropped, as `spcli run --protect` (needle-first marks its instruction; --variant protect= compares without).")] = PROTECT,
        restate: Annotated[bool, typer.Option("--restate/--no-restate", help="The speculator reads an example's instruction again after the prompt, as `spcli run --restate` (--variant restate=0 compares without).")] = True,
        keep_min: Annotated[float, typer.Option(help="auto:P policies: the least fraction of a prompt kept.")] = 0.05,
        keep_max: Annotated[float, typer.Option(help="auto:P policies: the most fraction of a prompt kept.")] = 0.5,
        match_auto: Annotated[bool, typer.Option("--match-auto/--no-match-auto", help="Per auto:P policy, also run a fixed keep at its mean kept fraction and compare the two, paired.")] = True,
        speculator_chunk: Annotated[int, typer.Option(help="Tokens per speculator prefill call, as `spcli run --speculator-chunk`.")] = SPECULATOR_CHUNK,
        dtype: Annotated[str, typer.Option(help="auto, bfloat16, float16 or float32. auto: the model's dtype on GPU and on CPUs with AMX, float32 on other CPUs (bf16 is slower there).")] = "auto",
        speculator_dtype: Annotated[str, typer.Option(help="The speculator's: auto, bfloat16, float16 or float32. auto: the run's dtype, except bfloat16 on a CPU running float32 that multiplies bf16 natively (AVX512-BF16, AMX), as spcli run.")] = "auto",
        device: Annotated[str, typer.Option(help="auto, cpu, cuda, cuda:N.")] = "auto",
        html: Annotated[bool, typer.Option(help="Also write a self-contained report.html.")] = False,
        prompt_field: Annotated[str, typer.Option(help="INPUT field holding prompt text, as `spcli run --prompt-field`.")] = "prompt",
        messages_field: Annotated[str, typer.Option(help="INPUT field holding chat messages, as `spcli run --messages-field`.")] = "messages",
        id_field: Annotated[str, typer.Option(help="INPUT field holding the row id, as `spcli run --id-field`.")] = "id",
    ) -> None:
        from spcli.config.run import FieldConfig
        from spcli.config.scoring import ScoreConfig, SelectConfig
        from spcli.evaluate.config import EvalConfig, parse_variant, split_keeps, split_list
        from spcli.evaluate.matched import matched_table
        from spcli.evaluate.report import text_table
        from spcli.evaluate.run import run_eval
        from spcli.evaluate.tasks import expand_tasks

        first, *others = split_list(speculator, str, "--speculator") if speculator else (None,)
        cfg = EvalConfig(
            out=out, inputs=tuple(inputs or ()), tasks=expand_tasks(t for item in task or () for t in split_list(item, str, "--task")),
            lengths=split_list(lengths, int, "--lengths"), model=model, speculator=first, extra_speculators=tuple(others),
            variants=tuple(parse_variant(v) for v in variant or ()),
            keeps=split_keeps(keep), selectors=split_list(selector, str, "--selector"), samples=samples,
            seed=seed, max_tokens=max_tokens, compare_tokens=compare_tokens, bootstrap=bootstrap, dtype=dtype, speculator_dtype=speculator_dtype,
            device=device, html=html, match_auto=match_auto, speculator_chunk=speculator_chunk,
            select=SelectConfig(keep=1.0, chunk=chunk, keep_first=keep_first, keep_last=keep_last, min_tokens=min_tokens,
                                min_free=min_free, unit=unit, max_unit=max_unit, unit_score=unit_score, protect=protect,
                                keep_min=keep_min, keep_max=keep_max),
            score=ScoreConfig(lookahead=lookahead, window=window, score_layers=score_layers, pool=pool, rows=rows,
                              restate=restate),
            fields=FieldConfig(prompt=prompt_field, messages=messages_field, id=id_field),
        )
        results = run_eval(cfg, log=lambda msg: typer.echo(msg, err=True))
        typer.echo(text_table(results["summary"], html))
        if results["matched"]:
            typer.echo("\n" + matched_table(results["matched"]))
