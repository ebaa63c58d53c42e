"""The first advice follows the evidence (engine/explain/advice.py): the step, the batch, the run's clipping."""

import torch
from torch import nn

from debug_nan.engine.explain.advice import AdviceContext, extreme_batch_value, rank_advice
from debug_nan.engine.explain.causes.wording import SUGGESTIONS
from debug_nan.engine.vocabulary import Cause


def _model():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 1))
    with torch.no_grad():
        model[1].weight.mul_(1e20)
    return model


def _overflow(ctx, batch=None):
    return rank_advice(Cause.OVERFLOW, "forward", list(SUGGESTIONS[Cause.OVERFLOW]), ctx, batch, _model(), step=3)


def test_before_any_update_the_weights_come_first_and_no_learning_rate():
    advice = _overflow(AdviceContext(updates=0, checkpoint="ckpt.pt"))
    assert advice[0].startswith("Check the weights as the run began: parameter `1.weight` holds |w| up to 4.15e+19.")
    assert "the checkpoint loaded (ckpt.pt)" in advice[0]
    assert advice[0].endswith("(Follows from the step: step 3, before any optimizer update of this run.)")
    assert not any("learning rate" in s.replace("no learning rate", "") for s in advice)


def test_after_updates_the_learning_rate_and_clipping_only_where_the_run_does_not_clip():
    plain = _overflow(AdviceContext(updates=2))
    assert plain[0].startswith("Lower the learning rate, or add warmup")
    assert "Clip gradients (--max-grad-norm)" in plain[0]
    assert "after 2 update(s) of this run" in plain[0]
    clipped = _overflow(AdviceContext(updates=2, clipping="torch.nn.utils.clip_grad_norm_ (max_norm 1)"))
    assert "The run clips already (torch.nn.utils.clip_grad_norm_ (max_norm 1))" in clipped[0]
    assert not any("--max-grad-norm" in s or "Clip gradients" in s for s in clipped)


def test_an_extreme_batch_value_puts_the_data_first_with_its_row_and_dataset_index():
    x = torch.randn(4, 3)
    x[2, 1] = 3e38
    assert extreme_batch_value({"x": x}, [40, 41, 881, 43]) == "key `x` holds 3e+38 at row 2 (dataset index 881)"
    assert extreme_batch_value({"x": torch.randn(4, 3)}) is None
    advice = _overflow(AdviceContext(updates=5), {"x": x})
    assert advice[0].startswith("Check the data first: the batch's key `x` holds 3e+38 at row 2")
    assert not any("learning rate" in s for s in advice)


def test_a_masked_row_keeps_the_masks_advice_first_and_no_context_changes_nothing():
    masked = rank_advice(Cause.ALL_MASKED_SOFTMAX, "forward", list(SUGGESTIONS[Cause.ALL_MASKED_SOFTMAX]),
                         AdviceContext(updates=4))
    assert masked == list(SUGGESTIONS[Cause.ALL_MASKED_SOFTMAX])
    base = list(SUGGESTIONS[Cause.OVERFLOW])
    assert rank_advice(Cause.OVERFLOW, "forward", base, None) == base


def test_the_runs_clipping_is_seen_from_its_calls_or_the_drivers_setting():
    from types import SimpleNamespace

    from debug_nan.engine.explain.advice import clipping_of
    from debug_nan.engine.watch.clipping import clip_watching, forget_clipping

    forget_clipping()
    assert clipping_of(SimpleNamespace(s=SimpleNamespace(max_grad_norm=None))) is None
    assert clipping_of(SimpleNamespace(s=SimpleNamespace(max_grad_norm=1.0))) == "its clipping at max norm 1"
    layer = nn.Linear(2, 2)
    layer(torch.ones(1, 2)).sum().backward()
    norm = clip_watching(torch.nn.utils.clip_grad_norm_, "max_norm")(layer.parameters(), 0.5)
    assert float(norm) > 0 and clipping_of(None) == "torch.nn.utils.clip_grad_norm_ (max_norm 0.5)"
    forget_clipping()


def test_an_unknown_op_fed_grown_values_gets_the_growth_advice_by_the_step():
    """nanoGPT at lr 1e7 (debug-nan run -- train.sh): one AdamW update later the attention backward makes NaN from
    finite inputs of |x| ~3e11, which no cause rule names; the update that grew them is what to change."""
    from types import SimpleNamespace
    base = list(SUGGESTIONS[Cause.UNKNOWN])
    grown = SimpleNamespace(inputs=[("grad_out", torch.full((2, 3), 1e-4)), ("value", torch.tensor([3.6e11, -1.0])),
                                    ("query", torch.tensor([2.6e11, float("nan")]))])
    after = rank_advice(Cause.UNKNOWN, "backward", list(base), AdviceContext(updates=1), event=grown, step=2)
    assert after[0].startswith("Lower the learning rate, or add warmup")
    assert after[0].endswith("after 1 update(s) of this run, so the weights the op read were grown by the updates; "
                             "the op's inputs reach |x| 3.6e+11 (`value`), where float32 rounds by about 2.2e+04.)")
    assert after[1:] == base
    first = rank_advice(Cause.UNKNOWN, "forward", list(base), AdviceContext(updates=0), event=grown, step=1)
    assert first[0].startswith("Check the weights as the run began") and "|x| 3.6e+11" in first[0]
    small = SimpleNamespace(inputs=[("value", torch.tensor([9e5, 1.0]))])  # below GROWN: nothing to follow from
    assert rank_advice(Cause.UNKNOWN, "backward", list(base), AdviceContext(updates=1), event=small) == base
