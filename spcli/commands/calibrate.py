"""`spcli calibrate`: which speculator layer and observation window keep the facts, at what cost; with
--keep-for, which keep rate suits the user's own prompts."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from spcli.config.scoring import KEEP_SCALE, MIN_TOKENS, SPECULATOR_CHUNK


def register(app: typer.Typer) -> None:
    @app.command(name="calibrate")
    def _cmd(
        inputs: Annotated[Optional[list[str]], typer.Argument(metavar="INPUT", help="With --keep-for: your JSONL/Parquet shards, globs or directories, as for `spcli run`.", show_default=False)] = None,
        keep_for: Annotated[bool, typer.Option("--keep-for", help="Calibrate the keep rate on a sample of INPUT instead of the layers: fidelity against full prefill at each --keep and auto; prints the `spcli run` flags.")] = False,
        model: Annotated[str, typer.Option(help="Base model name, local folder, GGUF file or cached HF id.")] = "smollm2-135m",
        speculator: Annotated[Optional[str], typer.Option(help="Speculator model or self / self:K; its layers are swept. Default: the model's.")] = None,
        tasks: Annotated[str, typer.Option(help="Built-in tasks, comma-separated (their fact sentences are the needles); the families needles and shapes stand for their tasks.")] = "niah,niah-multi,multidoc-qa",
        hold_out: Annotated[str, typer.Option("--hold-out", help="Tasks of --tasks measured and reported but not chosen on (comma-separated): a check on shapes the choice never saw.")] = "",
        unit: Annotated[str, typer.Option(help="Selection unit, as `spcli run --unit` (clause, sentence, word, chunk).")] = "clause",
        lengths: Annotated[str, typer.Option(help="Prompt lengths in tokens, comma-separated.")] = "2048,4096",
        samples: Annotated[Optional[int], typer.Option(help="Prompts per task and length; with --keep-for: records drawn from INPUT (seeded, uniform). Default: 8; with --keep-for 32.", show_default=False)] = None,
        keep: Annotated[Optional[str], typer.Option(help="Keep rates, comma-separated; the target must hold at each. With --keep-for: the rates swept (auto too). Default: 0.1,0.2; with --keep-for 0.05,0.1,0.2,0.3,0.5.", show_default=False)] = None,
        windows: Annotated[str, typer.Option(help="Observation windows W (the last W prompt queries, causal), comma-separated.")] = "16,32,64",
        target_recall: Annotated[float, typer.Option(help="Mean recall (--metric) every task must reach at every keep.")] = 0.95,
        metric: Annotated[str, typer.Option(help="Recall of a prompt: facts, the share of its fact sentences kept whole (an answer needs the whole fact; on the Qwen eval it tracks accuracy where token recall does not), or tokens, the share of fact tokens kept.")] = "facts",
        max_cost: Annotated[Optional[float], typer.Option(help="Speed budget, as a share of one full speculator forward: the choice is the layer and setting with the best worst-case recall among those costing at most this (each task and keep is checked against --target-recall). Default: none, the cheapest that meets --target-recall.", show_default=False)] = None,
        pool: Annotated[Optional[str], typer.Option(help="Average-pool kernels over token scores (odd), comma-separated: each is swept. --keep-for: one, as `spcli run --pool`. Default: the model's (the paper's 13; smollm2-135m: 31).", show_default=False)] = None,
        chunk: Annotated[Optional[str], typer.Option(help="Selection chunks in tokens, comma-separated: each is swept. --keep-for: one, as `spcli run --chunk`. Default: the model's (the paper's 32; smollm2-135m: 8).", show_default=False)] = None,
        rows: Annotated[Optional[str], typer.Option(help="Row aggregations, comma-separated (mean, max): each is swept. --keep-for: one, as `spcli run --rows`. Default: the model's (smollm2-135m: max, measured; otherwise mean).", show_default=False)] = None,
        no_paper: Annotated[bool, typer.Option("--no-paper", help="Do not also score the paper's recipe (every layer, look-ahead 8), the reference row.")] = False,
        out: Annotated[str, typer.Option("--out", "-o", help="Output directory: results.json and calibrate.png; with --keep-for: results.json and keep_fidelity.png. (--write-profile writes the profile to ~/.cache/spcli/profiles/ or $SPCLI_CACHE/profiles/, not here.)")] = "out/calibrate",
        write_profile: Annotated[bool, typer.Option("--write-profile", help="Store the choice as this model's profile: `spcli run` uses it where flags leave window, look-ahead, layers, pool, rows and chunk unset.")] = False,
        from_results: Annotated[Optional[str], typer.Option("--from-results", help="With --write-profile: write the profile from a saved run's results.json (a file or its --out folder) instead of measuring again; no model loads. Refused where that run was of another --model or --speculator, or the model folder has changed since.", show_default=False)] = None,
        dtype: Annotated[str, typer.Option(help="auto, bfloat16, float16 or float32. auto: the model's dtype on GPU and on CPUs with AMX, float32 on other CPUs (bf16 is slower there).")] = "auto",
        speculator_dtype: Annotated[str, typer.Option(help="The speculator's: auto, bfloat16, float16 or float32. auto: the run's dtype, except bfloat16 on a CPU running float32 that multiplies bf16 natively (AVX512-BF16, AMX), as spcli run.")] = "auto",
        device: Annotated[str, typer.Option(help="auto, cpu, cuda, cuda:N.")] = "auto",
        seed: Annotated[int, typer.Option(help="Seed of the built-in tasks (with --keep-for: of the sample).")] = 0,
        target_agreement: Annotated[Optional[float], typer.Option(help="--keep-for: mean agreement of the first 16 greedy tokens with full prefill to reach (default 0.9).", show_default=False)] = None,
        target_kl: Annotated[Optional[float], typer.Option(help="--keep-for: mean first-token KL from full prefill to stay under, instead.", show_default=False)] = None,
        keep_scale: Annotated[float, typer.Option(help="--keep-for: keep auto's scale, as `spcli run --keep-scale`.")] = KEEP_SCALE,
        keep_min: Annotated[float, typer.Option(help="--keep-for: keep auto's least fraction, as `spcli run --keep-min`.")] = 0.05,
        keep_max: Annotated[float, typer.Option(help="--keep-for: keep auto's most fraction, as `spcli run --keep-max`.")] = 0.5,
        min_tokens: Annotated[int, typer.Option(help="--keep-for: prompts shorter than this are not pruned, as in `spcli run`.")] = MIN_TOKENS,
        window: Annotated[Optional[int], typer.Option(help="--keep-for: as `spcli run --window`. Default: the model's.", show_default=False)] = None,
        lookahead: Annotated[Optional[int], typer.Option(help="--keep-for: as `spcli run --lookahead`. Default: the model's.", show_default=False)] = None,
        score_layers: Annotated[Optional[str], typer.Option(help="--keep-for: as `spcli run --score-layers`. Default: the model's.", show_default=False)] = None,
        speculator_chunk: Annotated[int, typer.Option(help="--keep-for: tokens per speculator prefill call, as `spcli run --speculator-chunk`.")] = SPECULATOR_CHUNK,
        prompt_field: Annotated[str, typer.Option(help="--keep-for: INPUT field holding prompt text, as `spcli run --prompt-field`.")] = "prompt",
        messages_field: Annotated[str, typer.Option(help="--keep-for: INPUT field holding chat messages, as `spcli run --messages-field`.")] = "messages",
        id_field: Annotated[str, typer.Option(help="--keep-for: INPUT field holding the row id, as `spcli run --id-field`.")] = "id",
        instruction_field: Annotated[str, typer.Option(help="--keep-for: INPUT field holding an instruction put beside the prompt and never dropped, as `spcli run --instruction-field`.")] = "instruction",
        instruction_at: Annotated[str, typer.Option(help="--keep-for: after or before the prompt, as `spcli run --instruction-at`.")] = "after",
    ) -> None:
        """Sweep every speculator layer, window, pool, row aggregation and chunk for fact recall and cost; recommend the cheapest that meets --target-recall, or with --max-cost the best that fits the speed budget; print its `spcli run` flags.

        One full speculator pass per prompt scores every (layer, window, pool, rows, chunk, keep); cost(l) is the measured share of the full forward spent up to layer l, what an early-exit speculator (--score-layers l --lookahead 0) pays.

        With --keep-for INPUT...: on a seeded sample of your records (no labels), full prefill against each --keep rate and auto, on the stages `spcli run` uses; fidelity (first token, first 16 tokens, first-step KL) with 95% bootstrap CIs; the smallest kept fraction meeting --target-agreement (or --target-kl) and its `spcli run` flags; results.json and keep_fidelity.png in --out.
        """
        from spcli.calibrate.config import CalibrateConfig
        from spcli.calibrate.layers import run_layers
        from spcli.calibrate.report import text_table
        from spcli.config.scoring import SelectConfig
        from spcli.evaluate.config import split_list
        from spcli.evaluate.tasks import expand_tasks

        if from_results is not None:
            return _from_results(from_results, write_profile, model, speculator)
        if keep_for or inputs:
            return _keep_for(inputs, keep_for, out=out, model=model, speculator=speculator, samples=samples or 32,
                             keeps=keep or "0.05,0.1,0.2,0.3,0.5", target_agreement=target_agreement,
                             target_kl=target_kl, seed=seed, dtype=dtype, speculator_dtype=speculator_dtype, device=device, pool=_one(pool, "--pool"),
                             speculator_chunk=speculator_chunk,
                             select=dict(chunk=_one(chunk, "--chunk"), keep_scale=keep_scale, keep_min=keep_min, keep_max=keep_max, min_tokens=min_tokens),
                             score=dict(window=window, lookahead=lookahead, score_layers=score_layers, rows=rows),
                             fields=dict(prompt=prompt_field, messages=messages_field, id=id_field,
                                         instruction=instruction_field, instruction_at=instruction_at))
        cfg = CalibrateConfig(
            out=out, model=model, speculator=speculator, tasks=expand_tasks(split_list(tasks, str, "--tasks")),
            hold_out=expand_tasks(split_list(hold_out, str, "--hold-out")) if hold_out else (),
            select=SelectConfig(keep=1.0, unit=unit),
            lengths=split_list(lengths, int, "--lengths"), samples=samples or 8, keeps=split_list(keep or "0.1,0.2", float, "--keep"),
            windows=split_list(windows, int, "--windows"), target_recall=target_recall, metric=metric, max_cost=max_cost, paper=not no_paper,
            pools=split_list(pool, int, "--pool") if pool else (), chunks=split_list(chunk, int, "--chunk") if chunk else (),
            rows=split_list(rows, str, "--rows") if rows else (),
            write_profile=write_profile, dtype=dtype, speculator_dtype=speculator_dtype, device=device, seed=seed,
        )
        results = run_layers(cfg, log=lambda msg: typer.echo(msg, err=True))
        typer.echo(text_table(results))


def _from_results(source: str, write_profile: bool, model: str, speculator: str | None) -> None:
    from spcli.calibrate.profile import choice_score, reinstate
    from spcli.errors import ConfigError
    from spcli.models import profiles

    if not write_profile:
        raise ConfigError("--from-results writes a profile from a saved run: give --write-profile with it")
    path, results = reinstate(source, model, speculator)
    typer.echo(f"profile written: {path}\n  from {source} ({profiles.describe(choice_score(results['choice']))}; "
               f"measured {results['config']['samples']} prompts per task and length)\n  {results['run_flags']}")


def _one(text: str | None, flag: str) -> int | None:
    """--keep-for takes one --pool / --chunk, as `spcli run` does."""
    from spcli.errors import ConfigError

    if text is None:
        return None
    try:
        return int(text)
    except ValueError:
        raise ConfigError(f"{flag} with --keep-for takes one number, as `spcli run {flag}`, got {text!r}") from None


def _keep_for(inputs, keep_for: bool, *, keeps: str, pool: int, select: dict, score: dict, fields: dict, **kw) -> None:
    """`spcli calibrate --keep-for INPUT...`: the flags map one-to-one onto KeepForConfig."""
    from spcli.calibrate.keep import KeepForConfig, run_keep
    from spcli.calibrate.keep_report import text_table
    from spcli.config.run import FieldConfig
    from spcli.config.scoring import AUTO, ScoreConfig, SelectConfig
    from spcli.errors import ConfigError
    from spcli.evaluate.config import split_list

    if not keep_for:
        raise ConfigError("INPUT files are for --keep-for (keep calibration on your records); give --keep-for or no INPUT")
    cfg = KeepForConfig(inputs=tuple(inputs or ()), keeps=split_list(keeps, float, "--keep"),
                        select=SelectConfig(keep=AUTO, **select), score=ScoreConfig(pool=pool, **score),
                        fields=FieldConfig(**fields), **kw)
    results = run_keep(cfg, log=lambda msg: typer.echo(msg, err=True))
    typer.echo(text_table(results))
