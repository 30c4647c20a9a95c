"""Linear algebra on tpu through JAX's linalg lowerings (issue 17.3).

Each aten op here gets a tpu kernel that writes the op, with PyTorch's conventions, as a
small JAX function of `jax.lax.linalg` primitives. The function is lowered for torchtpu's
platform once per input signature (with JAX's 64-bit mode, so float64 and int32/int64
results keep PyTorch's types) and inlined into the graph like any op (torchtpu.jax_interop):
in fused mode a factorization joins the pending graph, no host trip.

What runs where is XLA's and JAX's choice per platform: LAPACK custom calls on CPU
(getrf, geqrf/orgqr, syevd, gesdd), cuSOLVER on GPU, XLA's own expanders on TPU. Cholesky
and triangular solves are StableHLO ops, lowered in C++ (csrc/lowering/linalg.cpp).

PyTorch's conventions kept here: LU pivots are 1-based int32 (LAPACK's), `info` outputs
follow LAPACK's (getrf: 1 + the first zero pivot), `check_errors=True` raises
torch.linalg.LinAlgError through PyTorch's own _linalg_check_errors, empty outputs for
parts not asked for (mode="r", compute_uv=False, ...), batch dimensions broadcast.
Inputs other than float32 / float64 go to PyTorch's CPU kernel through the one CPU fallback
path (`_C.cpu_kernel_decides`, csrc/device/cpu_fallback.cpp): its error for a dtype it refuses
(float16), a counted fallback under TORCHTPU_FALLBACK for one it computes (complex).
"""
from __future__ import annotations

import functools
import inspect
import threading

import torch

from torchtpu import _C, _lazy, jax_interop

# Imported at the first lowering: a plain model needs no jax.
jax = _lazy.module("jax")
jnp = _lazy.module("jax.numpy")

__all__ = ["install", "lowered_ops"]

_KERNELS: dict[str, object] = {}
_LOWERED: dict[tuple, jax_interop.Lowered] = {}
_LOCK = threading.Lock()
_LIBRARY = None


def kernel(name: str):
    """Registers the decorated function as the tpu kernel of aten::<name> (at install())."""

    def register(fn):
        _KERNELS[name] = fn
        return fn

    return register


def lowered_ops() -> list[str]:
    """The aten ops with a kernel here ("aten::linalg_qr", ...): torch.compile keeps them whole."""
    return sorted(f"aten::{name}" for name in _KERNELS)


def install():
    global _LIBRARY
    if _LIBRARY is not None:
        return
    library = torch.library.Library("aten", "IMPL")
    for name, fn in _KERNELS.items():
        check_signature(name, fn)
        library.impl(name, fn, "PrivateUse1")
    _LIBRARY = library


def check_signature(name: str, fn):
    """The kernel's parameters must be the schema's, defaults included: PyTorch leaves out
    arguments equal to their schema default when it calls a Python kernel."""
    schema = getattr(torch.ops.aten, name).default._schema
    expected = [(a.name, a.default_value if a.has_default_value() else inspect.Parameter.empty)
                for a in schema.arguments]
    actual = [(p.name, p.default) for p in inspect.signature(fn).parameters.values()]
    if actual != expected:
        raise RuntimeError(f"torchtpu: the tpu kernel of aten::{name} takes {actual}, but the op's schema "
                           f"in this torch is {schema}")


def _lax(name: str):
    """A jax.lax.linalg function; geqrf and ormqr are still private in some JAX releases."""
    public = getattr(jax.lax.linalg, name, None)
    if public is not None:
        return public
    from jax._src.lax import linalg as private

    return getattr(private, name)


def run(name: str, static: tuple, fn, *tensors: torch.Tensor) -> list[torch.Tensor]:
    """fn(*arrays) on tpu tensors: lowered once per (op, static arguments, input types)."""
    types = tuple((tuple(t.shape), t.dtype) for t in tensors)
    key = (name, static, types)
    with _LOCK:
        lowered = _LOWERED.get(key)
    if lowered is None:
        lowered = jax_interop.lower(f"aten_{name}", fn, types, x64=True)
        with _LOCK:
            _LOWERED[key] = lowered
    return _C.call_stablehlo(lowered.key, list(tensors))


_FLOATS = (torch.float32, torch.float64)
_TAKEN = _FLOATS + (torch.int32, torch.int64)  # int for pivots


def real_float_only(name: str, floats: tuple = _FLOATS):
    """Runs the kernel for matrices of `floats` (float32 / float64 unless the op takes more);
    other dtypes go to PyTorch's CPU kernel (_on_cpu), which raises its error for dtypes the
    op does not take and computes complex ones as a counted fallback."""

    def wrap(fn):
        @functools.wraps(fn)
        def checked(*args, **kwargs):
            tensors = [a for a in list(args) + list(kwargs.values()) if isinstance(a, torch.Tensor)]
            if all(t.dtype in floats + _TAKEN for t in tensors) and any(t.dtype in floats for t in tensors):
                if _C.explaining():
                    _C.explain_route(f"aten::{name}", "JAX kernel", "torchtpu/_linalg.py: jax.lax.linalg, inlined "
                                     "as StableHLO (torchtpu::call_stablehlo)")
                return fn(*args, **kwargs)
            return _on_cpu(name, args, kwargs)

        return checked

    return wrap


def _on_cpu(name, args, kwargs):
    """PyTorch's CPU kernel decides, through the one CPU fallback path (device/cpu_fallback.cpp):
    its error when it raises (no fallback), else a counted fallback under TORCHTPU_FALLBACK."""
    return _C.cpu_kernel_decides(f"aten::{name}", "", "the JAX kernel takes real float matrices only", *args,
                                 **kwargs)


def raise_errors(info: torch.Tensor, api: str, a: torch.Tensor):
    """check_errors=True: PyTorch's own check raises LinAlgError from info (read on the host)."""
    torch._linalg_check_errors(info, api, is_matrix=a.dim() == 2)


# ---------------------------------------------------------------------------------------
# JAX building blocks (all take and return jax arrays; batch dimensions lead).


def mT(x):
    return jnp.swapaxes(x, -1, -2)


def broadcast_batch(x, batch):
    return jnp.broadcast_to(x, tuple(batch) + x.shape[-2:])


def batch_shape(*xs):
    return jnp.broadcast_shapes(*[x.shape[:-2] for x in xs])


def lu_info(lu):
    """LAPACK getrf's info: 1 + the index of the first exactly-zero pivot of U, or 0."""
    diagonal = jnp.diagonal(lu, axis1=-2, axis2=-1)
    k = diagonal.shape[-1]
    index = jnp.arange(1, k + 1, dtype=jnp.int32)
    first = jnp.min(jnp.where(diagonal == 0, index, k + 1), axis=-1, initial=k + 1)
    return jnp.where(first == k + 1, 0, first).astype(jnp.int32)


def lu_factor(a):
    """(LU, 1-based int32 pivots, permutation) of a, LAPACK's getrf."""
    lu, pivots, permutation = jax.lax.linalg.lu(a)
    return lu, (pivots + 1).astype(jnp.int32), permutation


def permutation_matrix(permutation, dtype):
    """P with A = P L U for `permutation` (A[permutation] = L U): P[r, i] = permutation[i] == r."""
    m = permutation.shape[-1]
    return (permutation[..., None, :] == jnp.arange(m)[:, None]).astype(dtype)


def unpack_lu(lu):
    m, n = lu.shape[-2:]
    k = min(m, n)
    lower = jnp.tril(lu[..., :, :k], -1) + jnp.eye(m, k, dtype=lu.dtype)
    return lower, jnp.triu(lu[..., :k, :])


def pivots_to_permutation(pivots, m):
    return jax.lax.linalg.lu_pivots_to_permutation(pivots.astype(jnp.int32) - 1, m)


def take_rows(x, rows):
    """x[..., rows[i], :] for each batch element."""
    return jnp.take_along_axis(x, jnp.broadcast_to(rows[..., :, None], rows.shape + (x.shape[-1],)), axis=-2)


def lu_solve_left(lu, permutation, b, adjoint):
    """X with A X = B (or A^T X = B) for A = P L U given as (lu, permutation); batches equal."""
    triangular = functools.partial(jax.lax.linalg.triangular_solve, left_side=True)
    if not adjoint:
        y = take_rows(b, permutation)  # P^T B
        y = triangular(lu, y, lower=True, unit_diagonal=True)
        return triangular(lu, y, lower=False)
    y = triangular(lu, b, lower=False, transpose_a=True)
    y = triangular(lu, y, lower=True, unit_diagonal=True, transpose_a=True)
    return take_rows(y, jnp.argsort(permutation, axis=-1))  # P Y


def lu_solve(lu, permutation, b, left, adjoint):
    """PyTorch's linalg.lu_solve semantics, batch dimensions broadcast."""
    batch = batch_shape(lu, b)
    lu = broadcast_batch(lu, batch)
    permutation = jnp.broadcast_to(permutation, tuple(batch) + permutation.shape[-1:])
    b = broadcast_batch(b, batch)
    if left:
        return lu_solve_left(lu, permutation, b, adjoint)
    # X A = B  <=>  A^T X^T = B^T
    return mT(lu_solve_left(lu, permutation, mT(b), not adjoint))


def empty(dtype):
    return jnp.zeros((0,), dtype)


# ---------------------------------------------------------------------------------------
# LU family.


def _no_pivoting(api):
    raise RuntimeError(f"{api}: LU without pivoting is not implemented on tpu; use pivot=True")


@kernel("linalg_lu_factor_ex")
@real_float_only("linalg_lu_factor_ex")
def linalg_lu_factor_ex(A, pivot=True, check_errors=False):
    if not pivot:
        _no_pivoting("linalg.lu_factor")

    def fn(a):
        lu, pivots, _ = lu_factor(a)
        return lu, pivots, lu_info(lu)

    lu, pivots, info = run("linalg_lu_factor_ex", (), fn, A)
    if check_errors:
        raise_errors(info, "torch.linalg.lu_factor_ex", A)
    return lu, pivots, info


@kernel("linalg_lu")
@real_float_only("linalg_lu")
def linalg_lu(A, pivot=True):
    if not pivot:
        _no_pivoting("linalg.lu")

    def fn(a):
        lu, _, permutation = lu_factor(a)
        lower, upper = unpack_lu(lu)
        return permutation_matrix(permutation, a.dtype), lower, upper

    return tuple(run("linalg_lu", (), fn, A))


@kernel("lu_unpack")
@real_float_only("lu_unpack")
def lu_unpack(LU_data, LU_pivots, unpack_data=True, unpack_pivots=True):
    if LU_pivots.dtype != torch.int32:
        raise RuntimeError("torch.lu_unpack: LU_pivots is expected to be a contiguous tensor of torch.int32 dtype. "
                           "Note: this function is intended to be used with the output produced by torch.linalg.lu_factor")

    def fn(lu, pivots):
        m = lu.shape[-2]
        p = permutation_matrix(pivots_to_permutation(pivots, m), lu.dtype) if unpack_pivots else empty(lu.dtype)
        lower, upper = unpack_lu(lu) if unpack_data else (empty(lu.dtype), empty(lu.dtype))
        return p, lower, upper

    return tuple(run("lu_unpack", (unpack_data, unpack_pivots), fn, LU_data, LU_pivots))


@kernel("linalg_lu_solve")
@real_float_only("linalg_lu_solve")
def linalg_lu_solve(LU, pivots, B, left=True, adjoint=False):
    def fn(lu, piv, b):
        return lu_solve(lu, pivots_to_permutation(piv, lu.shape[-2]), b, left, adjoint)

    return run("linalg_lu_solve", (left, adjoint), fn, LU, pivots, B)[0]


def vector_rhs(A, B):
    """PyTorch's linalg_solve_is_vector_rhs: B is a (batch of) vector(s)."""
    return B.dim() == 1 or (A.dim() - 1 == B.dim() and B.shape == A.shape[:-1])


@kernel("_linalg_solve_ex")
@real_float_only("_linalg_solve_ex")
def linalg_solve_ex(A, B, left=True, check_errors=False):
    vector = vector_rhs(A, B)

    def fn(a, b):
        if vector:
            b = b[..., :, None] if left else b[..., None, :]
        lu, pivots, permutation = lu_factor(a)
        x = lu_solve(lu, permutation, b, left, adjoint=False)
        if vector:
            x = x[..., :, 0] if left else x[..., 0, :]
        # PyTorch returns the factorization of A broadcast to the batch of the result.
        batch = x.shape[:-1] if vector else x.shape[:-2]
        lu = broadcast_batch(lu, batch)
        pivots = jnp.broadcast_to(pivots, tuple(batch) + pivots.shape[-1:])
        return x, lu, pivots, lu_info(lu)

    result, lu, pivots, info = run("_linalg_solve_ex", (left, vector), fn, A, B)
    if check_errors:
        raise_errors(info, "torch.linalg.solve_ex", A)
    return result, lu, pivots, info


@kernel("linalg_inv_ex")
@real_float_only("linalg_inv_ex")
def linalg_inv_ex(A, check_errors=False):
    def fn(a):
        lu, _, permutation = lu_factor(a)
        identity = jnp.broadcast_to(jnp.eye(a.shape[-1], dtype=a.dtype), a.shape)
        return lu_solve_left(lu, permutation, identity, adjoint=False), lu_info(lu)

    inverse, info = run("linalg_inv_ex", (), fn, A)
    if check_errors:
        raise_errors(info, "linalg.inv_ex", A)
    return inverse, info


def permutation_sign(pivots, dtype):
    """(-1)^(number of row interchanges) of 1-based LAPACK pivots."""
    k = pivots.shape[-1]
    swaps = jnp.sum(pivots != jnp.arange(1, k + 1, dtype=pivots.dtype), axis=-1)
    return jnp.where(swaps % 2 == 0, 1, -1).astype(dtype)


def factor_for_determinant(a, transpose: bool):
    """PyTorch's _linalg_det/_linalg_slogdet factor A^T when A is contiguous (det(A^T) =
    det(A)), and their backward formulas expect that factorization: so do the same."""
    return lu_factor(mT(a) if transpose else a)


@kernel("_linalg_det")
@real_float_only("_linalg_det")
def linalg_det(A):
    transpose = A.is_contiguous()

    def fn(a):
        lu, pivots, _ = factor_for_determinant(a, transpose)
        diagonal = jnp.diagonal(lu, axis1=-2, axis2=-1)
        return permutation_sign(pivots, a.dtype) * jnp.prod(diagonal, axis=-1), lu, pivots

    return tuple(run("_linalg_det", (transpose,), fn, A))


@kernel("_linalg_slogdet")
@real_float_only("_linalg_slogdet")
def linalg_slogdet(A):
    transpose = A.is_contiguous()

    def fn(a):
        lu, pivots, _ = factor_for_determinant(a, transpose)
        diagonal = jnp.diagonal(lu, axis1=-2, axis2=-1)
        sign = permutation_sign(pivots, a.dtype) * jnp.prod(jnp.sign(diagonal), axis=-1)
        return sign, jnp.sum(jnp.log(jnp.abs(diagonal)), axis=-1), lu, pivots

    return tuple(run("_linalg_slogdet", (transpose,), fn, A))


# ---------------------------------------------------------------------------------------
# QR, Householder products.


@kernel("linalg_qr")
@real_float_only("linalg_qr")
def linalg_qr(A, mode="reduced"):
    if mode not in ("reduced", "complete", "r"):
        raise RuntimeError(f"qr received unrecognized mode '{mode}' but expected one of 'reduced' (default), "
                           "'r', or 'complete'")

    def fn(a):
        q, r = jax.lax.linalg.qr(a, full_matrices=mode == "complete")
        return (empty(a.dtype) if mode == "r" else q), r

    return tuple(run("linalg_qr", (mode,), fn, A))


@kernel("geqrf")
@real_float_only("geqrf")
def geqrf(self):
    return tuple(run("geqrf", (), lambda a: tuple(_lax("geqrf")(a)), self))


@kernel("linalg_householder_product")
@real_float_only("linalg_householder_product")
def linalg_householder_product(input, tau):
    return run("linalg_householder_product", (), jax.lax.linalg.householder_product, input, tau)[0]


@kernel("ormqr")
@real_float_only("ormqr")
def ormqr(self, input2, input3, left=True, transpose=False):
    def fn(reflectors, tau, other):
        batch = batch_shape(reflectors, other)
        reflectors = broadcast_batch(reflectors, batch)
        tau = jnp.broadcast_to(tau, tuple(batch) + tau.shape[-1:])
        other = broadcast_batch(other, batch)
        return _lax("ormqr")(reflectors, tau, other, left=left, transpose=transpose)

    return run("ormqr", (left, transpose), fn, self, input2, input3)[0]


# ---------------------------------------------------------------------------------------
# Spectral decompositions, least squares, matrix exponential.


@kernel("_linalg_eigh")
@real_float_only("_linalg_eigh")
def linalg_eigh(A, UPLO="L", compute_v=True):
    if UPLO not in ("L", "U"):
        raise RuntimeError(f"Expected UPLO argument to be 'L' or 'U', but got {UPLO}")

    def fn(a):
        # The triangle UPLO names is read, as LAPACK's syevd does.
        vectors, values = jax.lax.linalg.eigh(a, lower=UPLO == "L", symmetrize_input=False)
        return values, (vectors if compute_v else empty(a.dtype))

    return tuple(run("_linalg_eigh", (UPLO, compute_v), fn, A))


@kernel("_linalg_svd")
@real_float_only("_linalg_svd")
def linalg_svd(A, full_matrices=False, compute_uv=True, driver=None):
    if driver is not None:
        raise RuntimeError("torch.linalg.svd: keyword argument `driver=` is only supported on CUDA inputs "
                           "with cuSOLVER backend.")

    def fn(a):
        if not compute_uv:
            s = jax.lax.linalg.svd(a, full_matrices=False, compute_uv=False)
            return empty(a.dtype), s, empty(a.dtype)
        u, s, vh = jax.lax.linalg.svd(a, full_matrices=full_matrices, compute_uv=True)
        return u, s, vh

    return tuple(run("_linalg_svd", (full_matrices, compute_uv), fn, A))


_LSTSQ_DRIVERS = ("gels", "gelsy", "gelsd", "gelss")


@kernel("linalg_lstsq")
@real_float_only("linalg_lstsq")
def linalg_lstsq(self, b, rcond=None, driver=None):
    """Least squares through the SVD (the minimum-norm solution, as gelsy/gelsd/gelss give;
    gels assumes full rank, where all agree). Outputs as PyTorch's CPU kernels shape them
    per driver (default gelsy): rank for all but gels, singular values for gelsd/gelss,
    residuals when m > n for gels, and for gelsd/gelss when every matrix has full rank."""
    driver = driver or "gelsy"
    if driver not in _LSTSQ_DRIVERS:
        raise RuntimeError(f"torch.linalg.lstsq: parameter `driver` should be one of ({', '.join(_LSTSQ_DRIVERS)})")
    m, n = self.shape[-2:]
    vector = b.dim() == self.dim() - 1
    eps = torch.finfo(self.dtype).eps
    cutoff = eps * max(m, n) if rcond is None or rcond < 0 else rcond

    def fn(a, rhs):
        if vector:
            rhs = rhs[..., None]
        batch = batch_shape(a, rhs)
        a, rhs = broadcast_batch(a, batch), broadcast_batch(rhs, batch)
        u, s, vh = jax.lax.linalg.svd(a, full_matrices=False)
        largest = jnp.max(s, axis=-1, keepdims=True, initial=0)
        kept = s > cutoff * largest
        inverse = jnp.where(kept, 1 / jnp.where(kept, s, 1), 0)
        x = mT(vh) @ (inverse[..., :, None] * (mT(u) @ rhs))
        rank = jnp.sum(kept, axis=-1).astype(jnp.int64)
        residuals = jnp.sum(jnp.square(a @ x - rhs), axis=-2)
        if vector:
            x = x[..., 0]
        return x, residuals, rank, s

    solution, residuals, rank, singular_values = run("linalg_lstsq", (vector, cutoff), fn, self, b)
    full = self.new_empty((0,))
    if driver == "gels":
        rank, singular_values = torch.empty(0, dtype=torch.int64, device=self.device), full
    elif driver == "gelsy":
        singular_values = full
    if not (m > n and driver != "gelsy" and (driver == "gels" or bool((rank == n).all()))):
        residuals = full  # PyTorch computes them only then (a host read of rank, as on CPU)
    if vector and residuals.numel():
        residuals = residuals[..., 0]
    return solution, residuals, rank, singular_values


@kernel("linalg_matrix_exp")
@real_float_only("linalg_matrix_exp", _FLOATS + (torch.float16, torch.bfloat16))
def linalg_matrix_exp(self):
    import jax.scipy.linalg

    def fn(a):
        # float16 / bfloat16 (PyTorch's CPU takes them too) are computed in float32.
        wide = a.astype(jnp.promote_types(a.dtype, jnp.float32))
        return jax.scipy.linalg.expm(wide).astype(a.dtype)

    return run("linalg_matrix_exp", (), fn, self)[0]
