"""Special functions (torch.special, digamma/polygamma, xlogy, sinc) against CPU on grids that
cross every branch of CPU's approximations, with special values (0, -0, poles, negative
integers, +-inf, NaN), in float32 and float64 and with gradients where PyTorch has them."""
import pytest
import torch

from utils import HALF_PRECISION, check

S = torch.special
# Branch points of the expansions: 2, 5, 8 (Bessel), +-2.09 and 8.32 (Airy), 0.5 (trigamma,
# spherical j0), negative (half-)integers (gamma family), 26 (erfcx).
GRID = torch.cat([torch.linspace(-30, 30, 121), torch.tensor([
    0.0, -0.0, 1e-6, -1e-6, 0.5, -0.5, 1.0, -1.0, 2.0, 2.09, -2.09, 5.0, 8.0, 8.3203353, 103.0, 110.0, 1e8,
    float("inf"), -float("inf"), float("nan")])])
POSITIVE = torch.cat([torch.linspace(0.05, 20, 60), torch.tensor([2.0, 5.0, 8.0, 1e-7])])
PROBABILITY = torch.cat([torch.linspace(0, 1, 41), torch.tensor([1e-30, 1e-12, 1 - 1e-7, -0.5, 1.5, float("nan")])])


def unary(*fns):
    return lambda x: tuple(f(x) for f in fns)


BESSEL = unary(torch.i0, S.i0e, S.i1, S.i1e, S.modified_bessel_i0, S.modified_bessel_i1, S.modified_bessel_k0,
               S.modified_bessel_k1, S.scaled_modified_bessel_k0, S.scaled_modified_bessel_k1, S.bessel_j0,
               S.bessel_j1, S.bessel_y0, S.bessel_y1, S.spherical_bessel_j0, S.airy_ai)
GAMMA = unary(torch.digamma, *[(lambda n: lambda x: torch.polygamma(n, x))(n) for n in range(5)])
MISC = unary(S.entr, torch.sinc, S.erfcx, S.log_ndtr)


def special_unary(dtype):
    x = GRID.to(dtype)
    check(BESSEL, x, rtol=1.3e-6 if dtype == torch.float32 else 1e-10, atol=1e-5)
    check(GAMMA, torch.cat([x, torch.tensor([-10.5, -3.5, -2.0, 1e-3], dtype=dtype)]), rtol=1.3e-6, atol=1e-5)
    check(MISC, x, rtol=1.3e-6, atol=1e-5)
    check(S.ndtri, PROBABILITY.to(dtype))


def test_special_unary(mode):
    special_unary(torch.float32)


@pytest.mark.modes("fused")  # the same lowerings in float64; the modes only cut graphs differently
def test_special_unary_float64(mode):
    special_unary(torch.float64)


def test_special_half_types(mode):
    # bfloat16/float16 compute in float and round once, as CPU does.
    for dtype in (torch.bfloat16, torch.float16):
        check(unary(S.i0e, S.i1, torch.digamma, S.entr, torch.sinc), torch.linspace(-6, 6, 25).to(dtype),
              **HALF_PRECISION)  # measured 0.39 of it (one step of the result dtype)


def test_special_gradients(mode):
    torch.manual_seed(0)
    x = (torch.rand(12) * 6 + 0.2).requires_grad_()
    check(unary(torch.digamma, lambda t: torch.polygamma(2, t), torch.i0, S.i0e, S.i1, S.i1e, S.entr, torch.sinc,
                S.erfcx, S.log_ndtr), x, grad=True)
    p = (torch.rand(10) * 0.9 + 0.05).requires_grad_()
    check(S.ndtri, p, grad=True)


def test_zeta_and_xlogy(mode):
    q = torch.tensor([0.5, 1.0, 2.5, 10.0, -1.5, -3.0, 0.0, 100.0, 1e-3, -10.5])
    for s in (1.0, 1.5, 2.0, 3.0, 0.5, 7.0):
        check(lambda q: S.zeta(torch.full_like(q, s), q), q, rtol=1.3e-6)
    check(lambda q: S.zeta(2.0, q), q, rtol=1.3e-6)
    a = torch.tensor([0.0, 0.0, 3.0, 0.0, 2.0, -1.0, 1.5], requires_grad=True)
    y = torch.tensor([0.0, 1.0, 2.0, float("nan"), -1.0, 0.5, 4.0])
    check(lambda a: (torch.xlogy(a, y.to(a.device)), S.xlog1py(a, y.to(a.device)), torch.xlogy(a, 2.0),
                     torch.xlogy(3.0, y.to(a.device).abs() + a * 0)), a, grad=True)


POLYNOMIALS = [S.chebyshev_polynomial_t, S.chebyshev_polynomial_u, S.chebyshev_polynomial_v,
               S.chebyshev_polynomial_w, S.shifted_chebyshev_polynomial_t, S.shifted_chebyshev_polynomial_u,
               S.shifted_chebyshev_polynomial_v, S.shifted_chebyshev_polynomial_w, S.hermite_polynomial_h,
               S.hermite_polynomial_he, S.laguerre_polynomial_l, S.legendre_polynomial_p]


def test_orthogonal_polynomials(mode):
    # No NaN x: CPU returns an uninitialized value for U, V, W there (its loop stops at once).
    xs = torch.cat([torch.linspace(-1.5, 1.5, 13), torch.tensor([0.0, 1.0, -1.0])])
    ns = torch.tensor([-1.0, 0, 1, 2, 3, 5, 7, 9, 12, 2.7, float("inf"), float("nan")])
    x, n = torch.meshgrid(xs, ns, indexing="ij")
    check(lambda x: tuple(f(x, n.to(x.device)) for f in POLYNOMIALS), x, rtol=1.3e-6)
    check(lambda x: tuple(f(x, 3) for f in POLYNOMIALS[:4]), xs)  # Scalar n
    check(lambda n: S.hermite_polynomial_h(0.5, n), torch.tensor([0.0, 5.0, 129.0, 200.0]))  # above CPU's limit: NaN
