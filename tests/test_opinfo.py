"""Conformance against PyTorch's own OpInfo database: every OpInfo's float32 sample inputs
on tpu against CPU (tools/op_coverage.py; ops run in worker subprocesses, so a crashing op
is reported instead of killing pytest).

The floors only go up: when lowerings land, raise them to the new measured numbers
(`PYTHONPATH=. .venv/bin/python tools/op_coverage.py --samples 2 --no-md` prints
them as forward_passing, forward_passing_no_fallback and backward_passing).
"""
import importlib.util
import os

import pytest

# Measured with SAMPLES samples/op, forward and backward, fused mode (3m17s on 2 shared cores).
FLOOR_FORWARD = 633         # OpInfo ops whose forward matches CPU (with or without fallback)
FLOOR_NO_FALLBACK = 448     # ... of which nothing fell back to CPU
FLOOR_BACKWARD = 500        # OpInfo ops whose gradients match CPU (with or without fallback)
SAMPLES = 2
TIMEOUT_S = 60.0

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _load_harness():
    spec = importlib.util.spec_from_file_location("op_coverage", os.path.join(ROOT, "tools", "op_coverage.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def coverage():
    harness = _load_harness()
    jobs = int(os.environ.get("TORCHTPU_OPINFO_JOBS", "1"))
    data = harness.run(samples=SAMPLES, backward=True, timeout=TIMEOUT_S, jobs=jobs, mode="fused",
                       log=lambda message: None)
    s = data["summary"]
    print(f"\nopinfo: {s['ops_total']} ops, forward_passing={s['forward_passing']}, "
          f"forward_passing_no_fallback={s['forward_passing_no_fallback']}, fail={s['forward']['fail']}, "
          f"backward_passing={s['backward_passing']}, crashes={s['crashes']}, timeouts={s['timeouts']}, {data['meta']['runtime_s']}s")
    return data


def test_opinfo_no_crashes(coverage):
    s = coverage["summary"]
    details = {k: coverage["ops"][k]["reason"] for k in s["crashes"]}
    assert not s["crashes"], f"OpInfo ops crashed the process: {details}"


def test_opinfo_no_timeouts(coverage):
    s = coverage["summary"]
    assert not s["timeouts"], f"OpInfo ops timed out (> {TIMEOUT_S}s): {s['timeouts']}"


def test_opinfo_forward_floor(coverage):
    s = coverage["summary"]
    assert s["forward_passing"] >= FLOOR_FORWARD, (
        f"{s['forward_passing']} OpInfo ops pass forward, floor is {FLOOR_FORWARD}; "
        f"failing: {sorted(k for k, r in coverage['ops'].items() if r['fwd'] == 'fail')}")


def test_opinfo_no_fallback_floor(coverage):
    s = coverage["summary"]
    assert s["forward_passing_no_fallback"] >= FLOOR_NO_FALLBACK, (
        f"{s['forward_passing_no_fallback']} OpInfo ops pass forward without fallback, "
        f"floor is {FLOOR_NO_FALLBACK}")


def test_opinfo_backward_floor(coverage):
    s = coverage["summary"]
    assert s["backward_passing"] >= FLOOR_BACKWARD, (
        f"{s['backward_passing']} OpInfo ops pass backward, floor is {FLOOR_BACKWARD}; "
        f"failing: {sorted(k for k, r in coverage['ops'].items() if r['bwd'] == 'fail')}")
