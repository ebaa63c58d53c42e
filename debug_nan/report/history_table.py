"""History at a glance: per layer, max |activation| and gradient norm over the steps run, as a compact table
with a sparkline per series (the log), or as a heat map (--plot PATH.png, matplotlib)."""

from __future__ import annotations

import math

from torch import nn

from debug_nan.checks.history import History
from debug_nan.errors import InputError
from debug_nan.report.outputs import atomic_write

BARS = "▁▂▃▄▅▆▇█"
MAX_ROWS = 60


def layers(model: nn.Module) -> list[tuple[str, str, list[str]]]:
    """(path, type, direct parameter names) for every module that owns parameters, in model order."""
    out = []
    for path, module in model.named_modules():
        own = [f"{path}.{n}" if path else n for n, _ in module.named_parameters(recurse=False)]
        if own:
            out.append((path, type(module).__name__, own))
    return out


def series(history: History, model: nn.Module) -> list[tuple[str, list[float | None], list[float | None]]]:
    """(label, max |activation| per step, gradient norm per step) per layer."""
    rows = []
    for path, kind, params in layers(model):
        acts = [r.activations.get(path) for r in history.steps]
        grads = []
        for r in history.steps:
            values = [r.grad_norms[p] for p in params if p in r.grad_norms]
            grads.append(math.sqrt(sum(v * v for v in values)) if values else None)
        rows.append((f"{path or '<model>'} ({kind})", acts, grads))
    return rows


def sparkline(values: list[float | None]) -> str:
    """One character per step on a log scale between the row's min and max; '!' non-finite, ' ' missing."""
    finite = [v for v in values if v is not None and math.isfinite(v) and v > 0]
    if not finite:
        return "".join("!" if v is not None and not math.isfinite(v) else " " for v in values)
    lo, hi = math.log10(min(finite)), math.log10(max(finite))
    out = []
    for v in values:
        if v is None:
            out.append(" ")
        elif not math.isfinite(v):
            out.append("!")
        elif v <= 0 or hi - lo < 1e-12:
            out.append(BARS[0])
        else:
            out.append(BARS[min(7, int((math.log10(v) - lo) / (hi - lo) * 7.999))])
    return "".join(out)


def _num(v: float | None) -> str:
    return "-" if v is None else f"{v:.3g}"


def history_lines(history: History, model: nn.Module) -> list[str]:
    rows = series(history, model)
    if not history.steps or not rows:
        return []
    width = min(max(len(label) for label, _, _ in rows), 56)
    n = len(history.steps)
    spark = max(n, 5)
    head = f"  {'layer':<{width}}  {'max|activation|':^{spark + 20}}  {'gradient norm':^{spark + 20}}"
    sub = f"  {'':<{width}}  {'first':>9} {'last':>9} {'trend':<{spark}}  {'first':>9} {'last':>9} {'trend':<{spark}}"
    lines = [head, sub]
    for label, acts, grads in rows[:MAX_ROWS]:
        first_a = next((a for a in acts if a is not None), None)
        first_g = next((g for g in grads if g is not None), None)
        last_a = next((a for a in reversed(acts) if a is not None), None)
        last_g = next((g for g in reversed(grads) if g is not None), None)
        lines.append(f"  {label[-width:]:<{width}}  {_num(first_a):>9} {_num(last_a):>9} {sparkline(acts):<{spark}}"
                     f"  {_num(first_g):>9} {_num(last_g):>9} {sparkline(grads):<{spark}}")
    if len(rows) > MAX_ROWS:
        lines.append(f"  ... {len(rows) - MAX_ROWS} more layers in the JSON report's history")
    totals = [r.grad_norm for r in history.steps]
    lines.append(f"  {'total gradient norm':<{width}}  {'':>9} {'':>9} {'':<{spark}}  {_num(totals[0]):>9} "
                 f"{_num(totals[-1]):>9} {sparkline(totals):<{spark}}")
    return lines


def check_plot_available(path: str | None) -> None:
    if not path:
        return
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise InputError(f"--plot {path} needs matplotlib: pip install matplotlib (or the project's plot extra).") from None
    if not path.lower().endswith(".png"):
        raise InputError(f"--plot {path}: give a .png path.")


def plot_history(history: History, model: nn.Module, path: str) -> None:
    """Two heat maps (layers x steps, log10 scale): max |activation| and gradient norm."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    rows = series(history, model)
    labels = [label for label, _, _ in rows]

    def grid(index: int) -> np.ndarray:
        data = np.array([[np.nan if v is None else v for v in row[index]] for row in rows], dtype=float)
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.log10(np.where(np.isfinite(data) & (data > 0), data, np.nan))

    steps = [r.step for r in history.steps]
    fig, axes = plt.subplots(1, 2, figsize=(6 + 0.4 * len(steps), 2 + 0.22 * len(rows)), sharey=True)
    for ax, index, title in ((axes[0], 1, "log10 max |activation|"), (axes[1], 2, "log10 gradient norm")):
        image = ax.imshow(grid(index), aspect="auto", cmap="magma", interpolation="nearest")
        ax.set_title(title)
        ax.set_xticks(range(len(steps)), [str(s) for s in steps])
        ax.set_xlabel("step")
        fig.colorbar(image, ax=ax, fraction=0.05)
    axes[0].set_yticks(range(len(labels)), labels, fontsize=7)
    fig.tight_layout()
    try:  # atomic: a failed write leaves no half PNG (OutputWriteError names --plot and why)
        atomic_write(path, lambda handle: fig.savefig(handle, format="png", dpi=110), "--plot")
    finally:
        plt.close(fig)
