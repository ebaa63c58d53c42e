"""An interrupted replay of a bundle whose cause this version does not declare keeps its words (app/replay.py)."""

from __future__ import annotations


def test_an_interrupted_replay_of_a_bundle_with_an_unknown_cause_keeps_its_words():
    """A bundle from a newer debug-nan may name a cause this version does not declare: an interrupt during its
    replay still gives a result (no traceback from inside the interrupt's handler)."""
    from debug_nan.app.replay import interrupted_result

    finding = dict(step=2, micro_step=1, phase="forward", module="m", module_type="Linear", op="aten.mm.default",
                   kind="nan", cause="some_new_cause", explanation="e", source=None, suggestions=[])
    result = interrupted_result({"finding": finding}, KeyboardInterrupt(), [])
    assert (result.status, result.finding, result.interrupted, result.exit_code) == ("error", None, True, 130)


# a bundle's `settings` as the one flat settings class wrote them (before the components): every name, flat
FLAT_BUNDLE_SETTINGS = {
    "data_dir": "./data", "table": None, "tree": None, "sequences": None, "token_limit": 24, "batch_size": 4,
    "asv_order": "first", "rarefy_depth": None, "unifrac": "unweighted", "synthetic_samples": 24, "d_model": 32,
    "heads": 2, "asv_layers": 1, "sample_layers": 1, "encoder_layers": 1, "ffn_mult": 2, "dropout": 0.1,
    "guards": False, "asv_encoder": "builtin", "asv_chunk_size": None, "nuc_weight": 1.0, "unifrac_weight": 1.0,
    "task": None, "device": "cuda", "max_steps": 3, "gradient_accumulation_steps": 2, "lr": 0.001,
    "weight_decay": 0.01, "warmup_steps": None, "max_grad_norm": 1.0, "precision": "fp32", "seed": 42,
    "checkpoint": None, "checkpoint_non_strict": False, "checkpoint_unsafe_load": False, "skip_batches": 0,
    "eval_every": None, "eval_batches": None, "eval_samples": None, "fsdp": False, "trace_every_step": False,
    "keep_going": False, "explosion_threshold": 10000.0, "explosion_growth": 1000.0, "snapshot": "host",
    "snapshot_every": 0, "outputs_every": 0, "report": "/old/r.json", "log": "/old/l.log", "plot": None,
    "bundle_dir": None, "bundle": True, "history": "compact", "quiet": False, "tensorboard": None,
}


def test_a_bundle_of_the_flat_settings_reads_into_the_components():
    """A bundle written before the settings had components: the same names, read into them, on this device,
    writing none of the run's outputs."""
    from debug_nan.app.replay import bundle_settings

    s = bundle_settings({"settings": FLAT_BUNDLE_SETTINGS}, "old.pt", "cpu")
    assert (s.aam.data.token_limit, s.aam.model.d_model, s.aam.model.guards) == (24, 32, False)
    assert (s.train.device, s.train.gradient_accumulation_steps, s.train.max_grad_norm) == ("cpu", 2, 1.0)
    assert (s.outputs.report, s.outputs.log, s.watch.snapshot) == (None, None, "host")
    assert set(s.to_dict()) == set(FLAT_BUNDLE_SETTINGS)


def test_a_callbacks_bundle_has_no_setting_of_the_built_in_task():
    """A callback's bundle records the framework's recipe, its watch and its outputs: the built-in task's settings
    stay at their defaults (its --task rebuilds the model)."""
    from debug_nan.app.replay import bundle_settings

    recorded = {k: FLAT_BUNDLE_SETTINGS[k] for k in ("task", "device", "lr", "seed", "explosion_growth", "report")}
    s = bundle_settings({"settings": {**recorded, "task": "t.py:build", "seed": None, "max_steps": None}}, "cb.pt",
                        "cpu")
    assert (s.train.task, s.train.lr, s.aam.model.d_model) == ("t.py:build", 0.001, 128)
    assert (s.train.seed, s.train.max_steps) == (42, 10)  # what the framework did not know: the defaults


def test_a_bundle_whose_settings_this_version_cannot_read_is_one_paragraph():
    import pytest

    from debug_nan.app.replay import bundle_settings
    from debug_nan.errors import InputError

    for settings, words in (({**FLAT_BUNDLE_SETTINGS, "new_knob": 1}, "was written by a newer debug-nan: its "
                                                                       "settings new_knob are unknown"),
                            (["lr"], "settings are not a table of settings (got list)"),
                            ({**FLAT_BUNDLE_SETTINGS, "lr": "fast"}, "`lr` must be of type float, got 'fast'"),
                            ({**FLAT_BUNDLE_SETTINGS, "snapshot": "disk"}, "`snapshot` must be one of host")):
        with pytest.raises(InputError) as info:
            bundle_settings({"settings": settings}, "b.pt", "cpu")
        assert words in str(info.value) and "b.pt" in str(info.value) and "\n" not in str(info.value)
