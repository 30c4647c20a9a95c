"""Profiling: torchtpu's events in torch.profiler's Chrome trace (flushes with their reason,
compiles with their cache, executions, transfers, CPU fallbacks) and torchtpu.profiler.trace,
which adds their attributes without record_shapes and jax's device timeline."""
import glob
import gzip
import json
import os
import warnings

import pytest
import torch
from torch.profiler import profile

import torchtpu
import torchtpu.profiler

def read_events(path):
    """torchtpu's events in a Chrome trace file, in order."""
    with open(path) as f:
        events = json.load(f)["traceEvents"]
    return sorted((e for e in events if e.get("name", "").startswith("torchtpu::")), key=lambda e: e["ts"])


def torchtpu_events(prof, tmp_path):
    """torchtpu's events of a finished profile, from its exported Chrome trace."""
    path = str(tmp_path / "trace.json")
    prof.export_chrome_trace(path)
    return read_events(path)


def named(events, prefix):
    return [e for e in events if e["name"].startswith(prefix)]


@pytest.fixture
def fresh_caches(tmp_path):
    """Empty memory and disk caches, so the first graph is compiled by XLA."""
    torchtpu._C.clear_memory_cache()
    previous = torchtpu._C.cache_dir()
    torchtpu._C.set_cache_dir(str(tmp_path / "cache"))
    yield
    torchtpu._C.set_cache_dir(previous)


@pytest.mark.modes("fused")
def test_trace_events_carry_their_attributes(mode, fresh_caches, tmp_path):
    torchtpu._C.set_dump_dir(str(tmp_path / "dump"))
    torchtpu.metrics.reset()
    x_cpu = torch.randn(6, 5, generator=torch.Generator().manual_seed(0))
    try:
        with torchtpu.profiler.trace(tmp_path / "prof"):
            x = x_cpu.to("tpu")
            y = (torch.exp(x) * 2 + 1).sum()
            value = y.item()
    finally:
        torchtpu._C.set_dump_dir("")
    counters = torchtpu.metrics.counters()
    assert value == pytest.approx((torch.exp(x_cpu) * 2 + 1).sum().item(), rel=1e-5)
    events = read_events(tmp_path / "prof" / torchtpu.profiler.TORCH_TRACE_NAME)

    up = [e["args"] for e in named(events, "torchtpu::transfer#to_device") if e["args"]["what"] == "tensor"]
    assert {"bytes": 6 * 5 * 4, "type": "float32[6, 5]"}.items() <= up[0].items()
    assert sum(a["bytes"] for a in up) == counters["bytes_to_device"]  # (with the Python numbers)
    (flush,) = named(events, "torchtpu::flush")
    assert flush["name"] == "torchtpu::flush#observation"
    assert flush["args"]["reason"] == "observation"
    assert flush["args"]["ops"] == counters["ops_traced"]  # every op recorded ran in this graph
    assert flush["args"]["outputs"] == 1  # profiling kept no intermediate value alive
    (compile_,) = named(events, "torchtpu::compile")
    assert compile_["name"] == "torchtpu::compile#compiled" and compile_["args"]["cache"] == "compiled"
    graph = compile_["args"]["graph"]
    assert os.path.exists(tmp_path / "dump" / f"graph_{graph}.mlir")  # the name of its dumped module
    # The user's line that began the graph (its first op, torch.exp).
    origin = compile_["args"]["origin"]
    assert origin.startswith(__file__ + ":") and origin.endswith(" in test_trace_events_carry_their_attributes")
    # The span is the compile: XLA's time (counted by the engine) fits inside it.
    compile_us = counters["compile_seconds"] * 1e6
    assert compile_us <= compile_["dur"] + 50 and compile_["dur"] < compile_us + 20_000
    (execute,) = named(events, "torchtpu::execute")
    assert execute["args"]["graph"] == graph
    (down,) = named(events, "torchtpu::transfer#to_host")
    assert down["args"]["bytes"] == 4 and down["args"]["type"] == "float32[]"
    # Nesting and order: the flush holds lower, compile and execute; the copy to host follows.
    for child in (named(events, "torchtpu::lower")[0], compile_, execute):
        assert flush["ts"] <= child["ts"] and child["ts"] + child["dur"] <= flush["ts"] + flush["dur"] + 1
    assert named(events, "torchtpu::wait")[0]["ts"] <= down["ts"]


@pytest.mark.modes("fused")
def test_compile_events_say_which_cache_had_the_executable(mode, fresh_caches, tmp_path):
    x = torch.randn(3, 7, generator=torch.Generator().manual_seed(1)).to("tpu")

    def step():
        return (x * 3 - 1).abs().sum().item()

    kinds = []
    for clear_memory in (False, False, True):  # compiled, then memory, then disk
        if clear_memory:
            torchtpu._C.clear_memory_cache()
        with profile(record_shapes=True) as prof:
            step()
        (event,) = named(torchtpu_events(prof, tmp_path), "torchtpu::compile")
        kinds.append((event["name"].split("#")[1], event["args"]["cache"]))
    assert kinds == [("compiled", "compiled"), ("memory", "memory"), ("disk", "disk")]


@pytest.mark.modes("fused")
def test_each_flush_reason_is_recorded(mode, tmp_path):
    model = torch.nn.Linear(4, 3).to("tpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(2, 4, generator=torch.Generator().manual_seed(2)).to("tpu")
    try:
        with profile() as prof:  # without record_shapes: the reason is in the event's name
            model(x).sum().backward()
            opt.step()                       # optimizer_step
            (x + 1).cpu()                    # observation
            z = x * 2
            torchtpu.sync()                  # sync
            z = z * 2
            torchtpu.set_mode("strict")      # mode_change
            torchtpu.set_mode("fused")
            torchtpu._C.set_max_pending_ops(3)
            for _ in range(3):               # size_limit
                z = z + z  # (a Python number would be a node of its own)
    finally:
        torchtpu._C.set_max_pending_ops(10000)
    reasons = [e["name"].split("#")[1] for e in named(torchtpu_events(prof, tmp_path), "torchtpu::flush")]
    assert reasons == ["optimizer_step", "observation", "sync", "mode_change", "size_limit"]


@pytest.mark.modes("strict")
def test_strict_mode_records_a_compile_and_an_execute_per_op(mode, tmp_path):
    x = torch.randn(5, generator=torch.Generator().manual_seed(3)).to("tpu")
    torch.exp(x)  # compiled (or found) before the profile
    with profile(record_shapes=True) as prof:  # a plain profile exports the args with record_shapes
        torch.exp(x)
        torch.tpu.synchronize()
    events = torchtpu_events(prof, tmp_path)
    assert not named(events, "torchtpu::flush")  # nothing is pending in strict mode
    assert [e["name"] for e in named(events, "torchtpu::compile")] == ["torchtpu::compile#memory"]
    assert len(named(events, "torchtpu::execute")) == 1
    assert named(events, "torchtpu::wait")[0]["args"]["reason"] == "sync"


@torch.library.custom_op("torchtpu_test::cube_on_cpu", mutates_args=(), device_types="cpu")
def cube_on_cpu(x: torch.Tensor) -> torch.Tensor:
    return x * x * x


def test_cpu_fallback_names_the_op(mode, tmp_path):
    x = torch.randn(4, generator=torch.Generator().manual_seed(4))
    with profile(record_shapes=True) as prof:
        out = cube_on_cpu(x.to("tpu"))
    torch.testing.assert_close(out.cpu(), x * x * x)
    (fallback,) = named(torchtpu_events(prof, tmp_path), "torchtpu::cpu_fallback")
    assert fallback["name"] == "torchtpu::cpu_fallback#torchtpu_test::cube_on_cpu"
    assert fallback["args"]["op"] == "torchtpu_test::cube_on_cpu"


@pytest.mark.modes("fused")
def test_trace_writes_the_torch_trace_and_jax_device_timeline(mode, tmp_path):
    logdir = tmp_path / "prof"
    model = torch.nn.Linear(8, 8).to("tpu")
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(5)).to("tpu")
    pjrt = torchtpu._C.runtime_info()["runtime"] == "pjrt"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torchtpu.profiler.trace(logdir) as prof:
            model(x).sum().item()
    # The PJRT runtime's executables run in its plugin, whose profiler jax's does not see.
    assert pjrt == any("whose profiler is not connected yet" in str(w.message) for w in caught)
    assert any(e.key.startswith("torchtpu::flush#observation") for e in prof.key_averages())
    with open(logdir / torchtpu.profiler.TORCH_TRACE_NAME) as f:
        names = {e.get("name", "") for e in json.load(f)["traceEvents"]}
    assert "torchtpu::execute" in names
    # jax's side: TensorBoard's xplane and a Perfetto trace in which XLA ran the executable.
    (run,) = glob.glob(str(logdir / "plugins" / "profile" / "*"))
    assert [p for p in glob.glob(run + "/*.xplane.pb") if os.path.getsize(p) > 0]
    (perfetto,) = glob.glob(run + "/perfetto_trace.json.gz")
    with gzip.open(perfetto) as f:
        device_events = json.load(f)["traceEvents"]
    assert pjrt or any("xecute" in str(e.get("name", "")) for e in device_events)


def test_trace_stops_both_profilers_when_the_block_raises(tmp_path):
    with pytest.raises(ZeroDivisionError):
        with torchtpu.profiler.trace(tmp_path / "a"):
            1 / 0
    with torchtpu.profiler.trace(tmp_path / "b"):  # a second trace can start
        torch.ones(2, device="tpu").sum().item()
    assert (tmp_path / "b" / torchtpu.profiler.TORCH_TRACE_NAME).exists()
