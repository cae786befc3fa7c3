"""Inline SVG plots for the HTML view: importance along the prompt (kept stretches shaded), keep-rate histogram."""

from __future__ import annotations

from html import escape

import numpy as np

from spcli.inspect.tokens import TokenView, split_runs

WIDTH, HEIGHT = 1000, 140
TOP, BOTTOM = 8, 112  # plot area, in viewBox units; axis labels below
MAX_POINTS = 500  # the curve is a mean over bins of n / MAX_POINTS tokens: a 32k prompt stays a small path


def _x(i: float, n: int) -> float:
    return round(WIDTH * i / max(n, 1), 2)


def _stretches(mask: np.ndarray) -> list[tuple[int, int]]:
    keys = mask.tolist()
    return [(s, e) for s, e in split_runs(keys) if keys[s]]


def importance_svg(view: TokenView) -> str:
    """The importance curve with kept stretches shaded blue and forced ones amber; a kept map alone without scores."""
    n = view.num_tokens
    parts = [f'<svg class="curve" viewBox="0 0 {WIDTH} {HEIGHT}" preserveAspectRatio="none" role="img" '
             f'aria-label="importance along the prompt, kept tokens shaded" xmlns="http://www.w3.org/2000/svg">']
    for cls, mask in (("kr", view.is_kept & ~view.is_forced), ("fr", view.is_forced)):
        for s, e in _stretches(mask):
            label = "forced" if cls == "fr" else "kept"
            parts.append(f'<rect class="{cls}" x="{_x(s, n)}" y="{TOP}" width="{max(_x(e, n) - _x(s, n), 0.6)}" '
                         f'height="{BOTTOM - TOP}"><title>{label} tokens {s}-{e - 1}</title></rect>')
    if view.importance is not None and n:
        num_bins = min(n, MAX_POINTS)
        edges = np.linspace(0, n, num_bins + 1).astype(np.int64)  # [num_bins + 1]
        sums = np.add.reduceat(view.importance.astype(np.float64), edges[:-1])  # [num_bins]
        means = sums / np.maximum(np.diff(edges), 1)
        # from the lowest bin to the 99th percentile: the attention sink's spike would flatten the rest
        low, top = float(means.min()), float(np.quantile(means, 0.99))
        scaled = np.clip((means - low) / (top - low), 0.0, 1.0) if top > low else np.full_like(means, 0.5)
        ys = BOTTOM - (BOTTOM - TOP) * scaled
        xs = [(_x(edges[i], n) + _x(edges[i + 1], n)) / 2 for i in range(num_bins)]
        d = " ".join(f"{'M' if i == 0 else 'L'}{x:.1f},{y:.1f}" for i, (x, y) in enumerate(zip(xs, ys)))
        parts.append(f'<path class="area" d="{d} L{xs[-1]:.1f},{BOTTOM} L{xs[0]:.1f},{BOTTOM} Z"/>')
        parts.append(f'<path class="imp" d="{d}" vector-effect="non-scaling-stroke"/>')
        per = f"mean per {n / num_bins:.3g} tokens, " if num_bins < n else ""
        caption = f"importance ({per}scale {low:.3g} to {top:.3g}, the 99th percentile)"
    else:
        caption = "kept map (importance not saved: run with --save-scores)"
    parts.append(f'<line class="axis" x1="0" y1="{BOTTOM}" x2="{WIDTH}" y2="{BOTTOM}" vector-effect="non-scaling-stroke"/>')
    parts.append("</svg>")
    ticks = "".join(f'<span style="left:{100 * q / 4:.0f}%">{round(n * q / 4)}</span>' for q in range(5))
    return (f'<figure class="plot">{"".join(parts)}<div class="ticks">{ticks}</div>'
            f'<figcaption>{escape(caption)}; token index below</figcaption></figure>')


def histogram_svg(counts: list[int]) -> str:
    """Rows per keep-rate bin (0-10%, ..., 90-100%)."""
    top = max(counts) or 1
    w = WIDTH / len(counts)
    bars, labels = [], []
    for i, c in enumerate(counts):
        h = (BOTTOM - TOP) * c / top
        bars.append(f'<rect class="bar" x="{i * w + 4:.1f}" y="{BOTTOM - h:.1f}" width="{w - 8:.1f}" height="{h:.1f}">'
                    f"<title>{10 * i}-{10 * (i + 1)}%: {c} rows</title></rect>")
        labels.append(f'<text x="{i * w + w / 2:.1f}" y="{BOTTOM + 18}" text-anchor="middle">{10 * i}-{10 * (i + 1)}%</text>')
        if c:
            labels.append(f'<text x="{i * w + w / 2:.1f}" y="{BOTTOM - h - 4:.1f}" text-anchor="middle">{c}</text>')
    return (f'<svg class="hist" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-label="rows per keep rate" '
            f'xmlns="http://www.w3.org/2000/svg">{"".join(bars)}{"".join(labels)}</svg>')
