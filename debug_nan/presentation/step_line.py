"""The per-step block of the log: the STEP rule, the task's data checks, the layer trace (--trace-every-step) and
the watch's summary line of the step. A StepObserver (engine/session/outcome.py) that the runner hands to the Trainer.
--quiet: one line per step (`step 3/10 | loss ... | ok`) and the data checks' warnings only."""

from __future__ import annotations

import math

from debug_nan.engine.watch.history import StepRecord


class StepLines:
    def __init__(self, log, max_steps: int, accumulation_steps: int, max_grad_norm: float | None,
                 quiet: bool = False):
        self.log, self.max_steps, self.accumulation_steps = log, max_steps, accumulation_steps
        self.max_grad_norm, self.quiet = max_grad_norm, quiet

    def _micro(self, micro: int) -> str:
        return f" {micro}" if self.accumulation_steps > 1 else ""

    def begin_step(self, step: int) -> None:
        if self.quiet:
            return
        self.log()
        self.log.rule(f"STEP {step}/{self.max_steps}" +
                      (f" (micro-batches 1..{self.accumulation_steps})" if self.accumulation_steps > 1 else ""))

    def batch_notes(self, micro: int, lines: list[str]) -> None:
        for line in lines:
            if self.quiet and not line.startswith("WARNING"):
                continue
            self.log(f"  [data{self._micro(micro)}] {line}", "yellow" if line.startswith("WARNING") else None)

    def layer_trace(self, micro: int, layer_stats: dict) -> None:
        if not layer_stats:
            return
        self.log(f"  [trace{self._micro(micro)}] layer-by-layer (module outputs, in order):")
        for name, stats in layer_stats.items():
            self.log(f"    {name}: {stats.line()}")

    def end_step(self, record: StepRecord) -> None:
        if self.quiet:
            self.log(quiet_line(record, self.max_steps, self.max_grad_norm))
            return
        for line, colour in step_lines(record, self.max_grad_norm):
            self.log(line, colour)


def quiet_line(record: StepRecord, max_steps: int, max_grad_norm: float | None) -> str:
    """--quiet's one line for a finished step: the watch line's values and the verdict."""
    verdict = "fp16 overflow, step skipped" if record.scaler_skipped else "ok"
    return f"  step {record.step}/{max_steps} | {' | '.join(watch_values(record, max_grad_norm))} | {verdict}"


def watch_values(record: StepRecord, max_grad_norm: float | None) -> list[str]:
    """Loss (and its parts), gradient norm (and clipping), lr, time, memory."""
    parts = ", ".join(f"{k} {v:.4g}" for k, v in record.parts.items())
    loss = f"loss {record.loss:.5g}" + (f" ({parts})" if parts else "") if record.loss is not None else "loss -"
    line = [loss]
    if record.grad_norm is not None and not record.scaler_skipped:
        clipped = max_grad_norm and record.grad_norm > max_grad_norm
        line.append(f"grad norm {record.grad_norm:.4g}" + (f" (clipped to {max_grad_norm:g})" if clipped else ""))
    line.append(f"lr {record.lr:.3g}")
    if record.seconds is not None:
        line.append(f"{record.seconds:.2f} s")
    if record.peak_memory_mb is not None:
        line.append(f"peak CUDA memory {record.peak_memory_mb:,.0f} MiB")
    return line


def step_lines(record: StepRecord, max_grad_norm: float | None) -> list[tuple[str, str | None]]:
    """(line, colour) for a finished step: the watch line; the largest gradients and activations; the verdict."""
    out: list[tuple[str, str | None]] = [("  [watch] " + " | ".join(watch_values(record, max_grad_norm)), None)]
    if record.grad_norms:
        top = sorted(record.grad_norms.items(), key=lambda kv: -kv[1] if math.isfinite(kv[1]) else -math.inf)[:3]
        out.append(("  [grads] largest: " + ", ".join(f"{n} {v:.3g}" for n, v in top), None))
    if record.activations:
        finite = {n: v for n, v in record.activations.items() if math.isfinite(v)}
        held = len(record.activations) - len(finite)  # outputs holding NaN/Inf on purpose (masks): notes, not trips
        line = f"  [acts]  {len(record.activations)} module outputs watched"
        if finite:
            name, value = max(finite.items(), key=lambda kv: kv[1])
            line += f"; largest finite |x| {value:.4g} in {name or '<model>'}"
        if held:
            line += f"; {held} held NaN/Inf (see the notes at the end)"
        out.append((line, None))
    elif not record.outputs_measured:
        out.append(("  [acts]  module outputs not measured in this step (they are measured on a stride; they never "
                    "trip)", None))
    if record.scaler_skipped:
        outputs = "module outputs and loss" if record.outputs_measured else "loss"
        out.append((f"  [ok] {outputs} finite; gradients overflowed the fp16 loss scale (step skipped)", None))
    else:
        out.append(("  [ok] the loss and every gradient are finite", "green"))
    return out
