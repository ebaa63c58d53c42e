"""Under torchrun a hang-up stops a worker like SIGTERM, with exit 129 (process/streams.py, process/interrupts.py).
(The real hang-ups and streams, in subprocesses: tests/e2e/process/test_hangups.py.)"""

from __future__ import annotations

import signal

import pytest


def test_under_torchrun_a_hang_up_stops_like_sigterm_with_129(monkeypatch):
    """torchrun forwards SIGHUP to its workers and kills them after a grace period: a worker stops at once, with
    the partial report (the loop's KeyboardInterrupt path), exit 129."""
    from debug_nan.process import interrupts, streams

    monkeypatch.setattr(streams, "_terminal_fds", set())
    monkeypatch.setattr(streams, "_hangups", [])
    monkeypatch.setattr(interrupts, "_received", [])
    monkeypatch.setattr(interrupts, "_stopping", [])
    monkeypatch.setenv("RANK", "1")
    with pytest.raises(KeyboardInterrupt) as caught:
        streams._on_hangup(signal.SIGHUP, None)
    assert (interrupts.interrupt_name(caught.value), interrupts.interrupt_code(caught.value)) == ("SIGHUP", 129)
    assert streams.hung_up() and streams.notes() == []  # the report says interrupted (SIGHUP), not "went on"
