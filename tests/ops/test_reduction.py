"""Reductions on tpu vs CPU: forward, gradients, dtypes, keepdim, edge cases."""
import re

import pytest
import torch

from test_elementwise import BF16, NAN, rand
from utils import check, run_cases

# name -> fn of one f32 (3, 4) input; checked with gradients in every mode.
REDUCE = {
    "sum": torch.sum, "sum_dim": lambda x: x.sum(1, keepdim=True), "mean": torch.mean,
    "mean_dims": lambda x: x.mean((0, 1)), "mean_f64": lambda x: x.mean(0, dtype=torch.float64),
    "prod": torch.prod, "prod_dim": lambda x: x.prod(1, keepdim=True),
    "var": lambda x: x.var(1), "var_c0": lambda x: torch.var(x, 0, correction=0, keepdim=True),
    "std": torch.std, "var_mean": lambda x: torch.var_mean(x, 1), "std_mean": lambda x: torch.std_mean(x, 0, correction=2),
    "max": torch.max, "min": torch.min, "max_dim": lambda x: x.max(1), "min_dim": lambda x: x.min(0, keepdim=True),
    "amax": lambda x: x.amax(1), "amin": lambda x: x.amin((0, 1), keepdim=True),
    "logsumexp": lambda x: x.logsumexp(1), "logsumexp_kd": lambda x: x.logsumexp((0, 1), keepdim=True),
    "norm2": torch.linalg.vector_norm, "norm1": lambda x: torch.linalg.vector_norm(x, 1, dim=1),
    "norm_inf": lambda x: torch.linalg.vector_norm(x, float("inf")), "norm_ninf": lambda x: torch.linalg.vector_norm(x, -float("inf"), 0),
    "norm0": lambda x: torch.linalg.vector_norm(x, 0), "norm3": lambda x: torch.linalg.vector_norm(x, 3, dim=1, keepdim=True),
    "norm": lambda x: x.norm(dim=1), "cumsum": lambda x: x.cumsum(1), "cumsum0": lambda x: x.cumsum(0),
    "cumprod": lambda x: x.cumprod(1),
    "aten_norm": lambda x: torch.ops.aten.norm.Scalar(x, 3),
    "aten_norm_dim": lambda x: torch.ops.aten.norm.ScalarOpt_dim(x, 1.5, [1], True),
    "aten_norm_none": lambda x: torch.ops.aten.norm.ScalarOpt_dim(x, None, [0]),
    "aten_norm_dtype": lambda x: torch.ops.aten.norm.ScalarOpt_dim_dtype(x, 2, [1], False, dtype=torch.float64),
    "aten_norm_all_dtype": lambda x: torch.ops.aten.norm.ScalarOpt_dtype(x, float("inf"), dtype=torch.float64),
}
# Backward of these uses ops owned elsewhere (masked_fill, scatter, flip, gather, as_strided).
ALLOW = {"aten::masked_fill_.Scalar", "aten::scatter.src_out", "aten::scatter.value_out", "aten::flip",
         "aten::gather.out", "aten::as_strided"}


@pytest.mark.parametrize("chunk", range(3))
def test_reduce_grad(mode, chunk):
    names = sorted(REDUCE)[chunk::3]
    run_cases([(n, REDUCE[n], [rand(3, 4, grad=True)], None) for n in names], grad=True, allow=ALLOW)


@pytest.mark.modes("fused")
def test_reduce_dtypes():
    cases = []
    for n, fn in REDUCE.items():
        cases += [(n + "/f64", fn, [rand(2, 5, dtype=torch.float64)], dict(rtol=1e-7, atol=1e-7)),
                  (n + "/bf16", fn, [rand(2, 5, dtype=torch.bfloat16)], BF16)]
        if n not in ("logsumexp_kd", "amin", "mean_dims"):
            cases.append((n + "/nan", fn, [torch.tensor([[1.0, NAN, 2.0], [3.0, 0.5, -1.0]])], None))
    run_cases(cases)


@pytest.mark.modes("fused")
def test_integer_and_bool_reductions():
    i = torch.tensor([[3, -1, 4, 1], [-5, 9, 2, 6], [5, 3, 5, 9]])
    b = i > 2
    cases = [("sum_i", torch.sum, [i], None), ("sum_b", torch.sum, [b], None), ("sum_i32", lambda t: t.sum(0), [i.int()], None),
             ("sum_u8", lambda t: t.sum(1), [i.abs().to(torch.uint8)], None),
             ("sum_dtype", lambda t: t.sum(1, dtype=torch.float32), [i], None),
             ("prod_i", lambda t: t.prod(1), [i], None), ("prod_b", torch.prod, [b], None),
             ("max_i", torch.max, [i], None), ("min_dim_i", lambda t: t.min(1), [i], None),
             ("max_dim_b", lambda t: t.max(0), [b], None), ("amax_i8", lambda t: t.amax(0), [i.to(torch.int8)], None),
             ("argmax_ties", lambda t: t.argmax(1), [i], None), ("argmin_ties", lambda t: t.argmin(0), [i], None),
             ("argmax_flat", torch.argmax, [i], None), ("argmin_kd", lambda t: t.argmin(1, keepdim=True), [i], None),
             ("argmax_none_kd", lambda t: t.argmax(keepdim=True), [i], None),
             ("any", torch.any, [i], None), ("all", torch.all, [b], None), ("any_dim", lambda t: t.any(1), [b], None),
             ("all_dim_kd", lambda t: t.all(0, keepdim=True), [i], None), ("any_dims", lambda t: t.any((0, 1)), [b], None),
             ("all_u8", lambda t: t.all(1), [i.abs().to(torch.uint8)], None), ("any_f", torch.any, [torch.tensor([0.0, NAN])], None),
             ("cumsum_i", lambda t: t.cumsum(1), [i], None), ("cumsum_b", lambda t: t.cumsum(0), [b], None),
             ("cumprod_i", lambda t: t.cumprod(1), [i], None), ("cumsum_dtype", lambda t: t.cumsum(1, dtype=torch.float64), [i], None),
             ("cumsum_i32", lambda t: t.cumsum(0), [i.int()], None)]
    run_cases(cases)


@pytest.mark.modes("fused")
def test_reduction_edge_cases():
    z = torch.tensor(2.5)
    e = torch.empty(0, 3)
    ties = torch.tensor([[1.0, 3.0, 3.0, NAN, NAN], [2.0, 2.0, -1.0, -1.0, 0.0]])
    cases = [("sum_0d", torch.sum, [z], None), ("mean_0d", lambda t: t.mean(0), [z], None),
             ("max_0d", torch.max, [z], None), ("max_dim_0d", lambda t: t.max(0), [z], None),
             ("argmax_0d", torch.argmax, [z], None), ("cumsum_0d", lambda t: t.cumsum(0), [z], None),
             ("prod_0d", torch.prod, [z], None), ("logsumexp_0d", lambda t: t.logsumexp(0), [z], None),
             ("sum_empty", lambda t: t.sum(0), [e], None), ("prod_empty", lambda t: t.prod(0), [e], None),
             ("mean_empty_dim1", lambda t: t.mean(1), [e], None), ("amax_empty_dim1", lambda t: t.amax(1), [e], None),
             ("any_empty", torch.any, [e], None), ("all_empty", torch.all, [e], None),
             ("cumsum_empty", lambda t: t.cumsum(0), [e], None), ("norm_empty", torch.linalg.vector_norm, [e], None),
             ("var_single", lambda t: t.var(0), [torch.tensor([[1.0, 2.0]])], None),
             ("max_dim_ties", lambda t: t.max(1), [ties], None), ("min_dim_ties", lambda t: t.min(1), [ties], None),
             ("argmax_ties", lambda t: t.argmax(1), [ties], None), ("argmin_ties", lambda t: t.argmin(1), [ties], None),
             ("logsumexp_inf", lambda t: t.logsumexp(1),
              [torch.tensor([[-float("inf"), -float("inf")], [float("inf"), 1.0]])], None),
             ("norm_inf_nan", lambda t: torch.linalg.vector_norm(t, float("inf"), 1), [ties], None),
             ("cumsum_long", lambda t: t.cumsum(0), [rand(300, dtype=torch.float64)], dict(rtol=1e-9, atol=1e-9))]
    run_cases(cases)


def test_amax_amin_backward_nan_and_ties(mode):
    # CPU's rule: the gradient split evenly among the elements equal to the result, so a slice
    # whose result is NaN (no element equals it) gets NaN everywhere (grad / 0 * 0).
    x = torch.tensor([[1.0, 3.0, 3.0, 0.0], [NAN, 2.0, NAN, 2.0], [-1.0, -1.0, -1.0, 5.0]], requires_grad=True)
    for fn in (lambda t: t.amax(1), lambda t: t.amin(1), lambda t: t.amax(0, keepdim=True), lambda t: t.amin(),
               lambda t: t[2:].amax(), lambda t: t.amax((0, 1))):
        check(fn, x, grad=True)


def test_empty_reductions_raise_as_on_cpu(mode):
    # The meta kernels of max/min and median/nanmedian(dim) accept a reduction over no
    # elements; CPU's kernels raise, and so does tpu (the call runs on CPU). Empty results
    # that CPU computes (a reduced dim of size 3 in a (3, 0) tensor) still come back.
    e = torch.empty(3, 0)
    calls = [torch.max, torch.min, lambda t: t.max(1), lambda t: t.min(-1, keepdim=True),
             lambda t: t.median(1), lambda t: t.nanmedian(1), lambda t: t[0].max(0)]
    for fn in calls:
        with pytest.raises((RuntimeError, IndexError)) as cpu_error:
            fn(e)
        with pytest.raises(cpu_error.type, match=re.escape(str(cpu_error.value))):
            fn(e.to("tpu"))
    for fn in (lambda t: t.max(0), lambda t: t.min(0, keepdim=True), lambda t: t.median(0), lambda t: t.nanmedian(0)):
        check(fn, e, no_fallback=False)
