"""The watch in the user's own run: the step session (engine/session/session.py) driven by the global hooks, replaying
in place.

The run's driver of the session, and the pinpointer's StepDriver: the loss code between the model's forward and the
backward is the script's, so a micro-batch is replayed from its tape (drivers/run/tape.py: the script's torch calls
around the model, recorded as it ran) and an update from the tape of the code between the last backward and the
optimizer step, then the script's own optimizer. The snapshot is the session's, as for every entry point: a trip is
answered at once, from the run's own state at that step: one micro-batch (or update) traced, whatever
the step number (scripts/bench_pinpoint.py).
A micro-batch's end does not know whether it is its step's last: the step's record is closed (its gradient norms,
the explosion check) when the optimizer steps.
"""

from __future__ import annotations

import io
import logging
import os
import time
from contextlib import contextmanager, nullcontext, redirect_stderr, redirect_stdout

import torch
import torch.distributed as dist

from debug_nan.drivers.framework import FrameworkDriver
from debug_nan.drivers.eval_forwards import EvalForwards, harmful_reading
from debug_nan.drivers.run.bundle import PROTOCOL, pickle_module, script_modules_by_value, script_state
from debug_nan.drivers.run.hooks import Hooks, RunStopped
from debug_nan.drivers.run.replayer import TapeReplayer
from debug_nan.drivers.run.tape import Tape
from debug_nan.engine.explain.fallback import suggest_trace_at
from debug_nan.engine.replay.driver import TaskFailure
from debug_nan.engine.replay.live import LiveTrace
from debug_nan.engine.replay.snapshot import schedule_state
from debug_nan.engine.session.session import StepSession
from debug_nan.engine.vocabulary import CheckKind
from debug_nan.engine.watch.history import History
from debug_nan.engine.watch.watch_result import Check
from debug_nan.presentation.bundle import write_bundle


class RunHistory(History):
    """The history, with the last micro-batch's result, whose gradient norms are the step's once the optimizer
    steps."""

    def __init__(self):
        super().__init__()
        self.last = None

    def add_micro(self, rec, result, last: bool) -> None:
        super().add_micro(rec, result, last)
        self.last = result

    def close(self, rec) -> None:
        """The step's optimizer step came: its gradient norms are those of its last micro-batch (accumulated)."""
        self.step_gradients(rec, self.last)
        rec.finish()


class RunSession(StepSession):
    """The session, with the run's history."""

    def __init__(self, driver, policies, watch=None):
        super().__init__(driver, policies, watch)
        self.history = RunHistory()


class RunDriver(TapeReplayer, FrameworkDriver):
    framework = "script"
    session_class = RunSession
    dialect = "script"  # advice in the words of the user's own loop

    def __init__(self, model, optimizer, settings, log, hooks: Hooks, dist_ctx=None, bundle_dir: str | None = None,
                 shown_from: str | None = None, trace_at: tuple[int, int] | None = None,
                 command: list[str] | None = None):
        super().__init__(model, optimizer, settings, log, dist_ctx=dist_ctx, scheduler=hooks.scheduler_of(optimizer),
                         bundle_dir=bundle_dir)
        self.hooks = hooks
        self.shown_from = shown_from  # the folder debug-nan started in (the script may chdir): paths shown from it
        self.trace_at = trace_at  # --trace-at: (step, micro-batch) traced as it runs (engine/replay/live.py)
        self.command = command  # the user's command as typed (the --trace-at suggestion repeats it)
        self.live: LiveTrace | None = None
        self.step_open = False
        self.answer_seconds: float | None = None  # from the sync that tripped to the finding (the pinpoint's cost)
        self.eval_forwards = EvalForwards(self)  # the model's forwards outside training (validation, generation)

    def finish(self):
        """The last update's check (under DDP, when the script destroys its process group: the ranks agree on it
        and replay its update together while they still can). After the group is gone the parameters are still
        replicas, so every rank decides the same alone."""
        if self.session.p.agreement is not None and not (dist.is_available() and dist.is_initialized()):
            self.session.p.agreement = None
        return super().finish()

    def _settle(self, decide, last: bool):
        self._stop_live()  # (the trip's decision explains the live trace, if it covers the micro-batch)
        started = time.perf_counter()
        self.diverged = None
        finding = super()._settle(decide, last)
        if finding is not None and self.diverged and finding.detected_by == "replay":
            finding.explanation += f" {self.diverged}"
        if self.stopped and self.answer_seconds is None:
            self.answer_seconds = time.perf_counter() - started
        if self.trace_at is None:
            suggest_trace_at(finding, self.command)  # (a replay that fell short: the exact command that traces it)
        return finding

    def write_bundle(self, state: dict) -> str:
        """The bundle of a finding (drivers/run/bundle.py): the script's model, optimizer and scheduler themselves
        (the session restored them to the failing step's start to read its state) and the tapes."""
        state = script_state(state, self.model, self.optimizer, self.session.snapshot.scheduler,
                             self.dist.world if self.dist is not None else 1)
        options = {"pickle_module": pickle_module(), "pickle_protocol": PROTOCOL}
        with script_modules_by_value():
            path = str(write_bundle(self.bundle_dir, state, options))
        inside = self.shown_from and os.path.commonpath([path, self.shown_from]) == self.shown_from
        return os.path.relpath(path, self.shown_from) if inside else path  # (the user's `debug-nan replay` path)

    def follow(self, optimizer, scheduler) -> None:
        """The script replaced its optimizer (a second training stage): the session follows the new one."""
        self.optimizer = optimizer
        self.session.follow(optimizer, scheduler)

    def adopt_scaler(self, scaler) -> None:
        """The script's GradScaler, known at its first scale(): the gradients' norms are read unscaled."""
        if self.scaler is None and scaler is not None and scaler.is_enabled():
            self.scaler = self.session.scaler = scaler

    @contextmanager
    def watch_paused(self):
        """A replay: no hook event is the run's, and what the script's code prints or logs on the way (its model's
        forward runs again) is not shown twice (debug-nan's own log keeps its stream)."""
        sink, disabled = io.StringIO(), logging.root.manager.disable
        logging.disable(logging.CRITICAL)
        try:
            with self.hooks.paused(), self.watch.paused(), _kept(self.log), redirect_stdout(sink), \
                    redirect_stderr(sink):
                yield
        finally:
            logging.disable(disabled)

    # -- the hooks' events -------------------------------------------------------------------------------------
    def micro_begin(self, batch, step: int) -> None:
        self.begin(batch, first=not self.step_open, step=step)
        self.step_open = True
        self.session.inputs.tapes.append(None)
        if self.trace_at == (step, self.session.micro) and not self.stopped:
            self.log(f"  [trace-at] step {step}, micro-batch {self.session.micro}: traced as it runs", "yellow")
            self.live = self.pinpointer.live = LiveTrace.start(self.model, batch, step, self.session.micro,
                                                               self.pinpointer.writers.names)

    def _stop_live(self) -> None:
        if self.live is not None and self.live.open:
            self.live.stop(self.model)

    def backward_begin(self, loss: torch.Tensor, tape: Tape | None) -> None:
        self.session.inputs.tapes[-1] = tape
        if self.live is not None and self.live.open:
            self.live.loss = loss
        if self.watch.enabled and loss.numel() == 1:
            self.watch_loss(loss.reshape(()))

    def raised(self, error: BaseException) -> None:
        """The script raised inside a micro-batch (before its backward): its partial tape, then the decision."""
        self._keep_partial_tape()
        self.end(last=False, error=error)

    def abandoned(self, code: int) -> None:
        """The command ended (exit `code`) inside a micro-batch, before its backward: the script gave up on it
        (AAM raises on a NaN in its forward and its CLI exits 1). Where the model's outputs hold NaN/Inf, or the
        exit is not 0, the micro-batch is replayed as far as the run got: a NaN/Inf born there is the finding; none
        leaves the run clean with the script's own code (it stopped for reasons of its own)."""
        self._stop_live()
        reading = _any_nonfinite(self.hooks.outputs)
        if (reading is None and code == 0) or self.stopped or self.session.inputs is None \
                or self.session.p.agreement is not None or not self.watch.enabled:
            return
        self._keep_partial_tape()
        where = f"step {self.session.inputs.step}, micro-batch {self.session.micro}"
        held = f", and the model's output held {reading}" if reading is not None else ""
        self.log(f"  [watch] the command ended (exit {code}) in {where} before its backward(){held}: replaying "
                 f"it to see whether a NaN/Inf was born before the script gave up on it", "yellow")
        outcome = self.session.end_micro(last=False, error=ScriptGaveUp(
            f"the command exited with code {code} in this micro-batch, before its backward()"))
        outcome.check = Check(CheckKind.FORWARD, "<model output>", reading) if reading is not None else None
        try:
            finding = self.session.decide(outcome)
        except TaskFailure:
            self.log(f"  [pinpoint] no NaN/Inf was born in {where} before the command ended: its exit is its own.")
            return
        if finding is not None:
            self.findings.append(finding)
            self.session.stop(finding)

    def eval_begin(self, module, args: tuple, kwargs: dict, steps_taken: int) -> bool:
        """A forward outside training begins -> True when the run is to stop before it: the first one after an
        update reads that update's check first (EvalForwards.update_first), which may trip."""
        if not self.watch_on_outside_training():
            return False
        self.eval_forwards.update_first()
        if self.stopped:
            return True
        self.eval_forwards.begin(module, args, kwargs, steps_taken)
        return False

    def eval_end(self, output) -> bool:
        """A forward outside training ended: True when its output was harmful and the run is to stop (one process;
        under torchrun the finding is kept and the run goes on: EvalForwards.found)."""
        if not self.watch_on_outside_training():
            self.eval_forwards.end(None)
            return False
        started = time.perf_counter()
        finding = self.eval_forwards.end(output)
        if finding is None:
            return False
        self.answer_seconds = time.perf_counter() - started
        self.eval_forwards.found(finding, stop=self.dist is None)
        return self.stopped

    def watch_on_outside_training(self) -> bool:
        return not self.stopped and not self.eval_forwards.done and not self.hooks.state.paused

    def forwards_given_up(self, tape: Tape, calls: list[int], outputs: list) -> None:
        """Model calls of this micro-batch whose outputs its backward does not take (the script skipped a NaN loss
        with `continue` and went on to the next batch): where such an output holds NaN/Inf, the script gave up on
        it, and that forward is replayed (its tape as far as that call) to name the op."""
        for n, output in zip(calls, outputs):
            reading = _any_nonfinite([output])
            if reading is None or self.stopped:
                continue
            self.log(f"  [watch] a forward of step {self.session.inputs.step}, micro-batch {self.session.micro} "
                     f"made a model output holding {reading} that no backward took (the script went on without it)",
                     "red")
            self.session.inputs.tapes[-1] = tape.up_to_model_call(n)
            outcome = self.session.end_micro(last=False)
            outcome.check = Check(CheckKind.FORWARD, "<model output>", reading)
            self._settle(lambda: self.session.decide(outcome), last=False)

    def _keep_partial_tape(self) -> None:
        inputs = self.session.inputs
        if inputs is not None and inputs.tapes:
            inputs.tapes[-1] = inputs.tapes[-1] or self.hooks.recorder.tape
        self.hooks.recorder.tape = None

    def backward_end(self) -> None:
        traced = self.live is not None and self.live.open
        self.end(last=False)
        if traced and not self.stopped:
            self._stop_live()
            self.pinpointer.live = None
            self.log(f"  [trace-at] step {self.live.step}, micro-batch {self.live.micro} ran under the tracer and "
                     f"no NaN/Inf reached its loss or gradients this time: the run did not come back to the values "
                     f"of the run that tripped (seed it: its data order, dropout)", "yellow")
        if self.stopped:
            raise RunStopped("trip")

    def step_begin(self, update: Tape | None) -> None:
        """The optimizer step begins: the update's tape, and the param groups as the step sees them (the script
        may have set its lr since the step began)."""
        inputs = self.session.inputs
        if inputs is not None and not self.stopped:
            inputs.update = update
            inputs.step_groups = schedule_state(self.optimizer, None)["groups"]

    def step_end(self, skipped: bool) -> None:
        """After the optimizer step (or a GradScaler's skip): close the step's record, the explosion check, then
        the parameters are read at the next sync."""
        if self.stopped or not self.step_open:
            return
        self.step_open = False
        record = self.session.record
        record.scaler_skipped = record.scaler_skipped or skipped
        self.history.close(record)
        self.steps_run = self.session.steps
        if not record.scaler_skipped:
            self._settle(lambda: self.session.check_explosion(record), last=False)
        if self.stopped:
            raise RunStopped("trip")
        if not skipped:
            self.stepped()


def _kept(log):
    """The log's stream kept while the script's output goes to a sink (presentation/log.py's keep_stream)."""
    return log.keep_stream() if hasattr(log, "keep_stream") else nullcontext()


class ScriptGaveUp(Exception):
    """The command ended inside a micro-batch, before its backward (an exit, or its own error caught)."""


def _any_nonfinite(outputs: list) -> float | None:
    """NaN, or inf, when a floating tensor of the model's outputs holds any non-finite value (NaN first), else
    None: an output the script gave up on is judged whole, -inf included (one sync)."""
    return harmful_reading(outputs, minus_inf_is_harm=True)
