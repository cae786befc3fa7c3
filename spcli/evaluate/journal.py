"""An eval's results as it goes: one line per finished example in `examples.jsonl`, so an interrupted
`spcli eval` resumes where it stopped (same --out, same settings) instead of starting again.

    eval_state.json   what the rows depend on (the config less out/bootstrap/html/samples, the resolved dtype,
                      the speculators, their scoring and the matched keeps) and, as `requested`, the config as
                      given; a resume with other flags is refused before any model loads, one whose resolved
                      settings differ once they are known, naming the fields; a larger --samples adds examples
    examples.jsonl    {"id", "rows", "overlaps"} per example, appended, flushed and fsync'ed after each one;
                      a torn last line (the process died mid-write) is dropped and that example runs again
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

from spcli.config.run import FieldConfig
from spcli.errors import ConfigError
from spcli.io.commit import atomic_write_bytes

STATE = "eval_state.json"
EXAMPLES = "examples.jsonl"
# change the report, not the rows; an example's id names its task, length, seed and index, so a larger --samples
# resumes and adds examples (the auto policies' matched keeps, which depend on every example, are fingerprinted)
NOT_FINGERPRINTED = ("out", "bootstrap", "html", "samples")


def fingerprint(cfg_dict: dict, **resolved) -> dict:
    """What an example's rows depend on: the config without the report-only fields, plus `resolved` (dtype,
    speculators, scoring), as JSON values."""
    fields = {k: v for k, v in cfg_dict.items() if k not in NOT_FINGERPRINTED}
    if fields.get("fields") == dataclasses.asdict(FieldConfig()):  # journals from before --prompt-field resume
        del fields["fields"]
    if fields.get("speculator_dtype", "auto") in (None, "auto"):  # as before the flag; the resolved one is added
        fields.pop("speculator_dtype", None)
    return json.loads(json.dumps({**fields, **resolved}, default=str))


REQUESTED = "requested"  # the config as given, before any model loads: a resume with other flags is refused at once


def refuse_other_settings(out: Path, old: dict, new: dict) -> None:
    keys = old.keys() | new.keys()
    if REQUESTED not in old:  # a journal from before the early check
        keys -= {REQUESTED}
    differ = sorted(k for k in keys if old.get(k) != new.get(k))
    if differ:
        raise ConfigError(f"{out} holds an eval made with other settings ({', '.join(differ)} differ): "
                          f"give another --out, or remove {STATE} and {EXAMPLES} to start again")


def check_requested(out: Path, requested: dict) -> None:
    """Before the models load: refuse a resume whose flags differ from the journal's (the resolved settings,
    known only once the models are loaded, are checked again by Journal)."""
    state_path = out / STATE
    if state_path.exists() and (out / EXAMPLES).exists():
        old = json.loads(state_path.read_text())
        if REQUESTED in old:
            refuse_other_settings(out, old[REQUESTED], requested)


class Journal:
    """The finished examples of one eval directory; `add` makes each one durable before the next starts."""

    def __init__(self, out: Path, state: dict, log=print) -> None:
        self.path = out / EXAMPLES
        self.done: dict[str, dict] = {}
        state_path = out / STATE
        if state_path.exists() and self.path.exists():
            refuse_other_settings(out, json.loads(state_path.read_text()), state)
            self.done = self._read()
            if self.done:
                log(f"eval: resuming in {out}: {len(self.done)} examples already done ({EXAMPLES})")
        else:
            self.path.unlink(missing_ok=True)
            atomic_write_bytes(state_path, json.dumps(state, indent=1).encode())

    def _read(self) -> dict[str, dict]:
        data = self.path.read_bytes()
        done = read_entries(self.path, data)
        end = data.rfind(b"\n") + 1
        if end != len(data):  # cut the torn last line, so the next example appends after a whole one
            with open(self.path, "r+b") as f:
                f.truncate(end)
        return done

    def add(self, example_id: str, rows: list[dict], overlaps: list[dict]) -> None:
        entry = {"id": example_id, "rows": rows, "overlaps": overlaps}
        with open(self.path, "ab") as f:
            f.write(json.dumps(entry, allow_nan=True).encode() + b"\n")  # NaN as JSON's NaN, as results.json
            f.flush()
            os.fsync(f.fileno())
        self.done[example_id] = entry


def read_entries(path: Path, data: bytes) -> dict[str, dict]:
    """The finished examples in `data` (the bytes of examples.jsonl at `path`), by id; a torn last line is left out."""
    done = {}
    lines = data.split(b"\n")
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            if i == len(lines) - 1:  # torn last write: that example runs again
                break
            raise ConfigError(f"{path}: line {i + 1} is not JSON; remove the file to start the eval again") from None
        done[entry["id"]] = entry
    return done


def journal_rows(done: dict[str, dict]) -> list[dict]:
    """Every row of the finished examples `read_journal` returns, example by example."""
    return [r for e in done.values() for r in e["rows"]]


def read_journal(out: Path) -> tuple[dict, dict[str, dict]]:
    """An eval directory's state and finished examples, read only (an eval may still be writing to it)."""
    state_path, path = out / STATE, out / EXAMPLES
    if not (state_path.exists() and path.exists()):
        raise ConfigError(f"{out} holds no eval journal ({STATE} and {EXAMPLES}): run `spcli eval --out {out}` first")
    return json.loads(state_path.read_text()), read_entries(path, path.read_bytes())
