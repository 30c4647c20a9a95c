"""Elementwise ops on the parts of a float (copysign, signbit, frexp, nextafter), heaviside,
hypot and floor division against CPU, bit-exact where CPU's result is exact, in every float
dtype, with signed zeros, infinities and NaN."""
import pytest
import torch

from utils import check

A = torch.tensor([1.5, -2.0, 0.0, -0.0, float("inf"), -float("inf"), float("nan"), 3.0, 7.5, -7.5, 1e30, 5.0, -5.0,
                  0.1, -1e-3])
B = torch.tensor([-1.0, 2.0, -0.0, 1.0, 3.0, float("nan"), 1.0, 3.0, -2.0, 2.0, 1e-30, 0.0, 0.0, 0.3, 7.0])
# Subnormal inputs are left out: XLA's CPU backend flushes them to zero in float arithmetic
# (the bit-level ops below handle them; floor division and hypot cannot).
SUBNORMAL = torch.tensor([1e-40, -3e-42, 1.4e-45])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_float_ops(mode, dtype):
    a, b = A.to(dtype), B.to(dtype)
    check(lambda a, b: (torch.copysign(a, b), torch.copysign(a, -0.0), torch.signbit(a), torch.frexp(a),
                        torch.nextafter(a, b), torch.heaviside(a, b), torch.floor_divide(a, b),
                        torch.div(a, b, rounding_mode="floor")), a, b, rtol=0, atol=0)
    check(torch.hypot, a, b, rtol=1e-6 if dtype in (torch.float32, torch.float64) else 1e-2)


def test_bit_ops_see_subnormals(mode):
    x = torch.cat([SUBNORMAL, -SUBNORMAL])
    check(lambda x: (torch.frexp(x), torch.nextafter(x, torch.zeros_like(x)), torch.nextafter(torch.zeros_like(x), x),
                     torch.signbit(x), torch.heaviside(x, torch.full_like(x, 0.5))), x, rtol=0, atol=0)


def test_integer_floor_division_and_signbit(mode):
    i, j = torch.tensor([7, -7, 0, 5, -5, -9]), torch.tensor([2, 2, 3, -3, -3, 4])
    check(lambda i, j: (torch.floor_divide(i, j), torch.floor_divide(i, 3), torch.signbit(i),
                        torch.heaviside(i, j)), i, j)


def test_gradients(mode):
    a = torch.tensor([1.5, -2.0, 0.3, 4.0], requires_grad=True)
    b = torch.tensor([-1.0, 2.0, 0.5, -3.0], requires_grad=True)
    check(lambda a, b: (torch.copysign(a, b), torch.hypot(a, b), torch.frexp(a)[0]), a, b, grad=True)
