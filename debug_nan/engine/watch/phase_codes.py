"""DDP phase codes: what each rank all-reduces (MAX) every micro-batch so that every rank takes the same decision.

A higher code was seen earlier in a micro-batch (0 = nothing). "exception": user code raised (between the loss and
the gradients, as far as ordering goes); "abort": a rank must stop for a reason that is not numerical (bad input,
out of memory, Ctrl-C). The watch computes its code on the device (no sync) and sends it in its one host copy.
"""

from __future__ import annotations

import torch

from debug_nan.engine.vocabulary import PHASE_OF_KIND, CheckKind
from debug_nan.engine.watch.watch_result import HARM_KINDS, MicroResult

_LATEST_FIRST = ("backward", "exception", "loss", "forward", "data", "optimizer", "abort")
CODE_PHASE = {code: phase for code, phase in enumerate(_LATEST_FIRST, start=1)}
_CODE_OF_PHASE = {phase: code for code, phase in CODE_PHASE.items()}
PHASE_CODE = {kind: _CODE_OF_PHASE[phase] for kind, phase in PHASE_OF_KIND.items()}  # check kind -> code
ABORT_CODE, EXCEPTION_CODE = _CODE_OF_PHASE["abort"], _CODE_OF_PHASE["exception"]
# finiteness read from a norm or a sum (which may overflow: the watch's second look)
NORM_KINDS = (CheckKind.PARAM, CheckKind.GRAD)


def host_code(result: MicroResult, raised: bool = False, abort: bool = False) -> int:
    """This rank's phase code from settled host values (the device computes the same in device_code)."""
    bad = result.first_harm()
    code = PHASE_CODE[bad.kind] if bad is not None else 0
    return max(code, ABORT_CODE if abort else EXCEPTION_CODE if raised else 0)


def device_code(flat: torch.Tensor, layout, raised: bool, abort: bool) -> torch.Tensor:
    """0-d float32 phase code of a micro-batch, on the device (no sync), from the watch's flat vector and its layout
    [(kind, names, width, _)]. As host_code, plus 0.5 when a norm read +Inf (it may have overflowed with finite
    elements: the ranks then settle it in a second round)."""
    # per kind, on slices of the flat vector: no host array is copied to the device (a pageable copy can block like
    # a sync)
    code = harm = data = ambiguous = torch.zeros((), device=flat.device, dtype=torch.float64)
    bad, start = ~torch.isfinite(flat), 0
    for kind, names, width, _ in layout:
        part = slice(start, start + len(names) * width)
        start = part.stop
        if kind in HARM_KINDS:
            harm = torch.maximum(harm, bad[part].any() * float(PHASE_CODE[kind]))
        if kind in NORM_KINDS:  # as the second look: +Inf norms, any non-finite parameter sum
            ambiguous = ambiguous + (torch.isposinf(flat[part]) if kind == CheckKind.GRAD else bad[part]).any()
        if kind == CheckKind.DATA:
            data = bad[part].any() * float(PHASE_CODE[CheckKind.DATA])
    if layout:
        code = torch.maximum(harm, data * (harm > 0)) + 0.5 * (ambiguous > 0)
    if abort or raised:
        code = torch.clamp(code, min=float(ABORT_CODE if abort else EXCEPTION_CODE))
    return code.float()


__all__ = ["ABORT_CODE", "CODE_PHASE", "EXCEPTION_CODE", "NORM_KINDS", "PHASE_CODE", "device_code", "host_code"]
