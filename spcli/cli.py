"""The command line: flags map one-to-one onto config fields; errors are handled in `main`."""

from __future__ import annotations

import sys
from typing import Annotated, Optional

import typer

from spcli.commands import panels as help_panels
from spcli.config.run import GROUP_MAX
from spcli.config.scoring import KEEP_SCALE, MAX_PRUNE_COST, MAX_UNIT, MIN_FREE, MIN_TOKENS, PROTECT, SPECULATOR_CHUNK
from spcli.errors import EXIT_FAILURE, SpcliError
from spcli.models.device import nvml_device_checks

app = typer.Typer(
    help="Offline bulk LLM prefill with Speculative Prefill (arXiv:2502.02789).\n\n"
    "Exit codes: 0 done, 1 internal error, 2 bad input or configuration, 65 done with error rows (run "
    "--fail-on-error), 75 interrupted (resumable: run again), 130 Ctrl-C; spcli status: 0 done, 3 not done yet, "
    "4 failed.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

STATE = {"debug": False}


def _flag_type(self, ctx):
    """No `<bool>` after a flag: a flag takes no value (typer shows its type for every option)."""
    return None if self.is_flag else _option_type(self, ctx)


_option_type = typer.core.TyperOption.display_type_rich
typer.core.TyperOption.display_type_rich = _flag_type


def _usage_name(self) -> str:
    """`INPUT...` on the usage line, as click writes a required argument (typer writes `{INPUT}...`)."""
    name = self.display_name_raw if self.required else f"[{self.display_name_raw}]"
    return name + ("..." if self.nargs != 1 else "")


typer.core.TyperArgument._usage_display_name = _usage_name


def bare_ray(args: list[str]) -> list[str]:
    """`--ray [ADDRESS]`: a bare --ray (last, or before another option or an existing input) is `--ray=`, a local
    cluster (click's options take a value or none, never an optional one)."""
    import os

    out = list(args)
    for i, a in enumerate(out):
        if a == "--":
            break
        following = out[i + 1] if i + 1 < len(out) else None
        if a == "--ray" and (following is None or following.startswith("-") or os.path.exists(following)):
            out[i] = "--ray="
    return out


class RunCommand(typer.core.TyperCommand):
    def parse_args(self, ctx, args):
        return super().parse_args(ctx, bare_ray(args))
help_panels.install()  # options in panels (Input, Model and speculator, ...), no name cut at 80 columns


def _version(value: bool) -> None:
    if value:
        from spcli import __version__

        typer.echo(f"spcli {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")] = False,
    debug: Annotated[bool, typer.Option(help="Show tracebacks.")] = False,
    log_level: Annotated[str, typer.Option(help="DEBUG, INFO, WARNING or ERROR.")] = "INFO",
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Only warnings and errors; no progress.")] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="DEBUG log lines (as --log-level DEBUG).")] = False,
    log_json: Annotated[bool, typer.Option("--log-json", help="Log lines (progress included) as JSON objects, one per line.")] = False,
) -> None:
    from spcli.job.progress import setup_logging

    STATE["debug"] = debug
    STATE["quiet"] = quiet
    setup_logging("DEBUG" if verbose else log_level, quiet, log_json)


@app.command(cls=RunCommand)
def run(
    inputs: Annotated[list[str], typer.Argument(metavar="INPUT", help="JSONL (.jsonl, .jsonl.gz) or Parquet shards, globs or directories.", show_default=False)],
    out: Annotated[str, typer.Option("--out", "-o", help="Output directory (created; resumed when it exists).")],
    model: Annotated[str, typer.Option(help="Model name (see `spcli models`), local folder, GGUF file (converted once) or cached HF id.")] = "smollm2-135m",
    speculator: Annotated[Optional[str], typer.Option(help="Speculator model (another tokenizer than the base's is scored through character spans); self = the base model's own weights (early exit after its last scoring layer); self:K = its first K layers. Default: the model's.")] = None,
    keep: Annotated[str, typer.Option(metavar="FLOAT|auto", help="Fraction of prompt tokens the base model prefills; 1.0 = full prefill; auto = per prompt, --keep-scale times the chunks that stand out, within --keep-min..--keep-max (measured against a fixed keep at the same mean: closer to full prefill, not more answers; docs/guide/run.md, Choosing keep).")] = "0.1",
    keep_scale: Annotated[float, typer.Option(help="--keep auto: keep this many times the chunks that stand out of the prompt's unpooled importance (the effective number of chunks above the median, exp of their entropy): one needle gets few, a text to summarise many (measured: docs/results.md, keep auto).")] = KEEP_SCALE,
    keep_min: Annotated[float, typer.Option(help="--keep auto: the least fraction of a prompt kept.")] = 0.05,
    keep_max: Annotated[float, typer.Option(help="--keep auto: the most fraction of a prompt kept.")] = 0.5,
    lookahead: Annotated[Optional[int], typer.Option(help="Greedy look-ahead tokens of the speculator, each a query row (the paper: 8). A truncated self:K decodes poor look-ahead tokens. Default: the model's (spcli models).")] = None,
    window: Annotated[Optional[int], typer.Option(help="The last W prompt tokens' queries score, each over the keys up to its own position; 0 = the last token only. Default: the model's.")] = None,
    score_layers: Annotated[Optional[str], typer.Option(help="Speculator layers that score: all, I, I-J or I,J,... (negatives from the end). Without look-ahead the speculator stops after the last one. Default: the model's.")] = None,
    chunk: Annotated[Optional[int], typer.Option(help="--unit chunk: tokens per selection chunk; sentence/word: the size of the word-aligned pieces a long sentence splits into. Default: the model's (the paper's 32; smollm2-135m: 8).", show_default=False)] = None,
    unit: Annotated[str, typer.Option(help="What selection keeps or drops whole: clause (a clause of at most --max-unit tokens: a sentence, line, or text that ends in . ! ? before a lower-case word or in ;; a longer one in word-aligned pieces of about --chunk that never cut a number, code, date or name from the two words before it), sentence (a sentence or line, as clause but Bling Fire's sentences alone and pieces cut at any word), word (word-aligned pieces of about --chunk; no kept span ends inside a word or number) or chunk (fixed --chunk tokens, the paper's). Units are taken best first while they fit; one that does not is taken if half of it fits, so a row keeps its budget to within half a unit.")] = "clause",
    max_unit: Annotated[int, typer.Option(help="--unit clause or sentence: the longest clause (sentence) kept or dropped as one unit, in tokens.")] = MAX_UNIT,
    unit_score: Annotated[str, typer.Option(help="A unit's score from its tokens' importance: mean, max, or topK (the mean of its K best, e.g. top4).")] = "mean",
    pool: Annotated[Optional[int], typer.Option(help="Average-pool kernel over token scores (odd; 1 = none). Default: the model's (the paper's 13; smollm2-135m: 31).", show_default=False)] = None,
    rows: Annotated[Optional[str], typer.Option(help="How the query rows' scores (each the max over heads and layers) combine: mean (the paper's) or max (a token one row attends to counts). Default: the model's (smollm2-135m: max, measured; otherwise mean).", show_default=False)] = None,
    keep_first: Annotated[int, typer.Option(help="First tokens always kept (attention sink).")] = 4,
    keep_last: Annotated[int, typer.Option(help="Last tokens always kept (question and generation prompt).")] = 64,
    min_tokens: Annotated[int, typer.Option(help="Prompts shorter than this are prefilled whole (no speculator).")] = MIN_TOKENS,
    min_free: Annotated[int, typer.Option(help="The rule for short prompts: a row keeps ceil(keep x its tokens), the forced --keep-first/--keep-last included, but at least the forced ones plus this many chosen ones (a 1k-token prompt at keep 0.1 keeps 196, not 103); 0 = the keep rate alone.")] = MIN_FREE,
    max_prune_cost: Annotated[float, typer.Option(help="A prompt is pruned only where its speculator pass plus its kept tokens' prefill are estimated (in FLOPs) under this share of its full prefill; the others are prefilled whole, as at keep 1.0, and the run's end says how many (keep 0.5 with a speculator of half the base's layers: whole). inf = always prune.")] = MAX_PRUNE_COST,
    protect: Annotated[str, typer.Option(help="Text never dropped, kept on top of the keep budget: the content of chat messages of these roles, and 'instruction' = a record's instruction field (--instruction-at), comma-separated; '' = none.")] = PROTECT,
    restate: Annotated[bool, typer.Option("--restate/--no-restate", help="With --instruction-at before: the speculator reads a record's instruction (--instruction-field) again after the prompt, so a question asked before the document scores it (the base model never sees it twice).")] = True,
    max_tokens: Annotated[int, typer.Option(help="Tokens to generate per row (a record's max_tokens overrides).")] = 64,
    temperature: Annotated[float, typer.Option(help="Sampling temperature; 0 = greedy.")] = 0.0,
    seed: Annotated[int, typer.Option(help="Sampling seed: each row draws from its own generator, seeded by this and its id (a record's own seed instead, where it has one), the same on a rerun or a resume.")] = 0,
    logprobs: Annotated[int, typer.Option(help="Per generated token, its logprob and the top N alternatives (column `logprobs`); 0 = off.")] = 0,
    top_p: Annotated[float, typer.Option(help="Sampling: only the most likely tokens whose probabilities add up to P (0, 1]. This and the next six are vLLM's SamplingParams, applied on both engines; a record's own field of that name overrides.")] = 1.0,
    top_k: Annotated[int, typer.Option(help="Sampling: only the K most likely tokens; 0 = all.")] = 0,
    min_p: Annotated[float, typer.Option(help="Sampling: only tokens at least P times as likely as the most likely one; 0 = all.")] = 0.0,
    presence_penalty: Annotated[float, typer.Option(help="Subtracted from the logit of a token already output, in [-2, 2] (greedy rows too).")] = 0.0,
    frequency_penalty: Annotated[float, typer.Option(help="Subtracted from a token's logit per time it was output, in [-2, 2].")] = 0.0,
    repetition_penalty: Annotated[float, typer.Option(help="A token of the prompt (its kept tokens) or the output: logit / P where positive, x P otherwise; 1 = off.")] = 1.0,
    stop: Annotated[Optional[list[str]], typer.Option(metavar="TEXT", help="Stop when TEXT is generated (repeat for several); TEXT is left out of the output, finish_reason stop. A newline in bash: $'\\n'.", show_default=False)] = None,
    batch_size: Annotated[Optional[int], typer.Option(help="hf: rows prefilled and decoded together (default 8). vllm: the speculator window, records scored together while vLLM runs as many rows as its KV cache and --max-num-seqs hold; default: enough prompts to fill one batched speculator pass per worker (32,768 tokens), at most what vLLM runs at once (docs/engine-loop.md). One committed part holds every row finished in --commit-interval.", show_default=False)] = None,
    dtype: Annotated[str, typer.Option(help="auto, bfloat16, float16 or float32. auto: the model's dtype on GPU and on CPUs with AMX, float32 on other CPUs (bf16 is slower there); the start banner says which and why.")] = "auto",
    speculator_dtype: Annotated[str, typer.Option(help="auto, bfloat16, float16 or float32: the speculator's. auto: the run's dtype, except on a CPU running float32 that multiplies bf16 natively (AVX512-BF16, AMX): bfloat16 there, ~2x faster (its scores summed in float32); the banner says which.")] = "auto",
    engine: Annotated[str, typer.Option(help="hf (transformers) or vllm.")] = "hf",
    device: Annotated[str, typer.Option(help="auto, cpu, cuda, cuda:N.")] = "auto",
    prompt_field: Annotated[str, typer.Option(help="Input field holding prompt text.")] = "prompt",
    messages_field: Annotated[str, typer.Option(help="Input field holding chat messages.")] = "messages",
    id_field: Annotated[str, typer.Option(help="Input field holding the row id (else <file stem>:<row>).")] = "id",
    output_format: Annotated[str, typer.Option(help="parquet, jsonl or openai (OpenAI batch response lines + a Parquet side output).")] = "parquet",
    pass_through: Annotated[Optional[str], typer.Option(metavar="COLS", help="Input columns (comma-separated) copied unchanged into every output row, beside id and output (Parquet keeps their types); with openai, into the Parquet side output.", show_default=False)] = None,
    instruction_field: Annotated[str, typer.Option(help="Input field holding an instruction (a question, a task): put beside the prompt (--instruction-at), a blank line between, and never dropped (--protect instruction). With a raw prompt it is read as one user message through the model's chat template.")] = "instruction",
    instruction_at: Annotated[str, typer.Option(help="Where a record's instruction goes: after = after the prompt (or the last user message's content), right before the answer; before = before the prompt (or the first user message's), and the speculator reads it again after the prompt (--restate).")] = "after",
    groups: Annotated[str, typer.Option(help="auto (= shard): the records of one document (the same prompt-field text, or the same messages but the last; or --group-field) form a group wherever they stand in their shard, found by a first pass over it: the speculator reads the document once, the group keeps the union of its questions' selections in it plus each question's own tokens, and the base prefills it once (vLLM: prefix caching), so a question's answer also depends on its group's other questions (never on the order of the shard's records, batches, workers or resume points); where that would not beat full prefill with the document prefilled once, or the document is under --min-tokens, the group keeps every token and its document is still prefilled once (under --min-tokens, a record whose own part has more to drop than it would keep alone is pruned alone). A gzip or Parquet shard is read through a decoded copy in the output directory, removed when read. consecutive: only records one after another (no first pass). off: each record alone. A directory resumes with the rule it was made with (before groups: off; before shard: consecutive).")] = "auto",
    group_field: Annotated[Optional[str], typer.Option(metavar="NAME", help="Input field whose equal values, one record after another, name a group (instead of equal prompt text).", show_default=False)] = None,
    group_max: Annotated[int, typer.Option(metavar="N", help="Records per group at most, which bounds a group's speculator pass and base prefill: a document with more is cut into groups by the records' own digests (--groups consecutive: at rows that are multiples of N).")] = GROUP_MAX,
    group_rule: Annotated[str, typer.Option(help="What a group keeps of its document: union = the union of its questions' selections, each at --keep (every question keeps what it alone would); document = one selection at --keep of the document from all its questions' scores together (their query rows as one: fewer tokens, a question may lose its fact to another's). Measured: docs/results/qa-job/README.md.")] = "union",
    save_scores: Annotated[bool, typer.Option(help="Also write per-token importance.")] = False,
    truncate: Annotated[str, typer.Option(help="Prompts longer than the model's context minus --max-tokens: error = an error row; left = drop their first tokens (keep the end); middle = drop tokens from the middle (keep the start and the end).")] = "error",
    max_record_bytes: Annotated[int, typer.Option(help="Longer input records become error rows without being parsed.")] = 8 << 20,
    commit_interval: Annotated[float, typer.Option(help="Seconds between commits of finished rows (0 = every batch).")] = 10.0,
    score_impl: Annotated[str, typer.Option(help="Scoring kernel: auto, torch or triton.")] = "auto",
    speculator_chunk: Annotated[int, typer.Option(help="Tokens per speculator prefill call: its activations scale with this, not the prompt (same outputs).")] = SPECULATOR_CHUNK,
    fresh: Annotated[bool, typer.Option(help="Start over: delete this directory's outputs (default: resume).")] = False,
    force: Annotated[bool, typer.Option(help="Append to a directory whose configuration differs.")] = False,
    retry_failed: Annotated[bool, typer.Option(help="Redo the committed error rows first, each replacing its old row (a record still bad stays an error row); then resume.")] = False,
    fail_on_error: Annotated[bool, typer.Option(help="Exit 65 instead of 0 when the finished directory holds error rows (every row is still written; for batch pipelines).")] = False,
    tp: Annotated[Optional[int], typer.Option(help="vllm: tensor-parallel size. Default: the model's.")] = None,
    max_model_len: Annotated[Optional[int], typer.Option(help="vllm: the base's longest request (kept + generated tokens). Default: the model's.")] = None,
    max_prompt_len: Annotated[Optional[int], typer.Option(help="vllm: the speculator's longest prompt (tokens before pruning); sizes its GPU reserve (spcli plan); longer prompts become error rows. Default: the base's positions, or the longest whose reserve leaves vLLM one --max-model-len request (spcli plan).")] = None,
    gpu_memory_utilization: Annotated[Optional[float], typer.Option(help="vllm: fraction of GPU memory vLLM takes. Default: computed to leave room for the speculator.")] = None,
    max_num_batched_tokens: Annotated[Optional[int], typer.Option(help="vllm: tokens per scheduler step (small values force chunked prefill). Default: vLLM's.")] = None,
    enforce_eager: Annotated[Optional[bool], typer.Option("--enforce-eager/--no-enforce-eager", help="vllm: skip torch.compile and CUDA graphs (faster start-up). Default: eager on CPU only.")] = None,
    max_num_seqs: Annotated[Optional[int], typer.Option(help="vllm: most requests in one scheduler step. Default: vLLM's.")] = None,
    kv_cache_dtype: Annotated[str, typer.Option(help="vllm: auto (the model's dtype) or fp8 (half the KV bytes per token).")] = "auto",
    speculator_placement: Annotated[str, typer.Option(help="vllm: workers (a speculator replica on every GPU, each scoring its share of a batch), driver (one copy in this process, on --device; on a CPU it scores while vLLM starts) or auto (workers on GPUs, driver on a CPU).")] = "auto",
    ray: Annotated[Optional[str], typer.Option("--ray", metavar="[ADDRESS]", help="Run on a Ray cluster: a pool of actors, one engine each, that take shards as they free up (a manifest per actor, as Slurm tasks have; a lost actor's work is taken over from its last commit). Alone: ray.init() (RAY_ADDRESS, else a new local cluster); auto: the cluster started on this machine (ray start --head); host:port or ray://host:port: that one. Give it after the inputs (or --ray=ADDRESS). Needs specprefill-cli[ray] (docs/guide/ray.md).", show_default=False)] = None,
    ray_workers: Annotated[Optional[int], typer.Option(help="--ray: actors in the pool. Default: the cluster's GPUs / --tp (vllm) or GPUs (hf); on CPUs, one per 4 CPUs.", show_default=False)] = None,
    split_rows: Annotated[Optional[int], typer.Option(metavar="N", help="--ray: a file of more than N rows runs as ranges of N rows, each taken by whichever actor frees up and resumed on its own (Parquet seeks to a range; JSONL reads up to it). 0: whole files. Default: 10000.", show_default=False)] = None,
    speculator_overlap: Annotated[str, typer.Option(help="vllm, workers: on = each replica scores the next window on a thread (and CUDA stream) of its own while vLLM runs the current one; off = scoring and vLLM's steps take turns; auto = on with GPUs, off on CPU (no spare cores).")] = "auto",
) -> None:
    """Run Speculative Prefill over prompt shards; write outputs and kept-token masks to --out.

    Resumes where the last run in --out stopped. SIGTERM, SIGINT and SIGUSR1 commit what is finished and exit 75 (run again to resume); bad records become rows with `error` set (exit 0, or 65 with --fail-on-error).
    """
    flags = {k: v for k, v in locals().items() if k not in ("inputs", "out", "fail_on_error")}  # the others: RunConfig flags
    from spcli import api
    from spcli.errors import EXIT_INTERRUPTED, EXIT_ROWS_FAILED, Interrupted
    from spcli.job.progress import Progress

    try:
        s = api.run(inputs, out, Progress(quiet=STATE.get("quiet", False)), **flags)  # the Python API's own entry
    except Interrupted as e:
        if STATE["debug"]:
            raise
        typer.echo(f"spcli: interrupted: {e}", err=True)
        sys.exit(EXIT_INTERRUPTED)  # not typer.Exit: click returns its code under standalone_mode=False
    typer.echo(done_line(s))
    if fail_on_error and s.failed:
        sys.exit(EXIT_ROWS_FAILED)


def done_line(s) -> str:
    """The last line of a run: totals over the directory, and this run's own figures when it resumed."""
    from spcli.job.progress import keep_pct

    failed = f"{s.failed} failed"
    if s.failed:
        failed += f": `spcli inspect {s.out} --failed` lists them, --retry-failed redoes them"
    if s.nothing_to_do:
        return f"nothing to do: {s.rows} rows already done{f' ({failed})' if s.failed else ''}; outputs in {s.out}"
    kept = f"prompt tokens {s.prompt_tokens}, kept {s.kept_tokens} ({keep_pct(s.kept_tokens, s.prompt_tokens)})"
    wall = max(s.wall_this_run_s, 1e-9)
    speed = (f"output tokens {s.output_tokens_this_run}, {s.wall_this_run_s:.1f} s "
             f"({s.prompt_tokens_this_run / wall:.0f} prompt tok/s, {s.output_tokens_this_run / wall:.1f} output tok/s)")
    if s.rows_this_run == s.rows and not s.retried:
        return f"done: {s.rows} rows ({failed}), {kept}, {speed}; outputs in {s.out}"
    retried = (f", {s.retried} failed row{'' if s.retried == 1 else 's'} redone ({s.retried_ok} now without error)"
               if s.retried else "")
    this_kept = (f"prompt tokens {s.prompt_tokens_this_run}, kept {s.kept_tokens_this_run} "
                 f"({keep_pct(s.kept_tokens_this_run, s.prompt_tokens_this_run)})")
    return (f"done: {s.rows} rows in total ({failed}), {kept}; this run: {s.rows_this_run} new rows{retried}, "
            f"{this_kept}, {speed}; outputs in {s.out}")


@app.command()
def models() -> None:
    """List model names, the model each is (its Hugging Face id), where its files are, and whether they are on this machine."""
    from spcli.models import listing
    from spcli.models.lookup import PRESETS

    typer.echo("\n".join(listing.table()))
    typer.echo("\nscoring with the default speculator, where flags leave it open (flags > calibrate profile > preset > "
               "fallback):")
    for p in PRESETS.values():
        typer.echo(f"{p.name:<20} {_scoring(p.name, p.speculator)}")
    typer.echo("\n" + "\n".join(listing.where_section()))
    typer.echo("\n" + "\n".join(listing.part_wheels_section()))


def _scoring(name: str, speculator: str) -> str:
    from spcli.models import profiles
    from spcli.models.lookup import local_folder

    # a profile is keyed by the model folder's content: only a folder on this machine can have one
    d, source = profiles.score_defaults(name, local_folder(name), speculator)
    return f"{profiles.describe(d)} ({source})"


def _register_commands() -> None:
    from spcli.commands import ALL

    for module in ALL:
        module.register(app)


_register_commands()


GLOBAL_FLAGS = ("-q", "--quiet", "-v", "--verbose", "--debug", "--log-json")  # spcli's own, taking no value
GLOBAL_VALUED = ("--log-level",)


def hoist_global_flags(argv: list[str]) -> list[str]:
    """`spcli run ... -q` as `spcli -q run ...`: the global flags given after the subcommand move before it
    (click reads them only there). Nothing after a `--` moves: it belongs to the command (slurm submit)."""
    names = ({c.name or c.callback.__name__.replace("_", "-") for c in app.registered_commands}
             | {g.name for g in app.registered_groups})
    at = next((i for i, a in enumerate(argv) if a in names), None)
    if at is None:
        return argv
    head, rest, moved = argv[:at], [], []
    tail = argv[at:]
    i = 0
    while i < len(tail):
        a = tail[i]
        if a == "--":
            rest += tail[i:]
            break
        if a in GLOBAL_FLAGS or any(a.startswith(f + "=") for f in GLOBAL_VALUED):
            moved.append(a)
        elif a in GLOBAL_VALUED and i + 1 < len(tail):
            moved += [a, tail[i + 1]]
            i += 1
        else:
            rest.append(a)
        i += 1
    return head + moved + rest


def main() -> None:
    nvml_device_checks()  # before any library asks torch for CUDA: vLLM forks its processes later
    try:
        code = app(args=hoist_global_flags(sys.argv[1:]), standalone_mode=False)  # click returns typer.Exit's code
        sys.exit(code if isinstance(code, int) else 0)
    except SpcliError as e:
        if STATE["debug"]:
            raise
        typer.echo(f"spcli: error: {e}", err=True)
        sys.exit(e.exit_code)
    except (typer.Exit, SystemExit) as e:
        sys.exit(getattr(e, "exit_code", getattr(e, "code", 0)))
    except KeyboardInterrupt:
        typer.echo("spcli: interrupted", err=True)
        sys.exit(130)
    except Exception as e:
        if hasattr(e, "show") and isinstance(getattr(e, "exit_code", None), int):  # click's (or typer's vendored click's) usage errors
            e.show()
            sys.exit(e.exit_code)
        if type(e).__name__ == "Abort":
            sys.exit(130)
        if STATE["debug"]:
            raise
        typer.echo(f"spcli: internal error: {type(e).__name__}: {e} (rerun with --debug for the traceback)", err=True)
        sys.exit(EXIT_FAILURE)
