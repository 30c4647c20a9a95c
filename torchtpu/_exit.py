"""At interpreter exit: autograd's tpu device threads let go of their last backward first.

torch >= 2.13 stashes a `contextvars.Context` in the thread-local state that every backward
copies (torch/autograd/graph.py, `_engine_run_backward`). A tpu backward runs on autograd's
thread for that device, which drops its last reference to the graph task, and with it to that
Context, just after the caller's `backward()` has returned. When that call is the script's last
line, the drop can land in `Py_FinalizeEx`: taking the GIL there ends the thread through
`pthread_exit`, whose unwinding meets a noexcept destructor, and the process aborts with
"terminate called without an active exception" (exit code 134, one run in 5-20 on a loaded
machine; PyTorch issue #190489; CUDA's device threads have the same race). A device thread runs
its tasks in order and lets go of one before it takes the next, so one more backward per device,
run without the stash, returns only after the thread has dropped everything earlier; its own
graph task, made in C++, holds no Python object, so dropping it needs no GIL.
"""
import atexit

import torch


def drain_autograd_threads(_C) -> None:
    """Returns once every tpu device thread of autograd has finished its earlier graph tasks."""
    if not _C.initialized() or _C.in_bad_fork():
        return  # no tpu tensor was made: no backward ran on tpu (and no runtime to start now)
    # In C++: a captured gradient returned to Python, or a tensor made here, would give the
    # drain's own graph task a Python object to drop on that thread.
    _C.drain_autograd_threads(torch.tpu.device_count())


def install(_C) -> None:
    def at_exit():
        try:
            drain_autograd_threads(_C)
        except Exception:  # a runtime already broken (the cause was reported): nothing to wait for
            pass

    atexit.register(at_exit)
