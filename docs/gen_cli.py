"""Write docs/cli.md, the command reference, from `spcli --help` and every command's `--help`.

    .venv/bin/python docs/gen_cli.py          # rewrite docs/cli.md
    .venv/bin/python docs/gen_cli.py --check  # exit 1 when docs/cli.md is stale

tests/test_help.py runs the check, so the reference and the code cannot drift apart.
Help is rendered at a fixed width (COLUMNS=100) without colours, so the file is the same everywhere.
"""

from __future__ import annotations

import sys
from pathlib import Path

DOC = Path(__file__).resolve().parent / "cli.md"
WIDTH = 100
ENV = {"COLUMNS": str(WIDTH), "LINES": "50", "NO_COLOR": "1", "TERM": "dumb", "FORCE_COLOR": None, "TTY_COMPATIBLE": None}


def command_paths() -> list[list[str]]:
    """[] for the root, then every command and sub-command, in registration order."""
    import typer

    from spcli.cli import app

    paths: list[list[str]] = []

    def walk(cmd, path: list[str]) -> None:  # a click Command; groups have .commands (typer vendors its own click)
        paths.append(path)
        for name, sub in getattr(cmd, "commands", {}).items():
            if not sub.hidden:
                walk(sub, path + [name])

    walk(typer.main.get_command(app), [])
    return paths


def help_text(path: list[str]) -> str:
    from typer.testing import CliRunner

    from spcli.cli import app

    result = CliRunner().invoke(app, [*path, "--help"], prog_name="spcli", env=ENV, color=False)
    if result.exit_code != 0:
        raise RuntimeError(f"spcli {' '.join(path)} --help failed: {result.output}")
    return "\n".join(line.rstrip() for line in result.output.splitlines()).strip("\n")


def render() -> str:
    lines = [
        "# spcli command reference",
        "",
        "Generated from `--help` by `docs/gen_cli.py`; `tests/test_help.py` fails when it is stale.",
        "Regenerate with `.venv/bin/python docs/gen_cli.py`.",
        "",
    ]
    for path in command_paths():
        lines += [f"## `spcli{''.join(' ' + p for p in path)}`", "", "```text", help_text(path), "```", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    text = render()
    if "--check" in argv:
        if not DOC.is_file() or DOC.read_text(encoding="utf-8") != text:
            print(f"{DOC} is stale: run .venv/bin/python docs/gen_cli.py", file=sys.stderr)
            return 1
        return 0
    DOC.write_text(text, encoding="utf-8")
    print(f"wrote {DOC}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
