"""Tier 3's entry from a replay: explain(Trace) -> Finding. The Trace is the replay's hand-off: the origin the
tracer named in the harmed value's lineage (an OpEvent) and what the replay saw besides. Pure: no replay, no
driver; every entry point's pinpoint ends here."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from torch import nn

from debug_nan.engine.explain.advice import AdviceContext, rank_advice
from debug_nan.engine.explain.diagnose import diagnose
from debug_nan.engine.explain.evidence import module_type, sample_ids, stats_dict
from debug_nan.engine.explain.finding import Finding
from debug_nan.engine.explain.optimizer_evidence import StepHyperparameters, optimizer_explanation
from debug_nan.engine.sharded import user_path
from debug_nan.engine.trace.tracer import OpEvent
from debug_nan.engine.vocabulary import CheckKind, Phase
from debug_nan.engine.watch.watch_result import Check
from debug_nan.errors import describe_exception


@dataclass
class ReplayFacts:
    """What the last replay saw besides its origin."""

    loss_harmed: bool = False  # the replayed loss itself was non-finite
    nonfinite_outputs: list = field(default_factory=list)  # (module path, origin ids) of module outputs with NaN/Inf
    hyper: StepHyperparameters | None = None  # the replayed optimizer step's lr etc.
    loss_value: float | None = None  # the replayed loss (a scalar one), beside the watch's reading of the run's
    grads_nonfinite: set[str] | None = None  # the parameters whose replayed gradient held NaN/Inf
    consequence: OpEvent | None = None  # the later birth the origin led to through finite values (tracer.consequence)
    # buffers the replay wrote non-finite that nothing harmed read (Lineage.unharmed_writers): (name, writer)
    unharmed_buffers: list = field(default_factory=list)


def replay_differs(check: Check | None, facts: ReplayFacts) -> str | None:
    """How the replay's value where the watch tripped differs from the run's, in words (None: the same, or not
    known). The replay starts from the run's own state at that step, so a difference is the kernels' (torch.compile's
    fused ones, a non-deterministic one, another device's), and the op named is the replay's."""
    if check is None or not check.nonfinite:
        return None
    if check.kind == CheckKind.LOSS and facts.loss_value is not None:
        replayed = _word(facts.loss_value)
        if replayed and ("nan" in replayed) != ("nan" in check.nonfinite):
            return (f" The watch saw the run's loss {check.nonfinite}; this replay from the same state computed "
                    f"{replayed}: the run's kernels computed it otherwise, and the op named is the replay's.")
    replayed_grads = {user_path(n) for n in facts.grads_nonfinite or ()}  # (named as the watch names them)
    if check.kind == CheckKind.GRAD and replayed_grads and check.name not in replayed_grads:
        others = sorted(replayed_grads)
        return (f" The watch saw the run's gradient of `{check.name}` go {check.nonfinite}; in this replay from "
                f"the same state it stayed finite, and {len(others)} other parameter(s)' did not (`{others[0]}` "
                f"first): the run's kernels computed it otherwise, and the op named is the replay's.")
    return None


def consequence_words(later: OpEvent) -> str:
    """The origin's own values never reached the harm: finite values made from them did, through a later birth."""
    node = f", in {later.backward_node}" if later.backward_node else ""
    where = (f" of `{later.module}`" if later.module else "") + (f" at {later.source}" if later.source else "")
    return (f" Its values did not reach the harmed value themselves: what was computed from them turned finite "
            f"again (e.g. 1/sqrt(inf) = 0 in a norm), and from those values {later.op} "
            f"({later.phase}{node}){where} made the {later.kind.upper()} that did; that later birth is a "
            f"consequence of this one, the earliest in the harmed value's lineage.")


def unharmed_buffer_note(name: str, writer: OpEvent, step: int) -> str:
    """A buffer that went non-finite in the replayed step although nothing harmed in it read the buffer: not the
    origin, but the next eval (or a checkpoint) will read it."""
    held = dict(writer.outputs).get(name.rsplit(".", 1)[-1])
    what = "NaN" if held is not None and bool(held.isnan().any()) else "Inf"
    where = ", ".join(p for p in (f"module `{writer.module}`" + (f" ({writer.module_type})" if writer.module_type
                                                                   else "") if writer.module else "",
                                  writer.source or "") if p)
    reader = ("(model.eval() normalises with the running statistics)" if "running_" in name else
              "(or any forward that reads the buffer)")
    try:
        _, why, _ = diagnose(writer)
    except Exception:  # noqa: BLE001 - the note stands without the writer's evidence
        why = ""
    return (f"buffer `{name}` went {what} in step {step} too, written by {writer.op or writer.label}"
            f"{f' ({where})' if where else ''}{f': {why}' if why else ''} Nothing the loss, a gradient or a "
            f"parameter of this step read descends from it, so it is not the origin; but it will harm the next eval "
            f"{reader} and any checkpoint saved from now on holds it.")


def _word(value: float) -> str:
    """A value as a check words it: "" when finite, "nan", "+inf" or "-inf"."""
    return "nan" if math.isnan(value) else "" if math.isfinite(value) else "+inf" if value > 0 else "-inf"


@dataclass
class Trace:
    """What a replay hands explain (replay -> explain): the origin in the harmed value's lineage, where it was
    replayed, what the watch saw there, and what else the replay saw."""

    step: int
    micro: int  # 1-based (the eval pass: the held-out batch)
    origin: OpEvent
    batch: object  # the micro-batch as produced (for its sample ids)
    check: Check | None = None  # the watch's check that tripped (None: user code raised)
    error: BaseException | None = None  # what user code raised, in the run or in the replay
    facts: ReplayFacts = field(default_factory=ReplayFacts)
    reached: list[str] | None = None  # an optimizer-phase origin: the parameters and states its values reached
    advice: AdviceContext | None = None  # what the run shows besides the op, to rank the advice by (advice.py)

    def to_dict(self) -> dict:
        """The trace as data: where, the origin op, what the watch saw (tensors left out)."""
        o = self.origin
        return {"step": self.step, "micro": self.micro, "op": o.op, "phase": o.phase, "module": o.module,
                "source": o.source, "kind": o.kind, "reached": self.reached, "loss_harmed": self.facts.loss_harmed,
                "check": None if self.check is None else
                {"kind": self.check.kind, "name": self.check.name, "value": self.check.value},
                "error": describe_exception(self.error) if self.error is not None else None}


def explain(trace: Trace, model: nn.Module, optimizer) -> Finding:
    """The Finding for the trace's origin, in words: the cause and its evidence, the advice, the module."""
    step, micro, event, raw, check, error = (trace.step, trace.micro, trace.origin, trace.batch, trace.check,
                                             trace.error)
    facts, reached = trace.facts, trace.reached
    cause, explanation, suggestions = diagnose(event, raw)
    if check is not None and check.kind == CheckKind.GRAD and facts.loss_harmed:
        explanation += (" In the run the loss was finite and only the gradients went non-finite; in this eager "
                        "replay from the same state the loss itself did: the run's kernels (torch.compile's fused "
                        "kernels, or a non-deterministic one) computed it otherwise, and the op named is the eager "
                        "computation's.")
    elif facts.consequence is not None:
        explanation += consequence_words(facts.consequence)
    elif check is not None and check.kind == CheckKind.GRAD and event.phase in ("forward", "loss"):
        related = {event.id} | {e.id for e in event.inf_sources}
        shown = [p or "<model>" for p, ids in facts.nonfinite_outputs if ids & related]
        where = (f"The loss stayed finite although module output `{shown[0]}` held the value (it was dropped "
                 f"or masked after it, e.g. by torch.where, indexing or nan_to_num)" if shown else
                 "The value was hidden before any module output or the loss (e.g. by torch.where or nan_to_num)")
        explanation += (f" {where}, but it still leaked: only the gradients went non-finite, since backward "
                        f"multiplies it by 0 and 0 * inf = NaN.")
    if not facts.loss_harmed or check is None or check.kind != CheckKind.GRAD:
        explanation += replay_differs(check, facts) or ""
    module, kind_of_module = event.module, event.module_type
    if event.phase == Phase.OPTIMIZER:
        bad = {k: v for k, v in event.scalars.items() if isinstance(v, float) and not math.isfinite(v)}
        if bad:  # the update's step size is itself non-finite (not an Inf written on purpose, a mask)
            explanation = (f"{event.op} was called with {', '.join(f'{k}={v}' for k, v in bad.items())}: the "
                           f"step size {'the loop computed ' if optimizer is None else ''}is not finite"
                           f"{'' if optimizer is None else '.'}")  # (the by-hand words go on after it)
        param, explanation, replaced = _optimizer_explanation(model, optimizer, facts.hyper, reached or [],
                                                              explanation)
        suggestions = replaced or suggestions
        module = param.rsplit(".", 1)[0] if param and "." in param else ""
        kind_of_module = module_type(model, module) if param else ""
    else:
        replaced = None
    if not replaced:  # (the optimizer's own evidence, a NaN lr or schedule, names its fix itself)
        suggestions = rank_advice(cause, event.phase, suggestions, trace.advice, raw, model, event, step)
    return Finding(
        step=step, micro_step=micro, phase=event.phase, module=module, module_type=kind_of_module,
        op=event.op, kind=event.kind, cause=cause, explanation=explanation, source=event.source,
        suggestions=suggestions, source_line=event.source_line, backward_node=event.backward_node,
        forward_source=event.forward_source, sample_ids=sample_ids(raw), inside=event.inside,
        inside_line=event.inside_line,
        inputs=stats_dict(event.inputs), outputs=stats_dict(event.outputs),
        watch=check.said() if check is not None else None,
        exception=describe_exception(error) if error is not None else None,
        notes=[unharmed_buffer_note(name, writer, step) for name, writer in facts.unharmed_buffers
               if writer is not event],
    )


def _optimizer_explanation(model, optimizer, hyper, reached: list[str], evidence: str
                           ) -> tuple[str | None, str, list | None]:
    """(parameter name, explanation, replacement suggestions or None) for an origin inside the optimizer step;
    `reached` names the parameters and states its values reached."""
    what = f"`{reached[0]}`" if reached else "a parameter or optimizer state"
    name = reached[0].split(" (optimizer")[0] if reached else None
    param = dict(model.named_parameters()).get(name) if name else None
    explanation, suggestions = optimizer_explanation(optimizer, hyper, param, what, evidence)
    return name, explanation, suggestions
