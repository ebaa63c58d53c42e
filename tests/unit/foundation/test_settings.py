"""The TOML job config: tables validated per section, keys and values checked, flags over the file."""

from pathlib import Path

import pytest

from debug_nan.errors import InputError
from debug_nan.settings import SECTIONS, RunSettings, build_settings, load_config

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
    assert sorted(names) == sorted(RunSettings().to_dict()) and len(names) == len(set(names))


@pytest.mark.parametrize("name", ["aam.toml", "tiny.toml", "bench-cpu.toml"])
def test_shipped_configs_are_valid(name):
    assert load_config(CONFIGS / name)


def test_flags_override_the_file_and_the_recipe_defaults_stay_the_tasks(tmp_path):
    path = config(tmp_path, "[train]\nmax_steps = 3\nlr = 0.5\n")
    s = build_settings(str(path), {"max_steps": 7, "lr": None})
    assert (s.max_steps, s.lr) == (7, 0.5)
    assert s.warmup_steps is None and s.max_grad_norm is None  # the task's own, unless asked for


def test_missing_and_invalid_files(tmp_path):
    with pytest.raises(InputError, match="does not exist"):
        load_config(tmp_path / "nope.toml")
    assert "is not valid TOML" in error(tmp_path, "[data\n")


def test_fsdp_is_a_train_setting_that_resumes_from_a_checkpoint(tmp_path):
    assert build_settings(None, {"fsdp": True}).fsdp and "fsdp" in SECTIONS["train"]
    s = build_settings(None, {"fsdp": True, "checkpoint": str(tmp_path / "c.pt")})  # (e2e/ddp/test_fsdp_checkpoint.py)
    assert s.fsdp and s.checkpoint == str(tmp_path / "c.pt")
