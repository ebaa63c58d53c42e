"""The re-execution's side of the pinpoint (run as `python -m debug_nan.launch.retrace SPEC_DIR`).

The user's command runs again in a fresh process, from the random state the first run started with, with the
same global hooks counting steps and micro-batches. Every micro-batch's loss is compared, bit for bit, with the
first run's: at the first difference the script is not deterministic, and this run answers only that (a traced
origin from another run would be a wrong one). The op-level tracer is on from the failing micro-batch's root
forward through its backward (its model inputs marked as data origins), or, for a trip in an optimizer step,
through that step (parameters and optimizer state marked first). Its origin becomes a Finding, written as JSON
to SPEC_DIR/answer.json, and the script is stopped there.
"""

from __future__ import annotations

import json
import math
import os
import struct
import sys
import traceback
from pathlib import Path
from types import SimpleNamespace

import torch

from debug_nan.checks.driver import StepInputs, TaskFailure
from debug_nan.checks.pinpoint import Pinpointer
from debug_nan.checks.snapshot import restore_rng
from debug_nan.checks.stats import flat_tensors
from debug_nan.checks.tracer import Tracer
from debug_nan.checks.watch import param_and_state_tensors
from debug_nan.checks.watch_result import Check
from debug_nan.launch import command as commands
from debug_nan.launch.hooks import Hooks, RunStopped
from debug_nan.launch.reexec import deterministic_algorithms
from debug_nan.checks.vocabulary import Phase


def same_bits(a: float, b: float) -> bool:
    return struct.pack("<d", a) == struct.pack("<d", b) or (math.isnan(a) and math.isnan(b))


class Retrace:
    """The hooks' listener in the re-execution."""

    def __init__(self, spec: dict, answer: Path):
        self.trip = spec["trip"]
        self.target = (self.trip["step"], self.trip["micro"])
        self.expected = spec["losses"]
        self.answer = answer
        self.seen = 0  # micro-batches whose loss was compared
        self.model = self.optimizer = self.tracer = None
        self.batch = None
        # under torchrun every rank's re-execution runs on to the end of the failing micro-batch (its optimizer
        # step), whatever it found on the way: a rank that stopped earlier would strand the others in a collective
        self.in_step = spec.get("ddp", False)
        self.trace = spec.get("trace", True)
        self.answered: dict | None = None
        self.hooks: Hooks | None = None  # whose `root` says whether the model is wrapped (DDP)

    def attach(self, model, optimizer) -> None:
        self.model, self.optimizer = model, optimizer

    def micro_begin(self, batch, step: int, micro: int) -> None:
        if self.trip["optimizer"] or (step, micro) != self.target or not self.trace or self.answered:
            return
        self.batch = batch
        self.tracer = Tracer(self.model)
        self.tracer.__enter__()
        for path, t in flat_tensors(batch):
            self.tracer.mark(t, path, "data")
        if self.hooks is None or self.hooks.root is self.model:  # (a DDP wrapper's inner module: its hook will run)
            self.tracer.context._pre(self.model, (), {})  # inside the root's forward: its own hook ran already

    def backward_begin(self, loss: torch.Tensor, step: int, micro: int) -> None:
        value = float(loss.double()) if loss.numel() == 1 else math.nan
        if self.answered is None and self.seen < len(self.expected) and not same_bits(value,
                                                                                      self.expected[self.seen]):
            expected = self.expected[self.seen]
            self.write({"diverged": f"the loss of micro-batch {micro} of step {step} was {expected!r} in the run and "
                                    f"{value!r} in its re-execution"})
            self.stop()
        self.seen += 1
        if self.tracer is not None and not self.trip["optimizer"] and self.tracer.origin_of([loss]) is not None:
            self.conclude([loss])

    def backward_end(self, step: int, micro: int) -> None:
        if self.tracer is not None and not self.trip["optimizer"]:
            self.conclude([p.grad for p in self.model.parameters() if p.grad is not None])
        if self.in_step and not self.trip["optimizer"] and (step, micro) == self.target:
            self.end_in_step()

    def step_begin(self, step: int) -> None:
        if self.trip["optimizer"] and step == self.target[0] and self.trace and not self.answered:
            self.tracer = Tracer(self.model)
            self.tracer.__enter__()
            self.tracer.phase_override = Phase.OPTIMIZER
            for name, t in param_and_state_tensors(self.model.named_parameters(), self.optimizer):
                self.tracer.mark(t, name, "optimizer")

    def step_end(self, step: int, skipped: bool) -> None:
        if self.tracer is not None and self.trip["optimizer"]:
            self.conclude([t for _, t in param_and_state_tensors(self.model.named_parameters(), self.optimizer)])
        if self.in_step and self.trip["optimizer"] and step == self.target[0]:
            self.end_in_step()

    def conclude(self, harmed: list, error: BaseException | None = None) -> None:
        """The tracer's origin in the lineage of `harmed` -> the Finding, written; the script stops."""
        tracer, self.tracer = self.tracer, None
        tracer.__exit__(None, None, None)
        origin = tracer.origin_of(harmed) if harmed else None
        if origin is None and error is not None:
            origin = tracer.first  # user code raised before the harm could be computed
        check = Check(**self.trip["check"]) if self.trip["check"] else None
        driver = SimpleNamespace(model=self.model, optimizer=self.optimizer, log=lambda *a, **k: None,
                                 device=next(self.model.parameters()).device)
        pinpointer = Pinpointer(driver)
        pinpointer.replay = lambda *args, **kwargs: (tracer, origin, error, self.batch)
        step, micro = self.target
        inputs = StepInputs(step=step, batches=[None] * (micro - 1) + [self.batch])
        try:
            finding = pinpointer.pinpoint(inputs, micro, check, error, optimizer=self.trip["optimizer"])
            self.write({"finding": finding.to_dict(), "ops": tracer.ops_seen, "origins": len(tracer.origins)})
        except TaskFailure as failure:
            self.write({"error": str(failure)})
        self.stop()

    def stop(self) -> None:
        """Answered: the script stops here, or under torchrun goes on untraced to the failing micro-batch's end."""
        if not self.in_step:
            raise RunStopped("traced")

    def end_in_step(self) -> None:
        """Under torchrun: every rank is at the failing micro-batch's end (past its collectives): stop."""
        self.answer.write_text(json.dumps({**(self.answered or {"untraced": True}), "lockstep": True}))
        raise RunStopped("traced")

    def write(self, answer: dict) -> None:
        if self.answered is None:  # the first answer stands (under torchrun the run goes on after it)
            self.answered = answer
            self.answer.write_text(json.dumps(answer))


def main(spec_dir: str) -> int:
    folder = Path(spec_dir)
    spec = json.loads((folder / "spec.json").read_text())
    listener = Retrace(spec, folder / "answer.json")
    hooks = listener.hooks = Hooks(listener)
    restore_rng(torch.load(folder / "rng.pt", weights_only=False), torch.device("cpu"))  # the run's start state
    deterministic_algorithms(spec["deterministic"])
    hooks.install()
    code = 0
    try:
        code = commands.run(commands.resolve(spec["words"]))
    except RunStopped:
        pass
    except Exception as exc:  # noqa: BLE001 - the script raised: the origin before it, if it was traced
        traceback.print_exc()
        if listener.tracer is not None:
            try:
                listener.conclude([], exc)
            except RunStopped:
                pass
    finally:
        hooks.uninstall()
    if listener.in_step:  # a DDP script's gloo threads can abort the interpreter's teardown: leave without it
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
