"""`spcli eval`: quality of each selector at each keep rate against full prefill, with 95% bootstrap CIs."""

from __future__ import annotations

from typing import Annotated, Optional

import typer


def register(app: typer.Typer) -> None:
    @app.command(name="eval")
    def _cmd(
        inputs: Annotated[Optional[list[str]], typer.Argument(help="JSONL/Parquet shards (optional `answer` field: string or list).")] = None,
        out: Annotated[str, typer.Option("--out", "-o", help="Output directory: results.json, PNG plots, report.html.")] = "out/eval",
        task: Annotated[Optional[list[str]], typer.Option(help="Built-in task (repeat or comma-separate): niah, niah-multi, kv-retrieval, var-tracking, multidoc-qa.")] = None,
        lengths: Annotated[str, typer.Option(help="Prompt lengths in tokens for built-in tasks, comma-separated.")] = "2048",
        model: Annotated[str, typer.Option(help="Base model name, local folder or cached HF id.")] = "smollm2-135m",
        speculator: Annotated[Optional[str], typer.Option(help="Speculator model or self:K. Default: the model's.")] = None,
        keep: Annotated[str, typer.Option(help="Keep rates, comma-separated; 1.0 = full prefill.")] = "0.1,0.3,0.5,1.0",
        selector: Annotated[str, typer.Option(help="Selectors, comma-separated: specprefill, random, recency, sink-recency, self-information.")] = "specprefill,random,recency,sink-recency,self-information",
        samples: Annotated[int, typer.Option(help="Examples per task and length (or the first N input records).")] = 20,
        seed: Annotated[int, typer.Option(help="Seed of the built-in tasks and the random selector.")] = 0,
        max_tokens: Annotated[Optional[int], typer.Option(help="Tokens to generate. Default: the task's (32-64).")] = None,
        compare_tokens: Annotated[int, typer.Option(help="Greedy tokens compared with full prefill (exact match).")] = 16,
        bootstrap: Annotated[int, typer.Option(help="Bootstrap resamples per confidence interval.")] = 2000,
        lookahead: Annotated[int, typer.Option(help="Speculator look-ahead tokens.")] = 8,
        pool: Annotated[int, typer.Option(help="Average-pool kernel over token scores (odd).")] = 13,
        chunk: Annotated[int, typer.Option(help="Tokens per selection chunk.")] = 32,
        keep_first: Annotated[int, typer.Option(help="First tokens always kept (not by `recency`).")] = 4,
        keep_last: Annotated[int, typer.Option(help="Last tokens always kept.")] = 64,
        min_tokens: Annotated[int, typer.Option(help="Prompts shorter than this are not pruned.")] = 256,
        dtype: Annotated[Optional[str], typer.Option(help="bfloat16, float16 or float32. Default: the model's.")] = None,
        device: Annotated[str, typer.Option(help="auto, cpu, cuda, cuda:N.")] = "auto",
        html: Annotated[bool, typer.Option(help="Also write a self-contained report.html.")] = False,
    ) -> None:
        """Compare selectors at each keep rate with full prefill: fidelity, task scores, CIs, plots."""
        from spcli.config import ScoreConfig, SelectConfig
        from spcli.evaluate.config import EvalConfig, split_list
        from spcli.evaluate.report import text_table
        from spcli.evaluate.run import run_eval

        cfg = EvalConfig(
            out=out, inputs=tuple(inputs or ()), tasks=tuple(t for item in task or () for t in split_list(item, str, "--task")),
            lengths=split_list(lengths, int, "--lengths"), model=model, speculator=speculator,
            keeps=split_list(keep, float, "--keep"), selectors=split_list(selector, str, "--selector"), samples=samples,
            seed=seed, max_tokens=max_tokens, compare_tokens=compare_tokens, bootstrap=bootstrap, dtype=dtype,
            device=device, html=html,
            select=SelectConfig(keep=1.0, chunk=chunk, keep_first=keep_first, keep_last=keep_last, min_tokens=min_tokens),
            score=ScoreConfig(lookahead=lookahead, pool=pool),
        )
        results = run_eval(cfg, log=lambda msg: typer.echo(msg, err=True))
        typer.echo(text_table(results["summary"]))
