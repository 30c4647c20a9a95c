"""Linear algebra on tpu (issue 17.3) against PyTorch on CPU, forward and backward, in every
mode: Cholesky and triangular solves (StableHLO ops), LU / QR / eigh / SVD / solve / inv /
det / slogdet / lstsq / pinv / matrix_exp and the Householder family (JAX's linalg lowerings,
inlined). Nothing may fall back to CPU (utils.check asserts it). Errors (`info`,
LinAlgError, unsupported dtypes) match CPU's.

Inputs are float64 unless a test says otherwise: both sides then agree to ~1e-12, and the
tolerances below (1e-8) sit far above that while still catching any wrong formula.
Eigenvectors and singular vectors are compared through gauge-invariant quantities (|U|,
U @ Vh, V diag(w) V^T), as PyTorch's OpInfo tests do: their signs are the library's choice."""
import pytest
import torch

import torchtpu
from utils import assert_close, check

TOL = dict(rtol=1e-8, atol=1e-8)


def gen(seed):
    return torch.Generator().manual_seed(seed)


def matrix(*shape, seed=0, grad=True, dtype=torch.float64):
    """A well-conditioned matrix (random plus a multiple of the identity)."""
    a = torch.randn(*shape, generator=gen(seed), dtype=dtype)
    n = min(shape[-2:])
    a[..., :n, :n] += 2 * torch.eye(n, dtype=dtype)
    return a.requires_grad_(grad)


def spd(*shape, seed=0, grad=True):
    a = torch.randn(*shape, generator=gen(seed), dtype=torch.float64)
    return (a @ a.mT + shape[-1] * torch.eye(shape[-1], dtype=torch.float64)).requires_grad_(grad)


def symmetric(fn):
    """fn of a symmetrized input, so gradients stay symmetric as PyTorch's formulas assume."""
    return lambda a, *rest: fn((a + a.mT) / 2, *rest)


# ---- StableHLO ops: Cholesky, triangular solves ------------------------------------------


def test_cholesky_family(mode):
    check(symmetric(torch.linalg.cholesky), spd(2, 4, 4), grad=True, **TOL)
    check(symmetric(lambda a: torch.linalg.cholesky(a, upper=True)), spd(4, 4, seed=1), grad=True, **TOL)
    check(symmetric(lambda a: torch.linalg.cholesky_ex(a)), spd(3, 3, seed=2), grad=True, **TOL)
    check(lambda a, b: torch.cholesky_solve(b, torch.linalg.cholesky(a)), spd(2, 3, 3, seed=3, grad=False),
          matrix(3, 2, seed=4), grad=True, **TOL)
    check(lambda a: torch.cholesky_inverse(torch.linalg.cholesky(a), upper=False), spd(3, 3, seed=5, grad=False),
          **TOL)


def test_triangular_solves(mode):
    a, b = matrix(2, 4, 4, seed=6), matrix(4, 3, seed=7)  # B broadcast over A's batch
    check(lambda a, b: torch.linalg.solve_triangular(a.triu(), b, upper=True), a, b, grad=True, **TOL)
    check(lambda a, b: torch.linalg.solve_triangular(a.tril(), b.mT, upper=False, left=False, unitriangular=True),
          a, b, grad=True, **TOL)
    check(lambda a, b: torch.triangular_solve(b, a.triu(), transpose=True), a, b, grad=True, **TOL)


def test_cholesky_info_and_errors_match_cpu(mode):
    not_pd = torch.eye(4, dtype=torch.float64)
    not_pd[2, 2] = -1.0  # the leading minor of order 3 is the first that is not positive definite
    batch = torch.stack([torch.eye(4, dtype=torch.float64), not_pd])
    _, info = torch.linalg.cholesky_ex(batch.to("tpu"))
    assert info.cpu().tolist() == torch.linalg.cholesky_ex(batch).info.tolist() == [0, 3]
    with pytest.raises(torch.linalg.LinAlgError, match=r"\(Batch element 1\): The factorization could not be "
                                                       r"completed because the input is not positive-definite "
                                                       r"\(the leading minor of order 3 is not positive-definite\)"):
        torch.linalg.cholesky(batch.to("tpu"))
    with pytest.raises(torch.linalg.LinAlgError, match="leading minor of order 3"):
        torch.linalg.cholesky_ex(not_pd.to("tpu"), check_errors=True)


# ---- LU family ---------------------------------------------------------------------------


def test_lu_factor_unpack_solve(mode):
    check(lambda a: torch.linalg.lu_factor(a), matrix(2, 4, 4, seed=8), grad=True, **TOL)
    check(lambda a: torch.linalg.lu(a), matrix(5, 3, seed=9), grad=True, **TOL)
    check(lambda a: torch.lu_unpack(*torch.linalg.lu_factor(a)), matrix(3, 4, seed=10), grad=True, **TOL)
    for left, adjoint in ((True, False), (False, True)):
        check(lambda a, b: torch.linalg.lu_solve(*torch.linalg.lu_factor(a), b if left else b.mT, left=left,
                                                 adjoint=adjoint),
              matrix(2, 3, 3, seed=11), matrix(3, 2, seed=12), grad=True, **TOL)


def test_solve_inv_det_slogdet(mode):
    a = matrix(2, 3, 3, seed=13)
    check(torch.linalg.solve, a, matrix(2, 3, 4, seed=14), grad=True, **TOL)
    check(torch.linalg.solve, a, matrix(3, 1, seed=15)[:, 0], grad=True, **TOL)  # a vector right-hand side
    check(lambda a, b: torch.linalg.solve(a, b, left=False), a, matrix(4, 3, seed=16), grad=True, **TOL)
    check(torch.linalg.inv, a, grad=True, **TOL)
    check(torch.linalg.det, a, grad=True, **TOL)
    check(torch.linalg.slogdet, matrix(3, 3, seed=17), grad=True, **TOL)
    check(torch.logdet, spd(3, 3, seed=18), grad=True, **TOL)


def test_singular_inputs_give_cpu_info_and_errors(mode):
    singular = torch.tensor([[1.0, 2.0, 3.0], [2.0, 4.0, 6.0], [1.0, 0.0, 1.0]], dtype=torch.float64)
    expected = torch.linalg.lu_factor_ex(singular)
    assert_close(torch.linalg.lu_factor_ex(singular.to("tpu")), expected, **TOL)
    assert torch.linalg.inv_ex(singular.to("tpu")).info.item() == torch.linalg.inv_ex(singular).info.item() == 3
    assert torch.linalg.det(singular.to("tpu")).item() == 0.0
    sign, logabsdet = torch.linalg.slogdet(singular.to("tpu"))
    assert sign.item() == 0.0 and logabsdet.item() == float("-inf")
    message = r"linalg.inv: The diagonal element 3 is zero, the inversion could not be completed because the input matrix is singular."
    with pytest.raises(torch.linalg.LinAlgError, match=message):
        torch.linalg.inv(singular)
    with pytest.raises(torch.linalg.LinAlgError, match=message):
        torch.linalg.inv(singular.to("tpu"))
    with pytest.raises(torch.linalg.LinAlgError, match="singular"):
        torch.linalg.solve(singular.to("tpu"), torch.ones(3, dtype=torch.float64, device="tpu"))


# ---- QR, Householder products -------------------------------------------------------------


def test_qr_modes_and_householder(mode):
    a = matrix(2, 5, 3, seed=19)
    check(torch.linalg.qr, a, grad=True, **TOL)
    check(lambda a: torch.linalg.qr(a, mode="complete"), matrix(4, 3, seed=20, grad=False), **TOL)
    check(lambda a: torch.linalg.qr(a, mode="r"), a, **TOL)
    check(torch.geqrf, a.detach(), **TOL)
    check(lambda a, t: torch.linalg.householder_product(a, t), a, torch.rand(2, 3, generator=gen(21),
                                                                             dtype=torch.float64), grad=True, **TOL)
    check(lambda a, t, c: torch.ormqr(a, t, c, left=False, transpose=True), matrix(4, 3, seed=22, grad=False),
          torch.rand(3, generator=gen(23), dtype=torch.float64), matrix(2, 4, seed=24, grad=False), **TOL)


# ---- eigh, SVD and what is built on them -----------------------------------------------------


def eigh_invariants(a, uplo="L"):
    values, vectors = torch.linalg.eigh(a, UPLO=uplo)
    return values, vectors.abs(), vectors @ torch.diag_embed(values) @ vectors.mT


def svd_invariants(a, full_matrices=False):
    u, s, vh = torch.linalg.svd(a, full_matrices=full_matrices)
    k = s.shape[-1]
    return s, u[..., :k].abs(), vh[..., :k, :].abs(), u[..., :k] @ vh[..., :k, :]


def test_eigh_and_svd(mode):
    check(symmetric(eigh_invariants), spd(2, 4, 4, seed=25), grad=True, **TOL)
    check(lambda a: eigh_invariants(a, "U"), spd(3, 3, seed=26, grad=False), **TOL)  # reads the upper triangle
    check(symmetric(torch.linalg.eigvalsh), spd(4, 4, seed=27), grad=True, **TOL)
    check(svd_invariants, matrix(2, 5, 3, seed=28), grad=True, **TOL)
    check(lambda a: svd_invariants(a, full_matrices=True), matrix(3, 4, seed=29, grad=False), **TOL)
    check(torch.linalg.svdvals, matrix(4, 3, seed=30), grad=True, **TOL)


def test_pinv_lstsq_rank_cond_matrix_exp(mode):
    check(torch.linalg.pinv, matrix(4, 3, seed=31), grad=True, **TOL)
    check(lambda a: torch.linalg.pinv(a, hermitian=True), spd(3, 3, seed=32, grad=False), **TOL)
    check(lambda a, b: torch.linalg.lstsq(a, b), matrix(5, 3, seed=33), matrix(5, 2, seed=34), grad=True, **TOL)
    check(lambda a, b: torch.linalg.lstsq(a, b, driver="gelsd"), matrix(2, 5, 3, seed=35, grad=False),
          matrix(2, 5, 2, seed=36, grad=False), **TOL)
    check(torch.linalg.matrix_rank, matrix(4, 3, seed=37, grad=False))
    check(torch.linalg.cond, matrix(3, 3, seed=38), grad=True, **TOL)
    check(torch.linalg.matrix_exp, matrix(2, 3, 3, seed=39) / 4, grad=True, **TOL)


# ---- float32, dtypes, fusion, torch.compile --------------------------------------------------


def test_float32(mode):
    # float32 results differ from CPU's by rounding only (LAPACK on both sides here).
    a = matrix(3, 3, seed=40, dtype=torch.float32)
    check(torch.linalg.solve, a, matrix(3, 2, seed=41, dtype=torch.float32), grad=True, rtol=1e-5, atol=1e-5)
    check(lambda a: torch.linalg.cholesky(a @ a.mT), a, grad=True, rtol=1e-5, atol=1e-5)
    check(svd_invariants, a, grad=True, rtol=1e-5, atol=1e-5)


def test_empty_matrices_and_half_precision_matrix_exp(mode):
    for shape in ((0, 3, 3), (2, 0, 0)):
        check(lambda a: (torch.linalg.det(a), torch.linalg.inv(a), torch.linalg.svdvals(a), torch.linalg.qr(a).R),
              torch.randn(shape, dtype=torch.float64))
    # PyTorch's CPU kernel computes half-precision exponentials in half precision and
    # overflows (inf for entries of size ~1); tpu computes in float32 and rounds once.
    a = torch.randn(3, 3, generator=gen(46)) / 2
    for dtype in (torch.float16, torch.bfloat16):
        assert_close(torch.linalg.matrix_exp(a.to(dtype).to("tpu")), torch.linalg.matrix_exp(a.to(dtype).float()).to(dtype),
                     rtol=0, atol=0)


def test_dtypes_linear_algebra_does_not_take_raise_like_cpu():
    half = torch.eye(3, dtype=torch.float16)
    for fn in (torch.linalg.cholesky, torch.linalg.qr, torch.linalg.inv):
        with pytest.raises(RuntimeError) as cpu_error:
            fn(half)
        with pytest.raises(RuntimeError) as tpu_error:
            fn(half.to("tpu"))
        assert str(tpu_error.value).splitlines()[0] == str(cpu_error.value).splitlines()[0]
    with pytest.raises(RuntimeError, match="LU without pivoting is not implemented on tpu"):
        torch.linalg.lu_factor(torch.eye(3, device="tpu"), pivot=False)


def _fallbacks():
    return dict(torchtpu.metrics.counters()["fallback_ops"])


def test_a_dtype_cpu_refuses_raises_its_error_and_counts_no_fallback():
    before = _fallbacks()
    with pytest.raises(NotImplementedError, match="\"geqrf_cpu\" not implemented for 'Half'"):
        torch.linalg.qr(torch.eye(3, dtype=torch.float16, device="tpu"))
    assert _fallbacks() == before


@pytest.mark.parametrize("policy", ["warn", "error"])
def test_complex_matrices_run_on_cpu_through_the_counted_fallback(policy):
    # The JAX kernels take real floats; CPU's kernel computes complex ones. That trip goes
    # through the one CPU fallback path: counted, warned, refused under TORCHTPU_FALLBACK=error.
    import os

    a = torch.randn(3, 3, generator=gen(47), dtype=torch.complex64)
    before = _fallbacks()
    torchtpu._C.set_fallback_policy(policy)
    try:
        if policy == "error":
            with pytest.raises(NotImplementedError, match="op aten::linalg_qr has no tpu lowering and "
                                                          "TORCHTPU_FALLBACK=error"):
                torch.linalg.qr(a.to("tpu"))
            assert _fallbacks() == before
        else:
            q, r = torch.linalg.qr(a.to("tpu"))
            assert q.device.type == "tpu"
            assert_close(q, torch.linalg.qr(a).Q, rtol=0, atol=0)  # CPU's own kernel computed it
            assert _fallbacks().get("aten::linalg_qr", 0) == before.get("aten::linalg_qr", 0) + 1
    finally:
        torchtpu._C.set_fallback_policy(os.environ.get("TORCHTPU_FALLBACK", "warn"))


@pytest.mark.modes("fused")
def test_factorizations_join_the_fused_graph(mode):
    # The `_ex` forms leave `info` on the device (the checking forms read it on the host, as
    # on CUDA): a whole chain of factorizations is one executable.
    a = matrix(3, 3, seed=42, grad=False).to("tpu")
    b = matrix(3, 2, seed=43, grad=False).to("tpu")
    torchtpu.sync(wait=True)
    start = torchtpu.metrics.counters()["execute_count"]
    x = torch.linalg.solve_ex(a, b).result + torch.linalg.inv_ex(a).inverse @ b
    total = (x.sum() + torch.linalg.det(a) + torch.linalg.svdvals(a).sum()
             + torch.linalg.cholesky_ex(a @ a.mT).L.sum() + torch.linalg.qr(a).R.sum())
    value = total.item()
    assert torchtpu.metrics.counters()["execute_count"] - start == 1
    ac, bc = a.cpu(), b.cpu()
    expected = ((2 * torch.linalg.solve(ac, bc)).sum() + torch.linalg.det(ac) + torch.linalg.svdvals(ac).sum()
                + torch.linalg.cholesky(ac @ ac.mT).sum() + torch.linalg.qr(ac).R.sum())
    assert value == pytest.approx(expected.item(), rel=1e-10)


def test_linalg_under_torch_compile():
    def step(a, b):
        x = torch.linalg.solve(a, b)
        q, r = torch.linalg.qr(a)
        return (x.square().sum() + torch.linalg.cholesky(a @ a.mT).sum() + torch.linalg.svdvals(a).sum()
                + (q @ r).sum())

    a, b = matrix(3, 3, seed=44), matrix(3, 2, seed=45)
    expected = step(a, b)
    expected.backward()
    ta, tb = a.detach().to("tpu").requires_grad_(), b.detach().to("tpu").requires_grad_()
    compiled = torch.compile(step, backend="tpu", fullgraph=True)
    before = dict(torchtpu.metrics.counters()["fallback_ops"])
    out = compiled(ta, tb)
    out.backward()
    assert torchtpu.metrics.counters()["fallback_ops"] == before
    assert_close(out, expected, **TOL)
    assert_close([ta.grad, tb.grad], [a.grad, b.grad], **TOL)
