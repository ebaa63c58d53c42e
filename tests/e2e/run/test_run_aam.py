"""`debug-nan run` on the real AAM code (github.com/jbk708/aam at 089f32d): its own
SequenceEncoder, MultiTaskLoss and Trainer.train_epoch, driven by a small script (tests/support/run/aam_pretrain.py) on
samples with padding slots. AAM hides the NaN with torch.where in the forward; it leaks into the gradients, and
the finding names AAM's attention pooling softmax and the padding slots. scikit-learn (AAM's validation metrics
only) is not installed here: the script puts a stand-in in its place.

AAM's code is not committed to this repository (third-party code fetched for testing stays out of it), and AAM is
not on PyPI, so CI cannot fetch it: the test runs where DEBUG_NAN_AAM_DIR points at a checkout of AAM at 089f32d
(its `aam/models` and `aam/training` suffice), and skips with that reason elsewhere."""

import os
from pathlib import Path

import pytest

from tests.support import SUPPORT

SCRIPT = str(SUPPORT / "run" / "aam_pretrain.py")


AAM_DIR = os.environ.get("DEBUG_NAN_AAM_DIR")


@pytest.mark.skipif(not (AAM_DIR and Path(AAM_DIR, "aam", "models", "attention_pooling.py").is_file()),
                    reason="set DEBUG_NAN_AAM_DIR to a checkout of github.com/jbk708/aam at 089f32d")
def test_aam_padding_slots_named_at_its_attention_pooling_softmax(run_here):
    pytest.importorskip("tensorboard")  # AAM's Trainer imports it
    pytest.importorskip("matplotlib")
    done, _, stderr = run_here("python", SCRIPT)
    assert done.code == 1, done.output
    first = done.first
    assert (first["step"], first["micro_step"], first["phase"], first["module"], first["module_type"],
            first["op"], first["cause"]) == (1, 1, "forward", "sample_encoder.asv_encoder.attention_pooling",
                                             "AttentionPooling", "aten._softmax.default", "all_masked_softmax")
    assert first["source"].endswith("models/attention_pooling.py:40")  # AAM's own file and line
    explanation = " ".join(first["explanation"].split())
    assert "14 of 32 rows whose 151 inputs were all -inf" in explanation
    assert "positions 3..7 of sample #0 (5 of 8 along dim 1)" in explanation  # the padding slots
    assert "only the gradients went non-finite" in explanation
    assert first["watch"].startswith("grad `sample_encoder.asv_encoder.")
    assert done.report["integration"]["pinpoint"].startswith("in place") and "[pinpoint] replaying step" in stderr
