"""torchtpu.explain(fn, *args) and TORCHTPU_EXPLAIN: the route each op takes through the tpu
kernels, as the routing code reports it (csrc/device/explain.h): lowered by which rule, a view
functionalization copied, a value shared, a data-dependent shape, declined by its lowering
(then CPU's error, or a counted fallback), the CPU fallback of an op without a lowering, the
device's own kernels, the JAX linear algebra kernels, views and in-place ops below
functionalization."""
import os
import warnings

import pytest
import torch

import torchtpu
from utils import run_python


def routes(explanation, op):
    return [(r.route, r.detail) for r in explanation.of(op)]


@pytest.fixture
def fallback_policy():
    def set_policy(policy):
        torchtpu._C.set_fallback_policy(policy)

    yield set_policy
    torchtpu._C.set_fallback_policy(os.environ.get("TORCHTPU_FALLBACK", "warn"))


def test_nothing_listens_by_default():
    assert not torchtpu._C.explaining()
    torchtpu.explain(lambda: torch.ones(2, device="tpu") + 1)
    assert not torchtpu._C.explaining()  # explain() stops listening when it returns


def test_lowered_ops_name_their_rule_and_views_name_what_functionalization_copied(mode):
    x = torch.arange(16.0).to("tpu")
    ex = torchtpu.explain(lambda x: (x.view(4, 4) + 1).clone().sum(), x)
    assert ex.error is None and ex.result.item() == sum(range(1, 17))
    assert routes(ex, "aten::add.Tensor") == [
        ("lowered", "rule lower_add_sub, csrc/lowering/elementwise.cpp, param Hlo::Add")]
    assert routes(ex, "aten::view_copy") == [
        ("lowered", "rule lower_reshape, csrc/lowering/shape.cpp; functionalization's copy of the view aten::view")]
    assert routes(ex, "aten::clone") == [("lowered: shares its input's value (no node)",
                                          "rule lower_identity, csrc/lowering/elementwise.cpp")]
    assert routes(ex, "aten::_local_scalar_dense") == []  # .item() ran after explain() returned
    (add,) = ex.of("aten::add")
    assert add.count == 1 and str(add).startswith("aten::add.Tensor: lowered (rule lower_add_sub")


def test_counts_calls_per_route():
    x = torch.ones(3, device="tpu")
    ex = torchtpu.explain(lambda: [x * 2 for _ in range(5)])
    (mul,) = ex.of("aten::mul")
    assert mul.op == "aten::mul.Tensor" and mul.count == 5 and str(mul).endswith(" x5")


def test_data_dependent_shapes_own_kernels_and_jax_kernels():
    x = torch.tensor([0.0, 1.0, 0.0, 2.0]).to("tpu")
    ex = torchtpu.explain(lambda: (x.nonzero(), x.to(torch.float64), x.sum().item(),
                                   torch.linalg.qr(torch.eye(3, device="tpu"))))
    assert routes(ex, "aten::nonzero") == [
        ("data-dependent shape", "the size is read on the host, then the op is lowered at it")]
    assert routes(ex, "aten::_to_copy") == [("own kernel", "csrc/device/copy.cpp: .to(device or dtype) (tpu_copy)")]
    assert routes(ex, "aten::_local_scalar_dense") == [
        ("own kernel", "csrc/device/copy.cpp: .item() reads the value on the host")]
    assert routes(ex, "aten::linalg_qr") == [("JAX kernel", "torchtpu/_linalg.py: jax.lax.linalg, inlined as "
                                                            "StableHLO (torchtpu::call_stablehlo)")]


def test_a_declined_call_says_why_and_that_cpu_raised_its_error():
    bools = torch.ones(2, 2, dtype=torch.bool, device="tpu")
    ex = torchtpu.explain(lambda: bools @ bools)
    assert isinstance(ex.error, RuntimeError) and "not implemented for 'Bool'" in str(ex.error)
    assert routes(ex, "aten::mm") == [("declined: a result dtype CPU's kernel refuses (LoweringRule::refuses)",
                                       "CPU's kernel raised its error; nothing fell back")]
    assert str(ex).endswith(f"raised NotImplementedError: {ex.error}")
    half = torch.eye(3, dtype=torch.float16, device="tpu")
    ex = torchtpu.explain(torch.linalg.cholesky, half)
    assert routes(ex, "aten::linalg_cholesky_ex") == [("declined: linear algebra takes float32 and float64 only",
                                                       "CPU's kernel raised its error; nothing fell back")]


@pytest.mark.parametrize("policy", ["warn", "error"])
def test_a_declined_call_cpu_computes_is_a_counted_fallback(fallback_policy, policy):
    fallback_policy(policy)
    c = torch.view_as_complex(torch.arange(8.0).view(4, 2)).to("tpu")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ex = torchtpu.explain(torch.take, c, torch.tensor([0, 2], device="tpu"))
        qr = torchtpu.explain(torch.linalg.qr, c.view(2, 2))
    outcome = {"warn": "CPU's kernel computes it: a CPU fallback, counted",
               "error": "CPU's kernel computes it: refused (TORCHTPU_FALLBACK=error)"}[policy]
    assert routes(ex, "aten::take") == [("declined: a complex value its rule does not take", outcome)]
    assert routes(qr, "aten::linalg_qr") == [("declined: the JAX kernel takes real float matrices only", outcome)]
    assert (ex.error is None) == (policy == "warn")


@pytest.mark.parametrize("policy", ["warn", "error"])
def test_an_op_without_a_lowering_runs_on_cpu(fallback_policy, policy):
    fallback_policy(policy)
    a = torch.tensor([1.0, 2.0]).to("tpu")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ex = torchtpu.explain(torch.igamma, a, a)
    route = {"warn": "no lowering: CPU fallback", "error": "no lowering: refused (TORCHTPU_FALLBACK=error)"}[policy]
    assert routes(ex, "aten::igamma.out") == [(route, "counted in metrics fallback_ops")]
    assert (ex.error is None) == (policy == "warn")


def test_composite_kernels_below_functionalization():
    # rot90 and diag_embed view and fill fresh tensors below functionalization.
    x = torch.arange(4.0).to("tpu")
    ex = torchtpu.explain(lambda: (torch.rot90(x.view(2, 2)), torch.diag_embed(x)))
    assert torch.equal(ex.result[1].cpu(), torch.diag_embed(torch.arange(4.0)))
    assert ("view below functionalization", "a composite kernel's view of an inner tensor: gathered from its root "
            "when read, scattered into it when written") in routes(ex, "aten::as_strided")
    assert routes(ex, "aten::zero_") == [("in-place or out= below functionalization",
                                         "its functional op runs, then the value is swapped in")]


def test_the_setting_prints_each_route_of_the_named_ops_once():
    result = run_python("""
        import torch, torchtpu
        x = torch.ones(3, device="tpu")
        for _ in range(3):
            y = (x + 1) * 2
        torch.view_as_complex(torch.ones(2, 2)).to("tpu").sum()  # another route of another overload
        torch.take(torch.view_as_complex(torch.ones(2, 2)).to("tpu"), torch.tensor([0], device="tpu"))
        print("EXPLAINING", torchtpu._C.explaining())
    """, timeout=300, TORCHTPU_EXPLAIN="aten::add.Tensor, aten::take", TORCHTPU_FALLBACK="silent")
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [line for line in result.stderr.splitlines() if line.startswith("torchtpu explain:")]
    assert lines == [
        'torchtpu explain: aten::add.Tensor: lowered (rule lower_add_sub, csrc/lowering/elementwise.cpp, '
        "param Hlo::Add)",
        "torchtpu explain: aten::take: declined: a complex value its rule does not take (CPU's kernel computes "
        "it: a CPU fallback, counted)"]
    assert "EXPLAINING True" in result.stdout
