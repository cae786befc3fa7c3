"""The README and docs/: every relative link reaches a file (and its #anchor a heading); the README keeps
its quick start, which CI (.ci/run) runs."""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation but - and _ dropped, spaces to -."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
    return {slug(m[1]) for m in re.finditer(r"^#{1,6} (.+)$", text, flags=re.M)}


def links(page: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)  # code blocks hold no links
    text = re.sub(r"`[^`\n]*`", "", text)
    return [m[1] for m in LINK.finditer(text)]


def test_slug_is_githubs():
    assert slug("The CPU dtype: `--dtype auto`, SmolLM2-135M-Instruct") == "the-cpu-dtype---dtype-auto-smollm2-135m-instruct"
    assert slug("Qwen2.5-Coder-1.5B with real speculators") == "qwen25-coder-15b-with-real-speculators"


def test_every_relative_link_resolves():
    broken = []
    checked = 0
    for page in pages():
        for target in links(page):
            if re.match(r"[a-z]+:", target):  # https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            checked += 1
            if not dest.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target} (no {dest.relative_to(ROOT) if dest.is_relative_to(ROOT) else dest})")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no heading #{anchor} in {dest.relative_to(ROOT)})")
    assert checked > 50
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_readme_is_short_and_keeps_the_quick_start():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 300
    assert "make demo" in readme and "make test" in readme  # .ci/run calls `make test`
    assert "make test" in (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert "pip install '.[vllm]'" in readme and "specprefill-cli" in readme


def test_every_command_has_a_guide():
    guides = {p.stem for p in (ROOT / "docs" / "guide").glob("*.md")}
    assert {"run", "inspect", "eval", "bench", "calibrate", "plan", "slurm", "models", "python"} <= guides


FILE = re.compile(r"(?<![\w/.-])((?:spcli|benches|tests|tools|examples|docs)/[\w/.-]*\.(?:py|sh|md|jsonl|parquet|json))")


def named_files(page: Path) -> list[str]:
    return [m[1] for m in FILE.finditer(page.read_text(encoding="utf-8"))]


def test_every_file_a_doc_names_exists():
    """A moved or removed file that a page still names (DESIGN's file map, a guide's command) fails here."""
    missing = [f"{page.relative_to(ROOT)}: {name}" for page in pages() for name in named_files(page)
               if not (ROOT / name).exists()]
    assert sum(len(named_files(p)) for p in pages()) > 50
    assert not missing, "files named in the docs that do not exist:\n" + "\n".join(missing)


def test_design_maps_every_package():
    """DESIGN's file map names every package of spcli/ (a new folder gets its line there)."""
    design = (ROOT / "docs" / "DESIGN.md").read_text(encoding="utf-8")
    packages = sorted(str(p.parent.relative_to(ROOT)) + "/" for p in (ROOT / "spcli").rglob("__init__.py")
                      if p.parent != ROOT / "spcli")
    assert [p for p in packages if p not in design] == []


# run with python -S and no PYTHONPATH: no installed spcli, so the finder below is the only one that knows it
EDITABLE = """import importlib.util, sys


class Editable:  # what an editable install (pip install -e ., setuptools) adds: a finder after the path finder
    def find_spec(self, name, path=None, target=None):
        if name == "spcli":
            return importlib.util.spec_from_file_location(name, {init!r}, submodule_search_locations=[{pkg!r}])


sys.meta_path.append(Editable())
from spcli import __version__
print(__version__)
"""


def test_readme_clone_folder_does_not_shadow_the_package(tmp_path):
    """The issue: a script saved beside a clone named `spcli` failed with "cannot import name '__version__' from
    'spcli' (unknown location)": with an editable install, the clone folder (no __init__.py) is found first as an
    empty namespace package. The README's folder name does not; `spcli` does (the failure, reproduced)."""
    import subprocess
    import sys

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    (folder,) = re.findall(r"git clone <this repository> (\S+) && cd (?:\S+)", readme)
    assert folder != "spcli" and "(unknown location)" in readme
    script = EDITABLE.format(init=str(ROOT / "spcli" / "__init__.py"), pkg=str(ROOT / "spcli"))
    results = {}
    for name in (folder, "spcli"):
        (tmp_path / name / name / "spcli").mkdir(parents=True)  # a clone: the package one level down
        (tmp_path / name / "script.py").write_text(script)
        results[name] = subprocess.run([sys.executable, "-S", "script.py"], cwd=tmp_path / name, capture_output=True,
                                       text=True, env={"PATH": "/usr/bin:/bin"})
    assert results[folder].returncode == 0 and results[folder].stdout.strip(), results[folder].stderr
    assert "cannot import name '__version__' from 'spcli' (unknown location)" in results["spcli"].stderr


def test_readme_your_own_data_shows_a_record_and_the_export():
    from spcli.config.run import FieldConfig
    from spcli.io.records import to_record
    from spcli.io.shards import Shard

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    own = readme.split("## Your own data", 1)[1].split("\n## ", 1)[0]
    (line,) = [x.strip() for x in own.splitlines() if x.strip().startswith("{")]
    record = json.loads(line)
    rec = to_record(record, Shard(0, "leases.jsonl"), 0, "jsonl", FieldConfig())
    assert rec.error is None and rec.protected == (record["instruction"],) and not rec.unapplied
    assert "spcli export" in own and "--join-input" in own and "--pass-through" in own
