"""Helpers that compare an operation on tpu against the same operation on CPU."""
import os
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch

import torchtpu


def to_tpu(obj):
    if isinstance(obj, torch.Tensor):
        t = obj.detach().to("tpu")
        return t.requires_grad_(obj.requires_grad) if obj.is_floating_point() or obj.is_complex() else t
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_tpu(o) for o in obj)
    if isinstance(obj, dict):
        return {k: to_tpu(v) for k, v in obj.items()}
    return obj


def to_cpu(obj):
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu()
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_cpu(o) for o in obj)
    return obj


# float16/bfloat16 results: XLA and CPU may round a result, or an intermediate they keep in
# float32, one step apart (bfloat16's step is 2^-8 = 3.9e-3 relative, float16's 2^-11).
HALF_PRECISION = dict(rtol=1e-2, atol=1e-2)


def assert_close(actual, expected, rtol=1e-5, atol=1e-5, equal_nan=True):
    if isinstance(expected, torch.Tensor):
        assert isinstance(actual, torch.Tensor), f"expected a tensor, got {type(actual)}"
        actual = actual.detach().cpu()
        assert actual.dtype == expected.dtype, f"dtype {actual.dtype} != {expected.dtype}"
        assert actual.shape == expected.shape, f"shape {tuple(actual.shape)} != {tuple(expected.shape)}"
        torch.testing.assert_close(actual, expected.detach(), rtol=rtol, atol=atol, equal_nan=equal_nan)
    elif isinstance(expected, (list, tuple)):
        assert len(actual) == len(expected)
        for a, e in zip(actual, expected):
            assert_close(a, e, rtol=rtol, atol=atol, equal_nan=equal_nan)
    else:
        assert actual == expected, f"{actual!r} != {expected!r}"


def check(fn, *args, rtol=1e-5, atol=1e-5, grad=False, no_fallback=True, **kwargs):
    """Runs fn on CPU args and on their tpu copies; compares outputs (and input gradients
    of a sum of the outputs when grad=True). Fails if anything fell back to CPU."""
    cpu_args = [a.detach().clone().requires_grad_(a.requires_grad) if isinstance(a, torch.Tensor) else a
                for a in args]
    tpu_args = [to_tpu(a) for a in cpu_args]
    before = dict(torchtpu.metrics.counters()["fallback_ops"])
    expected = fn(*cpu_args, **kwargs)
    actual = fn(*tpu_args, **kwargs)
    assert_close(actual, expected, rtol=rtol, atol=atol)
    if grad:
        def total(out):
            outs = out if isinstance(out, (list, tuple)) else [out]
            return sum((o.float() * (i + 1)).sum() for i, o in enumerate(outs) if o.is_floating_point())
        total(expected).backward()
        total(actual).backward()
        for c, t in zip(cpu_args, tpu_args):
            if isinstance(c, torch.Tensor) and c.requires_grad:
                assert t.grad is not None, "no gradient reached a tpu input"
                assert_close(t.grad, c.grad, rtol=rtol, atol=atol)
    if no_fallback:
        after = torchtpu.metrics.counters()["fallback_ops"]
        new = {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}
        assert not new, f"ops fell back to CPU: {new}"
    return actual


def check_error(fn, *args):
    """fn raises on CPU args; on their tpu copies it raises the same exception type with the
    same message (at the latest when its result is read), and nothing fell back to CPU or
    warned of a missing lowering: CPU's kernel only said no."""
    cpu_args = [a.detach().clone() if isinstance(a, torch.Tensor) else a for a in args]
    with pytest.raises(Exception) as on_cpu:
        fn(*cpu_args)
    before = dict(torchtpu.metrics.counters()["fallback_ops"])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(type(on_cpu.value)) as on_tpu:
            to_cpu(fn(*[to_tpu(a) for a in cpu_args]))
    assert type(on_tpu.value) is type(on_cpu.value)
    assert str(on_tpu.value) == str(on_cpu.value)
    assert [str(w.message) for w in caught if "no tpu lowering" in str(w.message)] == []
    assert torchtpu.metrics.counters()["fallback_ops"] == before


# --- complex-aware comparisons (tests/ops/test_complex.py, test_fft.py) --------------------

def crand(*shape, dtype=torch.complex64, lo=-2.0, hi=2.0, grad=False, seed=0):
    """Seeded complex values with both parts uniform in [lo, hi)."""
    g = torch.Generator().manual_seed(seed)
    parts = torch.rand(shape + (2,), generator=g, dtype=torch.float64) * (hi - lo) + lo
    return torch.view_as_complex(parts).to(dtype).requires_grad_(grad)


def rrand(*shape, lo=-2.0, hi=2.0, grad=False, seed=1):
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(shape, generator=g) * (hi - lo) + lo).requires_grad_(grad)


def total(outs):
    """A real loss of every output: a complex o contributes re(o) + 2 im(o), so a gradient with
    the wrong conjugation (or a dropped imaginary part) changes the result."""
    terms = []
    for k, o in enumerate(outs):
        if o.is_complex():
            terms.append((o.real.sum() + 2 * o.imag.sum()) * (k + 1))
        elif o.is_floating_point():
            terms.append(o.sum() * (k + 1))
    return sum(terms)


def run_cases(cases, grad=False, tol=None, allow=()):
    """cases: (label, fn, inputs) or (label, fn, inputs, tolerance of that case or None). Every
    case runs on CPU and on tpu copies (one fused graph in fused mode); outputs and input
    gradients are compared by label, and nothing may fall back (but the aten ops in `allow`)."""
    before = dict(torchtpu.metrics.counters()["fallback_ops"])
    cpu_in = [[a.detach().clone().requires_grad_(a.requires_grad) for a in case[2]] for case in cases]
    tpu_in = [[to_tpu(a) for a in ins] for ins in cpu_in]
    expected = [case[1](*ins) for case, ins in zip(cases, cpu_in)]
    actual = [case[1](*ins) for case, ins in zip(cases, tpu_in)]
    if grad:
        for outs in (expected, actual):
            flat = [o for out in outs for o in (out if isinstance(out, (tuple, list)) else [out]) if o.requires_grad]
            total(flat).backward()
    for case, a, e, ci, ti in zip(cases, to_cpu(actual), expected, cpu_in, tpu_in):
        case_tol = (case[3] if len(case) > 3 else None) or tol or {}
        try:
            assert_close(a, e, **case_tol)
            for c, t in zip(ci, ti):
                if c.grad is not None:
                    assert t.grad is not None, "no gradient reached the tpu input"
                    assert_close(t.grad, c.grad, **case_tol)
                elif c.requires_grad:
                    assert t.grad is None, "a gradient reached a tpu input that gets none on CPU"
        except AssertionError as error:
            raise AssertionError(f"{case[0]}: {error}") from None
    after = torchtpu.metrics.counters()["fallback_ops"]
    new = {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0) and k not in allow}
    assert not new, f"ops fell back to CPU: {new}"


def run_python(code, timeout=600, **env):
    """Runs code in a fresh interpreter with extra environment variables; returns the
    CompletedProcess (stdout and stderr captured as text)."""
    full_env = dict(os.environ)
    full_env.update(env)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          env=full_env, timeout=timeout)


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_tool(name: str):
    """tools/<name>.py as a module (the sweep harnesses: op_coverage, module_coverage)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "tools", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
