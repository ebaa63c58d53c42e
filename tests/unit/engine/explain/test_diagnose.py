"""Causes, each on a tiny traced program or a hand-built OpEvent (for kernels that do not run here)."""

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from debug_nan.engine.explain.diagnose import diagnose
from debug_nan.engine.trace.events import OpEvent, named_tensors
from debug_nan.engine.trace.tracer import Tracer


def traced(fn):
    """Run fn under the Tracer -> (the origin of its non-finite result, (cause, explanation, suggestions))."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch warns about degrees of freedom <= 0, as it should
        with Tracer(nn.Linear(1, 1)) as tr:
            result = fn()
    origin = tr.origin_of(result)
    assert origin is not None, "the result is finite or has no origin"
    return origin, diagnose(origin)


def event_for(func, args, kwargs=None, kind="nan", **fields) -> OpEvent:
    """An OpEvent for an op that is not run here, with its inputs named by the op's real schema."""
    tensors, scalars = named_tensors(func, args, kwargs or {})
    base = dict(op=str(func), phase="forward", module="attn", module_type="Attention", kind=kind, source=None,
                source_line=None, backward_node=None, forward_source=None, inputs=tensors, outputs=[],
                scalars=scalars, func=func, args=args, kwargs=kwargs or {})
    base.update(fields)
    return OpEvent(**base)


# -- reductions that divide by a count of zero ------------------------------------------------------------------
def test_std_of_one_element():
    origin, (cause, explanation, _) = traced(lambda: torch.tensor([3.0]).std())
    assert origin.op == "aten.std.correction" and cause == "div_by_zero"
    assert "over 1 element per output with correction 1" in explanation and "= 0" in explanation


def test_var_over_a_dim_of_size_one_and_a_correction_that_is_fine():
    origin, (cause, explanation, _) = traced(lambda: torch.randn(3, 1).var(dim=1).sum())
    assert cause == "div_by_zero" and "dim [1]" in explanation
    with Tracer(nn.Linear(1, 1)) as tr:
        ok = torch.tensor([3.0]).std(correction=0)
    assert float(ok) == 0.0 and tr.origin_of(ok) is None and not tr.origins


def test_mean_of_an_empty_selection():
    x = torch.randn(5)
    origin, (cause, explanation, _) = traced(lambda: x[x > 100].mean())
    assert cause == "div_by_zero" and "0 elements per output" in explanation


@pytest.mark.parametrize("logits, target, kwargs, op", [
    (torch.randn(4, 3), torch.full((4,), -100), {}, "aten.nll_loss_forward.default"),
    (torch.randn(2, 3, 4, 4), torch.zeros(2, 4, 4, dtype=torch.long), {"ignore_index": 0},
     "aten.nll_loss2d_forward.default"),
])
def test_cross_entropy_with_every_target_ignored(logits, target, kwargs, op):
    origin, (cause, explanation, _) = traced(lambda: F.cross_entropy(logits, target, **kwargs))
    assert origin.op == op and cause == "div_by_zero"
    ignore = kwargs.get("ignore_index", -100)
    assert f"every one of the {target.numel()} targets equals ignore_index={ignore}" in explanation


def test_nll_whose_kept_targets_all_weigh_zero():
    logp = torch.randn(4, 3).log_softmax(-1)
    _, (cause, explanation, _) = traced(lambda: F.nll_loss(logp, torch.tensor([0, 0, 1, 1]),
                                                           weight=torch.tensor([0.0, 0.0, 1.0])))
    assert cause == "div_by_zero" and "4 targets that are not ignore_index=-100 all have class weight 0" in explanation


@pytest.mark.parametrize("loss", [F.mse_loss, F.l1_loss])
def test_elementwise_loss_of_an_empty_selection(loss):
    pred, target = torch.randn(6), torch.randn(6)
    keep = target > 100  # selects nothing
    _, (cause, explanation, _) = traced(lambda: loss(pred[keep], target[keep]))
    assert cause == "div_by_zero" and ("empty selection" in explanation)


# -- complex values --------------------------------------------------------------------------------------------
def test_complex_log_of_zero():
    origin, (cause, explanation, _) = traced(lambda: torch.log(torch.zeros(2, dtype=torch.complex64)))
    assert origin.kind == "inf" and cause == "log_of_nonpositive" and "2 values equal to 0" in explanation


@pytest.mark.parametrize("node, words", [("AngleBackward0", "angle(z)"), ("AbsBackward0", "z / |z|"),
                                         ("SgnBackward0", "sgn(z)")])
def test_complex_backward_at_zero_is_a_singularity(node, words):
    z = torch.tensor([0j, 1 + 1j, 0j], dtype=torch.complex64)
    event = event_for(torch.ops.aten.div.Tensor, (torch.zeros(3, dtype=torch.complex64), torch.zeros(3)),
                      phase="backward", backward_node=node, forward_source="model.py:7", saved={"self": z})
    cause, explanation, _ = diagnose(event)
    assert cause == "grad_at_singularity" and words in explanation
    assert "saved forward self is 0 at 2 of 3 positions" in explanation and "forward at model.py:7" in explanation


# -- Infs: what float64 says -----------------------------------------------------------------------------------
def test_overflow_is_finite_in_float64():
    _, (cause, explanation, _) = traced(lambda: torch.tensor([100.0, 1.0]).exp())
    assert cause == "overflow" and "float32 maximum" in explanation and "2.688e+43" in explanation


def test_overflow_advice_fits_the_precision_the_op_ran_in():
    """An fp32 exp that overflows is not helped by float32 or bf16 (fp32's range); an fp16 one is."""
    _, (cause, _, wide) = traced(lambda: torch.tensor([100.0]).exp())
    _, (cause16, _, narrow) = traced(lambda: torch.tensor([100.0], dtype=torch.float16).exp())
    assert cause == cause16 == "overflow"
    assert not any("--precision bf16" in s for s in wide) and any("--precision bf16" in s for s in narrow)


@pytest.mark.parametrize("fn, words", [
    (lambda: torch.atanh(torch.tensor([1.0, 0.5])), "atanh(x) is infinite at x = +-1"),
    (lambda: torch.lgamma(torch.tensor([0.0, 0.5])), "lgamma(x) is infinite at x = 0"),
    (lambda: torch.erfinv(torch.tensor([1.0, 0.5])), "erfinv(x) is infinite at x = +-1"),
])
def test_a_pole_is_not_an_overflow(fn, words):
    _, (cause, explanation, _) = traced(fn)
    assert cause == "invalid_domain" and "not an overflow but a pole" in explanation and words in explanation


def test_an_unknown_op_infinite_in_float64_too_is_not_called_overflow():
    _, (cause, explanation, _) = traced(lambda: torch.special.zeta(torch.tensor([1.0]), torch.tensor([1.0])))
    assert cause == "unknown" and "still Inf" in explanation and "in any precision" in explanation


def test_division_by_the_number_zero():
    _, (cause, explanation, _) = traced(lambda: torch.tensor([1.0, 0.0]) / 0)
    assert cause == "div_by_zero" and "by the number 0 (1 of them 0/0 = NaN" in explanation


def test_ctc_of_an_infeasible_alignment():
    torch.manual_seed(0)
    log_probs = torch.randn(5, 2, 6).log_softmax(-1)  # T=5 frames for both samples
    targets = torch.tensor([[1, 2, 3, 4, 5, 1], [1, 2, 1, 2, 0, 0]])
    origin, (cause, explanation, suggestions) = traced(lambda: F.ctc_loss(
        log_probs, targets, torch.tensor([5, 5]), torch.tensor([6, 4]), reduction="sum"))
    assert origin.op == "aten._ctc_loss.Tensor" and cause == "infeasible_target"
    assert "#0 (input length 5 < target length 6 + 0 repeats)" in explanation and "#1" not in explanation
    assert "not an overflow" in explanation and any("zero_infinity" in s for s in suggestions)


# -- fused attention: attn_mask (CPU kernel, composite) and attn_bias (CUDA kernels) ----------------------------
class _Capture(TorchDispatchMode):
    def __init__(self, name):
        super().__init__()
        self.name, self.call = name, None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if self.name in str(func):
            self.call = (func, args, kwargs or {})
        return func(*args, **(kwargs or {}))


def _masked_query_rows():
    q = torch.randn(2, 2, 3, 4)
    mask = torch.ones(2, 1, 3, 3, dtype=torch.bool)
    mask[1, :, 2] = False  # sample 1, query 2: no key at all
    return q, mask


def test_sdpa_cpu_kernel_reads_attn_mask():
    q, mask = _masked_query_rows()
    with _Capture("_scaled_dot_product_flash_attention_for_cpu") as cap:
        F.scaled_dot_product_attention(q, q, q, attn_mask=mask)
    func, args, kwargs = cap.call
    cause, explanation, _ = diagnose(event_for(func, args, kwargs), {"x": torch.zeros(2, 5)})
    assert cause == "all_masked_softmax" and "`attn_mask`" in explanation
    assert "leaves 2 query rows of 12 with no key" in explanation and "samples #1" in explanation


def test_sdpa_cuda_kernel_reads_attn_bias():
    q, mask = _masked_query_rows()
    bias = torch.zeros(2, 2, 3, 3).masked_fill(~mask, float("-inf"))  # the fused kernels take an additive bias
    func = torch.ops.aten._scaled_dot_product_efficient_attention.default
    event = event_for(func, (q, q, q, bias, False))
    assert "attn_bias" in dict(event.inputs)
    cause, explanation, _ = diagnose(event)
    assert cause == "all_masked_softmax" and "`attn_bias`" in explanation and "leaves 2 query rows" in explanation


# -- wording: AAM terms only for the built-in model ---------------------------------------------------------------
def _softmax_event(module_class: str) -> tuple[OpEvent, dict]:
    scores = torch.zeros(6, 4)  # [B x A, L]: B = 2 samples, A = 3 slots
    scores[4] = float("-inf")  # sample 1, slot 1
    batch = {"tokens": torch.zeros(2, 3, 4, dtype=torch.long), "sample_ids": ["S0", "S1"]}
    func = torch.ops.aten._softmax.default
    return event_for(func, (scores, -1, False), module_class=module_class), batch


def test_aam_wording_only_for_the_built_in_model():
    event, batch = _softmax_event("debug_nan.aam.model.attention.SelfAttention")
    cause, explanation, suggestions = diagnose(event, batch)
    assert cause == "all_masked_softmax" and "ASV slots 1 of sample S1" in explanation
    assert "token-limited collate" in explanation and any("--guards" in s for s in suggestions)
    event, batch = _softmax_event("my_task.Encoder")
    cause, explanation, suggestions = diagnose(event, batch)
    assert cause == "all_masked_softmax" and "positions 1 of sample S1 (1 of 3 along dim 1)" in explanation
    assert "ASV" not in explanation and "collate" not in explanation
    assert not any("--guards" in s or "AAM" in s for s in suggestions)


def test_one_declared_vocabulary():
    """Every cause has its suggestions and no suggestion list is for an undeclared cause; a finding with an
    undeclared cause or phase cannot be made, and a declared one is kept as its plain string."""
    from debug_nan.engine.explain.causes.wording import SUGGESTIONS
    from debug_nan.engine.explain.finding import Finding
    from debug_nan.engine.vocabulary import Cause, Phase

    assert set(SUGGESTIONS) == {c.value for c in Cause}
    fields = dict(step=1, micro_step=1, module="", module_type="", op=None, kind="nan", explanation="",
                  source=None, suggestions=[])
    f = Finding(phase=Phase.LOSS, cause=Cause.DIV_BY_ZERO, **fields)
    assert (type(f.phase), type(f.cause), f.phase, f.cause) == (str, str, "loss", "div_by_zero")
    for bad in ({"phase": "loss", "cause": "nan_happened"}, {"phase": "training", "cause": "unknown"}):
        with pytest.raises(ValueError):
            Finding(**bad, **fields)


def test_advice_in_each_entry_points_words():
    """A CLI flag (and the value shown with it) becomes what that entry point's user sets; the sentence around it
    stays whole."""
    from debug_nan.engine.vocabulary import in_dialect

    text = "Clip with --max-grad-norm 1.0. Or use --precision bf16."
    assert in_dialect(text, "cli") == text
    assert in_dialect(text, "hf") == ("Clip with TrainingArguments(max_grad_norm=...). Or use "
                                      "TrainingArguments(bf16=True).")
    assert in_dialect(text, "api") == ("Clip with torch.nn.utils.clip_grad_norm_ before optimizer.step(). Or use "
                                       "torch.autocast(dtype=torch.bfloat16).")
