"""How debug-nan stops the user's script from inside a hook (`debug-nan run`)."""

from __future__ import annotations

import ctypes
import threading


class RunStopped(BaseException):
    """Ends the user's script from inside a hook: a BaseException, so `try/except Exception` in the script does
    not swallow it. `reason`: "trip", "max-steps", "error"."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class StoppedInThread(RunStopped):
    """The stop of a hook in another thread, raised in the main thread: that thread's stop ends only that thread,
    while the main thread (joining it, or running on) is the script. Raised asynchronously, as a class (what
    PyThreadState_SetAsyncExc takes): `reason` is the stop's (set before it is raised)."""

    last_reason = "trip"

    def __init__(self):
        super().__init__(StoppedInThread.last_reason)


def stop_main_thread(stop: RunStopped) -> None:
    """Raise StoppedInThread in the main thread as soon as it runs Python code (when a join() returns)."""
    StoppedInThread.last_reason = stop.reason
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(threading.main_thread().ident),
                                               ctypes.py_object(StoppedInThread))
