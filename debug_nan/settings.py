"""Run settings: one dataclass, filled from defaults, then a TOML config file, then explicit CLI flags.

The config file groups the settings in tables, each key in exactly one (SECTIONS): [data], [model], [train],
[checks], [output]. A key in the wrong table, an unknown key or an unknown table is an error that names the key,
the table and the right table. Keys may also stand at the top level, outside any table (a short config of a few
keys needs no tables); a table and the top level may not both set the same key.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the same parser, as the package tomli (a dependency there)
    import tomli as tomllib

from debug_nan.errors import InputError, describe_os_error

CHOICES = {
    "asv_order": ("first", "abundance", "random"),
    "unifrac": ("unweighted", "weighted"),
    "precision": ("fp32", "bf16", "fp16"),
    "asv_encoder": ("builtin", "torch"),
    "snapshot": ("host", "device", "params", "off"),  # checks.snapshot.SNAPSHOT_MODES
    "history": ("compact", "full"),  # report.history_rows: blocks grouped to fit one screen, or every layer
}


@dataclass
class RunSettings:
    # data
    data_dir: str = "./data"
    table: str | None = None
    tree: str | None = None
    sequences: str | None = None
    token_limit: int = 512
    batch_size: int = 6
    asv_order: str = "first"
    rarefy_depth: int | None = None
    unifrac: str = "unweighted"
    synthetic_samples: int = 48
    # model (AAM-style reference model, the built-in task)
    d_model: int = 128
    heads: int = 4
    asv_layers: int = 2
    sample_layers: int = 2
    encoder_layers: int = 2
    ffn_mult: int = 4
    dropout: float = 0.1
    guards: bool = True
    asv_encoder: str = "builtin"  # "torch": nn.TransformerEncoder (its inference fast path: PYT-8.9 as it happened)
    asv_chunk_size: int | None = None
    nuc_weight: float = 1.0
    unifrac_weight: float = 1.0
    # training
    task: str | None = None
    device: str = "auto"
    max_steps: int = 10
    gradient_accumulation_steps: int = 1
    lr: float = 1e-4  # the default optimizer's (AdamW): a task's own optimizer sets its own
    weight_decay: float = 0.01
    warmup_steps: int | None = None  # None: the task's own schedule (the built-in pipeline: warmup 2)
    max_grad_norm: float | None = None  # None: the task's own clipping (the built-in pipeline: 1.0); 0: none
    precision: str = "fp32"
    seed: int = 42
    checkpoint: str | None = None  # start from the user's checkpoint (drivers/trainer/checkpoint.py)
    checkpoint_non_strict: bool = False
    checkpoint_unsafe_load: bool = False
    skip_batches: int = 0  # micro-batches to fast-forward past (without training) before the first step
    eval_every: int | None = None  # an eval pass every N optimizer steps, and one at the end; None: none
    eval_batches: int | None = None  # held-out batches per eval pass (None: all of them)
    eval_samples: int | None = None  # built-in pipeline: samples held out (None: 1/8, at least one batch)
    fsdp: bool = False  # under torchrun: shard the model with FSDP2 (drivers/trainer/sharding.py) instead of DDP
    # checks
    trace_every_step: bool = False
    keep_going: bool = False
    explosion_threshold: float = 1e4
    explosion_growth: float = 1e3
    snapshot: str = "host"  # where the replay's copy of the state lives: host (pinned CPU on CUDA), device, off
    snapshot_every: int = 0  # copy the state every N steps; 0: auto (engine/session/copies.py)
    outputs_every: int = 0  # measure module outputs every N steps; 0: auto (engine/session/output_schedule.py)
    # output
    report: str | None = None
    log: str | None = None
    plot: str | None = None
    bundle_dir: str | None = None
    bundle: bool = True
    history: str = "compact"
    quiet: bool = False  # the header, one line per step and the summary
    tensorboard: str | None = None  # a folder for TensorBoard event files, written at the end of the run

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


FIELD_TYPES = {f.name: f.type for f in fields(RunSettings)}

SECTIONS = {
    "data": ("data_dir", "table", "tree", "sequences", "token_limit", "batch_size", "asv_order", "rarefy_depth",
             "unifrac", "synthetic_samples"),
    "model": ("d_model", "heads", "asv_layers", "sample_layers", "encoder_layers", "ffn_mult", "dropout", "guards",
              "asv_encoder", "asv_chunk_size", "nuc_weight", "unifrac_weight"),
    "train": ("task", "device", "max_steps", "gradient_accumulation_steps", "lr", "weight_decay", "warmup_steps",
              "max_grad_norm", "precision", "seed", "checkpoint", "checkpoint_non_strict", "checkpoint_unsafe_load",
              "skip_batches", "eval_every", "eval_batches", "eval_samples", "fsdp"),
    "checks": ("trace_every_step", "keep_going", "explosion_threshold", "explosion_growth", "snapshot",
               "snapshot_every", "outputs_every"),
    "output": ("report", "log", "plot", "bundle_dir", "bundle", "history", "quiet", "tensorboard"),
}
TABLE_OF = {name: table for table, names in SECTIONS.items() for name in names}
assert sorted(TABLE_OF) == sorted(FIELD_TYPES), "every setting belongs to exactly one config table"


def _check_value(name: str, value: Any, origin: str) -> Any:
    """Coerce a TOML value to the field's type, or raise InputError naming the key and where it came from."""
    ftype = str(FIELD_TYPES[name])
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
    if name in CHOICES and value not in CHOICES[name]:
        raise InputError(f"{origin}: `{name}` must be one of {', '.join(CHOICES[name])}, got {value!r}.")
    return value


def load_config(path: str | Path) -> dict[str, Any]:
    """Read a TOML job config into {setting: value}, validating every table, key and value."""
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise InputError(f"Config file {path} does not exist (given with --config).") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise InputError(f"Config file {path} is not valid TOML: {exc}.") from None
    except OSError as exc:  # a directory, no read permission, a name longer than the file system allows
        raise InputError(f"Config file {path} (given with --config) cannot be read: {describe_os_error(exc)}.") \
            from None
    where = f"Config file {path}"
    values: dict[str, Any] = {}
    for key, value in raw.items():
        if isinstance(value, dict):
            if key not in SECTIONS:
                hint = difflib.get_close_matches(key, SECTIONS, n=1)
                raise InputError(f"{where}: unknown table [{key}]"
                                 f"{f' (did you mean [{hint[0]}]?)' if hint else ''}. The tables are "
                                 f"{', '.join(f'[{t}]' for t in SECTIONS)}.")
            for name, item in value.items():
                _put(values, _setting(name, item, key, where), item, f"[{key}]", where)
        else:
            _put(values, _setting(key, value, None, where), value, "the top level", where)
    return values


def _setting(key: str, value: Any, table: str | None, where: str) -> str:
    """The setting a key names, checked against its table (None: the top level, where any setting may stand)."""
    name = key.replace("-", "_")
    place = f"[{table}]" if table else "the top level"
    if name not in FIELD_TYPES:
        hint = difflib.get_close_matches(name, FIELD_TYPES, n=1)
        raise InputError(f"{where}: unknown key `{key}` in {place}"
                         f"{f' (did you mean `{hint[0]}` in [{TABLE_OF[hint[0]]}]?)' if hint else ''}. Keys are the "
                         f"long CLI option names, e.g. token_limit in [data], d_model in [model], lr in [train].")
    if isinstance(value, dict):
        raise InputError(f"{where}: `{key}` in {place} is a table; settings are plain values (`{name}` belongs in "
                         f"[{TABLE_OF[name]}]).")
    if table is not None and TABLE_OF[name] != table:
        raise InputError(f"{where}: key `{key}` is in [{table}] but belongs in [{TABLE_OF[name]}]; move it there.")
    return name


def _put(values: dict[str, Any], name: str, value: Any, place: str, where: str) -> None:
    if name in values:
        raise InputError(f"{where}: `{name}` is set twice (again in {place}); keep one.")
    values[name] = _check_value(name, value, where)


def build_settings(config_path: str | None, overrides: dict[str, Any]) -> RunSettings:
    """Defaults <- config file <- explicit flags (entries of `overrides` that are not None)."""
    values: dict[str, Any] = {}
    if config_path:
        values.update(load_config(config_path))
    values.update({k: v for k, v in overrides.items() if v is not None})
    settings = RunSettings(**values)
    validate(settings)
    return settings


def validate(s: RunSettings) -> None:
    """Range checks that do not need the data; each message names the option."""
    positive = ["token_limit", "batch_size", "max_steps", "gradient_accumulation_steps", "d_model", "heads",
                "ffn_mult", "synthetic_samples", "asv_layers", "sample_layers", "encoder_layers"]
    for name in positive:
        value = getattr(s, name)
        if value is None or value <= 0:
            raise InputError(f"--{name.replace('_', '-')} must be a positive integer, got {value}.")
    if s.d_model % s.heads:
        raise InputError(f"--d-model ({s.d_model}) must be divisible by --heads ({s.heads}).")
    def option(name: str) -> str:
        return "--" + name.replace("_", "-")

    for name in ("lr", "explosion_threshold", "explosion_growth", "nuc_weight", "unifrac_weight"):
        value = getattr(s, name)
        if not (math.isfinite(value) and value > 0):
            raise InputError(f"{option(name)} must be a positive finite number, got {value}.")
    for name in ("weight_decay", "max_grad_norm"):
        value = getattr(s, name)
        if value is not None and not (math.isfinite(value) and value >= 0):
            raise InputError(f"{option(name)} must be a finite number >= 0, got {value}.")
    if s.warmup_steps is not None and s.warmup_steps < 0:
        raise InputError(f"--warmup-steps must be >= 0, got {s.warmup_steps}.")
    if not 0 <= s.seed < 2**63:
        raise InputError(f"--seed must be in 0 .. 2^63 - 1, got {s.seed}.")
    if s.rarefy_depth is not None and s.rarefy_depth <= 0:
        raise InputError(f"--rarefy-depth must be a positive integer, got {s.rarefy_depth}.")
    if s.asv_chunk_size is not None and s.asv_chunk_size <= 0:
        raise InputError(f"--asv-chunk-size must be a positive integer, got {s.asv_chunk_size}.")
    if s.skip_batches < 0:
        raise InputError(f"--skip-batches must be >= 0, got {s.skip_batches}.")
    for name in ("eval_every", "eval_batches", "eval_samples"):
        value = getattr(s, name)
        if value is not None and value <= 0:
            raise InputError(f"{option(name)} must be a positive integer, got {value}.")
    if s.eval_every is None and (s.eval_batches is not None or s.eval_samples is not None):
        given = "--eval-batches" if s.eval_batches is not None else "--eval-samples"
        raise InputError(f"{given} sets up the eval pass, which runs only with --eval-every N; add it.")
    if not 0.0 <= s.dropout < 1.0:
        raise InputError(f"--dropout must be in [0, 1), got {s.dropout}.")
    if s.snapshot_every < 0:
        raise InputError(f"--snapshot-every must be >= 0 (0: chosen from what a copy costs), got {s.snapshot_every}.")
    if s.outputs_every < 0:
        raise InputError(f"--outputs-every must be >= 0 (0: chosen from what measuring them costs), got "
                         f"{s.outputs_every}.")
    if s.keep_going and s.snapshot in ("off", "params"):
        raise InputError("--keep-going skips a failing step's update by restoring the snapshot taken before it; "
                         f"with --snapshot {s.snapshot} it cannot undo an optimizer step: use --snapshot host (or "
                         "device), or "
                         "--stop-at-first.")
    for name, allowed in CHOICES.items():
        if getattr(s, name) not in allowed:
            raise InputError(f"--{name.replace('_', '-')} must be one of {', '.join(allowed)}.")
