"""What a repro bundle holds (presentation/bundle.py writes it), read from a Trainer after its replay."""

from __future__ import annotations

import torch

from debug_nan.engine.explain.finding import Finding
from debug_nan.engine.replay.driver import StepInputs
from debug_nan.engine.replay.snapshot import portable_rng
from debug_nan.engine.stats import move_to


def repro_state(trainer, inputs: StepInputs, micro: int, finding: Finding, check, optimizer_phase: bool) -> dict:
    """Everything a repro bundle holds (presentation/bundle.py writes it): the state before the step, its
    micro-batches up to the failing one as produced (CPU) with their RNG states, the settings. It restores
    the snapshot to read the state, so it comes after the replay."""
    n = max(micro, trainer.accumulation_steps) if optimizer_phase else micro  # (`run`: a step's micro-batches
    # are its backward calls, not a setting)
    return {"finding": finding.to_dict(), "step": inputs.step, "micro": micro,
            "optimizer_phase": optimizer_phase, "check": check.to_dict() if check is not None else None,
            "batches": [move_to(b, torch.device("cpu")) for b in inputs.batches[:n]],
            "rng": [portable_rng(r) for r in inputs.rng[:n]],
            # what a driver that replays recorded code recorded (`debug-nan run`: drivers/run/bundle.py)
            "tapes": inputs.tapes[:n], "update": inputs.update if optimizer_phase else None,
            "step_groups": inputs.step_groups if optimizer_phase else None, "first_step": trainer.first_step,
            **inputs.snapshot.state_dicts(), "settings": trainer.s.to_dict(), "torch": str(torch.__version__),
            "device": str(trainer.device)}
