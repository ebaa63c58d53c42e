"""--plot PATH.png: the per-layer history as two heat maps (rows x steps, log10 scale), max |activation| and gradient
norm. NaN, Inf, exact zero and 'not measured' each have their own colour, named in a legend, apart from the colour
scale of the finite values (so a NaN never reads as a small value, nor a zero as a NaN)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from debug_nan.engine.watch.history import History
from debug_nan.errors import InputError, require_package
from debug_nan.presentation.history_rows import build_rows
from debug_nan.presentation.outputs import atomic_write

if TYPE_CHECKING:  # (a type only: the top process of `run -- PROGRAM` renders its ranks' results without torch)
    from torch import nn

# category -> (colour, legend label); cells of the finite log10 scale are drawn with the colour map instead
SPECIAL = {1: ("#d62728", "NaN"), 2: ("#ff00ff", "Inf"), 3: ("#7f7f7f", "exactly 0"), 4: ("#ffffff", "not measured")}
CMAP = "viridis"
SOFTWARE = "debug-nan"  # the PNG's Software text: `debug-nan run` may replace a PNG of its own (app/run_paths.py)


def check_plot_available(path: str | None) -> None:
    if not path:
        return
    require_package("matplotlib", f"--plot {path} needs matplotlib: pip install matplotlib (or the project's plot "
                    f"extra).")
    if not path.lower().endswith(".png"):
        raise InputError(f"--plot {path}: give a .png path.")


def _category(v: float | None) -> int:
    if v is None:
        return 4
    if math.isnan(v):
        return 1
    if math.isinf(v):
        return 2
    return 3 if v == 0 else 0


def grids(series: list[list[float | None]]):
    """(log10 values, NaN where not a positive finite value; category per cell, 0 = on the colour scale)."""
    import numpy as np

    cats = np.array([[_category(v) for v in row] for row in series], dtype=int).reshape(len(series), -1)
    values = np.array([[math.log10(v) if _category(v) == 0 else np.nan for v in row] for row in series],
                      dtype=float).reshape(len(series), -1)
    return values, cats


def plot_history(history: History, model: nn.Module, path: str, full: bool = False,
                 finding_module: str | None = None) -> None:
    """Two heat maps side by side, one legend for the special cells; written atomically."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch

    rows = build_rows(history, model, full, finding_module)
    labels = [row.label for row in rows]
    steps = [r.step for r in history.steps]
    height = 2.6 + 0.22 * len(rows)
    fig, axes = plt.subplots(1, 2, figsize=(7 + 0.35 * min(len(steps), 60), height), sharey=True,
                             layout="constrained")
    special = ListedColormap(["#00000000"] + [SPECIAL[k][0] for k in sorted(SPECIAL)])
    seen: set[int] = set()
    for ax, attr, title in ((axes[0], "acts", "max |activation|"), (axes[1], "grads", "gradient norm")):
        values, cats = grids([getattr(row, attr) for row in rows])
        seen.update(int(c) for c in np.unique(cats) if c)
        finite = values[np.isfinite(values)]
        lo, hi = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 1.0)
        pad = max(0.0, 1.0 - (hi - lo)) / 2  # at least one decade: steady values read as one colour
        lo, hi = lo - pad, hi + pad
        image = ax.imshow(np.ma.masked_invalid(values), aspect="auto", cmap=CMAP, vmin=lo, vmax=hi,
                          interpolation="nearest")
        ax.imshow(np.ma.masked_equal(cats, 0), aspect="auto", cmap=special, vmin=0, vmax=len(SPECIAL),
                  interpolation="nearest")
        ax.set_title(title, fontsize=10, pad=8)
        ticks = range(0, len(steps), max(1, len(steps) // 20))
        ax.set_xticks(list(ticks), [str(steps[k]) for k in ticks], fontsize=7)
        ax.set_xlabel("step")
        bar = fig.colorbar(image, ax=ax, fraction=0.06, pad=0.02, shrink=min(1.0, 6 / height))
        bar.set_label("log10 of the finite values" if finite.size else "no finite value", fontsize=8)
        if not finite.size:
            bar.set_ticks([])
    axes[0].set_yticks(range(len(labels)), labels, fontsize=7)
    if seen:
        fig.legend(handles=[Patch(facecolor=SPECIAL[k][0], edgecolor="black", label=SPECIAL[k][1])
                            for k in sorted(seen)], loc="outside lower center", ncol=len(seen), fontsize=8,
                   frameon=False)
    fig.suptitle(f"debug-nan per-layer history, {len(steps)} step(s)", fontsize=11)
    try:  # atomic: a failed write leaves no half PNG (OutputWriteError names --plot and why)
        atomic_write(path, lambda handle: fig.savefig(handle, format="png", dpi=110, metadata={"Software": SOFTWARE}),
                     "--plot")
    finally:
        plt.close(fig)
