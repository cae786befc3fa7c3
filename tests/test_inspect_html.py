"""`spcli inspect --html`: a self-contained page, checked as text and in a real browser.

The browser tests load the file from disk in headless Debian chromium (tests/browser_setup.sh
installs it), read the rendered DOM back with --dump-dom and take a screenshot. They skip, saying
why, where chromium is not installed.
"""

from __future__ import annotations

import json
import random
import re
import shutil
import struct
import subprocess
import zlib
from pathlib import Path

import pytest
from typer.testing import CliRunner

from spcli.cli import app
from spcli.config.scoring import SelectConfig
from test_inspect_summary import ok_row, write_run
from test_inspect_terminal import IMPORTANCE, KEPT, PROMPT, SELECT

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="chromium is not installed: run `sh tests/browser_setup.sh` as root (Debian package chromium)"
)
WORDS = ["alpha", "beta", "gamma", "delta", "river", "bridge", "report"]  # one token each with a leading space


def kept_runs(kept: list[int], n: int, select: SelectConfig) -> int:
    """Kept spans the page should show: stretches of kept, not-forced tokens, cut at chunk boundaries."""
    forced = set(range(select.keep_first)) | set(range(max(0, n - select.keep_last), n))
    free = [i in set(kept) and i not in forced for i in range(n)]
    return sum(free[i] and (i == 0 or not free[i - 1] or i % select.chunk == 0) for i in range(n))


@pytest.fixture()
def page_run(tmp_path, tiny_dir):
    records = [{"id": "t1", "prompt": PROMPT}, {"id": "t2", "prompt": PROMPT}, {"id": "bad", "prompt": 3}]
    results = [ok_row(12, KEPT, 1.0, output="the <answer>", importance=IMPORTANCE), ok_row(12, list(range(12)), 2.0, output="other"),
               dict(error="in.jsonl:line 3: field 'prompt' must be a string, got int")]
    return write_run(tmp_path / "run", tiny_dir, records, results, SELECT, save_scores=True)


@pytest.fixture()
def long_context_dir(tmp_path, tiny_dir):
    """The tiny model's tokenizer and config with a 64k context (inspect never loads the weights)."""
    dest = tmp_path / "long-context-model"
    dest.mkdir()
    for p in tiny_dir.iterdir():
        if p.suffix != ".safetensors":
            shutil.copy(p, dest / p.name)
    config = json.loads((dest / "config.json").read_text())
    (dest / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 65536}))
    return dest


@pytest.fixture()
def long_run(tmp_path, long_context_dir):
    """One 32768-token prompt, kept as the selection stage would keep it (10%, chunks of 32)."""
    import torch

    from spcli.stages.select import select_tokens

    n = 32768
    words = random.Random(0).choices(WORDS, k=n)
    prompt = words[0] + "".join(" " + w for w in words[1:])
    select = SelectConfig(keep=0.1, chunk=32, keep_first=4, keep_last=64, min_tokens=256)
    importance = torch.rand(n, generator=torch.Generator().manual_seed(0))
    kept = select_tokens(importance, select).tolist()
    row = ok_row(n, kept, 3.0, output="long answer", importance=importance.tolist())
    out = write_run(tmp_path / "long", long_context_dir, [{"id": "long", "prompt": prompt}], [row], select, save_scores=True)
    return out, kept, select


def kept_spans(html: str) -> int:
    """Kept-chunk spans inside the rendered prompts (the legend has its own)."""
    prompts = "".join(re.findall(r'<pre class="prompt">(.*?)</pre>', html, flags=re.S))
    return len(re.findall(r'<span class="k c\d"', prompts))


def write_html(run: Path, *args: str) -> str:
    page = run.parent / f"{run.name}.html"
    res = CliRunner().invoke(app, ["inspect", str(run), "--html", str(page), *args])
    assert res.exit_code == 0, res.output
    assert res.output == f"wrote {page}\n"
    return page.read_text(encoding="utf-8")


def test_page_is_self_contained(page_run):
    html = write_html(page_run)
    assert html.startswith("<!doctype html>")
    assert not re.search(r"<(link|img|iframe)\b|<script[^>]*\bsrc=|@import|url\(", html)
    assert set(re.findall(r"https?://[^\s\"'<>]+", html)) <= {"http://www.w3.org/2000/svg"}  # an XML namespace, not a fetch
    assert html.count('<article class="row"') == 3 and 'id="q"' in html  # the list with its search box
    assert "the &lt;answer&gt;" in html and "<answer>" not in html


def test_one_row_structure(page_run):
    html = write_html(page_run, "--id", "t1")
    assert html.count('<article class="row"') == 1 and 'id="q"' not in html
    assert html.index('<article class="row"') < html.index('<section id="summary"')  # the row first, then the run
    assert kept_spans(html) == kept_runs(KEPT, 12, SELECT) == 2
    assert len(re.findall(r'<span class="f"', html)) == 2 + 1  # forced head and tail, and the legend
    assert re.search(r'data-field="num_prompt_tokens">12<', html) and re.search(r'data-field="keep_rate">75.0%<', html)
    assert '<path class="imp"' in html and len(re.findall(r'<rect class="kr"', html)) == 1


def test_compare_page(page_run, tmp_path, tiny_dir):
    records = [{"id": "t1", "prompt": PROMPT}, {"id": "t2", "prompt": PROMPT}]
    b = write_run(tmp_path / "b", tiny_dir, records,
                  [ok_row(12, [0, 1, 2, 3, 10, 11], 1.0, output="the <answer>"), ok_row(12, list(range(12)), 1.0, output="new")], SELECT)
    html = write_html(page_run, "--compare", str(b))
    assert re.search(r'data-field="num_both">2<', html) and re.search(r'data-field="num_match">1<', html)
    assert html.count('<article class="row"') == 2 and html.count('data-field="match">outputs match<') == 1
    first = re.search(r'<article class="row" id="row-0".*?<pre class="prompt">(.*?)</pre>', html, flags=re.S).group(1)
    assert re.findall(r'<span class="(oa|ob)"[^>]*>([^<]*)<', first) == [("ob", " two three four"), ("oa", " five six seven eight nine ten")]


def test_32k_prompt_stays_small(long_run):
    run, kept, select = long_run
    html = write_html(run, "--id", "long")
    assert 'class="error"' not in html and 'class="warn"' not in html
    spans = html.count("<span")
    assert kept_spans(html) == kept_runs(kept, 32768, select)
    assert spans < 800, spans  # runs of text, not one element per token
    curve = re.search(r'<path class="imp" d="([^"]*)"', html).group(1)
    assert len(re.findall(r"<rect ", html)) < 400 and curve.count("L") == 499  # the curve: 500 points


def chromium(tmp_path: Path, *args: str) -> str:
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
           "--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars",
           f"--user-data-dir={tmp_path / 'chromium-profile'}", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


def png_colours(path: Path) -> int:
    """Distinct byte values in the PNG's pixel data: a blank page has a handful, a rendered one many."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    idat, pos = b"", 8
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos : pos + 8])
        if kind == b"IDAT":
            idat += data[pos + 8 : pos + 8 + length]
        pos += 12 + length
    return len(set(zlib.decompress(idat)))


def field(dom: str, name: str) -> str:
    m = re.search(rf'data-field="{name}">([^<]*)<', dom)
    assert m, f"no data-field {name} in the rendered DOM"
    return m.group(1)


@needs_chromium
def test_browser_renders_one_row(page_run, tmp_path):
    write_html(page_run, "--id", "t1")
    page = page_run.parent / "run.html"
    dom = chromium(tmp_path, "--dump-dom", page.as_uri())
    assert (field(dom, "id"), field(dom, "num_prompt_tokens"), field(dom, "num_kept_tokens")) == ("t1", "12", "9")
    assert (field(dom, "keep_rate"), field(dom, "finish_reason"), field(dom, "output")) == ("75.0%", "length", "the &lt;answer&gt;")
    assert (field(dom, "rows"), field(dom, "failed"), field(dom, "keep_mean")) == ("3", "1", "87.5%")
    assert kept_spans(dom) == 2
    shot = tmp_path / "row.png"
    chromium(tmp_path, f"--screenshot={shot}", "--window-size=1280,1000", page.as_uri())
    assert shot.stat().st_size > 20_000 and png_colours(shot) > 100


@needs_chromium
def test_browser_list_search_filters_rows(page_run, tmp_path):
    write_html(page_run)
    page = page_run.parent / "run.html"
    dom = chromium(tmp_path, "--dump-dom", page.as_uri() + "?q=other")  # the page fills the search box from ?q=
    rows = re.findall(r'<tr data-search="[^"]*"( hidden="")?>', dom)
    assert len(rows) == 3 and [bool(h) for h in rows] == [True, False, True]
    assert re.search(r'<span id="count">1</span>', dom)


@needs_chromium
def test_browser_handles_a_32k_token_prompt(long_run, tmp_path):
    run, kept, select = long_run
    write_html(run, "--id", "long")
    page = run.parent / "long.html"
    dom = chromium(tmp_path, "--dump-dom", page.as_uri())
    assert field(dom, "num_prompt_tokens") == "32768" and field(dom, "num_kept_tokens") == str(len(kept))
    assert kept_spans(dom) == kept_runs(kept, 32768, select)
    shot = tmp_path / "long.png"
    chromium(tmp_path, f"--screenshot={shot}", "--window-size=1280,1000", page.as_uri())
    assert png_colours(shot) > 100


def test_the_two_chunk_shades_are_different_hues():
    import re

    from spcli.inspect.html import CSS

    k0, k1 = (tuple(int(h[i : i + 2], 16) for i in (0, 2, 4)) for h in re.findall(r"--k[01]:#([0-9a-f]{6})", CSS))
    hue = [max(range(3), key=lambda i: c[i]) for c in (k0, k1)]  # the dominant channel
    assert hue[0] != hue[1] and max(abs(a - b) for a, b in zip(k0, k1)) >= 40, (k0, k1)
