"""`--help` layout: options grouped in panels, in a table that never cuts an option's name.

Typer gives the long name, the short name, the negative name and the type a column each; at 80
columns `--gpu-memory-utilization` and `--no-enforce-eager` then squeeze the help into ~19
characters and rich cuts names (`--speculator-chu`). Here a row is: the required mark | the names
(`--out, -o`; a negative name on the next line) and the type below them | the help. The names
column is as wide as its longest name and never wraps; the help takes the rest.

Panels are assigned by option name (`PANELS`), the same name in the same panel in every command,
and a command's own options (`COMMAND_PANELS`) in a panel of their own; an option named nowhere stays
in Typer's "Options" panel (tests/test_help.py wants every option of run, eval, bench and calibrate
in a panel).
"""

from __future__ import annotations

INPUT, MODEL, SELECTION, GENERATION, ENGINE, OUTPUT = (
    "Input", "Model and speculator", "Selection", "Generation", "Engine", "Output")
ORDER = (INPUT, MODEL, SELECTION, GENERATION, ENGINE, OUTPUT)

PANELS: dict[str, str] = {
    **dict.fromkeys(("prompt_field", "messages_field", "id_field", "instruction_field", "instruction_at", "group_field", "max_record_bytes",
                     "truncate"), INPUT),
    **dict.fromkeys(("model", "speculator", "lookahead", "window", "score_layers", "pool", "rows", "score_impl",
                     "speculator_chunk"), MODEL),
    **dict.fromkeys(("keep", "keep_scale", "keep_min", "keep_max", "chunk", "keep_first", "keep_last", "min_tokens",
                     "min_free", "max_prune_cost", "unit", "max_unit", "unit_score", "protect", "restate", "groups",
                     "group_max", "group_rule"), SELECTION),
    **dict.fromkeys(("max_tokens", "temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty",
                     "repetition_penalty", "stop", "seed", "logprobs"), GENERATION),
    **dict.fromkeys(("engine", "device", "dtype", "speculator_dtype", "batch_size", "tp", "max_model_len", "max_prompt_len", "gpu_memory_utilization",
                     "max_num_batched_tokens", "enforce_eager", "max_num_seqs", "kv_cache_dtype",
                     "speculator_placement", "speculator_overlap", "ray", "ray_workers", "split_rows"), ENGINE),
    **dict.fromkeys(("out", "output_format", "save_scores", "pass_through", "commit_interval", "fresh", "force",
                     "retry_failed", "fail_on_error", "quiet", "verbose"), OUTPUT),
}
# a command's own options: one panel of its own, printed first (`seed` there is the tasks' seed, not sampling's)
COMMAND_PANELS: dict[str, tuple[str, tuple[str, ...]]] = {
    "eval": ("Tasks and report", ("task", "lengths", "samples", "seed", "selector", "variant", "compare_tokens",
                                  "bootstrap", "match_auto", "html")),
    "bench": ("Benchmark", ("lengths", "batch", "repeats", "warmup", "ttft_limit", "json")),
    "calibrate": ("Calibration", ("keep_for", "tasks", "hold_out", "unit", "lengths", "samples", "seed", "windows", "metric",
                                  "target_recall", "max_cost", "no_paper", "target_agreement", "target_kl",
                                  "write_profile", "from_results")),
}
PANELLED_COMMANDS = ("run", *COMMAND_PANELS)  # commands whose options are grouped; the others keep one "Options" panel


def assign_panels(command, ctx) -> None:
    """Give each of a command's options its panel (an explicit rich_help_panel wins), panels in ORDER, --help
    last; arguments stay in Typer's "Arguments" panel, printed first."""
    if command.name not in PANELLED_COMMANDS:
        return
    from typer.core import TyperOption

    own, own_names = COMMAND_PANELS.get(command.name, (None, ()))
    panels = {**PANELS, **dict.fromkeys(own_names, own)}
    for param in command.params:
        if isinstance(param, TyperOption) and getattr(param, "rich_help_panel", None) is None and param.name in panels:
            param.rich_help_panel = panels[param.name]
    help_option = command.get_help_option(ctx)
    if help_option is not None:
        help_option.rich_help_panel = "Help"
    rank = {name: i for i, name in enumerate((own, *ORDER) if own else ORDER)}
    command.params.sort(key=lambda p: rank.get(getattr(p, "rich_help_panel", None), len(ORDER)))


def _names(param, ctx):
    from rich.text import Text
    from typer import rich_utils as ru
    from typer.core import TyperArgument

    if isinstance(param, TyperArgument):
        text = Text(param.display_name_raw + ("..." if param.nargs != 1 else ""))
        return ru.highlighter(text)
    longs = [o for o in param.opts if o.startswith("--")]
    shorts = [o for o in param.opts if not o.startswith("--")]
    text = ru.highlighter(Text(", ".join(longs + shorts)))
    if param.secondary_opts:
        text.append("\n")
        text.append(ru.negative_highlighter(Text(", ".join(param.secondary_opts))))
    kind = param.display_type_rich(ctx=ctx)
    if kind:
        text.append("\n  ")
        text.append(kind, style=ru.STYLE_TYPES)
    return text


def print_options_panel(*, name, params, ctx, markup_mode, console) -> None:
    """Typer's `_print_options_panel`, three columns: required | names and type | help."""
    from rich.panel import Panel
    from rich.table import Table
    from rich.text import Text
    from typer import rich_utils as ru

    if not params:
        return
    names = [_names(p, ctx) for p in params]
    width = max(len(line) for n in names for line in n.plain.splitlines())
    table = Table(highlight=True, show_header=False, expand=True, box=None, padding=(0, 1), pad_edge=False)
    table.add_column(width=1, no_wrap=True)
    table.add_column(min_width=width, max_width=width, no_wrap=True)
    table.add_column(ratio=1)
    for param, cell in zip(params, names):
        required = Text(ru.REQUIRED_SHORT_STRING, style=ru.STYLE_REQUIRED_SHORT) if param.required else Text("")
        table.add_row(required, cell, ru._get_parameter_help(param=param, ctx=ctx, markup_mode=markup_mode))
    console.print(Panel(table, border_style=ru.STYLE_OPTIONS_PANEL_BORDER, title=name,
                        title_align=ru.ALIGN_OPTIONS_PANEL))


def install() -> None:
    """Route Typer's help through `assign_panels` and `print_options_panel` (its private names: checked by
    tests/test_help.py at 80 columns; where they are missing, Typer's own layout stays)."""
    from typer import rich_utils as ru

    if not hasattr(ru, "_print_options_panel") or not hasattr(ru, "rich_format_help"):
        return
    original = getattr(ru.rich_format_help, "__wrapped__", ru.rich_format_help)

    def rich_format_help(*, obj, ctx, markup_mode):
        assign_panels(obj, ctx)
        return original(obj=obj, ctx=ctx, markup_mode=markup_mode)

    rich_format_help.__wrapped__ = original
    ru.rich_format_help = rich_format_help
    ru._print_options_panel = print_options_panel
