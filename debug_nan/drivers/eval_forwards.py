"""The watched model's forwards outside training: a validation pass under `no_grad` or `inference_mode`, a generate
loop, a sampling callback, a Lightning sanity check. The mission's first story is one of these: training finite,
`val nan` every epoch. `debug-nan run` sees them through its global hooks (drivers/run/hooks.py); the callbacks
and the Monitor through the forward hooks of `ForwardsOutsideTraining` on their model.

Harm: a model output holding NaN or +Inf that the script goes on to use (a validation loss, a sampled token). An
output whose only non-finite values are -Inf is taken for a deliberate mask (masked logits) and stays silent, as a
mask does in training. Each such forward costs one host sync, its output's check, as a training micro-batch does;
its arguments are captured before it runs (a copy of the tensors the script may change in place) with the RNG
state, so a trip is replayed in place at once, from the model as the forward saw it, under the op-level tracer
(the Pinpointer's eval replay). The finding has phase `eval`, the step of the last optimizer step before it and the
forward's number since that step; the run then stops, as for a training finding (exit 1).
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.utils._pytree import tree_flatten

from debug_nan.drivers.run.model_calls import batch_of
from debug_nan.drivers.run.tape import batch_form, call_arguments
from debug_nan.drivers.wrappers import bare
from debug_nan.engine.explain.finding import Finding
from debug_nan.engine.replay.snapshot import capture_rng
from debug_nan.engine.stats import capture_batch
from debug_nan.engine.vocabulary import CheckKind
from debug_nan.engine.watch.module_hooks import ModuleHook, keep_out_of_copies
from debug_nan.engine.watch.watch_result import Check


class EvalForwards:
    """Checks each forward of the watched model made outside training, and pinpoints the first harmful one. Uses
    the driver's device, log, pinpointer and watch_paused()."""

    def __init__(self, driver):
        self.d = driver
        self.step = -1  # the optimizer steps taken when the last forward outside training came
        self.count = 0  # forwards outside training since that step
        self.total = 0
        self.done = False  # a finding was made: no more checks
        self._call = None  # the forward under way: (module, batch, form, RNG state, inference mode, training)

    def begin(self, module: nn.Module, args: tuple, kwargs: dict, steps_taken: int) -> None:
        """Before the forward: its arguments as given (copied where the script could change them) and the RNG."""
        if self.step != steps_taken:
            self.step, self.count = steps_taken, 0
        self.count += 1
        self.total += 1
        device = self.d.device
        # torch's generators only (NumPy's and Python's state cost 0.15 ms to read, and a forward draws from neither:
        # the replay takes theirs as they are then)
        rng = {"torch": torch.get_rng_state()}
        if device.type == "cuda":
            rng["cuda"] = torch.cuda.get_rng_state(device)
        self._call = (module, capture_batch(batch_of(args, kwargs), device), batch_form(args, kwargs), rng,
                      torch.is_inference_mode_enabled(), module.training)

    def update_first(self) -> Finding | None:
        """Before the first forward outside training after an update: that update's parameter check first (the sync
        the next step would make), as the CLI reads it before its eval pass, so that a validation on weights the
        update broke names the update at its step, not the validation (whose replay starts from the broken weights)
        -> the update's finding, or None. Under DDP it waits for the next step's agreed sync: a pass that only rank
        0 runs must not wait on the others."""
        s = self.d.session
        if s.stopped or not s.update_unread or s.p.agreement is not None:
            return None
        with torch.inference_mode(False), torch.enable_grad():  # (a trip replays that step: with gradients)
            return self.d.read_update()

    def end(self, output) -> Finding | None:
        """After the forward: its output's one check; the finding when it holds NaN or +Inf."""
        call, self._call = self._call, None
        reading = harmful_reading(output)
        if call is None or reading is None:
            return None
        module, batch, form, torch_rng, inference, training = call
        rng = {**capture_rng(self.d.device), **torch_rng}
        step, index = self.step, self.count
        mode = f"{'train' if training else 'eval'} mode, {'inference_mode' if inference else 'no_grad'}"
        when = f"after step {step}" if step else "before the first optimizer step"
        self.d.log(f"  [watch] TRIP in a forward outside training {when} ({mode}), forward {index} since: the "
                   f"model's output held {reading}", "red")

        def evaluate(replayed_batch) -> list[tuple[str, torch.Tensor]]:
            args, kwargs = call_arguments(replayed_batch, form)
            with torch.inference_mode() if inference else torch.no_grad():
                out = bare(module)(*args, **kwargs)
            return [(f"output {i}", t) for i, t in enumerate(_floats(out), 1)]

        where = (f"In a forward of the model outside training {when} ({mode}: a validation pass, a generate loop), "
                 f"forward {index} since that step: ")
        check = Check(CheckKind.FORWARD, "<model output>", reading)
        with self.d.watch_paused():
            return self.d.pinpointer.pinpoint_eval(step, index, batch, rng, evaluate, check, None, where=where)


    def found(self, finding: Finding, stop: bool = True) -> None:
        """The driver keeps the finding; with `stop` it watches no more (the model is left as it is: training was
        finite, there is nothing to put back). Under several ranks (`stop` False) this rank goes on to its next agreed
        sync, where it tells the others (session.held): a rank stopped in a forward outside training would leave the
        others waiting in their next collective."""
        d = self.d
        self.done = True  # (the first one is the finding: later forwards outside training are not checked)
        if any(f is finding for f in d.findings):  # the update's, read before this forward (update_first): kept
            return  # and stopped on already, as a training finding
        d.findings.append(finding)
        where = (f"Found in a forward of the model outside training (a validation pass, a generate loop) after step "
                 f"{finding.step}; every training step before it was finite. ")
        if not stop:  # several ranks: told to the others at the next agreed sync (session.held), all stop there
            finding.rank, finding.first_ranks = d.dist.rank, [d.dist.rank]
            d.session.held = finding
            d.notes.append(where + f"Rank {d.dist.rank} made it alone; it told the other ranks at the next sync of "
                           f"their training (or at its end), and every rank stopped there together.")
            return
        d.notes.append(where + "The run was stopped at that forward, as at any finding (no repro bundle for a "
                       "forward outside training: the finding above is its replay).")
        d.stopped = True
        d.session.watch.discard()


class ForwardsOutsideTraining:
    """Forward hooks on a framework's model (the Lightning and HF callbacks, the Monitor): each outermost forward
    of `modules` made with gradients off, outside a training micro-batch, is checked (EvalForwards); a harmful one
    is pinpointed and `on_finding(finding)` is the integration's: keep it (EvalForwards.found) and stop its loop."""

    def __init__(self, driver, modules: list[nn.Module], steps_taken, on_finding):
        self.d, self.steps_taken, self.on_finding = driver, steps_taken, on_finding
        self.evals = EvalForwards(driver)
        self.depth, self.busy, self.tracking = 0, False, None
        self.handles = []
        pre, post = ModuleHook(self._pre, compiled="eager"), ModuleHook(self._post, compiled="eager")
        for module in {id(m): m for m in modules}.values():
            keep_out_of_copies(module)  # (an EMA's deepcopy, torch.save(model): the copy has none of these hooks)
            self.handles += [module.register_forward_pre_hook(pre, with_kwargs=True),
                             module.register_forward_hook(post, with_kwargs=True, always_call=True)]

    def _active(self) -> bool:
        d = self.d
        return (not self.busy and not torch.is_grad_enabled() and not d.session.stopped and not d.watch.enabled
                and not self.evals.done)

    def _pre(self, module, args, kwargs) -> None:
        self.depth += 1
        if self.depth == 1 and self._active():
            self.busy = True
            try:
                finding = self.evals.update_first()
            finally:
                self.busy = False
            if finding is not None:
                self.on_finding(finding)
                return
            self.tracking = module
            self.evals.begin(module, args, kwargs, self.steps_taken())

    def _post(self, module, args, kwargs, output) -> None:
        self.depth = max(0, self.depth - 1)
        if self.depth or self.tracking is not module:
            return
        self.tracking, self.busy = None, True
        try:
            finding = self.evals.end(output)
        finally:
            self.busy = False
        if finding is not None:
            self.on_finding(finding)

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles.clear()


def harmful_reading(output, minus_inf_is_harm: bool = False) -> float | None:
    """NaN, or +inf, when a floating tensor of a model output holds one (NaN first); None when it is finite or
    its only non-finite values are -inf (a mask; `minus_inf_is_harm`: those count too, read as inf). One host sync:
    each tensor's sum in float32, one pass over it (a sum is finite when every value is, -inf when the only
    non-finite ones are -inf, NaN or +inf otherwise); only a sum that is not finite (or a finite output whose sum
    overflowed) is looked at element by element."""
    tensors = _floats(output)
    if not tensors:
        return None
    sums = torch.stack([t.sum(dtype=torch.float32) for t in tensors]).tolist()
    suspects = [t for t, s in zip(tensors, sums) if math.isnan(s) or s == math.inf or (minus_inf_is_harm and
                                                                                       s == -math.inf)]
    if not suspects:
        return None
    infinite = torch.isinf if minus_inf_is_harm else torch.isposinf
    flags = torch.stack([torch.stack([t.isnan().any(), infinite(t).any()]) for t in suspects]).any(0).tolist()
    return math.nan if flags[0] else math.inf if flags[1] else None


def _floats(output) -> list[torch.Tensor]:
    return [t for t in tree_flatten(output)[0] if isinstance(t, torch.Tensor) and t.is_floating_point()]
