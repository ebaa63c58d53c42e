"""History at a glance in the log: per layer (or block, see history_rows.py), max |activation| and gradient norm
over the steps run, first and last value and a sparkline, every line within LINE_WIDTH columns."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from debug_nan.engine.watch.history import History
from debug_nan.presentation.history_rows import Row, build_rows, units
from debug_nan.presentation.line_width import LINE_WIDTH, fit

if TYPE_CHECKING:  # (a type only: the top process of `run -- PROGRAM` renders its ranks' results without torch)
    from torch import nn

BARS = "▁▂▃▄▅▆▇█"
MAX_TREND = 12  # sparkline characters; longer runs put several steps in one character (their worst value)
NUMBER = 8  # columns of one value: "1.23e+04"
MIN_DECADES = 1.0  # a row's sparkline spans at least this many decades, so that steady values draw flat


def sparkline(values: list[float | None], width: int | None = None) -> str:
    """One character per step (or per bucket of steps when `width` is smaller: the bucket's largest value, a NaN/Inf
    winning) on a log scale spanning the row's range, at least MIN_DECADES tall and centred on it: 3.41 -> 3.41 is
    flat, 1 -> 10 runs from ▁ to █. '!' non-finite, ' ' not measured, '_' exactly zero."""
    values = _buckets(values, width or len(values))
    finite = [v for v in values if v is not None and math.isfinite(v) and v > 0]
    if finite:
        lo, hi = math.log10(min(finite)), math.log10(max(finite))
        if hi - lo < MIN_DECADES:  # centred on the middle of a bar (not between two), so steady draws flat
            lo = (lo + hi) / 2 - 4.5 / 8 * MIN_DECADES
            hi = lo + MIN_DECADES
    out = []
    for v in values:
        if v is None:
            out.append(" ")
        elif not math.isfinite(v):
            out.append("!")
        elif v <= 0:
            out.append("_")
        else:
            out.append(BARS[min(7, int((math.log10(v) - lo) / (hi - lo) * 8))])
    return "".join(out)


def _buckets(values: list[float | None], width: int) -> list[float | None]:
    if len(values) <= width:
        return values
    out = []
    for k in range(width):
        chunk = [v for v in values[k * len(values) // width:(k + 1) * len(values) // width] if v is not None]
        bad = [v for v in chunk if not math.isfinite(v)]
        out.append(bad[0] if bad else (max(chunk) if chunk else None))
    return out


def _num(v: float | None) -> str:
    return "-" if v is None else f"{v:.3g}"


def _first_last(values: list[float | None]) -> tuple[float | None, float | None]:
    present = [v for v in values if v is not None]
    return (present[0], present[-1]) if present else (None, None)


def common_prefix(names: list[str]) -> str:
    """The dotted prefix every name shares (`model.`), or ''."""
    split = [n.split(".") for n in names]
    if len(split) < 2 or not all(split):
        return ""
    shared = []
    for parts in zip(*(s[:-1] for s in split)):
        if len(set(parts)) > 1:
            break
        shared.append(parts[0])
    return ".".join(shared) + "." if shared else ""


def _elide(label: str, width: int) -> str:
    """Middle components of a dotted label replaced by '…', the longest first, never the first, the last or an
    index (`asv_encoder.….layers.0.attn.qkv (Linear)`), until it fits `width` or nothing is left to elide."""
    parts = label.split(".")
    middle = sorted((k for k in range(1, len(parts) - 1) if not parts[k].isdigit()), key=lambda k: -len(parts[k]))
    gone: set[int] = set()

    def joined() -> str:
        out = []
        for k, part in enumerate(parts):
            if k not in gone:
                out.append(part)
            elif not out or out[-1] != "…":
                out.append("…")
        return ".".join(out)

    for k in middle:
        if len(joined()) <= width:
            break
        gone.add(k)
    return joined()


def short_labels(labels: list[str], width: int) -> list[str]:
    """Labels elided to `width` where they are longer; two labels never read the same (the ones that would keep
    their full text)."""
    shown = [_elide(label, width) if len(label) > width else label for label in labels]
    clashes = {s for s in shown if shown.count(s) > 1}
    return [label if s in clashes else s for label, s in zip(labels, shown)]


def history_lines(history: History, model: nn.Module, full: bool = False, finding_module: str | None = None,
                  width: int = LINE_WIDTH) -> list[str]:
    """The table: header, one line per row, the total gradient norm, and a legend of the scale."""
    rows = build_rows(history, model, full, finding_module)
    if not history.steps or not rows:
        return []
    n = len(history.steps)
    fold = [not full and _all_nonfinite(r) for r in rows]  # NaN/Inf everywhere: one line (full: listed)
    dead = [r for r, f in zip(rows, fold) if f]
    rows = [r for r, f in zip(rows, fold) if not f]
    fixed = 2 + 2 + 2 * (2 * NUMBER + 2) + 2  # indent, gaps, first/last pairs
    labels = [r.label for r in rows]
    wanted = max(map(len, labels), default=0)  # the labels first, the sparklines down to 5 characters
    trend = max(1, min(n, MAX_TREND, max(5, (width - fixed - wanted) // 2)))
    column = max(5, trend)  # the sparkline column, at least as wide as its heading
    room = width - fixed - 2 * column
    prefix = common_prefix([r.name for r in rows])
    if wanted > room and prefix and not any(r.name[len(prefix):][:1].isdigit() for r in rows):
        labels = [label[len(prefix):] for label in labels]  # folded into the heading: `layer (under model.)`
    else:
        prefix = ""
    if max(map(len, labels), default=0) > room:  # the module types go first
        labels = [label.rsplit(" (", 1)[0] for label in labels]
    labels = short_labels(labels, room)
    label_width = max(len(label) for label in labels + ["total gradient norm"])

    def series(values: list[float | None]) -> str:
        first, last = _first_last(values)
        return f"{_num(first):>{NUMBER}} {_num(last):>{NUMBER}} {sparkline(values, trend):<{column}}"

    title = "layer" + (f" (under {prefix})" if prefix else "")
    half = 2 * NUMBER + 2 + column
    lines = [f"  {title:<{label_width}}  {'max |activation|':^{half}}  {'gradient norm':^{half}}".rstrip(),
             f"  {'':<{label_width}}  {'first':>{NUMBER}} {'last':>{NUMBER}} {'trend':<{column}}  "
             f"{'first':>{NUMBER}} {'last':>{NUMBER}} trend"]
    for label, row in zip(labels, rows):
        lines.append(f"  {label:<{label_width}}  {series(row.acts)}  {series(row.grads)}".rstrip())
    if dead:
        names = ", ".join(r.name or "<model>" for r in dead[:4]) + (", ..." if len(dead) > 4 else "")
        lines.append(f"  NaN/Inf in every step run (both columns), {len(dead)} row(s): {names}")
    totals = [r.grad_norm for r in history.steps]
    lines.append(f"  {'total gradient norm':<{label_width}}  {'':>{half}}  {series(totals)}".rstrip())
    lines += legend(n, trend, len(units(model)), len(rows) + len(dead), full, width)
    return lines


def _all_nonfinite(row: Row) -> bool:
    values = [v for v in row.acts + row.grads if v is not None]
    return bool(values) and not any(math.isfinite(v) for v in values)


def legend(steps: int, trend: int, layers: int, rows: int, full: bool, width: int = LINE_WIDTH) -> list[str]:
    """What the sparklines' scale is, and how the rows were grouped, wrapped at `width`."""
    per = ("one character per step" if steps <= trend
           else f"up to {-(-steps // trend)} steps per character (their largest)")
    lines = fit("  trend: log scale over the row's range, at least 10x tall (steady values draw flat),", width) + \
        fit(f"         {per}; ! NaN/Inf, _ exactly 0", width)
    if not full and rows < layers:
        lines += fit(f"  {layers} modules with parameters in {rows} rows: blocks grouped (a range row over all, "
                     f"then the", width) + \
            fit("  blocks that grew most and the block of the finding); --history full lists each", width)
    return lines
