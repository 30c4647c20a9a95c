"""Profiling tpu code: torchtpu's events in torch.profiler, the device timeline through jax's.

Inside `torch.profiler.profile(...)` torchtpu records, as PyTorch profiler events:

    torchtpu::flush#<reason>      a pending graph runs; reason: observation (a value was read),
                                  optimizer_step, size_limit, sync, mode_change, torch_compile
                                  args: ops, outputs, origin (the Python line that began it)
    torchtpu::lower               the graph is lowered to StableHLO (args: graph, ops)
    torchtpu::compile#<cache>     its executable is found: cache = memory | disk | compiled
                                  (XLA compiled it); the span's duration is the time taken
                                  args: graph, origin, ops
    torchtpu::execute             the launch (asynchronous: the host's share; args: graph)
    torchtpu::transfer#<dir>      to_device / to_host copies (args: bytes, type, what)
    torchtpu::wait                waiting for the device (before a copy to host, synchronize)
    torchtpu::cpu_fallback#<op>   an op without a lowering runs on CPU (args: op)

`graph` is the graph's hash, as in TORCHTPU_DUMP_DIR's file names. The names carry the
classifying attribute, so `prof.key_averages()` splits flushes by reason and compiles by
cache. torch.profiler exports the other attributes (the args) only with record_shapes=True,
and record_shapes=True keeps every op's input tensors referenced until the profile object
is gone: on tpu those intermediate values then stay live and become outputs of the fused
graphs, so a profiled step compiles other graphs than an unprofiled one. `trace(logdir)`
profiles without it and writes the args into its Chrome trace from torchtpu's own log.

`trace(logdir)` also runs jax's profiler: XLA's side (executables running, their thunks) for
TensorBoard's profile plugin and Perfetto.
"""
from __future__ import annotations

import collections
import contextlib
import json
import os
import warnings

import torch

from torchtpu import _C

__all__ = ["trace"]

TORCH_TRACE_NAME = "torch_trace.json"


def _jax_options(python_tracer: bool):
    import jax.profiler

    options = jax.profiler.ProfileOptions()
    # jax's Python tracer records every Python call: minutes of overhead on a training step.
    options.python_tracer_level = 1 if python_tracer else 0
    return options


def _add_span_attributes(path: str, spans) -> None:
    """Writes the logged spans' attributes into the Chrome trace at path as their events' args.
    A thread runs its spans one after another, so per (thread, name) the k-th event in time
    is the k-th logged span."""
    with open(path) as f:
        trace = json.load(f)
    events = collections.defaultdict(list)
    for e in trace["traceEvents"]:
        if e.get("ph") == "X" and str(e.get("name", "")).startswith("torchtpu::"):
            events[(e.get("tid"), e["name"])].append(e)
    logged = collections.defaultdict(list)
    for thread, name, attributes in spans:
        logged[(thread, name)].append(attributes)
    unmatched = []
    for key, group in events.items():
        attributes = logged.get(key, [])
        if len(attributes) != len(group):
            unmatched.append(key[1])
            continue
        for event, attrs in zip(sorted(group, key=lambda e: e["ts"]), attributes):
            event.setdefault("args", {}).update(attrs)
    if unmatched:
        warnings.warn(f"torchtpu.profiler: no attributes for {sorted(set(unmatched))} (events and log differ)")
    with open(path, "w") as f:
        json.dump(trace, f)


@contextlib.contextmanager
def trace(logdir: str | os.PathLike, *, python_tracer: bool = False, **profile_kwargs):
    """Profiles the block with torch.profiler and jax's profiler, both written under logdir:

        logdir/torch_trace.json                        PyTorch ops and torchtpu's events
                                                       (Chrome trace: Perfetto, chrome://tracing)
        logdir/plugins/profile/<run>/*.xplane.pb       the XLA/device timeline (TensorBoard:
        logdir/plugins/profile/<run>/perfetto_trace.json.gz   `tensorboard --logdir logdir`; Perfetto)

    Yields the torch.profiler.profile object (for `key_averages()`). Work issued before the
    block runs first; the block's work is waited for before the traces stop. torchtpu's
    events carry their attributes as args in torch_trace.json. python_tracer=True also
    records Python calls in jax's trace (slow); other keyword arguments go to
    torch.profiler.profile (record_shapes=True changes the graphs: see the module's doc).
    """
    import jax.profiler

    if _C.runtime_info().get("runtime") == "pjrt":
        warnings.warn("torchtpu.profiler.trace: under TORCHTPU_RUNTIME=pjrt the XLA timeline (plugins/profile) holds "
                      "jax's own work only: torchtpu's executables run in the PJRT plugin, whose profiler is not "
                      "connected yet; set TORCHTPU_RUNTIME=jaxlib to see them there", stacklevel=3)
    logdir = os.fspath(logdir)
    os.makedirs(logdir, exist_ok=True)
    _C.sync(True, "sync")  # earlier work stays out of the traces
    profile_kwargs.setdefault("activities", [torch.profiler.ProfilerActivity.CPU])
    prof = torch.profiler.profile(**profile_kwargs)
    jax.profiler.start_trace(logdir, create_perfetto_trace=True, profiler_options=_jax_options(python_tracer))
    _C.start_span_log()
    try:
        with prof:
            yield prof
            _C.sync(True, "sync")  # the block's device work ends inside the traces
    finally:
        spans = _C.take_span_log()
        jax.profiler.stop_trace()
    path = os.path.join(logdir, TORCH_TRACE_NAME)
    prof.export_chrome_trace(path)
    _add_span_attributes(path, spans)
