"""The settings' components and their generic structure (settings/): a composite's leaves, its flat record (a
component the run has not is left out), a table borrowed by a field, the TOML reader's errors naming the key."""

from dataclasses import dataclass, field
from typing import ClassVar

import pytest

from debug_nan.errors import InputError
from debug_nan.settings import Layout, OutputSettings, RunSettings, TrainSettings, WatchSettings
from debug_nan.settings.tables import leaves, setting


@dataclass
class Sizes:
    TABLE: ClassVar[str] = "sizes"
    TITLE: ClassVar[str] = "Sizes"
    width: int = 4
    kind: str = setting("a", choices=("a", "b"))
    depth: int | None = setting(None, table="run")


@dataclass
class Run:
    TABLE: ClassVar[str] = "run"
    TITLE: ClassVar[str] = "Run"
    steps: int = 2


@dataclass
class Both:
    sizes: Sizes = field(default_factory=Sizes)
    run: Run = field(default_factory=Run)


LAYOUT = Layout(Both, examples="width in [sizes]")


def test_a_layout_reads_the_structure():
    assert LAYOUT.sections == {"sizes": ("width", "kind"), "run": ("steps", "depth")}
    assert (LAYOUT.places["depth"].path, LAYOUT.places["depth"].component) == ("sizes", Sizes)
    assert LAYOUT.places["kind"].choices == ("a", "b")
    assert LAYOUT.default("steps") == 2 and LAYOUT.default("nope") is None
    both = LAYOUT.build({"width": 8, "depth": 3, "steps": 5})
    assert both == Both(Sizes(width=8, depth=3), Run(steps=5))
    with pytest.raises(TypeError, match="unknown settings other"):
        LAYOUT.build({"other": 1})


def test_the_toml_reader_names_the_key_and_its_table(tmp_path):
    path = tmp_path / "c.toml"

    def error(text: str) -> str:
        path.write_text(text)
        with pytest.raises(InputError) as info:
            LAYOUT.load_config(path)
        return str(info.value)

    assert "key `depth` is in [sizes] but belongs in [run]; move it there" in error("[sizes]\ndepth = 1\n")
    assert "unknown key `widht` in [sizes] (did you mean `width` in [sizes]?). Keys are the long CLI option " \
           "names, e.g. width in [sizes]." in error("[sizes]\nwidht = 1\n")
    assert "unknown table [rn] (did you mean [run]?). The tables are [sizes], [run]." in error("[rn]\nsteps = 1\n")
    assert "`kind` must be one of a, b, got 'c'" in error('kind = "c"\n')
    path.write_text("width = 3\n[run]\ndepth = 2\n")
    assert LAYOUT.load_config(path) == {"width": 3, "depth": 2}


def test_the_run_settings_are_three_components_and_the_record_has_only_those_present():
    s = RunSettings()
    assert [path for path, _ in leaves(s)] == ["train", "watch", "outputs"]
    assert set(s.to_dict()) == {f for c in (TrainSettings(), WatchSettings(), OutputSettings()) for f in vars(c)}
    script = RunSettings(train=None, watch=WatchSettings(explosion_growth=5.0), outputs=OutputSettings(plot="p"))
    assert script.accumulation_steps == 1 and "lr" not in script.to_dict() and "token_limit" not in script.to_dict()
    assert (script.to_dict()["explosion_growth"], script.to_dict()["plot"]) == (5.0, "p")
    assert RunSettings(TrainSettings(gradient_accumulation_steps=3)).accumulation_steps == 3
    assert OutputSettings(report="out/r.json").bundle_folder() == "out" and OutputSettings().bundle_folder() == "."
