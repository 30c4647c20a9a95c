"""The execution engine: modes, graph caching, disk cache, donation, memory, metrics."""
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import torchtpu
from utils import assert_close, run_python


def make_mlp(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))


def train(model, device, steps, momentum=0.9):
    model = model.to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=momentum)
    torch.manual_seed(1)
    x, y = torch.randn(8, 16).to(device), torch.randn(8, 4).to(device)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        d = model(x) - y
        loss = (d * d).mean()
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    return [l.item() for l in losses], model


def test_training_loop_matches_cpu_in_every_mode(mode):
    cpu_losses, cpu_model = train(make_mlp(), "cpu", 5)
    tpu_losses, tpu_model = train(make_mlp(), "tpu", 5)
    torch.testing.assert_close(tpu_losses, cpu_losses, rtol=1e-5, atol=1e-6)
    for p, q in zip(tpu_model.parameters(), cpu_model.parameters()):
        assert_close(p, q.detach(), rtol=1e-5, atol=1e-6)


@pytest.mark.modes("fused")
def test_fused_loop_compiles_two_graphs_then_only_hits_the_cache(mode):
    torchtpu._C.clear_memory_cache()
    torchtpu.metrics.reset()
    model = make_mlp().to("tpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x, y = torch.randn(8, 16).to("tpu"), torch.randn(8, 4).to("tpu")
    compiled, executed = [], []
    for _ in range(20):
        opt.zero_grad()
        d = model(x) - y
        (d * d).mean().backward()
        opt.step()  # the optimizer hook ends the step's graph: no sync needed
        c = torchtpu.metrics.counters()
        compiled.append(c["graphs_compiled"] + c["cache_hits_disk"])
        executed.append(c["execute_count"])
    # Step 1 creates the momentum buffers, step 2 onwards is the steady-state graph.
    assert compiled == [1] + [2] * 19
    # One graph per step, launched by the optimizer step.
    assert executed == list(range(1, 21))
    assert torchtpu.metrics.counters()["fallback_ops"] == {}


@pytest.mark.modes("fused")
def test_fused_mode_defers_work_until_observed(mode):
    torchtpu.metrics.reset()
    a = torch.ones(4, 4, device="tpu")
    b = (a + 1) * 3
    c = b.sum()
    assert torchtpu._C.pending_ops() >= 3
    assert torchtpu.metrics.counters()["execute_count"] == 0
    assert c.item() == 96.0
    assert torchtpu.metrics.counters()["execute_count"] == 1
    assert torchtpu._C.pending_ops() == 0


@pytest.mark.modes("strict", "debug")
def test_strict_and_debug_run_each_op(mode):
    torchtpu.metrics.reset()
    a = torch.ones(4, device="tpu")
    b = a + 1
    b = b * 2
    assert torchtpu._C.pending_ops() == 0
    assert torchtpu.metrics.counters()["execute_count"] >= 3
    assert b.cpu().tolist() == [4.0] * 4


@pytest.mark.modes("fused")
def test_size_limit_flushes_pending_graph(mode):
    torchtpu._C.set_max_pending_ops(10)
    try:
        torchtpu.metrics.reset()
        x = torch.zeros(3, device="tpu")
        for _ in range(25):
            x = x + 1
        assert torchtpu.metrics.counters()["execute_count"] >= 2
        assert x.cpu().tolist() == [25.0] * 3
    finally:
        torchtpu._C.set_max_pending_ops(10000)


def test_mode_api():
    assert torchtpu.get_mode() == "fused"
    with torchtpu.mode("strict"):
        assert torchtpu.get_mode() == "strict"
        with torchtpu.mode("debug"):
            assert torchtpu.get_mode() == "debug"
        assert torchtpu.get_mode() == "strict"
    assert torchtpu.get_mode() == "fused"
    with pytest.raises(ValueError, match="choose debug, strict or fused"):
        torchtpu.set_mode("turbo")


@pytest.mark.modes("fused", "strict")
def test_memory_stays_flat_and_parameters_are_donated(mode):
    model = make_mlp().to("tpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x, y = torch.randn(8, 16).to("tpu"), torch.randn(8, 4).to("tpu")
    usage = []
    torchtpu.metrics.reset()
    for step in range(200):
        opt.zero_grad()
        d = model(x) - y
        (d * d).mean().backward()
        opt.step()
        if step in (10, 199):
            torch.tpu.synchronize()
            usage.append(torch.tpu.memory_allocated())
    assert usage[0] == usage[1]
    if mode == "fused":
        # Every parameter and momentum buffer update reuses its input buffer.
        assert torchtpu.metrics.counters()["donated_buffers"] >= 190 * 8


@pytest.mark.modes("strict")
def test_recompilation_report_names_the_changed_shape(mode):
    torchtpu.metrics.reset()
    for rows in (4, 6):
        x = torch.randn(rows, 8, device="tpu")
        y = torch.exp(x)  # the line that starts the new graph
    torchtpu.sync(wait=True)
    report = torchtpu.metrics.report()
    assert "recompilations" in report
    entries = [e for e in torchtpu.metrics.recompilations() if "aten::exp" in e[1]]
    assert entries, report
    origin, reason = entries[-1]
    assert "test_engine.py" in origin and "float32[6, 8]" in reason and "float32[4, 8]" in reason


def test_metrics_counters_have_the_documented_keys():
    keys = {"ops_traced", "graphs_compiled", "cache_hits_memory", "cache_hits_disk", "compile_seconds",
            "execute_count", "bytes_to_device", "bytes_to_host", "downloads", "fallback_ops", "recompilations"}
    counters = torchtpu.metrics.counters()
    assert keys <= counters.keys()
    torch.ones(3, device="tpu").cpu()
    assert torchtpu.metrics.counters()["bytes_to_host"] >= 12 and torchtpu.metrics.counters()["downloads"] >= 1
    torchtpu.metrics.reset()
    after = torchtpu.metrics.counters()
    assert after["bytes_to_host"] == 0 and after["fallback_ops"] == {}
    assert "torchtpu metrics" in torchtpu.metrics.report()


def test_fallback_is_counted_and_warned_once():
    torchtpu.metrics.reset()
    x = torch.rand(5, device="tpu")
    # igamma (the regularized incomplete gamma function) has no tpu lowering yet: when it gets
    # one, pick another op that falls back (tools/op_coverage.py lists them).
    with pytest.warns(UserWarning, match="aten::igamma has no tpu lowering"):
        y = torch.igamma(x, x + 1)
    assert_close(y, torch.igamma(x.cpu(), x.cpu() + 1))
    torch.igamma(x, x + 1)
    assert torchtpu.metrics.counters()["fallback_ops"]["aten::igamma"] == 2
    assert "aten::igamma" in torchtpu.metrics.report()




def test_fallback_error_policy():
    result = run_python("""
        import torch, torchtpu
        try:
            torch.igamma(torch.ones(3, device="tpu"), torch.ones(3, device="tpu"))
        except NotImplementedError as e:
            print("raised:", e)
    """, TORCHTPU_FALLBACK="error")
    assert "raised: torchtpu: op aten::igamma has no tpu lowering and TORCHTPU_FALLBACK=error" in result.stdout, result.stderr


def test_dump_dir_writes_stablehlo(tmp_path):
    result = run_python("""
        import torch
        print((torch.ones(3, device="tpu") * 2).sum().item())
    """, TORCHTPU_DUMP_DIR=str(tmp_path), TORCHTPU_CACHE_DIR="")
    assert result.returncode == 0, result.stderr
    dumps = list(tmp_path.glob("*.mlir"))
    assert dumps
    text = dumps[0].read_text()
    assert "func.func public @main" in text and "stablehlo" in text


TRAIN_SCRIPT = """
    import json, torch, torchtpu
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)).to("tpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x, y = torch.randn(8, 16).to("tpu"), torch.randn(8, 4).to("tpu")
    for _ in range(3):
        opt.zero_grad()
        d = model(x) - y
        loss = (d * d).mean()
        loss.backward()
        opt.step()
    c = torchtpu.metrics.counters()
    print(json.dumps({"loss": loss.item(), "compiled": c["graphs_compiled"], "disk": c["cache_hits_disk"]}))
"""


def last_json(result):
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_second_process_loads_executables_from_disk(tmp_path):
    first = last_json(run_python(TRAIN_SCRIPT, TORCHTPU_CACHE_DIR=str(tmp_path)))
    second = last_json(run_python(TRAIN_SCRIPT, TORCHTPU_CACHE_DIR=str(tmp_path)))
    assert first["compiled"] >= 2 and first["disk"] == 0
    assert second["compiled"] == 0 and second["disk"] == first["compiled"]
    assert second["loss"] == first["loss"]


def test_damaged_cache_entries_are_recompiled_with_a_warning(tmp_path):
    first = last_json(run_python(TRAIN_SCRIPT, TORCHTPU_CACHE_DIR=str(tmp_path)))
    entries = sorted(tmp_path.glob("*.xla"))
    assert len(entries) == first["compiled"]
    entries[0].write_bytes(entries[0].read_bytes()[:100])  # truncated
    data = bytearray(entries[1].read_bytes())
    data[-10] ^= 0xFF  # corrupted payload
    entries[1].write_bytes(bytes(data))
    result = run_python(TRAIN_SCRIPT, TORCHTPU_CACHE_DIR=str(tmp_path))
    second = last_json(result)
    assert second["compiled"] == 2 and second["loss"] == first["loss"]
    assert result.stderr.count("ignoring damaged compilation cache entry") == 2
    third = last_json(run_python(TRAIN_SCRIPT, TORCHTPU_CACHE_DIR=str(tmp_path)))
    assert third["compiled"] == 0


def test_concurrent_writers_leave_a_valid_cache(tmp_path):
    env = dict(os.environ, TORCHTPU_CACHE_DIR=str(tmp_path))
    procs = [subprocess.Popen([sys.executable, "-c", textwrap.dedent(TRAIN_SCRIPT)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    for p in procs:
        out, err = p.communicate(timeout=600)
        assert p.returncode == 0, err
    assert not list(tmp_path.glob("*.tmp.*"))
    after = last_json(run_python(TRAIN_SCRIPT, TORCHTPU_CACHE_DIR=str(tmp_path)))
    assert after["compiled"] == 0


def test_mode_from_environment():
    result = run_python("import torchtpu; print(torchtpu.get_mode())", TORCHTPU_MODE="strict")
    assert result.stdout.strip().endswith("strict"), result.stderr
