"""Conformance against PyTorch's own OpInfo database: every OpInfo's float32 sample inputs
on tpu against CPU (tools/op_coverage.py; ops run in worker subprocesses, so a crashing op
is reported instead of killing pytest).

Samples are seeded and tolerances are PyTorch's own per op (see tools/op_coverage.py), so a
run is repeatable on one machine. The floor is a set, tests/opinfo_floor.txt: each OpInfo op
with the least status it must keep forward and backward (pass without fallback, pass with
fallback). The test fails naming every entry that no longer holds, and warns listing the
entries that pass better than held; the file's header gives the command that raises them
(one full run). Near misses (passing with an error above half the allowed one, which another
machine's rounding can flip: XLA's CPU code follows the host's vector units, addbmm once
differed by 1.5e-5) are held at "-".
"""
import os
import warnings

import pytest

from utils import load_tool

SAMPLES = 2
TIMEOUT_S = 60.0


@pytest.fixture(scope="module")
def coverage():
    harness = load_tool("op_coverage")
    jobs = int(os.environ.get("TORCHTPU_OPINFO_JOBS", "1"))
    data = harness.run(samples=SAMPLES, backward=True, timeout=TIMEOUT_S, jobs=jobs, mode="fused",
                       log=lambda message: None)
    s = data["summary"]
    print(f"\nopinfo: {s['ops_total']} ops, forward_passing={s['forward_passing']}, "
          f"forward_passing_no_fallback={s['forward_passing_no_fallback']}, fail={s['forward']['fail']}, "
          f"backward_passing={s['backward_passing']}, crashes={s['crashes']}, timeouts={s['timeouts']}, "
          f"near misses fwd={s['near_misses_fwd']} bwd={s['near_misses_bwd']}, {data['meta']['runtime_s']}s")
    return data


def test_opinfo_no_crashes(coverage):
    s = coverage["summary"]
    details = {k: coverage["ops"][k]["reason"] for k in s["crashes"]}
    assert not s["crashes"], f"OpInfo ops crashed the process: {details}"


def test_opinfo_no_timeouts(coverage):
    s = coverage["summary"]
    assert not s["timeouts"], f"OpInfo ops timed out (> {TIMEOUT_S}s): {s['timeouts']}"


def pinned_torch() -> str:
    """The torch release CI tests and the floor was measured with (constraints.txt)."""
    with open(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "constraints.txt")) as f:
        return next(line.split("==")[1].strip() for line in f if line.startswith("torch=="))


def test_opinfo_passing_set_holds(coverage):
    import torch

    harness = load_tool("op_coverage")
    lost, gained = harness.compare_floor(harness.read_floor(), coverage)
    # On another torch (make test with tools/constraints-torch-newest.txt) the OpInfo database
    # itself may lack an entry (torch 2.15 dropped cholesky and qr, the deprecated forms of
    # linalg.cholesky and linalg.qr): warned, not lost. On the pinned torch every entry must be there.
    absent = [entry for entry in lost if entry.endswith("not in this torch's OpInfo database")]
    if absent and torch.__version__.split("+")[0] != pinned_torch():
        warnings.warn(f"{len(absent)} entries of tests/opinfo_floor.txt are not in torch {torch.__version__}'s "
                      "OpInfo database:\n  " + "\n  ".join(absent))
        lost = [entry for entry in lost if entry not in absent]
    if gained:
        warnings.warn(f"{len(gained)} OpInfo entries pass better than tests/opinfo_floor.txt holds; raise them with "
                      f"`{harness.FLOOR_COMMAND}`:\n  " + "\n  ".join(gained))
    assert not lost, f"{len(lost)} OpInfo entries of tests/opinfo_floor.txt no longer hold:\n  " + "\n  ".join(lost)


# ---------------------------------------------------------------------------------------
# The harness itself (in this process; no tpu op runs).


@pytest.fixture(scope="module")
def op_db_by_name():
    harness = load_tool("op_coverage")
    harness._stub_expecttest()
    from torch.testing._internal.common_methods_invocations import op_db

    return harness, {harness.op_key(op): op for op in op_db}


def test_opinfo_samples_do_not_depend_on_what_ran_before(op_db_by_name):
    import random

    import numpy as np
    import torch

    harness, ops = op_db_by_name
    op = ops["nn.functional.huber_loss"]  # its samples draw `delta` from Python's random
    first = harness.seeded_samples(op, torch.float32, False, 2)
    random.random(), np.random.rand(), torch.rand(3)  # what an earlier op would leave behind
    again = harness.seeded_samples(op, torch.float32, False, 2)
    for a, b in zip(first, again):
        assert a.kwargs == b.kwargs and torch.equal(a.input, b.input) and torch.equal(a.args[0], b.args[0])


def test_opinfo_tolerances_are_pytorchs_own(op_db_by_name):
    import torch

    harness, ops = op_db_by_name
    # addbmm: TestCommon's test_numpy_refs (1.3e-5, 1.3e-5) and test_out (1.5e-5, 1e-5); not
    # MPS's test_numpy_ref_mps (1.3e-4).
    atol, rtol, where = harness.tolerance(ops["addbmm"], torch.float32)
    assert (atol, rtol) == (1.5e-5, 1.3e-5) and "test_out" in where and "mps" not in where
    # matmul: its ROCm-only overrides are inactive here.
    assert harness.tolerance(ops["matmul"], torch.float32)[:2] == (1e-5, 1e-5)
    assert harness.tolerance(ops["baddbmm"], torch.float32) == (0.0, 0.0, "")  # complex64 only
    assert harness.tolerance(ops["sum"], torch.float32) == (0.0, 0.0, "")


def test_closeness():
    import torch

    harness = load_tool("op_coverage")
    e = torch.tensor([1.0, -2.0, float("nan"), float("inf")], dtype=torch.float64)
    assert harness.closeness(e.clone(), e, 1e-5, 1e-5) == 0.0
    a = e + torch.tensor([1e-5, 0.0, 0.0, 0.0], dtype=torch.float64)
    assert abs(harness.closeness(a, e, 1e-5, 1e-5) - 1e-5 / (1e-5 + 1e-5)) < 1e-6


def test_the_floor_names_what_stopped_passing_and_what_passes_better(tmp_path):
    harness = load_tool("op_coverage")
    run = {"meta": {"dtype": "float32"}, "ops": {
        "abs": {"fwd": "pass", "bwd": "pass", "closeness_fwd": 0.1, "closeness_bwd": 0.2},
        "sin": {"fwd": "fallback", "bwd": "fail", "fallback_fwd": {"aten::sin": 2}, "bwd_reason": "mismatch"},
        "cos": {"fwd": "pass", "bwd": "n/a", "closeness_fwd": 0.9},  # a near miss: held at "-"
        "tan": {"fwd": "pass", "bwd": "pass"},
    }}
    path = tmp_path / "floor.txt"
    path.write_text("abs float32 pass -\nsin float32 pass pass\nexp float32 pass pass  # gone\n")
    lost, gained = harness.compare_floor(harness.read_floor(str(path)), run)
    assert lost == ["sin (float32) fwd: held pass, now fallback: fell back: aten::sin",
                    "sin (float32) bwd: held pass, now fail: mismatch",
                    "exp (float32): not in this torch's OpInfo database"]
    assert gained == ["abs (float32) bwd: held -, now pass", "tan (float32) fwd: held -, now pass",
                      "tan (float32) bwd: held -, now pass"]
    harness.update_floor(run, str(path))  # raises, never lowers; keeps what the run lacks
    held = harness.read_floor(str(path))
    assert {key: value[:2] for key, value in held.items()} == {
        ("abs", "float32"): ("pass", "pass"), ("sin", "float32"): ("pass", "pass"),
        ("exp", "float32"): ("pass", "pass"), ("tan", "float32"): ("pass", "pass"),
        ("cos", "float32"): ("-", "-")}  # kept with its comment: a near miss
    assert "near miss" in held[("cos", "float32")][2]
    assert harness.compare_floor(held, run)[1] == []


def test_the_floor_file_is_what_the_tool_writes():
    # Sorted, every line parsed, nothing held twice: a hand edit that breaks the format fails here.
    harness = load_tool("op_coverage")
    held = harness.read_floor()
    with open(harness.FLOOR_PATH) as f:
        lines = [line.partition("#")[0].split() for line in f if line.partition("#")[0].strip()]
    assert len(lines) == len(held) and [line[:2] for line in lines] == sorted(line[:2] for line in lines)
    assert all(fwd in harness.FLOOR_LEVELS and bwd in harness.FLOOR_LEVELS for fwd, bwd, _ in held.values())
