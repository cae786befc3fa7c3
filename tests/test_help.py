"""The command reference (docs/cli.md) is the `--help` text, and the help says what the code does."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from typer.testing import CliRunner

from spcli.cli import app

ROOT = Path(__file__).resolve().parents[1]


def gen_cli():
    spec = importlib.util.spec_from_file_location("gen_cli", ROOT / "docs" / "gen_cli.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_docs_cli_md_is_the_help_text():
    gen = gen_cli()
    expected = gen.render()
    actual = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    assert actual == expected, "docs/cli.md is stale: run `.venv/bin/python docs/gen_cli.py` and commit the result"


def test_every_command_is_documented():
    gen = gen_cli()
    doc = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    paths = gen.command_paths()
    assert ["run"] in paths and ["inspect"] in paths and ["models"] in paths
    for path in paths:
        assert f"## `spcli{''.join(' ' + p for p in path)}`" in doc


def test_help_mentions_what_the_code_does():
    runner = CliRunner()
    root = runner.invoke(app, ["--help"], env={"COLUMNS": "200"})
    assert root.exit_code == 0
    for text in ("--log-json", "--log-level", "--quiet", "--debug", "Exit codes: 0 done, 1 internal error"):
        assert text in root.output
    inspect = runner.invoke(app, ["inspect", "--help"], env={"COLUMNS": "200"})
    assert inspect.exit_code == 0
    for text in ("--id", "--row", "--html", "--limit", "--compare", "--width", "--no-color", "--plain", "⟦kept chunk⟧"):
        assert text in inspect.output


def _commands():
    """(path, click command) for the root and every command and sub-command."""
    import typer

    found = []

    def walk(cmd, path):
        found.append((path, cmd))
        for name, sub in getattr(cmd, "commands", {}).items():
            if not sub.hidden:
                walk(sub, path + [name])

    walk(typer.main.get_command(app), [])
    return found


def test_no_option_name_is_cut_at_80_columns():
    import re

    runner = CliRunner()
    for path, cmd in _commands():
        res = runner.invoke(app, [*path, "--help"], env={"COLUMNS": "80", "NO_COLOR": "1", "TERM": "dumb"})
        assert res.exit_code == 0, res.output
        assert max(len(line) for line in res.output.splitlines()) <= 80, path
        for param in cmd.params:
            for name in [*param.opts, *param.secondary_opts]:
                if name.startswith("-") and not getattr(param, "hidden", False):
                    assert re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", res.output), \
                        f"spcli {' '.join(path)} --help at 80 columns cuts or drops {name}:\n{res.output}"


def test_run_help_groups_every_option_in_a_panel():
    from spcli.commands.panels import ORDER

    res = CliRunner().invoke(app, ["run", "--help"], env={"COLUMNS": "80", "NO_COLOR": "1", "TERM": "dumb"})
    assert res.exit_code == 0, res.output
    titles = [line.split("─ ", 1)[1].split(" ─")[0] for line in res.output.splitlines() if line.startswith("╭─ ")]
    assert titles == ["Arguments", *ORDER, "Help"], f"an option of spcli run is in no panel (spcli/commands/panels.py " \
                                                    f"PANELS): {titles}"


def test_eval_bench_calibrate_help_groups_every_option_in_a_panel():
    from spcli.commands.panels import COMMAND_PANELS, ORDER

    for name, (own, _) in COMMAND_PANELS.items():
        res = CliRunner().invoke(app, [name, "--help"], env={"COLUMNS": "80", "NO_COLOR": "1", "TERM": "dumb"})
        assert res.exit_code == 0, res.output
        titles = [line.split("─ ", 1)[1].split(" ─")[0] for line in res.output.splitlines() if line.startswith("╭─ ")]
        expected = [t for t in ["Arguments", own, *ORDER, "Help"] if t in titles]
        assert titles == expected and own in titles, f"spcli {name}: an option is in no panel (spcli/commands/panels.py): {titles}"
