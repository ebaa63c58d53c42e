"""Tier 2 driver: turn a trip of the watch into a Finding.

Restore the state from just before the failing step (parameters, optimizer, scaler, scheduler), re-run the
step's earlier micro-batches with their RNG states (so accumulated gradients match), then replay the failing
micro-batch under the operator-level Tracer through forward, loss, backward and, for a parameter trip, the
optimizer step. The tracer's first origin is diagnosed (tier 3).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from debug_nan.checks.diagnose import SUGGESTIONS, describe_rows, diagnose
from debug_nan.checks.snapshot import Snapshot, restore_rng
from debug_nan.checks.stats import flat_tensors, move_to, tensor_stats
from debug_nan.checks.tracer import OpEvent, StopReplay, Tracer
from debug_nan.checks.watch import Check, param_and_state_tensors
from debug_nan.errors import describe_exception
from debug_nan.report.finding import Finding

PHASE_OF_CHECK = {"data": "data", "forward": "forward", "loss": "loss", "loss_part": "loss", "grad": "backward",
                  "param": "optimizer"}


class TaskFailure(Exception):
    """User code raised mid-step and the replay found no non-finite value behind it."""


@dataclass
class StepInputs:
    """What a replay of one optimizer step needs: its micro-batches (as produced, before device placement),
    the RNG state before each micro-batch, and the snapshot taken before the first."""

    step: int
    batches: list
    rng: list = field(default_factory=list)
    snapshot: Snapshot | None = None


def _stats_dict(named: list[tuple[str, torch.Tensor]], limit: int = 6) -> dict[str, dict]:
    out = {}
    for name, t in named[:limit]:
        try:
            out[name] = tensor_stats(t).to_dict()
        except RuntimeError:
            continue
    return out


class Pinpointer:
    def __init__(self, trainer):
        self.t = trainer

    # -- replay -------------------------------------------------------------------------------------------------
    def _rerun(self, inputs: StepInputs, count: int, scaled: bool) -> None:
        """From the snapshot, forward + backward of the step's first `count` micro-batches, each with its RNG
        state (with the fp16 loss scale, as in the run, or without it)."""
        t = self.t
        inputs.snapshot.restore()
        t.model.zero_grad(set_to_none=True)
        for i in range(count):
            restore_rng(inputs.rng[i], t.device)
            loss, _ = t.compute_loss(move_to(inputs.batches[i], t.device), replay=True)
            if scaled:
                t.backward(loss)
            else:
                (loss / t.accum).backward()

    def replay(self, inputs: StepInputs, micro: int, optimizer: bool = False, trace: bool = True):
        """Restore the snapshot and re-run the step up to the failing point -> (tracer, exception, batch).

        A forward/backward trip: micro-batches 1..micro-1 plainly, `micro` under the tracer. A parameter trip
        (optimizer=True): every micro-batch plainly (under DDP the gradients are averaged across the ranks, as in
        the run: every rank takes part, trace=False on all but the pinpointing one), then the optimizer step
        under the tracer."""
        t = self.t
        t.watch.enabled = False
        exc = tracer = None
        batch = None
        try:
            self._rerun(inputs, micro if optimizer else micro - 1, scaled=True)
            if optimizer and getattr(t, "dist", None) is not None:
                t.average_gradients()
            if not trace:
                return None, None, None
            if not optimizer:
                restore_rng(inputs.rng[micro - 1], t.device)
                batch = move_to(inputs.batches[micro - 1], t.device)
            with Tracer(t.model, stop_at_first=True) as tracer:
                try:
                    if optimizer:
                        if t.scaler is not None:
                            t.scaler.unscale_(t.optimizer)
                        tracer.phase_override = "optimizer"
                        t.clip_and_step(None)
                    else:
                        loss, _ = t.compute_loss(batch, replay=True)
                        t.backward(loss)
                except (KeyboardInterrupt, MemoryError, torch.OutOfMemoryError):
                    raise
                except StopReplay:
                    pass
                except Exception as e:  # the same exception as in the run, usually
                    exc = e
        finally:
            t.watch.enabled = True
            t.watch.discard()
        return tracer, exc, batch

    def finite_without_scaling(self, inputs: StepInputs, micro: int) -> bool:
        """fp16: do micro-batches 1..micro give finite gradients with the loss scale off? (Then a non-finite
        scaled gradient was only the scale's overflow.) Leaves the state as the snapshot had it."""
        t = self.t
        t.watch.enabled = False
        try:
            self._rerun(inputs, micro, scaled=False)
            grads = [p.grad.detach() for p in t.model.parameters() if p.grad is not None]
            return bool(torch.stack([torch.isfinite(g).all() for g in grads]).all()) if grads else True
        except (KeyboardInterrupt, torch.OutOfMemoryError):
            raise
        except Exception:  # noqa: BLE001 - anything odd here is for the op-level replay to explain
            return False
        finally:
            inputs.snapshot.restore()
            t.model.zero_grad(set_to_none=True)
            t.watch.enabled = True
            t.watch.discard()

    # -- findings -----------------------------------------------------------------------------------------------
    def pinpoint(self, inputs: StepInputs, micro: int, check: Check | None, error: BaseException | None,
                 optimizer: bool = False, trace: bool = True) -> Finding | None:
        if not trace:  # DDP, not the pinpointing rank: only take part in the re-run's gradient all-reduce
            self.replay(inputs, micro, optimizer, trace=False)
            return None
        finding = self._pinpoint(inputs, micro, check, error, optimizer)
        bundle_dir = getattr(self.t, "bundle_dir", None)
        if bundle_dir is not None:
            from debug_nan.report.bundle import write_bundle

            try:
                finding.bundle = str(write_bundle(self.t, inputs, micro, finding, check, optimizer, bundle_dir))
                self.t.log(f"  [bundle] repro bundle written: {finding.bundle} (debug-nan replay {finding.bundle})")
            except Exception as exc:  # noqa: BLE001 - the finding matters more than its bundle
                self.t.log(f"  [bundle] could not write the repro bundle to {bundle_dir}: "
                           f"{type(exc).__name__}: {exc}", "yellow")
        return finding

    def _pinpoint(self, inputs: StepInputs, micro: int, check: Check | None, error: BaseException | None,
                  optimizer: bool = False) -> Finding:
        log = self.t.log
        raw = inputs.batches[micro - 1]
        seen = (f"{check.kind} check of `{check.name or '<loss>'}` read {check.value}" if check is not None
                else f"user code raised {describe_exception(error)}")
        log(f"  [watch] TRIP at step {inputs.step}, micro-batch {micro}: {seen}", "red")
        if check is not None and check.kind == "data":
            return self.data_finding(inputs, micro, check)
        log(f"  [pinpoint] replaying step {inputs.step} micro-batch {micro} from the snapshot under the op-level "
            f"tracer (forward, loss, backward{', optimizer' if optimizer else ''})...")
        tracer, replay_exc, batch = self.replay(inputs, micro, optimizer)
        error = error or replay_exc
        event = tracer.first or tracer.module_inf
        log(f"  [pinpoint] {tracer.ops_seen} ops traced.")
        if event is None:
            if error is not None:
                raise TaskFailure(f"step {inputs.step}, micro-batch {micro}: {describe_exception(error)}. The replay "
                                  f"found no NaN/Inf before it, so this is an error in the task's code, not a "
                                  f"numerical one.")
            return self.watch_only_finding(inputs, micro, check)
        return self.event_finding(inputs.step, micro, event, raw, check, error)

    def event_finding(self, step: int, micro: int, event: OpEvent, raw, check: Check | None,
                      error: BaseException | None) -> Finding:
        cause, explanation, suggestions = diagnose(event, raw)
        if check is not None and check.kind == "grad" and event.phase in ("forward", "loss"):
            explanation += (" The value was hidden before any module output or the loss (e.g. by torch.where or "
                            "nan_to_num), but it still leaked: only the gradients went non-finite, since backward "
                            "multiplies it by 0 and 0 * inf = NaN.")
        module, module_type = event.module, event.module_type
        if event.phase == "optimizer":
            param, explanation = self._optimizer_explanation(event, explanation)
            module = param.rsplit(".", 1)[0] if param and "." in param else ""
            module_type = self._module_type(module) if param else ""
        return Finding(
            step=step, micro_step=micro, phase=event.phase, module=module, module_type=module_type,
            op=event.op, kind=event.kind, cause=cause, explanation=explanation, source=event.source,
            suggestions=suggestions, source_line=event.source_line, backward_node=event.backward_node,
            forward_source=event.forward_source, sample_ids=_sample_ids(raw),
            inputs=_stats_dict(event.inputs), outputs=_stats_dict(event.outputs),
            watch=(f"{check.kind} `{check.name or '<loss>'}` = {check.value}" if check is not None else None),
            exception=describe_exception(error) if error is not None else None,
        )

    def _optimizer_explanation(self, event: OpEvent, evidence: str) -> tuple[str | None, str]:
        """(parameter name, explanation) for an origin inside the optimizer step."""
        names = {t.data_ptr(): name
                 for name, t in param_and_state_tensors(self.t.model.named_parameters(), self.t.optimizer)}
        hit = [names.get(tensor.data_ptr()) for _, tensor in event.outputs
               if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all())]
        hit = [h for h in hit if h]
        what = f"`{hit[0]}`" if hit else "a parameter or optimizer state"
        opt = type(self.t.optimizer).__name__
        param = hit[0].split(" (optimizer")[0] if hit else None
        return param, (f"The {opt} step made {what} non-finite although every gradient going in was finite: "
                       f"{evidence} (settings of this optimizer: "
                       f"{ {k: v for k, v in self.t.optimizer.defaults.items() if k in ('lr', 'eps', 'betas', 'momentum', 'weight_decay')} }).")

    def data_finding(self, inputs: StepInputs, micro: int, check: Check) -> Finding:
        raw = inputs.batches[micro - 1]
        tensor = dict(flat_tensors(raw))[check.name]
        bad = ~torch.isfinite(tensor)
        n_nan, n_inf = int(torch.isnan(tensor).sum()), int(torch.isinf(tensor).sum())
        where = bad.nonzero()[:6].tolist()
        rows = bad.reshape(bad.shape[0], -1).any(dim=1).nonzero().squeeze(1) if tensor.dim() else None
        owners = f"; rows belong to {describe_rows(rows, tensor.shape[0], raw)}" if rows is not None else ""
        explanation = (f"The batch itself is non-finite before the model sees it: key `{check.name}` "
                       f"{list(tensor.shape)} holds {n_nan} NaN and {n_inf} Inf of {tensor.numel()} values, at "
                       f"positions {where}{' ...' if bad.sum() > 6 else ''}{owners}.")
        return Finding(step=inputs.step, micro_step=micro, phase="data", module="", module_type="", op=None,
                       kind="nan" if n_nan else "inf", cause="nonfinite_input", explanation=explanation,
                       source=None, suggestions=list(SUGGESTIONS["nonfinite_input"]), sample_ids=_sample_ids(raw),
                       inputs={check.name: tensor_stats(tensor).to_dict()}, watch=f"data `{check.name}`",
                       detected_by="data check")

    def watch_only_finding(self, inputs: StepInputs, micro: int, check: Check) -> Finding:
        phase = PHASE_OF_CHECK.get(check.kind, "forward")
        module = check.name if check.kind == "forward" else ""
        explanation = (f"The watch saw {check.kind} `{check.name or '<loss>'}` = {check.value}, but the op-level "
                       f"replay of the same micro-batch stayed finite: the value depends on something the replay "
                       f"could not restore (a non-deterministic kernel, state outside the model and optimizer).")
        return Finding(step=inputs.step, micro_step=micro, phase=phase, module=module,
                       module_type=self._module_type(module), op=None,
                       kind="nan" if math.isnan(check.value) else "inf", cause="unknown", explanation=explanation,
                       source=None, suggestions=list(SUGGESTIONS["unknown"]), sample_ids=_sample_ids(inputs.batches[micro - 1]),
                       watch=f"{check.kind} `{check.name}` = {check.value}", detected_by="watch")

    def explosion(self, rec, floor: float, steps, accum: int) -> Finding:
        s = self.t.s
        name, value = max(rec.grad_norms.items(), key=lambda kv: kv[1])
        module = name.rsplit(".", 1)[0] if "." in name else ""
        series = ", ".join(f"{r.grad_norm:.3g}" for r in steps if r.grad_norm is not None)
        share = value * value / max(rec.grad_norm ** 2, 1e-30)
        explanation = (f"The total gradient norm grew from {floor:.3g} to {rec.grad_norm:.3g} by step {rec.step}, "
                       f"past --explosion-threshold {s.explosion_threshold:g} and {rec.grad_norm / max(floor, 1e-12):.3g}x the "
                       f"smallest earlier norm (per step: {series}). Largest: `{name}` {value:.3g} ({share:.0%} of "
                       f"the squared total). Nothing is non-finite yet: stopped before the overflow.")
        self.t.log(f"  [watch] TRIP at step {rec.step}: gradient norm {rec.grad_norm:.4g} (explosion)", "red")
        return Finding(step=rec.step, micro_step=accum, phase="backward", module=module,
                       module_type=self._module_type(module), op=None, kind="inf", cause="gradient_explosion",
                       explanation=explanation, source=None, suggestions=list(SUGGESTIONS["gradient_explosion"]),
                       watch=f"grad norm {rec.grad_norm:.4g}", detected_by="gradient history")

    def _module_type(self, path: str) -> str:
        try:
            return type(self.t.model.get_submodule(path)).__name__ if path else ""
        except AttributeError:
            return ""


def _sample_ids(batch) -> list[str] | None:
    if isinstance(batch, dict) and isinstance(batch.get("sample_ids"), (list, tuple)):
        return [str(i) for i in batch["sample_ids"]]
    return None
