"""The CLI job's settings (app/job_settings.py): the TOML config's tables from the components (validated per
table, keys and values checked, the same tables and keys as the one flat settings class before them), flags over the
file, the flat record the report and the bundle carry."""

from pathlib import Path

import pytest

from debug_nan.errors import InputError
from debug_nan.app.job_settings import LAYOUT, SECTIONS, JobSettings, build_settings, load_config

CONFIGS = Path(__file__).resolve().parents[3] / "configs"


def config(tmp_path, text: str) -> Path:
    path = tmp_path / "job.toml"
    path.write_text(text)
    return path


def error(tmp_path, text: str) -> str:
    with pytest.raises(InputError) as info:
        load_config(config(tmp_path, text))
    return str(info.value)


def test_tables_fill_the_settings(tmp_path):
    values = load_config(config(tmp_path, "[data]\ntoken_limit = 24\n[model]\nd_model = 32\n[train]\nlr = 0.5\n"
                                          "[checks]\nkeep_going = true\n[output]\nbundle = false\n"))
    assert values == {"token_limit": 24, "d_model": 32, "lr": 0.5, "keep_going": True, "bundle": False}


def test_a_key_in_the_wrong_table_names_the_right_one(tmp_path):
    message = error(tmp_path, "[model]\nlr = 0.1\n")
    assert "key `lr` is in [model] but belongs in [train]" in message and "job.toml" in message


def test_unknown_key_names_the_table_and_a_close_match(tmp_path):
    message = error(tmp_path, "[model]\nd_modle = 3\n")
    assert "unknown key `d_modle` in [model]" in message and "did you mean `d_model` in [model]?" in message


def test_unknown_table(tmp_path):
    message = error(tmp_path, "[training]\nlr = 0.1\n")
    assert "unknown table [training] (did you mean [train]?)" in message
    assert "[data], [model], [train], [checks], [output]" in message


def test_a_nested_table_is_not_a_setting(tmp_path):
    assert "`heads` in [model] is a table" in error(tmp_path, "[model.heads]\nn = 2\n")


def test_wrong_type_and_wrong_choice(tmp_path):
    assert "`token_limit` must be of type int, got 'many'" in error(tmp_path, '[data]\ntoken_limit = "many"\n')
    assert "`precision` must be one of fp32, bf16, fp16, got 'fp8'" in error(tmp_path, '[train]\nprecision = "fp8"\n')


def test_flat_top_level_keys_are_accepted_but_not_twice(tmp_path):
    assert load_config(config(tmp_path, "max_steps = 3\ntoken-limit = 8\n")) == {"max_steps": 3, "token_limit": 8}
    assert "`max_steps` is set twice (again in [train])" in error(tmp_path, "max_steps = 3\n[train]\nmax_steps = 4\n")


def test_every_setting_has_exactly_one_table():
    names = [n for table in SECTIONS.values() for n in table]
    assert sorted(names) == sorted(JobSettings().to_dict()) and len(names) == len(set(names))


@pytest.mark.parametrize("name", ["aam.toml", "tiny.toml", "bench-cpu.toml"])
def test_shipped_configs_are_valid(name):
    assert load_config(CONFIGS / name)


def test_flags_override_the_file_and_the_recipe_defaults_stay_the_tasks(tmp_path):
    path = config(tmp_path, "[train]\nmax_steps = 3\nlr = 0.5\n")
    s = build_settings(str(path), {"max_steps": 7, "lr": None})
    assert (s.train.max_steps, s.train.lr) == (7, 0.5)
    assert s.train.warmup_steps is None and s.train.max_grad_norm is None  # the task's own, unless asked for


def test_missing_and_invalid_files(tmp_path):
    with pytest.raises(InputError, match="does not exist"):
        load_config(tmp_path / "nope.toml")
    assert "is not valid TOML" in error(tmp_path, "[data\n")


def test_fsdp_is_a_train_setting_that_resumes_from_a_checkpoint(tmp_path):
    assert build_settings(None, {"fsdp": True}).train.fsdp and "fsdp" in SECTIONS["train"]
    s = build_settings(None, {"fsdp": True, "checkpoint": str(tmp_path / "c.pt")})  # (e2e/ddp/test_fsdp_checkpoint.py)
    assert s.train.fsdp and s.train.checkpoint == str(tmp_path / "c.pt")


# the tables and keys of the one flat settings class the components replaced: every config file written for it
# loads unchanged
FLAT_TABLES = {
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


def test_the_tables_and_keys_are_the_flat_settings_ones(tmp_path):
    assert list(SECTIONS) == list(FLAT_TABLES)
    assert {table: set(names) for table, names in SECTIONS.items()} == \
        {table: set(names) for table, names in FLAT_TABLES.items()}
    toml = {bool: lambda v: str(v).lower(), str: lambda v: f'"{v}"', int: str, float: repr}
    every = "".join(f"[{table}]\n" + "".join(f"{name} = {toml[type(value)](value)}\n" for name in names
                                             if (value := LAYOUT.default(name)) is not None)
                    for table, names in FLAT_TABLES.items())  # every key with a default, in its old table
    assert load_config(config(tmp_path, every)) == {n: LAYOUT.default(n) for names in FLAT_TABLES.values()
                                                    for n in names if LAYOUT.default(n) is not None}


def test_the_tables_are_the_components():
    """[data] and [model] are the built-in task's (aam/settings.py), [train], [checks], [output] the training's, the
    watch's and the outputs'; --eval-samples is the built-in task's, in [train] where configs have had it."""
    from debug_nan.aam.settings import AAMData, AAMModel
    from debug_nan.settings import OutputSettings, TrainSettings, WatchSettings

    owner = {name: place.component for name, place in LAYOUT.places.items()}
    for table, component in (("data", AAMData), ("model", AAMModel), ("train", TrainSettings),
                             ("checks", WatchSettings), ("output", OutputSettings)):
        assert {owner[n] for n in SECTIONS[table] if n != "eval_samples"} == {component}, table
    assert owner["eval_samples"] is AAMData and LAYOUT.table_of["eval_samples"] == "train"
    s = build_settings(None, {"token_limit": 8, "d_model": 16, "heads": 2, "lr": 0.5, "keep_going": True,
                              "plot": "p.png", "eval_every": 2, "eval_samples": 12})
    assert (s.aam.data.token_limit, s.aam.model.d_model, s.train.lr, s.watch.keep_going, s.outputs.plot,
            s.aam.data.eval_samples) == (8, 16, 0.5, True, "p.png", 12)


def test_eval_samples_stays_in_train(tmp_path):
    assert "key `eval_samples` is in [data] but belongs in [train]" in error(tmp_path, "[data]\neval_samples = 8\n")
    assert load_config(config(tmp_path, "[train]\neval_every = 1\neval_samples = 8\n"))["eval_samples"] == 8


def test_the_flat_record_and_the_tasks_view_keep_the_names():
    """The report's and the bundle's `settings`: one flat dict by the options' names, in the tables' order, read
    back into the same settings; a --task is given the flat names (settings.batch_size) as before."""
    s = build_settings(None, {"batch_size": 4, "seed": 7, "snapshot": "device", "history": "full"})
    record = s.to_dict()
    assert list(record) == [n for names in SECTIONS.values() for n in names]
    assert JobSettings.from_flat(record) == s
    view = s.for_task()
    assert (view.batch_size, view.seed, view.snapshot, view.history, view.token_limit) == (4, 7, "device", "full",
                                                                                          512)


@pytest.mark.parametrize("flags, message", [
    ({"d_model": 30, "heads": 4}, "--d-model (30) must be divisible by --heads (4)."),
    ({"keep_going": True, "snapshot": "off"}, "with --snapshot off it cannot undo an optimizer step"),
    ({"eval_samples": 8}, "--eval-samples sets up the eval pass, which runs only with --eval-every N"),
    ({"eval_batches": 2, "eval_samples": 8}, "--eval-batches sets up the eval pass"),
    ({"max_steps": 0}, "--max-steps must be a positive integer, got 0."),
    ({"token_limit": -1}, "--token-limit must be a positive integer, got -1."),
    ({"explosion_growth": float("inf")}, "--explosion-growth must be a positive finite number, got inf."),
    ({"outputs_every": -1}, "--outputs-every must be >= 0"),
    ({"dropout": 1.0}, "--dropout must be in [0, 1), got 1.0."),
])
def test_each_component_checks_its_own_ranges(flags, message):
    with pytest.raises(InputError) as info:
        build_settings(None, flags)
    assert message in str(info.value)


def test_a_value_set_in_code_outside_its_choices_names_the_option():
    s = JobSettings.from_flat({"history": "wide"})
    with pytest.raises(InputError, match="--history must be one of compact, full"):
        s.validate()


def test_every_setting_is_an_option_in_the_help_group_of_its_component():
    import click

    from debug_nan.app.cli import main
    from debug_nan.app.cli_help import GENERAL, SECTIONS as HELP_GROUPS, section_of

    params = {p.name: p for p in main.params}
    assert set(LAYOUT.places) <= set(params), "a setting without its option"
    assert {section_of(params[name]) for name in SECTIONS["data"] + SECTIONS["model"]} == {HELP_GROUPS[3]}
    assert section_of(params["eval_samples"]) == HELP_GROUPS[3]  # the built-in task's, though in [train]
    assert (section_of(params["lr"]), section_of(params["snapshot"]), section_of(params["plot"])) == \
        HELP_GROUPS[1:3] + HELP_GROUPS[4:]
    assert section_of(params["config"]) == GENERAL
    text = main.get_help(click.Context(main, info_name="debug-nan"))
    assert [text.index(f"\n{title}:\n") for title in HELP_GROUPS] == sorted(text.index(f"\n{title}:\n")
                                                                          for title in HELP_GROUPS)
