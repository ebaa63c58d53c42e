"""The settings' structure read generically: components, composites, the TOML config's tables.

A component is a dataclass of plain settings with `TABLE` (its TOML table) and `TITLE` (its group in `--help`);
a field may name another table in its metadata (`setting(..., table="train")`: where config files have always
had it) and its choices (`choices=(...)`). A composite is a dataclass whose fields are components or composites
(`RunSettings`, the CLI's `JobSettings`). `Layout(composite)` reads one composite class: every setting's name, type,
table, choices and place, the tables in order (SECTIONS), and turns a TOML file or flat values into settings.

The config file groups the settings in tables, each key in exactly one. A key in the wrong table, an unknown key
or an unknown table is an error that names the key, the table and the right table. Keys may also stand at the
top level, outside any table (a short config of a few keys needs no tables); a table and the top level may not
both set the same key.
"""

from __future__ import annotations

import dataclasses
import difflib
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the same parser, as the package tomli (a dependency there)
    import tomli as tomllib

from debug_nan.errors import InputError, describe_os_error


def setting(default: Any, *, choices: tuple[str, ...] | None = None, table: str | None = None):
    """A component's field with its choices and, where it is not the component's, its TOML table."""
    metadata = {key: value for key, value in (("choices", choices), ("table", table)) if value is not None}
    return field(default=default, metadata=metadata)


def is_component(obj) -> bool:
    return is_dataclass(obj) and hasattr(obj, "TABLE")


def leaves(composite) -> list[tuple[str, Any]]:
    """(attribute, component) of a composite class or instance, depth first; a component instance's attribute is
    its dotted path from the composite. A field holding None (a component the run has not: `debug-nan run`'s
    training) is left out."""
    found = []
    for f in fields(composite):
        value = getattr(composite, f.name) if not isinstance(composite, type) else _field_class(composite, f)
        if value is None:
            continue
        if is_component(value):
            found.append((f.name, value))
        else:
            found.extend((f"{f.name}.{path}", leaf) for path, leaf in leaves(value))
    return found


def _field_class(composite: type, f: dataclasses.Field) -> type:
    """The class a composite's field holds: its default factory's (every composite field has one)."""
    if f.default_factory is dataclasses.MISSING:
        raise TypeError(f"{composite.__name__}.{f.name}: a composite's field needs a default factory")
    return f.default_factory


def flatten(composite) -> dict[str, Any]:
    """A composite instance's settings as one flat dict {name: value} (the report's and the bundle's `settings`)."""
    return {name: value for _, leaf in leaves(composite) for name, value in dataclasses.asdict(leaf).items()}


def check_choices(component) -> None:
    """Every field with choices holds one of them (values set in code, which Click and the TOML reader did not
    check); the message names the option."""
    for f in fields(component):
        allowed = f.metadata.get("choices")
        if allowed and getattr(component, f.name) not in allowed:
            raise InputError(f"--{f.name.replace('_', '-')} must be one of {', '.join(allowed)}.")


@dataclass(frozen=True)
class Place:
    """One setting: its component's attribute path in the composite, its component, type (as written), table."""

    path: str
    component: type
    type: str
    table: str
    choices: tuple[str, ...] | None
    default: Any


class Layout:
    """One composite class's settings: SECTIONS (table -> setting names, in the tables' order), every name's
    Place, and the TOML file or flat values turned into settings."""

    def __init__(self, composite: type, examples: str):
        """`examples`: a few keys with their tables, for the message about an unknown key."""
        self.composite, self.examples = composite, examples
        self.places: dict[str, Place] = {}
        own: dict[str, list[str]] = {}
        borrowed: dict[str, list[str]] = {}
        for path, component in leaves(composite):
            own.setdefault(component.TABLE, [])
            for f in fields(component):
                table = f.metadata.get("table", component.TABLE)
                (own if table == component.TABLE else borrowed).setdefault(table, []).append(f.name)
                if f.name in self.places:
                    raise TypeError(f"setting {f.name} is in two components")
                self.places[f.name] = Place(path, component, str(f.type), table, f.metadata.get("choices"),
                                            f.default)
        self.sections = {table: (*names, *borrowed.pop(table, ())) for table, names in own.items()}
        if borrowed:
            raise TypeError(f"settings borrow tables no component has: {borrowed}")
        self.table_of = {name: place.table for name, place in self.places.items()}

    # -- building settings ---------------------------------------------------------------------------------------
    def build(self, values: dict[str, Any]):
        """The composite from flat {name: value} (missing names at their defaults); unknown names: TypeError."""
        unknown = sorted(set(values) - set(self.places))
        if unknown:
            raise TypeError(f"unknown settings {', '.join(unknown)}")
        return self._build(self.composite, values)

    def _build(self, cls: type, values: dict[str, Any]):
        if is_component(cls):
            return cls(**{f.name: values[f.name] for f in fields(cls) if f.name in values})
        return cls(**{f.name: self._build(_field_class(cls, f), values) for f in fields(cls)})

    def default(self, name: str) -> Any:
        place = self.places.get(name)
        return place.default if place is not None else None

    # -- the TOML config -----------------------------------------------------------------------------------------
    def load_config(self, path: str | Path) -> dict[str, Any]:
        """Read a TOML job config into {setting: value}, validating every table, key and value."""
        path = Path(path)
        try:
            raw = tomllib.loads(path.read_text())
        except FileNotFoundError:
            raise InputError(f"Config file {path} does not exist (given with --config).") from None
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise InputError(f"Config file {path} is not valid TOML: {exc}.") from None
        except OSError as exc:  # a directory, no read permission, a name longer than the file system allows
            raise InputError(f"Config file {path} (given with --config) cannot be read: "
                             f"{describe_os_error(exc)}.") from None
        where = f"Config file {path}"
        values: dict[str, Any] = {}
        for key, value in raw.items():
            if isinstance(value, dict):
                if key not in self.sections:
                    hint = difflib.get_close_matches(key, self.sections, n=1)
                    raise InputError(f"{where}: unknown table [{key}]"
                                     f"{f' (did you mean [{hint[0]}]?)' if hint else ''}. The tables are "
                                     f"{', '.join(f'[{t}]' for t in self.sections)}.")
                for name, item in value.items():
                    self._put(values, self._setting(name, item, key, where), item, f"[{key}]", where)
            else:
                self._put(values, self._setting(key, value, None, where), value, "the top level", where)
        return values

    def _setting(self, key: str, value: Any, table: str | None, where: str) -> str:
        """The setting a key names, checked against its table (None: the top level, where any setting may stand)."""
        name = key.replace("-", "_")
        place = f"[{table}]" if table else "the top level"
        if name not in self.places:
            hint = difflib.get_close_matches(name, self.places, n=1)
            raise InputError(f"{where}: unknown key `{key}` in {place}"
                             f"{f' (did you mean `{hint[0]}` in [{self.table_of[hint[0]]}]?)' if hint else ''}. "
                             f"Keys are the long CLI option names, e.g. {self.examples}.")
        if isinstance(value, dict):
            raise InputError(f"{where}: `{key}` in {place} is a table; settings are plain values (`{name}` belongs "
                             f"in [{self.table_of[name]}]).")
        if table is not None and self.table_of[name] != table:
            raise InputError(f"{where}: key `{key}` is in [{table}] but belongs in [{self.table_of[name]}]; move it "
                             f"there.")
        return name

    def _put(self, values: dict[str, Any], name: str, value: Any, place: str, where: str) -> None:
        if name in values:
            raise InputError(f"{where}: `{name}` is set twice (again in {place}); keep one.")
        values[name] = self.check_value(name, value, where)

    def check_value(self, name: str, value: Any, origin: str) -> Any:
        """Coerce a TOML value to the field's type, or raise InputError naming the key and where it came from."""
        place = self.places[name]
        ftype = place.type
        if value is None:
            return None
        ok = True
        if ftype.startswith("bool"):
            ok = isinstance(value, bool)
        elif ftype.startswith("int"):
            ok = isinstance(value, int) and not isinstance(value, bool)
        elif ftype.startswith("float"):
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
            value = float(value) if ok else value
        elif ftype.startswith("str"):
            ok = isinstance(value, str)
        if not ok:
            raise InputError(f"{origin}: `{name}` must be of type {ftype}, got {value!r}.")
        if place.choices and value not in place.choices:
            raise InputError(f"{origin}: `{name}` must be one of {', '.join(place.choices)}, got {value!r}.")
        return value
