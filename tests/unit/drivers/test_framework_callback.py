"""What both framework callbacks share (drivers/framework_outputs.py): one CallbackOptions, checked as the callback
is built, and the settings its run reports (its own options with the framework's recipe)."""

import pytest
import torch

from debug_nan.drivers.framework_outputs import CallbackOptions, FrameworkCallback
from debug_nan.errors import InputError


def test_the_options_are_kept_as_given_and_become_the_runs_settings(tmp_path):
    report = str(tmp_path / "r.json")
    callback = FrameworkCallback(report, None, log=None, on_trip="raise", task="t.py:build", explosion_threshold=5.0,
                                 explosion_growth=7.0, snapshot_every=3, outputs_every=2)
    assert callback.options == CallbackOptions(report=report, on_trip="raise", task="t.py:build",
                                               explosion_threshold=5.0, explosion_growth=7.0, snapshot_every=3,
                                               outputs_every=2)
    assert callback.outputs.bundle_dir == str(tmp_path)  # (bundles beside the report, as in the CLI)
    assert (callback.finding, callback.status, callback.driver) == (None, None, None)
    optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.ones(2))], lr=3e-4, weight_decay=0.01)
    s = callback.options.settings(callback.outputs, device="cpu", optimizer=optimizer, accumulation=4,
                                  precision="bf16", max_grad_norm=1.0, max_steps=0, seed=7)
    w, t, o = s.watch, s.train, s.outputs
    assert (t.task, w.explosion_threshold, w.explosion_growth, w.snapshot_every, w.outputs_every) == \
        ("t.py:build", 5.0, 7.0, 3, 2)
    # max_steps 0 (a framework with no limit): None, never a made-up number
    assert (t.gradient_accumulation_steps, t.precision, t.max_grad_norm, t.max_steps, t.seed, t.lr, t.weight_decay) \
        == (4, "bf16", 1.0, None, 7, 3e-4, 0.01)
    assert (o.report, o.bundle_dir, o.bundle) == (report, str(tmp_path), True)


def test_a_bad_option_fails_as_the_callback_is_built(tmp_path):
    with pytest.raises(InputError, match="on_trip='halt'"):
        FrameworkCallback(on_trip="halt")
    (tmp_path / "a_file").write_text("")
    with pytest.raises(InputError, match="is a file; give a folder"):
        FrameworkCallback(bundle_dir=str(tmp_path / "a_file"))
