"""Conformance against PyTorch's ModuleInfo and OptimizerInfo databases: every nn module of
`module_db` (forward: outputs and buffers; backward: input and parameter gradients) and every
optimizer config of `optim_db` (with its foreach / fused / sparse implementations) on tpu
against CPU, fused mode (tools/module_coverage.py; entries run in worker subprocesses, so a
crash is reported instead of killing pytest).

Cost: SAMPLES sample inputs per module (module_db has ~1800 in all, too many for `make test`;
the tool's default runs every sample, and `--mode strict` the other mode). The floors are sets,
tests/module_floor.txt and tests/optim_floor.txt: each entry with the least status it must
keep. The test fails naming every entry that no longer holds and warns listing the entries
that pass better than held (raise them with the command in the files' headers).
"""
import os
import warnings

import pytest

from utils import ROOT, load_tool

SAMPLES = 3  # per module: the first three of module_inputs_func (see the docstring)
TIMEOUT_S = 120.0  # per entry; the slowest (nn.TransformerDecoderLayer, 3 samples) took 5 s on a loaded 2-core machine


@pytest.fixture(scope="module")
def coverage():
    harness = load_tool("module_coverage")
    results = harness.run(samples=SAMPLES, backward=True, timeout=TIMEOUT_S, mode="fused", log=lambda message: None)
    for kind, data in results.items():
        print("\n" + harness.describe(kind, data))
    return results


@pytest.mark.parametrize("kind", ["modules", "optims"])
def test_no_crashes_or_timeouts(coverage, kind):
    s = coverage[kind]["summary"]
    details = {k: coverage[kind]["ops"][k].get("reason") for k in s["crashes"] + s["timeouts"]}
    assert not s["crashes"] and not s["timeouts"], f"{kind} crashed or timed out (> {TIMEOUT_S}s): {details}"


@pytest.mark.parametrize("kind", ["modules", "optims"])
def test_passing_set_holds(coverage, kind):
    harness = load_tool("module_coverage")
    lost, gained = harness.compare_floor(kind, coverage[kind])
    path = os.path.relpath(harness.FLOOR_PATHS[kind], ROOT)
    if gained:
        warnings.warn(f"{len(gained)} {kind} entries pass better than {path} holds; raise them with "
                      f"`{harness.FLOOR_COMMAND}`:\n  " + "\n  ".join(gained))
    assert not lost, f"{len(lost)} entries of {path} no longer hold:\n  " + "\n  ".join(lost)


# ---------------------------------------------------------------------------------------
# The harness itself (in this process; no tpu op runs).


def test_every_optimizer_implementation_is_an_entry():
    harness = load_tool("module_coverage")
    harness.oc._stub_expecttest()
    from torch.testing._internal.common_optimizers import optim_db

    entries = harness.optim_entries(optim_db)
    configs = sum(len(info.optim_inputs_func(device="cpu")) for info in optim_db)
    assert sum(1 for key in entries if "." not in key) == configs  # every config, as given
    assert entries["Adam[0].fused"][2] == "fused" and entries["Adam[0].foreach"][2] == "foreach"
    assert entries["SGD[0].sparse"][2] == "sparse" and entries["SparseAdam[0]"][2] == "sparse"
    assert "Adadelta[0].fused" not in entries  # no fused Adadelta in PyTorch
    assert not any(key.startswith("LBFGS[0].") for key in entries)  # LBFGS has one implementation


def test_module_tolerances_are_pytorchs_own_or_1e5():
    import torch

    harness = load_tool("module_coverage")
    harness.oc._stub_expecttest()
    from torch.testing._internal.common_modules import module_db

    infos = {info.name: info for info in module_db}
    # nn.Bilinear: TestModule.test_forward grants 1e-4 on CPU; nn.Linear has no override.
    assert harness.oc.tolerance(infos["nn.Bilinear"], torch.float32, harness.MODULE_TOLERANCE_CLASSES)[:2] == (1e-4, 1e-4)
    assert harness.oc.tolerance(infos["nn.Linear"], torch.float32, harness.MODULE_TOLERANCE_CLASSES) == (0.0, 0.0, "")
    assert harness.DEFAULT_ATOL == harness.DEFAULT_RTOL == 1e-5


@pytest.mark.parametrize("kind", ["modules", "optims"])
def test_the_floor_file_is_what_the_tool_writes(kind):
    # Sorted, every line parsed, nothing held twice, every name still in PyTorch's database.
    harness = load_tool("module_coverage")
    path = harness.FLOOR_PATHS[kind]
    held = harness.oc.read_floor(path)
    with open(path) as f:
        lines = [line.partition("#")[0].split() for line in f if line.partition("#")[0].strip()]
    assert len(lines) == len(held) and [line[:2] for line in lines] == sorted(line[:2] for line in lines)
    assert all(fwd in harness.oc.FLOOR_LEVELS and bwd in harness.oc.FLOOR_LEVELS for fwd, bwd, _ in held.values())
    assert {name for name, _ in held} <= set(harness.list_keys(kind))
