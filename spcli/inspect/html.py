"""`spcli inspect --html FILE`: one self-contained page (inline CSS, SVG and a few lines of JS; no network).

The prompt is rendered as runs of kept / dropped / forced text (one span per kept chunk, one per
dropped stretch), so a 32k-token prompt is a few hundred elements, not 32k.
"""

from __future__ import annotations

from html import escape

from spcli import __version__
from spcli.inspect import compare as cmp
from spcli.inspect.summary import Summary
from spcli.inspect.svg import histogram_svg, importance_svg
from spcli.inspect.terminal import pct
from spcli.inspect.tokens import DROPPED, FORCED, TokenView, token_runs

DIFF_CLASS = {cmp.BOTH: "k c0", cmp.ONLY_A: "oa", cmp.ONLY_B: "ob", cmp.NEITHER: "d"}


def _card(label: str, value: str, field: str) -> str:
    return f'<div class="card"><div class="v" data-field="{field}">{escape(value)}</div><div class="l">{escape(label)}</div></div>'


def summary_section(s: Summary) -> str:
    pending = "unknown" if s.num_pending is None else str(s.num_pending)
    q = s.ttft_quantiles
    cards = [
        _card("rows done", str(s.num_rows), "rows"), _card("failed", str(s.num_failed), "failed"),
        _card("pending", pending, "pending"), _card("mean keep rate", pct(s.keep_mean), "keep_mean"),
        _card(f"prefill saved ({s.num_kept_tokens} of {s.num_prompt_tokens} tokens kept)", pct(s.saved_fraction), "saved"),
        _card(f"base prefill time saved ({'measured' if s.full_prefill and s.full_prefill.is_measured else 'estimated'})",
              "-" if s.saved_prefill_s is None else f"{s.saved_prefill_s:.1f} s of {s.full_prefill.seconds:.1f} s",
              "saved_s"),
        _card("prompt / output tokens/s", "-" if s.wall_s <= 0 else
              f"{s.prompt_tokens_per_s:.0f} / {s.output_tokens_per_s:.1f}", "tokens_per_s"),
        _card("TTFT p50", f"{q['p50']:.2f} s" if q else "-", "ttft_p50"),
        _card("TTFT p99", f"{q['p99']:.2f} s" if q else "-", "ttft_p99"),
    ]
    config = "".join(f'<div><dt>{escape(k)}</dt><dd data-field="cfg_{escape(k)}">{escape(str(v))}</dd></div>'
                     for k, v in s.config.items())
    errors = "".join(f"<tr><td class=num>{e.count}</td><td>{escape(e.message)}<div class=ex>e.g. {escape(e.example)}</div></td></tr>"
                     for e in s.errors) or '<tr><td colspan=2 class="muted">none</td></tr>'
    state = "finished" if s.is_finished else "not finished"
    return (f'<section id="summary"><h2>Run <span class="muted">{escape(s.out)}: {state}, '
            f'{s.num_shards_done}/{s.num_shards} shards done</span></h2><div class="cards">{"".join(cards)}</div>'
            f'<div class="two"><div><h3>Keep rate per row</h3>{histogram_svg(s.keep_histogram)}</div>'
            f'<div><h3>Configuration</h3><dl class="cfg">{config}</dl></div></div>'
            f'<h3>Errors</h3><table class="errors"><tbody>{errors}</tbody></table></section>')


def comparison_section(c: cmp.Comparison) -> str:
    n = len(c.rows)
    cards = [
        _card("ids in both runs", str(n), "num_both"), _card("outputs match", str(c.num_match), "num_match"),
        _card("match rate", pct(c.num_match / n if n else None), "match_rate"),
        _card("ids only in A / only in B", f"{c.num_only_in_a} / {c.num_only_in_b}", "num_only"),
        _card("keep A / keep B", f"{c.keep_a} / {c.keep_b}", "keeps"),
    ]
    return (f'<section id="compare"><h2>Compare <span class="muted">A: {escape(c.out_a)} with B: {escape(c.out_b)}</span></h2>'
            f'<div class="cards">{"".join(cards)}</div></section>')


def _row_head(row: dict, num_tokens: int) -> str:
    if row.get("error") is not None:
        return f'<p class="error" data-field="error">{escape(row["error"])}</p>'
    fields = [("prompt tokens", "num_prompt_tokens", str(num_tokens)), ("kept", "num_kept_tokens", str(row["num_kept_tokens"])),
              ("keep rate", "keep_rate", pct(row.get("keep_rate"))), ("finish", "finish_reason", str(row.get("finish_reason"))),
              ("TTFT", "ttft_s", f"{row['ttft_s']:.3f} s" if row.get("ttft_s") is not None else "-")]
    dl = "".join(f'<div><dt>{label}</dt><dd data-field="{f}">{escape(v)}</dd></div>' for label, f, v in fields)
    return (f'<dl class="head">{dl}</dl><div class="output"><span class="lbl">output</span>'
            f'<span data-field="output">{escape(row.get("output") or "")}</span></div>')


def prompt_spans(view: TokenView) -> str:
    spans = []
    for run in token_runs(view):
        where = f"tokens {run.start}-{run.end - 1}"
        if run.state == DROPPED:
            spans.append(f'<span class="d" title="dropped {where}">{escape(run.text)}</span>')
        elif run.state == FORCED:
            spans.append(f'<span class="f" title="forced {where}">{escape(run.text)}</span>')
        else:
            score = ""
            if view.importance is not None:
                lo, hi = run.chunk_index * view.chunk, min(view.num_tokens, (run.chunk_index + 1) * view.chunk)
                score = f", chunk mean importance {float(view.importance[lo:hi].mean()):.4g}"
            spans.append(f'<span class="k c{run.chunk_index % 2}" title="kept chunk {run.chunk_index}, {where}{score}">'
                         f"{escape(run.text)}</span>")
    return "".join(spans)


LEGEND = ('<div class="legend"><span class="k c0">kept chunk</span><span class="k c1">next chunk</span>'
          '<span class="f">forced (first/last)</span><span class="d">dropped</span></div>')


def row_article(view: TokenView | None, row: dict, index: int, error: str | None = None) -> str:
    head = f'<h2 class="rid" data-field="id">{escape(row["id"])}</h2>'
    if view is None:
        body = _row_head(row, row.get("num_prompt_tokens") or 0)
        if error and row.get("error") is None:
            body += f'<p class="error">{escape(error)}</p>'
    else:
        warn = f'<p class="warn">{escape(view.warning)}</p>' if view.warning else ""
        body = (f"{_row_head(row, view.num_tokens)}{warn}{importance_svg(view)}{LEGEND}"
                f'<pre class="prompt">{prompt_spans(view)}</pre>')
    return f'<article class="row" id="row-{index}" data-id="{escape(row["id"])}">{head}{body}</article>'


def diff_article(view: TokenView, row_b: dict, runs: list[cmp.DiffRun], index: int) -> str:
    a = view.row
    same = a.get("output") == row_b.get("output") and a.get("error") is None
    spans = "".join(f'<span class="{DIFF_CLASS[r.state]}" title="{r.state.replace("_", " ")}: tokens {r.start}-{r.end - 1}">'
                    f"{escape(r.text)}</span>" for r in runs)
    outputs = (f'<div class="two"><div><h3>A: kept {a["num_kept_tokens"]} ({pct(a.get("keep_rate"))})</h3>'
               f'<p class="output" data-field="output_a">{escape(a.get("output") or a.get("error") or "")}</p></div>'
               f'<div><h3>B: kept {row_b["num_kept_tokens"]} ({pct(row_b.get("keep_rate"))})</h3>'
               f'<p class="output" data-field="output_b">{escape(row_b.get("output") or row_b.get("error") or "")}</p></div></div>')
    legend = ('<div class="legend"><span class="k c0">kept in both</span><span class="oa">only in A</span>'
              '<span class="ob">only in B</span><span class="d">in neither</span></div>')
    return (f'<article class="row" id="row-{index}" data-id="{escape(a["id"])}"><h2 class="rid">{escape(a["id"])} '
            f'<span class="badge {"ok" if same else "no"}" data-field="match">{"outputs match" if same else "outputs differ"}</span>'
            f'</h2>{outputs}{legend}<pre class="prompt">{spans}</pre></article>')


def row_list(rows: list[dict]) -> str:
    """The searchable list of rows (id, tokens, keep rate, output); each links to its article."""
    trs = []
    for i, r in enumerate(rows):
        err = ' class="err"' if r["error"] else ""
        cells = (f"<td class=num>{r['num_prompt_tokens']}</td><td>{pct(r['keep_rate'])}</td>"
                 f"<td{err}>{escape(r['error'] or r['output'] or '')}</td>")
        trs.append(_list_row(i, r["id"], f"{r['id']} {r['output'] or r['error'] or ''}", cells))
    return _list("<th>id</th><th>prompt tokens</th><th>kept</th><th>output</th>", trs)


def compare_list(rows: list[cmp.ComparedRow]) -> str:
    """The searchable list of compared rows: keep rates, kept-set differences, match, both outputs."""
    trs = []
    for i, r in enumerate(rows):
        a, b = r.a["output"] or r.a["error"] or "", r.b["output"] or r.b["error"] or ""
        match = f"<td class={'yes' if r.is_match else 'no'}>{'yes' if r.is_match else 'NO'}</td>"
        cells = (f"<td>{pct(r.a['keep_rate'])}</td><td>{pct(r.b['keep_rate'])}</td><td class=num>{r.num_only_a}</td>"
                 f"<td class=num>{r.num_only_b}</td>{match}<td>{escape(a)}</td><td>{escape(b)}</td>")
        trs.append(_list_row(i, r.id, f"{r.id} {a} {b}", cells))
    head = "".join(f"<th>{h}</th>" for h in ("id", "kept A", "kept B", "only A", "only B", "match", "output A", "output B"))
    return _list(head, trs)


def _list_row(index: int, row_id: str, search: str, cells: str) -> str:
    return f'<tr data-search="{escape(search.lower())}"><td><a href="#row-{index}">{escape(row_id)}</a></td>{cells}</tr>'


def _list(head: str, trs: list[str]) -> str:
    return (f'<section id="list"><h2>Rows <span class="muted"><span id="count">{len(trs)}</span> shown</span></h2>'
            f'<input id="q" type="search" placeholder="Filter by id or output" autocomplete="off">'
            f'<table class="list"><thead><tr>{head}</tr></thead><tbody>{"".join(trs)}</tbody></table></section>')


def document(title: str, sections: list[str]) -> str:
    return (f'<!doctype html><html lang="en"><head><meta charset="utf-8"><meta name="viewport" '
            f'content="width=device-width, initial-scale=1"><meta name="generator" content="spcli {__version__}">'
            f"<title>{escape(title)}</title><style>{CSS}</style></head><body><header><h1>spcli inspect</h1>"
            f'<span class="sub">{escape(title)}</span></header><main>{"".join(sections)}</main><script>{JS}</script></body></html>')


CSS = """
:root{--bg:#f6f7f9;--fg:#1c1e21;--muted:#6b7280;--line:#e3e5e8;--k0:#bcd9ff;--k1:#c6efb9;--f:#ffd477;--d:#a3a7ae;
--oa:#b8ecc0;--ob:#e3ccff;--accent:#1f3b67}
*{box-sizing:border-box}body{margin:0;background:var(--bg);color:var(--fg);font:14px/1.5 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif}
header{background:var(--accent);color:#fff;padding:12px 24px;display:flex;gap:16px;align-items:baseline}
header h1{font-size:18px;margin:0}header .sub{opacity:.8}
main{max-width:1280px;margin:0 auto;padding:8px 24px 40px}
h2{font-size:17px;margin:22px 0 10px}h3{font-size:14px;margin:14px 0 6px;color:#374151}.muted{color:var(--muted);font-weight:400}
.cards{display:grid;grid-template-columns:repeat(auto-fill,minmax(160px,1fr));gap:10px}
.card{background:#fff;border:1px solid var(--line);border-radius:8px;padding:10px 12px}
.card .v{font-size:20px;font-weight:650}.card .l{color:var(--muted);font-size:12px}
.two{display:grid;grid-template-columns:1fr 1fr;gap:18px}
table{border-collapse:collapse;background:#fff;border:1px solid var(--line);width:100%}
th,td{text-align:left;padding:4px 8px;border-bottom:1px solid var(--line);vertical-align:top}
dl.cfg{display:grid;grid-template-columns:repeat(auto-fill,minmax(140px,1fr));gap:6px 14px;margin:0;background:#fff;border:1px solid var(--line);border-radius:8px;padding:10px 12px}
dl.cfg dt{color:var(--muted);font-size:12px}dl.cfg dd{margin:0;font-weight:600;overflow-wrap:anywhere}.num{text-align:right;font-variant-numeric:tabular-nums}
.ex{color:var(--muted);font-size:12px}td.err,td.no{color:#b42318}td.yes{color:#067647}
table.list th,table.list td:first-child{white-space:nowrap}
table.list td:last-child{max-width:520px;overflow:hidden;text-overflow:ellipsis;white-space:nowrap}
table.list tbody tr:hover{background:#eef3fb}
#q{width:100%;padding:7px 10px;border:1px solid var(--line);border-radius:6px;margin-bottom:8px;font:inherit}
article.row{background:#fff;border:1px solid var(--line);border-radius:10px;padding:4px 18px 18px;margin-top:18px}
.rows article.row{display:none}.rows article.row:target{display:block}
.rows:not(:has(article.row:target)) article.row:first-of-type{display:block}
dl.head{display:flex;flex-wrap:wrap;gap:8px 22px;margin:0 0 8px}dl.head dt{color:var(--muted);font-size:12px}
dl.head dd{margin:0;font-weight:650;font-size:16px}
.output{background:#f3f4f6;border-radius:6px;padding:6px 10px;white-space:pre-wrap}.output .lbl{color:var(--muted);margin-right:8px}
.error{color:#b42318;background:#fef3f2;padding:6px 10px;border-radius:6px}.warn{color:#93370d;background:#fffaeb;padding:6px 10px}
figure.plot{margin:10px 0 4px;position:relative}figure.plot figcaption{color:var(--muted);font-size:12px}
svg.curve{width:100%;height:110px;display:block;background:#fbfbfc;border:1px solid var(--line)}
svg .kr{fill:var(--k1);opacity:.75}svg .fr{fill:var(--f);opacity:.9}
svg .imp{fill:none;stroke:#c2410c;stroke-width:1.5}svg .area{fill:#c2410c;opacity:.12}svg .axis{stroke:#9ca3af;stroke-width:1}
.ticks{position:relative;height:16px;font-size:11px;color:var(--muted)}
.ticks span{position:absolute;transform:translateX(-50%)}.ticks span:first-child{transform:none}
.ticks span:last-child{transform:translateX(-100%)}
svg.hist{width:100%;height:170px;background:#fff;border:1px solid var(--line);border-radius:8px}svg.hist .bar{fill:#6c8fd0}svg.hist text{font-size:22px;fill:#4b5563}
.legend{display:flex;gap:8px;margin:8px 0;font-size:12px}.legend span{padding:1px 6px;border-radius:3px}
pre.prompt{white-space:pre-wrap;overflow-wrap:anywhere;font:13px/1.65 ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;
margin:0;padding:12px;border:1px solid var(--line);border-radius:8px;background:#fff;max-height:70vh;overflow-y:auto}
.k{background:var(--k0);color:#0b1220}.k.c1{background:var(--k1)}.f{background:var(--f);color:#1c1300;font-weight:600}
.d{color:var(--d)}.oa{background:var(--oa)}.ob{background:var(--ob)}
.badge{font-size:12px;padding:2px 8px;border-radius:10px;margin-left:8px;vertical-align:middle}
.badge.ok{background:#dcfae6;color:#067647}.badge.no{background:#fee4e2;color:#b42318}
@media (max-width:800px){.two{grid-template-columns:1fr}}
"""

JS = """
const q=document.getElementById('q');
function filter(){const v=q.value.trim().toLowerCase();let n=0;
for(const tr of document.querySelectorAll('table.list tbody tr')){const ok=tr.dataset.search.includes(v);tr.hidden=!ok;n+=ok;}
document.getElementById('count').textContent=n;}
if(q){q.addEventListener('input',filter);const p=new URLSearchParams(location.search).get('q');if(p){q.value=p;filter();}}
"""
