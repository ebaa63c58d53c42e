"""The rows of the per-layer history: which layers, grouped how, named how. Shared by the log's table, the heat
map and the TensorBoard export.

A unit is a module that owns parameters. `--history full` gives one row per unit. The compact view (the default)
keeps that when it fits one screen (MAX_ROWS); deeper models are grouped by block: every unit whose path holds a
numeric component (`layers.17.mlp.up_proj`) belongs to the block up to it (`layers.17`), and the blocks of one
container form a family (`layers`). A family is one row over all its blocks (`layers.0..31`), then its TOP_BLOCKS
blocks that grew most (over their finite values) and the block of the finding, each as one row.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from debug_nan.engine.sharded import user_class, user_path
from debug_nan.engine.watch.history import History

if TYPE_CHECKING:  # (a type only: the top process of `run -- PROGRAM` renders its ranks' results without torch)
    from torch import nn

MAX_ROWS = 16  # rows of layers in the compact view: with the header and the legend, one screen
TOP_BLOCKS = 3  # blocks of a family shown one by one, besides the block of the finding
_INDEX = re.compile(r"^\d+$")


@dataclass
class Row:
    """One row: a label (unique in its table), and per history step max |activation| and the gradient norm
    (None: not measured in that step)."""

    name: str  # module path as the user wrote it (no wrapper segments), block path or family range (`layers.0..31`);
    # '' is the model root
    kind: str  # the module type, `Block x 32` for a family
    acts: list[float | None]
    grads: list[float | None]

    @property
    def label(self) -> str:
        return f"{self.name or '<model>'} ({self.kind})"


@dataclass
class Layout:
    """A model's modules as the rows read them: (path, type, direct parameter names) for every module, in model
    order (a block that owns no parameter is named by its type too). Made from the model (`of`), or read back from
    its JSON form (`modules`) where the model is in another process: the ranks of `debug-nan run -- PROGRAM`."""

    modules: list[tuple[str, str, list[str]]]

    @classmethod
    def of(cls, model: nn.Module | Layout) -> Layout:
        if isinstance(model, Layout):
            return model
        return cls([(path, user_class(type(module)).__name__,
                     [f"{path}.{n}" if path else n for n, _ in module.named_parameters(recurse=False)])
                    for path, module in model.named_modules()])


def units(model: nn.Module | Layout) -> list[tuple[str, str, list[str]]]:
    """(path, type, direct parameter names) for every module that owns parameters, in model order."""
    return [(path, kind, own) for path, kind, own in Layout.of(model).modules if own]


def _worse(a: float | None, b: float) -> float:
    """The larger, a NaN winning over everything (it is what the row must show)."""
    if a is None or math.isnan(b):
        return b
    return a if math.isnan(a) else max(a, b)


def _measure(history: History, act_modules: list[list[str]], grad_params: list[list[str]], subtree: list[bool]):
    """Per row: max |activation| over its modules' outputs (with every submodule's when `subtree`) and the L2 norm
    of its parameters' gradients, per step. One pass over each step's values (dict look-ups, no scans)."""
    owners: dict[str, list[int]] = {}  # parameter -> rows it counts in
    for row, params in enumerate(grad_params):
        for p in params:
            owners.setdefault(p, []).append(row)
    exact: dict[str, list[int]] = {}
    prefixes: dict[str, list[int]] = {}
    for row, names in enumerate(act_modules):
        for name in names:
            (prefixes if subtree[row] else exact).setdefault(name, []).append(row)
    rows = len(grad_params)
    acts: list[list[float | None]] = [[] for _ in range(rows)]
    grads: list[list[float | None]] = [[] for _ in range(rows)]
    for record in history.steps:
        a: list[float | None] = [None] * rows
        for name, value in record.activations.items():
            for row in exact.get(name, []) + _covering(name, prefixes):
                a[row] = _worse(a[row], value)
        squares: list[float | None] = [None] * rows
        for name, value in record.grad_norms.items():
            for row in owners.get(name, ()):
                squares[row] = (squares[row] or 0.0) + value * value
        for row in range(rows):
            acts[row].append(a[row])
            grads[row].append(None if squares[row] is None else math.sqrt(squares[row]))
    return acts, grads


def _covering(name: str, prefixes: dict[str, list[int]]) -> list[int]:
    """The rows whose prefix is `name` or one of its ancestors (`a.b.c` -> rows of `a.b.c`, `a.b`, `a`)."""
    out = list(prefixes.get(name, ()))
    while name:
        name = name.rpartition(".")[0]
        out += prefixes.get(name, ())
    return out


def block_of(path: str) -> tuple[str, str] | None:
    """(family, block) of a module path: `layers.17.mlp` -> ("layers", "layers.17"), `3.weight` of a root
    nn.Sequential -> ("", "3"); None outside any block."""
    parts = path.split(".")
    for k, part in enumerate(parts):
        if _INDEX.match(part):
            return ".".join(parts[:k]), ".".join(parts[:k + 1])
    return None


def _growth(acts: list[float | None], grads: list[float | None]) -> float:
    """How much a block grew: last / first over its finite values, the larger of both series."""
    growth = 0.0
    for values in (acts, grads):
        finite = [v for v in values if v is not None and math.isfinite(v) and v > 0]
        if len(finite) >= 2:
            growth = max(growth, finite[-1] / finite[0])
    return growth


def build_rows(history: History, model: nn.Module | Layout, full: bool = False,
               finding_module: str | None = None) -> list[Row]:
    """The table's rows in model order: every unit (`full`, or when they fit), else grouped by block."""
    model = Layout.of(model)
    found = units(model)
    if full or len(found) <= MAX_ROWS:
        acts, grads = _measure(history, [[p] for p, _, _ in found], [params for _, _, params in found],
                               [False] * len(found))
        return [Row(user_path(p), kind, a, g) for (p, kind, _), a, g in zip(found, acts, grads)]
    return _grouped(history, model, found, finding_module)


def _grouped(history, model: Layout, found, finding_module) -> list[Row]:
    kinds = {path: kind for path, kind, _ in model.modules}
    order: list[tuple[str, str]] = []  # ("unit", path) | ("family", family) in model order
    families: dict[str, dict[str, list[str]]] = {}  # family -> block -> parameters
    loose: dict[str, list[str]] = {}
    for path, _, params in found:
        where = block_of(path)
        if where is None:
            loose[path] = params
            order.append(("unit", path))
            continue
        family, block = where
        if family not in families:
            families[family] = {}
            order.append(("family", family))
        families[family].setdefault(block, []).extend(params)
    # measure every block once, then pick which to show
    blocks = [b for fam in families.values() for b in fam]
    acts, grads = _measure(history, [[b] for b in blocks], [params for fam in families.values()
                                                           for params in fam.values()], [True] * len(blocks))
    per_block = {b: (a, g) for b, a, g in zip(blocks, acts, grads)}
    steps = len(history.steps)
    target = block_of(finding_module)[1] if finding_module and block_of(finding_module) else None
    specs: list[tuple[str, str, list[str], list[str]]] = []  # name, kind, activation prefixes, parameters
    for what, name in order:
        if what == "unit":
            specs.append((name, kinds[name], [name], loose[name]))
            continue
        fam = families[name]
        if len(fam) == 1:  # one block: itself
            (block, params), = fam.items()
            specs.append((block, kinds[block], [block], params))
            continue
        first, last = (b.rsplit(".", 1)[-1] for b in (next(iter(fam)), list(fam)[-1]))
        kind = kinds[next(iter(fam))]
        specs.append((f"{name}.{first}..{last}" if name else f"{first}..{last}", f"{kind} x {len(fam)}", list(fam),
                      [p for params in fam.values() for p in params]))
        # with one step there is no growth to rank by: the range row and the block of the finding
        ranked = sorted(fam, key=lambda b: _growth(*per_block[b]), reverse=True)[:TOP_BLOCKS if steps > 1 else 0]
        chosen = set(ranked) | ({target} if target in fam else set())
        specs += [(b, kinds[b], [b], fam[b]) for b in fam if b in chosen]
    if len(specs) > MAX_ROWS:  # many loose units as well: keep the families and the finding's rows first
        specs = _fold_loose(specs, families, target)
    acts, grads = _measure(history, [s[2] for s in specs], [s[3] for s in specs],
                           [s[0] not in loose for s in specs])
    return [Row(user_path(name), kind, a, g) for (name, kind, _, _), a, g in zip(specs, acts, grads)]


def _fold_loose(specs, families, target):
    """Loose units (outside blocks) grouped by their top-level module when the grouped table is still too tall."""
    out, seen, counts = [], {}, {}
    blocks = {b for fam in families.values() for b in fam}
    for name, kind, prefixes, params in specs:
        if ".." in name or name in blocks or "." not in name:  # families, blocks, top-level units stay
            out.append((name, kind, prefixes, params))
            continue
        top = name.split(".")[0]
        counts[top] = counts.get(top, 0) + 1
        if top in seen:
            row = out[seen[top]]
            out[seen[top]] = (f"{top}.*", f"{counts[top]} modules", row[2] + prefixes, row[3] + params)
        else:
            seen[top] = len(out)
            out.append((name, kind, prefixes, params))
    return out
