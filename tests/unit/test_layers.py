"""The package's import graph, read from the source (ast): no cycle, and no module importing from a layer above
its own. The layers, by role (ARCHITECTURE.md):

    foundation (errors, frames, settings, process/, the package root)
    -> engine: vocabulary and stats -> watch -> trace -> explain -> replay -> session (no I/O, no loop)
    -> presentation (log, summary, history, bundles: formats the engine's data)
    -> the plug-in seam (drivers/task.py, drivers/recipe.py)
    -> drivers (Trainer, Monitor, frameworks, run) | the built-in AAM task (aam/): side by side, neither imports
       the other
    -> application (app/: CLI, jobs, replay command) and the public import paths (integrations/) -> __main__
"""

import ast
import re
from functools import lru_cache
from pathlib import Path

import pytest

from debug_nan.app.job_settings import SECTIONS

PACKAGE = Path(__file__).resolve().parents[2] / "debug_nan"

LAYERS = {  # module or package prefix -> layer; the longest matching prefix wins
    "debug_nan": 0, "debug_nan.errors": 0, "debug_nan.settings": 0, "debug_nan.frames": 0, "debug_nan.process": 0,
    "debug_nan.engine": 1, "debug_nan.engine.vocabulary": 1, "debug_nan.engine.stats": 1,
    "debug_nan.engine.watch": 2,
    "debug_nan.engine.trace": 3,
    "debug_nan.engine.explain": 4,
    "debug_nan.engine.replay": 5,
    "debug_nan.engine.session": 6,
    "debug_nan.presentation": 7,
    "debug_nan.drivers.task": 8, "debug_nan.drivers.recipe": 8,
    "debug_nan.drivers": 9, "debug_nan.aam": 9,
    "debug_nan.app": 10, "debug_nan.integrations": 10,
    "debug_nan.__main__": 11,
}
SIDE_BY_SIDE = ("debug_nan.drivers", "debug_nan.aam")  # same layer, and neither imports the other (but the seam)
SEAM = ("debug_nan.drivers.task", "debug_nan.drivers.recipe")

# Imports inside a function: allowed only when listed here, each with its reason. (importer, imported)
LAZY = {
    ("debug_nan", "debug_nan.drivers.monitor"): "`import debug_nan` stays light (no torch) for the CLI; Monitor is "
                                                "exposed on first use",
    ("debug_nan.app.cli", "debug_nan.app.job"): "--help and usage errors answer without importing torch",
    ("debug_nan.app.cli", "debug_nan.app.replay"): "--help and usage errors answer without importing torch",
    ("debug_nan.app.cli", "debug_nan.app.run_job"): "--help and usage errors answer without importing torch",
    ("debug_nan.app.cli", "debug_nan.app.run_program"): "a program's top process never trains: it imports no "
                                                        "torch, nor the in-process run (app/run_job.py)",
    ("debug_nan.app.cli", "debug_nan.presentation.report"): "--help and usage errors answer without importing torch",
    ("debug_nan.app.cli", "debug_nan.engine.session.distributed"): "--help and usage errors answer without importing "
                                                                  "torch",
}

# Known violations in files other helpers own, removed by their change (the lead deletes the entry at merge).
PENDING: dict = {}  # upward imports waiting for a fix, each with its reason (none now)


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer(module: str) -> int:
    best = max((p for p in LAYERS if module == p or module.startswith(p + ".")), key=len)
    return LAYERS[best]


def resolve(module: str, known: set[str]) -> str:
    """An imported name -> the package module it loads (`from debug_nan.train import distributed` names the
    module debug_nan.engine.session.distributed)."""
    return module if module in known else module.rsplit(".", 1)[0]


@lru_cache(maxsize=1)
def imports() -> list[tuple[str, str, bool, int]]:
    """(importer, imported, lazy, line) for every import of a debug_nan module."""
    files = sorted(PACKAGE.rglob("*.py"))
    known = {module_name(f) for f in files}
    out = []
    for f in files:
        importer = module_name(f)
        tree = ast.parse(f.read_text(), str(f))
        lazy_nodes = {id(n) for fn in ast.walk(tree) if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))
                      for n in ast.walk(fn)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [f"{node.module}.{a.name}" for a in node.names]
            else:
                continue
            for name in names:
                if name.split(".")[0] == "debug_nan":
                    target = resolve(name, known)
                    if target != importer:
                        out.append((importer, target, id(node) in lazy_nodes, node.lineno))
    return out


def test_the_walk_sees_the_package():
    found = imports()
    assert len({i for i, _, _, _ in found}) > 30
    assert ("debug_nan.engine.session.session", "debug_nan.engine.replay.pinpoint", False) in {
        (i, t, z) for i, t, z, _ in found}


def test_no_upward_import():
    upward = [f"{i}:{line} imports {t} (layer {layer(i)} -> {layer(t)})" for i, t, _, line in imports()
              if layer(t) > layer(i) and (i, t) not in LAZY and (i, t) not in PENDING]
    assert not upward, "\n".join(upward)


def test_drivers_and_the_builtin_task_stand_side_by_side():
    """The built-in AAM task is a plug-in like any --task: it knows the seam (Task, Recipe), no driver; and no
    driver knows it (the application picks the task)."""
    def family(module):
        return next((f for f in SIDE_BY_SIDE if module == f or module.startswith(f + ".")), None)
    crossing = [f"{i}:{line} imports {t}" for i, t, _, line in imports()
                if family(i) and family(t) and family(i) != family(t) and not t.startswith(SEAM)
                and not i.startswith(SEAM)]
    assert not crossing, "\n".join(crossing)


def test_lazy_imports_are_the_listed_ones():
    lazy = {(i, t) for i, t, z, _ in imports() if z}
    assert lazy - set(LAZY) - set(PENDING) == set(), "an unlisted import inside a function: import at the top"
    assert set(LAZY) - lazy == set(), "a listed lazy import no longer exists: remove it from LAZY"


def test_no_import_cycle():
    """Over every import but the listed lazy ones (which run after every module has loaded)."""
    graph: dict[str, set[str]] = {}
    for i, t, _, _ in imports():
        if (i, t) not in PENDING and (i, t) not in LAZY:
            graph.setdefault(i, set()).add(t)
    state: dict[str, int] = {}  # 1 visiting, 2 done

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path + [node, nxt]
            if nxt not in state:
                cycle = visit(nxt, path + [node])
                if cycle:
                    return cycle
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state:
            cycle = visit(start, [])
            assert cycle is None, " -> ".join(cycle)


HUGE_FILE_LINES = 800  # a guideline, not a cap: files are split by meaning; only one this long surely holds several


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_file_is_huge(path):
    assert len(path.read_text().splitlines()) <= HUGE_FILE_LINES, "split it by meaning: one responsibility per file"


def test_only_the_built_in_task_reads_its_settings():
    """The [data] and [model] tables of the settings are the built-in AAM task's (aam/settings.py): outside aam/
    only the application (which builds it and prints its header) may import or read them, so the engine,
    presentation and the other drivers carry no AAM knob."""
    names = "|".join(SECTIONS["data"] + SECTIONS["model"])
    read = re.compile(rf"\b(?:s|settings|self\.s|trainer\.s|\w+\.settings|\w*\.?aam(?:\.data|\.model)?)\.({names})\b")
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        part = path.relative_to(PACKAGE).parts[0]
        if part in ("aam", "app"):
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if (m := read.search(line)) is not None:
                found.append(f"{path.relative_to(PACKAGE)}:{n} reads {m[1]}")
    found += [f"{i}:{line} imports {t}" for i, t, _, line in imports()
              if t.startswith("debug_nan.aam.settings") and not i.startswith(("debug_nan.aam", "debug_nan.app"))]
    assert not found, found


def test_the_engine_sees_only_the_watchs_settings():
    """The engine imports no settings but the watch's (settings/watch.py): not the training's, the outputs', the
    composed ones, the built-in task's or the CLI job's."""
    seen = sorted({f"{i}:{line} imports {t}" for i, t, _, line in imports() if i.startswith("debug_nan.engine")
                   and (t.startswith(("debug_nan.settings", "debug_nan.aam", "debug_nan.app")))
                   and t != "debug_nan.settings.watch"})
    assert not seen, seen
    assert ("debug_nan.engine.session.policies", "debug_nan.settings.watch") in {(i, t) for i, t, _, _ in imports()}
