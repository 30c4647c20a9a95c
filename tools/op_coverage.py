#!/usr/bin/env python
"""Op coverage: PyTorch's OpInfo database (float32 sample inputs) on "tpu" against CPU.

For every OpInfo in torch.testing._internal.common_methods_invocations.op_db, up to N
sample inputs are run on CPU (the oracle) and on tpu copies of the same inputs; outputs
are compared with torch.testing.assert_close (equal_nan=True) at PyTorch's default float32
tolerances, or at the op's own float32 tolerance where PyTorch's test suite grants one
(`tolerance`). Where the op supports autograd in float32, the gradients of the sum of its
float outputs w.r.t. its float inputs are compared too.

Sample inputs are deterministic: before an op's samples are made, torch, Python's `random`
and numpy are seeded (PyTorch's own `set_rng_seed`, as its TestCase.setUp does), so they
do not depend on which ops a worker ran before; workers run with PYTHONHASHSEED=0.
Each op's record has its `closeness`: the largest error over the allowed error
(|actual - expected| / (atol + rtol * |expected|)) among its passing comparisons, so the
summary can list `near_misses`, passing ops that another machine's rounding could flip.

Per op and per direction (forward / backward) the status is one of
    pass      all tried samples match, nothing fell back to CPU
    fallback  all tried samples match, but some aten ops ran through the CPU fallback
    fail      some sample raised on tpu or did not match CPU (first reason recorded)
    crash     the worker process died (segfault, abort, ...) while running the op
    timeout   the op took longer than --timeout seconds
    n/a       not applicable: no float32 support, no usable samples (CPU itself raises),
              or (backward) no autograd support / nothing differentiable

Ops run in worker subprocesses, so a crash or hang is recorded for that op and the
worker is restarted; the run itself never dies.

    PYTHONPATH=. .venv/bin/python tools/op_coverage.py            # writes docs/op_coverage.{md,json}
    PYTHONPATH=. .venv/bin/python tools/op_coverage.py --ops add,mul,sin --samples 2 --no-md
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STATUSES = ("pass", "fallback", "fail", "crash", "timeout", "n/a")
REASON_CHARS = 400
# Ops whose output is uninitialized memory (compared on shapes and dtypes only).
UNINITIALIZED = {"empty", "empty_like", "empty_strided", "empty_permuted", "new_empty", "new_empty_strided"}
# Ops whose positional arguments after the input must stay on CPU (index tensors).
CPU_INDEX_ARGS = {"tensor_split"}
SEED = 0
# A passing op whose closeness is above this could fail on another machine of the same
# kind: XLA's accumulation order follows the CPU's vector units (addbmm differed by 1.5e-5).
NEAR_MISS = 0.5
# PyTorch's OpInfo test classes whose toleranceOverrides compare an op's results with
# another implementation of the op (another device, a NumPy reference, a decomposition,
# out=/non-contiguous variants, a compiled graph) on CPU or CUDA. Others are left out:
# TorchScript, functorch transforms, forward AD, DTensor, and backends' own suites (MPS).
TOLERANCE_TEST_CLASSES = {None, "TestCommon", "TestDecomp", "TestUnaryUfuncs", "TestInductorOpInfo"}
TOLERANCE_DEVICES = {None, "cpu", "cuda"}


# =========================================================================================
# Worker side: runs inside a subprocess, imports torch + torchtpu.
# =========================================================================================

def _stub_expecttest():
    # torch.testing._internal.common_utils imports expecttest (a test-only dependency that
    # is not installed here); only expecttest.TestCase is needed at import time.
    try:
        import expecttest  # noqa: F401
    except ImportError:
        import types
        import unittest

        module = types.ModuleType("expecttest")
        module.TestCase = unittest.TestCase
        module.ACCEPT = False
        sys.modules["expecttest"] = module


# Dtypes besides float32 with a column in the markdown's "By dtype" table.
OTHER_DTYPES = ("bfloat16", "float16", "int64")


def op_key(op) -> str:
    return op.name + ("." + op.variant_test_name if op.variant_test_name else "")


def tolerance(op, dtype, test_classes=TOLERANCE_TEST_CLASSES):
    """(atol, rtol, where): the loosest `dtype` tolerance that PyTorch's own test suite grants
    the op (toleranceOverride in its OpInfo decorators, `test_classes` on CPU or CUDA), or
    (0, 0, "") when it grants none: then assert_close's defaults apply. ModuleInfo carries
    its decorators the same way (tools/module_coverage.py passes TestModule)."""
    from torch.testing._internal.common_device_type import toleranceOverride

    atol, rtol, where = 0.0, 0.0, []
    for info in op.decorators:
        if getattr(info, "cls_name", "absent") not in test_classes:
            continue
        if info.device_type not in TOLERANCE_DEVICES or "mps" in (info.test_name or ""):
            continue
        if not bool(info.active_if) or (info.dtypes is not None and dtype not in info.dtypes):
            continue
        for decorator in info.decorators:
            if isinstance(decorator, toleranceOverride) and dtype in decorator.d:
                tol = decorator.d[dtype]
                atol, rtol = max(atol, tol.atol), max(rtol, tol.rtol)
                where.append(f"{info.cls_name}.{info.test_name or '*'}"
                             + (f"@{info.device_type}" if info.device_type else ""))
    return atol, rtol, ", ".join(where)


def seeded_samples(op, dtype, requires_grad, count):
    """The op's first `count` sample inputs on CPU, the same in every process."""
    from torch.testing._internal.common_utils import set_rng_seed

    set_rng_seed(SEED)  # torch, random and numpy: sample functions use all three
    samples = []
    for sample in op.sample_inputs("cpu", dtype, requires_grad=requires_grad):
        samples.append(sample)
        if len(samples) >= count:
            break
    return samples


def closeness(actual, expected, atol, rtol) -> float:
    """max |actual - expected| / (atol + rtol * |expected|) over finite elements (0: equal)."""
    import torch

    a, e = actual.detach().double(), expected.detach().double()
    finite = torch.isfinite(a) & torch.isfinite(e)
    error = (a - e).abs()[finite]
    allowed = (atol + rtol * e.abs())[finite]
    if error.numel() == 0 or not bool((error > 0).any()):
        return 0.0
    return float((error / allowed).max())


def _short(text: str, limit: int = REASON_CHARS) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _error(prefix: str, error: BaseException) -> str:
    return _short(f"{prefix}: {type(error).__name__}: {error}")


class Mismatch(AssertionError):
    pass


class _Worker:
    def __init__(self):
        import warnings

        warnings.filterwarnings("ignore")
        _stub_expecttest()
        import torch

        torch.set_num_threads(1)
        import torchtpu
        from torch.testing._internal.common_methods_invocations import op_db

        self.torch = torch
        self.torchtpu = torchtpu
        self.ops = {op_key(op): op for op in op_db}
        self.atol = self.rtol = 0.0  # the op's tolerance (0: assert_close's defaults)
        self.closeness = 0.0  # the op's largest error over the allowed error so far
        # Warm up the device so the first op's timeout does not include client start-up.
        (torch.ones(2, device="tpu") + 1).cpu()

    # ---- moving and comparing -----------------------------------------------------------

    def to_tpu(self, obj):
        torch = self.torch
        if isinstance(obj, torch.Tensor):
            t = obj.detach().to("tpu")
            if obj.requires_grad and (obj.is_floating_point() or obj.is_complex()):
                t.requires_grad_(True)
            return t
        if isinstance(obj, torch.device):
            return torch.device("tpu") if obj.type == "cpu" else obj
        if isinstance(obj, str) and obj == "cpu":
            return "tpu"
        if isinstance(obj, tuple) and hasattr(obj, "_fields"):
            return type(obj)(*(self.to_tpu(o) for o in obj))
        if isinstance(obj, (list, tuple)):
            return type(obj)(self.to_tpu(o) for o in obj)
        if isinstance(obj, dict):
            return {k: self.to_tpu(v) for k, v in obj.items()}
        return obj

    def clone(self, obj):
        torch = self.torch
        if isinstance(obj, torch.Tensor):
            return obj.detach().clone().requires_grad_(obj.requires_grad)
        if isinstance(obj, tuple) and hasattr(obj, "_fields"):
            return type(obj)(*(self.clone(o) for o in obj))
        if isinstance(obj, (list, tuple)):
            return type(obj)(self.clone(o) for o in obj)
        if isinstance(obj, dict):
            return {k: self.clone(v) for k, v in obj.items()}
        return obj

    def leaves(self, obj, out=None):
        """Tensors inside obj, in a deterministic order."""
        out = [] if out is None else out
        if isinstance(obj, self.torch.Tensor):
            out.append(obj)
        elif isinstance(obj, (list, tuple)):
            for o in obj:
                self.leaves(o, out)
        elif isinstance(obj, dict):
            for k in obj:
                self.leaves(obj[k], out)
        return out

    def compare(self, actual, expected, where="out", metadata_only=False, on_tpu=True):
        """Raises Mismatch unless actual (tpu) matches expected (CPU) at the op's tolerance."""
        torch = self.torch
        if isinstance(expected, torch.Tensor):
            if not isinstance(actual, torch.Tensor):
                raise Mismatch(f"{where}: expected a tensor, got {type(actual).__name__}")
            if on_tpu and actual.device.type != "tpu" and expected.device.type == "cpu":
                raise Mismatch(f"{where}: result is on {actual.device}, not on tpu")
            a = actual.detach().cpu()
            e = expected.detach()
            if a.dtype != e.dtype:
                raise Mismatch(f"{where}: dtype {a.dtype} != {e.dtype}")
            if a.shape != e.shape:
                raise Mismatch(f"{where}: shape {tuple(a.shape)} != {tuple(e.shape)}")
            if metadata_only:
                return
            rtol, atol = torch.testing._comparison.default_tolerances(a, e)
            rtol, atol = max(rtol, self.rtol), max(atol, self.atol)  # as PyTorch's assertEqual does
            try:
                torch.testing.assert_close(a, e, rtol=rtol, atol=atol, equal_nan=True, check_device=False,
                                           check_stride=False)
                if on_tpu and (a.is_floating_point() or a.is_complex()) and a.numel():
                    self.closeness = max(self.closeness, closeness(a, e, atol, rtol))
            except AssertionError as error:
                message = " ".join(str(error).split())
                if a.is_floating_point() or a.is_complex():
                    try:
                        torch.testing.assert_close(a, e, rtol=1e-3, atol=1e-3, equal_nan=True)
                        message += " [close: passes at rtol=atol=1e-3]"
                    except AssertionError:
                        pass
                raise Mismatch(f"{where}: {message}") from None
        elif isinstance(expected, (list, tuple)):
            if not isinstance(actual, (list, tuple)) or len(actual) != len(expected):
                raise Mismatch(f"{where}: expected a sequence of {len(expected)}, got {type(actual).__name__}")
            for i, (a, e) in enumerate(zip(actual, expected)):
                self.compare(a, e, f"{where}[{i}]", metadata_only, on_tpu)
        elif isinstance(expected, dict):
            for k in expected:
                self.compare(actual[k], expected[k], f"{where}[{k!r}]", metadata_only, on_tpu)
        elif isinstance(expected, float):
            if not (actual == expected or (actual != actual and expected != expected)):
                if metadata_only:
                    return
                if isinstance(actual, float) and abs(actual - expected) <= 1e-5 + 1.3e-6 * abs(expected):
                    return
                raise Mismatch(f"{where}: {actual!r} != {expected!r}")
        else:
            if isinstance(actual, torch.Tensor) and actual.dim() == 0:
                actual = actual.item()
            if actual != expected and not metadata_only:
                raise Mismatch(f"{where}: {actual!r} != {expected!r}")

    def seeded_in_wrapper(self, op):
        """OpInfo wraps random ops in wrapper_set_seed (a fixed seed inside every call), so
        the CPU result looks deterministic; a tpu RNG cannot reproduce CPU's bits anyway."""
        code = getattr(op.op, "__code__", None)
        return bool(code and "wrapper_set_seed" in code.co_names)

    def compare_maybe_random(self, actual, expected, where, random, result):
        try:
            self.compare(actual, expected, where)
        except Mismatch:
            if not random:
                raise
            self.compare(actual, expected, where, metadata_only=True)
            result["random_values_differ"] = True

    def compare_output(self, actual, expected, sample, random, result):
        """The raw outputs; where they differ and OpInfo gives the sample an
        output_process_fn_grad (its gauge-invariant view of the outputs: |U|, S, U @ Vh of
        an SVD, |V| of eigh), that view instead. Singular and eigen vectors are unique only
        up to sign, which each LAPACK or XLA implementation picks its own way; PyTorch's
        tests never compare the signs across implementations either."""
        try:
            self.compare_maybe_random(actual, expected, "out", random, result)
        except Mismatch:
            processed = sample.output_process_fn_grad(expected)
            if processed is expected:  # OpInfo's default (identity): nothing else to compare
                raise
            self.compare(sample.output_process_fn_grad(actual), processed, "out (gauge-invariant)")
            result["gauge_invariant"] = True

    def fallbacks(self):
        return dict(self.torchtpu.metrics.counters()["fallback_ops"])

    @staticmethod
    def diff(before, after):
        return {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}

    def float_total(self, out):
        """Sum of the float outputs that carry a gradient, or None."""
        parts = [o.sum() for o in self.leaves(out) if o.is_floating_point() and o.requires_grad]
        if not parts:
            return None
        total = parts[0]
        for p in parts[1:]:
            total = total + p
        return total

    # ---- one op --------------------------------------------------------------------------

    def run_op(self, key, samples, backward, progress, dtype_name="float32"):
        torch = self.torch
        op = self.ops[key]
        dtype = getattr(torch, dtype_name)
        result = {"fwd": "n/a", "bwd": "n/a", "reason": "", "bwd_reason": "", "fallback_fwd": {},
                  "fallback_bwd": {}, "samples_fwd": 0, "samples_bwd": 0, "random": False}
        if dtype not in op.supported_dtypes("cpu"):
            result["reason"] = f"{dtype_name} not supported by the op (OpInfo dtypes)"
            return result
        want_grad = bool(backward and op.supports_autograd and dtype in op.supported_backward_dtypes("cpu"))
        self.atol, self.rtol, result["tolerance_from"] = tolerance(op, dtype)
        if result["tolerance_from"]:
            result["tolerance"] = {"atol": self.atol, "rtol": self.rtol}
        self.closeness = 0.0
        try:
            sample_list = seeded_samples(op, dtype, want_grad, samples)
        except Exception as error:  # noqa: BLE001
            result["reason"] = _error("n/a: sample_inputs raised on CPU", error)
            return result
        if not sample_list:
            result["reason"] = f"n/a: no {dtype_name} sample inputs"
            return result

        # ---- forward --------------------------------------------------------------------
        progress({"phase": "fwd"})
        fwd_fail = None
        fwd_fallback = collections.Counter()
        kept = []  # (sample, cpu inputs, cpu out, tpu inputs, tpu out) for backward
        cpu_errors = []
        for index, sample in enumerate(sample_list):
            progress({"phase": "fwd", "sample": index})
            args = (sample.input, sample.args, sample.kwargs)
            tpu_args = self.to_tpu(args)
            if op.name in CPU_INDEX_ARGS:
                # PyTorch requires these arguments on CPU (OpInfo creates them with device="cpu").
                tpu_args = (tpu_args[0], self.clone(sample.args), tpu_args[2])
            cpu_args = self.clone(args)
            cpu_args2 = self.clone(args)
            try:
                torch.manual_seed(1234)
                expected = op(cpu_args[0], *cpu_args[1], **cpu_args[2])
                torch.manual_seed(4321)
                expected2 = op(cpu_args2[0], *cpu_args2[1], **cpu_args2[2])
            except Exception as error:  # noqa: BLE001
                cpu_errors.append(_error("CPU reference raised", error))
                continue
            # Random ops: OpInfo wraps them in wrapper_set_seed, or the CPU result depends on
            # the seed. A tpu RNG cannot reproduce CPU's bits, so when values differ only
            # shapes and dtypes are compared (values still are when they happen to match,
            # e.g. when the op fell back to CPU).
            random = self.seeded_in_wrapper(op) and op.name != "item"
            if op.name in UNINITIALIZED:
                random = True  # uninitialized memory: only shapes and dtypes are meaningful
            try:
                self.compare(expected2, expected, on_tpu=False)
            except Exception:  # noqa: BLE001
                random = True
            result["random"] = result["random"] or random
            result["samples_fwd"] += 1
            before = self.fallbacks()
            try:
                torch.manual_seed(1234)
                actual = op(tpu_args[0], *tpu_args[1], **tpu_args[2])
                self.compare_output(actual, expected, sample, random, result)
            except Mismatch as error:
                fwd_fail = fwd_fail or _short(f"sample {index}: mismatch: {error}")
            except Exception as error:  # noqa: BLE001
                fwd_fail = fwd_fail or _short(f"sample {index}: " + _error("tpu raised", error))
                actual = None
                self.recover()
            fwd_fallback.update(self.diff(before, self.fallbacks()))
            if want_grad and actual is not None:
                kept.append((index, sample, cpu_args, expected, tpu_args, actual))
        result["fallback_fwd"] = dict(fwd_fallback)
        if result["samples_fwd"] == 0:
            result["reason"] = "n/a: every sample raised on CPU: " + (cpu_errors[0] if cpu_errors else "")
            result["reason"] = _short(result["reason"])
            return result
        if fwd_fail:
            result["fwd"], result["reason"] = "fail", fwd_fail
        else:
            result["fwd"] = "fallback" if fwd_fallback else "pass"
            result["closeness_fwd"] = round(self.closeness, 4)
            if result.get("random_values_differ"):
                result["reason"] = ("uninitialized output: shapes/dtypes match" if op.name in UNINITIALIZED
                                    else "random op: values differ from CPU's RNG; shapes/dtypes match")
            elif result.get("gauge_invariant"):
                result["reason"] = "vector signs differ from CPU's LAPACK; OpInfo's gauge-invariant outputs match"
        progress({"phase": "fwd-done", "partial": result})

        # ---- backward -------------------------------------------------------------------
        self.closeness = 0.0
        if not want_grad:
            result["bwd_reason"] = f"no {dtype_name} autograd support" if backward else "backward not run"
            return result
        bwd_fail = None
        bwd_fallback = collections.Counter()
        for index, sample, cpu_args, expected, tpu_args, actual in kept:
            progress({"phase": "bwd", "sample": index})
            cpu_inputs = [t for t in self.leaves(cpu_args) if t.requires_grad and t.is_floating_point()]
            tpu_inputs = [t for t in self.leaves(tpu_args) if t.requires_grad and t.is_floating_point()]
            try:
                cpu_total = self.float_total(sample.output_process_fn_grad(expected))
                if cpu_total is None or not cpu_inputs:
                    continue
                cpu_grads = torch.autograd.grad(cpu_total, cpu_inputs, allow_unused=True)
            except Exception:  # noqa: BLE001
                continue  # CPU cannot differentiate this sample: not applicable
            result["samples_bwd"] += 1
            if len(cpu_inputs) != len(tpu_inputs):
                bwd_fail = bwd_fail or f"sample {index}: {len(tpu_inputs)} tpu inputs require grad, CPU {len(cpu_inputs)}"
                continue
            before = self.fallbacks()
            try:
                tpu_total = self.float_total(sample.output_process_fn_grad(actual))
                if tpu_total is None:
                    raise Mismatch("tpu output does not require grad")
                tpu_grads = torch.autograd.grad(tpu_total, tpu_inputs, allow_unused=True)
                for i, (a, e) in enumerate(zip(tpu_grads, cpu_grads)):
                    if e is None and a is None:
                        continue
                    if e is None or a is None:
                        raise Mismatch(f"grad[{i}]: {'None' if a is None else 'tensor'} on tpu, "
                                       f"{'None' if e is None else 'tensor'} on CPU")
                    self.compare_maybe_random(a, e, f"grad[{i}]", result["random"], result)
            except Mismatch as error:
                bwd_fail = bwd_fail or _short(f"sample {index}: mismatch: {error}")
            except Exception as error:  # noqa: BLE001
                bwd_fail = bwd_fail or _short(f"sample {index}: " + _error("tpu raised", error))
                self.recover()
            bwd_fallback.update(self.diff(before, self.fallbacks()))
        result["fallback_bwd"] = dict(bwd_fallback)
        if result["fwd"] == "fail" and not kept:
            result["bwd"], result["bwd_reason"] = "fail", "forward raised on tpu for every sample"
        elif result["samples_bwd"] == 0:
            result["bwd_reason"] = "no differentiable float output/input in the tried samples"
        elif bwd_fail:
            result["bwd"], result["bwd_reason"] = "fail", bwd_fail
        else:
            result["bwd"] = "fallback" if bwd_fallback else "pass"
            result["closeness_bwd"] = round(self.closeness, 4)
        return result

    def recover(self):
        # After an error in fused mode, flush whatever is pending so the next op starts clean.
        try:
            self.torchtpu.sync(wait=True)
        except Exception:  # noqa: BLE001
            pass


def serve(fd: int, keys: list, run):
    """A worker's loop (this tool's and tools/module_coverage.py's): announces `keys` on the pipe
    `fd`, then answers each request on stdin with run(key, request, progress)'s result."""
    out = os.fdopen(fd, "w", buffering=1)

    def send(message):
        out.write(json.dumps(message) + "\n")
        out.flush()

    send({"type": "ready", "ops": keys})
    for line in sys.stdin:
        request = json.loads(line)
        key = request["op"]
        start = time.monotonic()
        try:
            result = run(key, request, lambda p: send({"type": "progress", "op": key, **p}))
        except Exception as error:  # noqa: BLE001  (a bug in the harness, not the op)
            result = {"fwd": "fail", "bwd": "n/a", "reason": _error("harness error", error)}
        result["seconds"] = round(time.monotonic() - start, 3)
        send({"type": "done", "op": key, "result": result})


def worker_main(fd: int):
    worker = _Worker()
    serve(fd, list(worker.ops), lambda key, request, progress: worker.run_op(
        key, request["samples"], request["backward"], progress, request.get("dtype", "float32")))


# =========================================================================================
# Parent side: schedules ops on worker subprocesses; imports neither torch nor torchtpu.
# =========================================================================================

class WorkerProcess:
    def __init__(self, env, log_dir, index, script=__file__):
        self.log_path = os.path.join(log_dir, f"worker{index}-{time.monotonic_ns()}.log")
        self.log = open(self.log_path, "wb")
        read_fd, write_fd = os.pipe()
        self.proc = subprocess.Popen(
            [sys.executable, os.path.abspath(script), "--worker", str(write_fd)],
            stdin=subprocess.PIPE, stdout=self.log, stderr=subprocess.STDOUT, env=env, cwd=ROOT,
            pass_fds=(write_fd,), start_new_session=True)
        os.close(write_fd)
        self.fd = read_fd
        self.buffer = b""
        self.op = None
        self.deadline = None
        self.progress = {}
        self.ops_done = 0

    def send(self, message):
        self.proc.stdin.write((json.dumps(message) + "\n").encode())
        self.proc.stdin.flush()

    def read_messages(self):
        """Messages now available; None at EOF (the worker died)."""
        chunk = os.read(self.fd, 1 << 20)
        if not chunk:
            return None
        self.buffer += chunk
        *lines, self.buffer = self.buffer.split(b"\n")
        return [json.loads(line) for line in lines if line.strip()]

    def wait_ready(self, timeout):
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise RuntimeError(f"worker did not start within {timeout}s; log: {self.log_tail()}")
            ready, _, _ = select.select([self.fd], [], [], left)
            if ready:
                messages = self.read_messages()
                if messages is None:
                    raise RuntimeError(f"worker died while starting; log: {self.log_tail()}")
                for m in messages:
                    if m["type"] == "ready":
                        return m

    def log_tail(self, chars=1500):
        try:
            self.log.flush()
            with open(self.log_path, "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - chars))
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def kill(self):
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.close()

    def close(self):
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        try:
            os.close(self.fd)
        except OSError:
            pass
        self.log.close()


def _exit_description(returncode):
    if returncode is None:
        return "worker died"
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"worker exited with status {returncode}"


def _crash_log(text):
    """The informative part of a dead worker's log: faulthandler's fatal error line and the
    innermost Python frames, or else the last lines (C++ abort messages end up there)."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    lines = [line for line in lines if not line.startswith("Extension modules:") and "(total: " not in line]
    fatal = [i for i, line in enumerate(lines) if line.startswith("Fatal Python error")]
    if fatal:
        i = fatal[-1]
        before = lines[max(0, i - 3):i]  # e.g. a C++ "terminate called ..." message
        frames = [line for line in lines[i + 1:] if line.startswith("File ")][:3]
        return " | ".join(before + [lines[i]] + frames)
    return " | ".join(lines[-6:])


def run(ops=None, samples=3, backward=True, timeout=60.0, jobs=1, mode="fused", cache_dir=None,
        verbose=False, max_ops_per_worker=0, log=None, dtype="float32", script=__file__):
    """Runs the coverage; returns {"meta": ..., "summary": ..., "ops": {key: record}}.
    `script` is the tool whose `--worker` runs the entries (tools/module_coverage.py reuses
    this scheduler for ModuleInfo and OptimizerInfo entries)."""
    log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    start = time.monotonic()
    own_cache = cache_dir is None
    cache_dir = cache_dir or tempfile.mkdtemp(prefix="torchtpu-opcov-cache-")
    log_dir = tempfile.mkdtemp(prefix="torchtpu-opcov-logs-")
    env = dict(os.environ)
    env["TORCHTPU_CACHE_DIR"] = cache_dir
    env["TORCHTPU_MODE"] = mode
    env["TORCHTPU_FALLBACK"] = "silent"
    env["PYTHONPATH"] = ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PYTHONFAULTHANDLER"] = "1"  # a Python stack in the log when a worker crashes
    env["PYTHONHASHSEED"] = "0"  # set order in sample functions: the same in every worker

    results = {}
    workers = []
    try:
        first = WorkerProcess(env, log_dir, 0, script)
        all_ops = first.wait_ready(300)["ops"]
        workers.append(first)
        if ops:
            wanted = [o.strip() for o in ops if o.strip()]
            unknown = [o for o in wanted if o not in all_ops]
            if unknown:
                raise ValueError(f"unknown names: {unknown}")
            todo = wanted
        else:
            todo = list(all_ops)
        for i in range(1, max(1, min(jobs, len(todo)))):
            w = WorkerProcess(env, log_dir, i, script)
            w.wait_ready(300)
            workers.append(w)
        queue = collections.deque(todo)
        total = len(todo)

        def finish(key, record):
            results[key] = record
            if verbose or record["fwd"] in ("crash", "timeout") or record.get("bwd") in ("crash", "timeout"):
                log(f"[{len(results)}/{total}] {key}: fwd={record['fwd']} bwd={record.get('bwd')} "
                    f"{record.get('reason', '')[:160]} {record.get('bwd_reason', '')[:160]}")
            elif len(results) % 50 == 0:
                log(f"[{len(results)}/{total}] {time.monotonic() - start:.0f}s")

        def restart(i):
            workers[i] = WorkerProcess(env, log_dir, i, script)
            workers[i].wait_ready(300)

        def dead_record(w, status, detail):
            phase = w.progress.get("phase", "start")
            partial = w.progress.get("partial")
            if partial and phase in ("fwd-done", "bwd"):
                record = dict(partial)
                record["bwd"] = status
                record["bwd_reason"] = _short(f"{status} in backward (sample {w.progress.get('sample')}): {detail}")
            else:
                record = {"fwd": status, "bwd": status, "fallback_fwd": {}, "fallback_bwd": {},
                          "reason": _short(f"{status} in forward (sample {w.progress.get('sample')}): {detail}"),
                          "bwd_reason": ""}
            record["seconds"] = round(time.monotonic() - w.started, 3)
            record["crash_phase"] = phase
            record["crash_sample"] = w.progress.get("sample")
            return record

        while queue or any(w.op for w in workers):
            for i, w in enumerate(workers):
                if w.op is None and queue:
                    if max_ops_per_worker and w.ops_done >= max_ops_per_worker:
                        w.close()
                        restart(i)
                        w = workers[i]
                    w.op = queue.popleft()
                    w.progress = {}
                    w.started = time.monotonic()
                    w.deadline = w.started + timeout
                    w.send({"op": w.op, "samples": samples, "backward": backward, "dtype": dtype})
            busy = [w for w in workers if w.op]
            if not busy:
                break
            wait = max(0.0, min(w.deadline for w in busy) - time.monotonic())
            ready, _, _ = select.select([w.fd for w in busy], [], [], wait)
            for i, w in enumerate(workers):
                if not w.op:
                    continue
                if w.fd in ready:
                    messages = w.read_messages()
                    if messages is None:  # the worker died: a crash of this op
                        w.proc.wait()
                        detail = _exit_description(w.proc.returncode) + "; " + _crash_log(w.log_tail(20000))
                        finish(w.op, dead_record(w, "crash", detail))
                        w.close()
                        restart(i)
                        continue
                    for m in messages:
                        if m["type"] == "progress":
                            w.progress = m
                        elif m["type"] == "done":
                            finish(m["op"], m["result"])
                            w.op = None
                            w.ops_done += 1
                elif time.monotonic() >= w.deadline:
                    finish(w.op, dead_record(w, "timeout", f"no result within {timeout:g}s"))
                    w.kill()
                    restart(i)
    finally:
        for w in workers:
            w.kill()
        if own_cache:
            shutil.rmtree(cache_dir, ignore_errors=True)
        shutil.rmtree(log_dir, ignore_errors=True)

    elapsed = time.monotonic() - start
    ordered = {k: results[k] for k in todo if k in results}
    meta = _meta(samples, backward, timeout, jobs, mode, elapsed)
    meta["dtype"] = dtype
    return {"meta": meta,
            "summary": summarize(ordered), "ops": ordered}


def _meta(samples, backward, timeout, jobs, mode, elapsed):
    meta = {"samples_per_op": samples, "backward": backward, "timeout_s": timeout, "jobs": jobs,
            "mode": mode, "runtime_s": round(elapsed, 1), "date": time.strftime("%Y-%m-%d %H:%M:%S")}
    try:
        import importlib.metadata as md

        meta["torch"] = md.version("torch")
        meta["jaxlib"] = md.version("jaxlib")
    except Exception:  # noqa: BLE001
        pass
    try:
        meta["git_commit"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                                            capture_output=True, text=True).stdout.strip()
    except OSError:
        pass
    return meta


def summarize(records: dict) -> dict:
    total = len(records)
    fwd = collections.Counter(r["fwd"] for r in records.values())
    bwd = collections.Counter(r.get("bwd", "n/a") for r in records.values())
    applicable = total - fwd["n/a"]
    bwd_applicable = total - bwd["n/a"]
    by_ops = collections.Counter()   # aten op -> number of OpInfo ops where it fell back
    by_calls = collections.Counter()  # aten op -> number of fallback calls
    for r in records.values():
        seen = set()
        for part in ("fallback_fwd", "fallback_bwd"):
            for aten, count in (r.get(part) or {}).items():
                by_calls[aten] += count
                seen.add(aten)
        by_ops.update(seen)

    def pct(n, d):
        return round(100.0 * n / d, 1) if d else 0.0

    return {
        "ops_total": total,
        "not_applicable": fwd["n/a"],
        "applicable": applicable,
        "forward": {s: fwd[s] for s in STATUSES},
        "backward": {s: bwd[s] for s in STATUSES},
        "backward_applicable": bwd_applicable,
        "forward_passing": fwd["pass"] + fwd["fallback"],
        "forward_passing_no_fallback": fwd["pass"],
        "forward_pass_pct_of_applicable": pct(fwd["pass"] + fwd["fallback"], applicable),
        "forward_pass_no_fallback_pct_of_applicable": pct(fwd["pass"], applicable),
        "forward_pass_pct_of_all": pct(fwd["pass"] + fwd["fallback"], total),
        "backward_passing": bwd["pass"] + bwd["fallback"],
        "backward_passing_no_fallback": bwd["pass"],
        "backward_pass_pct_of_applicable": pct(bwd["pass"] + bwd["fallback"], bwd_applicable),
        # Passing ops within a factor 1/NEAR_MISS of their tolerance: the margin floors need.
        "near_misses_fwd": sorted(k for k, r in records.items() if r.get("closeness_fwd", 0) > NEAR_MISS),
        "near_misses_bwd": sorted(k for k, r in records.items() if r.get("closeness_bwd", 0) > NEAR_MISS),
        "crashes": sorted(k for k, r in records.items() if "crash" in (r["fwd"], r.get("bwd"))),
        "timeouts": sorted(k for k, r in records.items() if "timeout" in (r["fwd"], r.get("bwd"))),
        "fallback_aten_ops_by_opinfo_count": by_ops.most_common(),
        "fallback_aten_ops_by_call_count": by_calls.most_common(),
    }


def _cell(text, limit):
    text = " ".join(str(text).split()).replace("|", "\\|")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def write_markdown(data: dict, path: str, top: int = 30):
    s, meta = data["summary"], data["meta"]
    f, b = s["forward"], s["backward"]
    lines = [
        "# OpInfo coverage",
        "",
        "Generated by `tools/op_coverage.py` (do not edit by hand): PyTorch's OpInfo database "
        "(`op_db`), float32 sample inputs (seeded), tpu against CPU with `torch.testing.assert_close` "
        "(equal_nan) at its defaults (rtol 1.3e-6, atol 1e-5), or at the op's own float32 tolerance where "
        "PyTorch's test suite grants one (its OpInfo `toleranceOverride`s). Backward compares the gradients of the sum of "
        "the float outputs w.r.t. the float inputs. An op passes only if every tried sample passes; "
        "`fallback` means it passed but some aten ops ran on CPU. Random ops (the CPU result depends "
        "on the seed, or OpInfo wraps them in `wrapper_set_seed`) and `empty*` ops are compared on "
        "shapes and dtypes only when their values differ from CPU's. Where outputs differ and OpInfo "
        "gives the sample an `output_process_fn_grad` (its gauge-invariant view: |U|, S, U @ Vh of an "
        "SVD, |V| of eigh), that view is compared: vector signs are each LAPACK's own choice. "
        "Crashes (the worker process died) "
        "and timeouts are per op; a worker is restarted after each.",
        "",
        f"Run: torch {meta.get('torch')}, jaxlib {meta.get('jaxlib')}, commit {meta.get('git_commit')}, "
        f"mode `{meta['mode']}`, {meta['samples_per_op']} samples/op, backward {'on' if meta['backward'] else 'off'}, "
        f"timeout {meta['timeout_s']:g}s/op, {meta['jobs']} worker(s), {meta['runtime_s']:.0f}s, {meta['date']}.",
        "",
        "## Summary",
        "",
        "| | forward | backward |",
        "|---|---:|---:|",
        f"| OpInfo ops tried | {s['ops_total']} | {s['ops_total']} |",
        f"| not applicable (no float32 / no usable sample / no autograd) | {f['n/a']} | {b['n/a']} |",
        f"| applicable | {s['applicable']} | {s['backward_applicable']} |",
        f"| pass without fallback | {f['pass']} | {b['pass']} |",
        f"| pass with CPU fallback | {f['fallback']} | {b['fallback']} |",
        f"| fail | {f['fail']} | {b['fail']} |",
        f"| crash | {f['crash']} | {b['crash']} |",
        f"| timeout | {f['timeout']} | {b['timeout']} |",
        "",
        f"- Forward passing: **{s['forward_passing']} / {s['applicable']} applicable = "
        f"{s['forward_pass_pct_of_applicable']}%** ({s['forward_pass_pct_of_all']}% of all {s['ops_total']} OpInfo ops).",
        f"- Forward passing without any fallback: **{s['forward_passing_no_fallback']} = "
        f"{s['forward_pass_no_fallback_pct_of_applicable']}%** of applicable.",
        f"- Backward passing: {s['backward_passing']} / {s['backward_applicable']} = "
        f"{s['backward_pass_pct_of_applicable']}% ({s['backward_passing_no_fallback']} without fallback).",
        f"- Crashes: {', '.join(s['crashes']) or 'none'}. Timeouts: {', '.join(s['timeouts']) or 'none'}.",
        f"- Near misses (passing with an error above {NEAR_MISS:g} of the allowed error): forward "
        f"{', '.join(s['near_misses_fwd']) or 'none'}; backward {', '.join(s['near_misses_bwd']) or 'none'}.",
        "",
        f"## Most common CPU-fallback aten ops (top {top})",
        "",
        "Counted as the number of OpInfo ops (forward or backward) in which the aten op fell back.",
        "",
        "| aten op | OpInfo ops | calls |",
        "|---|---:|---:|",
    ]
    calls = dict(s["fallback_aten_ops_by_call_count"])
    for aten, n in s["fallback_aten_ops_by_opinfo_count"][:top]:
        lines.append(f"| `{aten}` | {n} | {calls.get(aten, 0)} |")
    lines += by_dtype_section(path)
    lines += [
        "",
        "## Per op",
        "",
        "| OpInfo | fwd | bwd | fallen-back aten ops | reason |",
        "|---|---|---|---|---|",
    ]
    for key, r in data["ops"].items():
        fb = sorted(set(r.get("fallback_fwd") or {}) | set(r.get("fallback_bwd") or {}))
        fb = [a.replace("aten::", "") for a in fb]
        reason = r.get("reason", "")
        if r.get("bwd") in ("fail", "crash", "timeout") and r.get("bwd_reason"):
            reason = (reason + " | bwd: " if reason else "bwd: ") + r["bwd_reason"]
        lines.append(f"| `{key}` | {r['fwd']} | {r.get('bwd', 'n/a')} | {_cell(', '.join(fb), 120)} | "
                     f"{_cell(reason, 160)} |")
    with open(path, "w") as out:
        out.write("\n".join(lines) + "\n")


def dtype_json_path(md_path: str, dtype: str) -> str:
    """Where the JSON of a `dtype` run lies: op_coverage.json for float32, op_coverage_<dtype>.json else."""
    base = os.path.splitext(md_path)[0]
    return base + (".json" if dtype == "float32" else f"_{dtype}.json")


def by_dtype_section(md_path: str) -> list:
    """The "By dtype" table: one column per dtype whose run's JSON sits beside the markdown."""
    columns = []
    for dtype in ("float32",) + OTHER_DTYPES:
        try:
            with open(dtype_json_path(md_path, dtype)) as f:
                data = json.load(f)
        except (OSError, ValueError):
            continue
        columns.append((dtype, data["summary"], data["meta"]))
    if len(columns) < 2:
        return []
    rows = [("OpInfo ops with samples of the dtype (applicable)", lambda s: s["applicable"]),
            ("forward passing", lambda s: f"{s['forward_passing']} ({s['forward_pass_pct_of_applicable']}%)"),
            ("forward passing without fallback",
             lambda s: f"{s['forward_passing_no_fallback']} ({s['forward_pass_no_fallback_pct_of_applicable']}%)"),
            ("forward fail", lambda s: s["forward"]["fail"]),
            ("backward applicable", lambda s: s["backward_applicable"]),
            ("backward passing", lambda s: f"{s['backward_passing']} ({s['backward_pass_pct_of_applicable']}%)"),
            ("crash / timeout", lambda s: f"{len(s['crashes'])} / {len(s['timeouts'])}")]
    lines = ["", "## By dtype", "",
             "The same run per dtype (`tools/op_coverage.py --dtype D`; each dtype's own OpInfo samples "
             "and PyTorch's own tolerances for it, assert_close's dtype defaults otherwise). Per-op results of the "
             "other dtypes are in their JSON files beside this one.", "",
             "| | " + " | ".join(d for d, _, _ in columns) + " |",
             "|---|" + "---:|" * len(columns)]
    for label, cell in rows:
        lines.append(f"| {label} | " + " | ".join(str(cell(s)) for _, s, _ in columns) + " |")
    lines.append("| run (commit, samples/op, seconds) | " + " | ".join(
        f"{m.get('git_commit')}, {m['samples_per_op']}, {m['runtime_s']:.0f}" for _, _, m in columns) + " |")
    return lines


def rewrite_dtype_section(md_path: str) -> None:
    """Replaces the "By dtype" section of an existing markdown file (after a non-float32 run)."""
    with open(md_path) as f:
        text = f.read()
    head, sep, rest = text.partition("\n## Per op\n")
    if not sep:
        return
    start = head.find("\n\n## By dtype\n")
    if start >= 0:
        head = head[:start]
    with open(md_path, "w") as f:
        f.write(head.rstrip("\n") + "\n" + "\n".join(by_dtype_section(md_path)) + "\n" + sep + rest)


# =========================================================================================
# The floor: the set of (op, dtype, direction) entries that pass (tests/opinfo_floor.txt).
# =========================================================================================

FLOOR_PATH = os.path.join(ROOT, "tests", "opinfo_floor.txt")
FLOOR_COMMAND = "PYTHONPATH=. .venv/bin/python tools/op_coverage.py --samples 2 --update-floor"
# What an entry holds, weakest first: "-" holds nothing, "fallback" that the op matches CPU,
# "pass" that it also runs without any CPU fallback.
FLOOR_LEVELS = ("-", "fallback", "pass")
FLOOR_HEADER = f"""\
# OpInfo ops that pass on tpu against CPU: tests/test_opinfo.py fails naming any entry that
# no longer holds, and reports the ones that pass better than held here. Columns: OpInfo name
# (name.variant), sample dtype, forward, backward; each status is the least the op must keep:
#   pass      matches CPU and nothing fell back to CPU
#   fallback  matches CPU, some aten ops ran on CPU
#   -         nothing held: fails, not applicable, or a near miss (passing with an error above
#             {NEAR_MISS:g} of the allowed one, which another machine's rounding may flip; the
#             comment gives its closeness)
# Raise entries with one full run (2 samples/op, fused mode, as the test; a few minutes):
#   {FLOOR_COMMAND}
# It only raises entries; lowering one (an op that stopped passing for a good reason) is a
# hand edit of this file, with the reason in the commit.
"""


def _level(status: str) -> int:
    return FLOOR_LEVELS.index(status) if status in FLOOR_LEVELS else 0


def floor_entries(data: dict) -> dict:
    """{(op, dtype): (forward, backward, comment)} held by a run: its passing statuses, with
    near misses held at "-"."""
    dtype = data["meta"].get("dtype", "float32")
    entries = {}
    for key, record in data["ops"].items():
        held, notes = [], []
        for direction in ("fwd", "bwd"):
            status = record.get(direction, "n/a")
            closeness = record.get(f"closeness_{direction}", 0)
            if status in ("pass", "fallback") and closeness > NEAR_MISS:
                notes.append(f"{direction} near miss (closeness {closeness})")
                status = "-"
            held.append(status if status in FLOOR_LEVELS else "-")
        entries[(key, dtype)] = (held[0], held[1], "; ".join(notes))
    return entries


def read_floor(path: str = FLOOR_PATH) -> dict:
    """{(op, dtype): (forward, backward, comment)} from a floor file."""
    entries = {}
    with open(path) as f:
        for line in f:
            text, _, comment = line.partition("#")
            if not text.strip():
                continue
            op, dtype, fwd, bwd = text.split()
            entries[(op, dtype)] = (fwd, bwd, comment.strip())
    return entries


def write_floor(entries: dict, path: str = FLOOR_PATH, header: str = FLOOR_HEADER) -> None:
    """Writes the entries that hold something (or carry a comment), sorted by op and dtype."""
    width = max(len(op) for op, _ in entries) + 1
    with open(path, "w") as f:
        f.write(header)
        for (op, dtype), (fwd, bwd, comment) in sorted(entries.items()):
            if fwd == "-" and bwd == "-" and not comment:
                continue
            line = f"{op:<{width}}{dtype:<9}{fwd:<9}{bwd}"
            f.write((f"{line:<{width + 30}}# {comment}" if comment else line).rstrip() + "\n")


def compare_floor(held: dict, data: dict, database: str = "OpInfo") -> tuple[list, list]:
    """(lost, gained): descriptions of held entries a run no longer reaches (with the reason),
    and of entries it passes better than held."""
    measured = floor_entries(data)
    dtype = data["meta"].get("dtype", "float32")
    lost, gained = [], []
    for (op, entry_dtype), (fwd, bwd, _) in held.items():
        if entry_dtype != dtype:
            continue
        record = data["ops"].get(op)
        if record is None:
            lost.append(f"{op} ({dtype}): not in this torch's {database} database")
            continue
        for direction, want in (("fwd", fwd), ("bwd", bwd)):
            got = record.get(direction, "n/a")
            if _level(got) < _level(want):
                reason = record.get("reason" if direction == "fwd" else "bwd_reason", "")
                if got == "fallback":
                    reason = "fell back: " + ", ".join(sorted(record.get(f"fallback_{direction}") or {}))
                lost.append(f"{op} ({dtype}) {direction}: held {want}, now {got}: {reason[:200]}")
    for key, (fwd, bwd, _) in measured.items():
        was = held.get(key, ("-", "-", ""))
        for direction, got, want in (("fwd", fwd, was[0]), ("bwd", bwd, was[1])):
            if _level(got) > _level(want):
                gained.append(f"{key[0]} ({key[1]}) {direction}: held {want}, now {got}")
    return lost, gained


def update_floor(data: dict, path: str = FLOOR_PATH, header: str = FLOOR_HEADER) -> list:
    """Raises the file's entries to what the run reached (never lowers one); returns the raised ones."""
    held = read_floor(path) if os.path.exists(path) else {}
    _, gained = compare_floor(held, data)
    for key, (fwd, bwd, comment) in floor_entries(data).items():
        old = held.get(key, ("-", "-", ""))
        new = tuple(max(a, b, key=_level) for a, b in zip(old[:2], (fwd, bwd)))
        held[key] = (*new, comment if new != old[:2] or not old[2] else old[2])
    write_floor(held, path, header)
    return gained


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--samples", type=int, default=3, help="sample inputs per op (default 3)")
    parser.add_argument("--no-backward", action="store_true", help="forward only")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds per op (default 60)")
    parser.add_argument("--jobs", type=int, default=1, help="worker processes (default 1)")
    parser.add_argument("--mode", default="fused", choices=("fused", "strict", "debug"))
    parser.add_argument("--ops", help="comma-separated OpInfo names (name or name.variant); default all")
    parser.add_argument("--dtype", default="float32", choices=("float32",) + OTHER_DTYPES,
                        help="sample dtype (default float32; others fill the markdown's By dtype table)")
    parser.add_argument("--json", help="default: docs/op_coverage.json (float32) or docs/op_coverage_<dtype>.json")
    parser.add_argument("--md", default=os.path.join(ROOT, "docs", "op_coverage.md"))
    parser.add_argument("--no-md", action="store_true", help="write neither the markdown nor the JSON file")
    parser.add_argument("--update-floor", nargs="?", const=FLOOR_PATH, metavar="FILE",
                        help="raise the entries of the OpInfo floor (default tests/opinfo_floor.txt) to what "
                             "this run passes; implies --no-md")
    parser.add_argument("--max-ops-per-worker", type=int, default=0,
                        help="restart a worker after this many ops (bounds memory growth; 0: never)")
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    if args.worker is not None:
        return worker_main(args.worker)
    data = run(ops=args.ops.split(",") if args.ops else None, samples=args.samples,
               backward=not args.no_backward, timeout=args.timeout, jobs=args.jobs, mode=args.mode,
               verbose=args.verbose, max_ops_per_worker=args.max_ops_per_worker, dtype=args.dtype)
    s = data["summary"]
    print(json.dumps({k: v for k, v in s.items() if not k.startswith("fallback_aten")}, indent=1))
    if args.update_floor:
        gained = update_floor(data, args.update_floor)
        print(f"raised {len(gained)} entries of {args.update_floor}:", *gained, sep="\n  ", file=sys.stderr)
        lost, _ = compare_floor(read_floor(args.update_floor), data)
        if lost:
            print("held entries this run does not reach (kept; fix them, or lower them by hand):", *lost,
                  sep="\n  ", file=sys.stderr)
        return 1 if lost else 0
    if not args.no_md:
        json_path = args.json or dtype_json_path(args.md, args.dtype)
        with open(json_path, "w") as out:
            json.dump(data, out, indent=1, sort_keys=False)
            out.write("\n")
        if args.dtype == "float32":
            write_markdown(data, args.md)
        else:
            rewrite_dtype_section(args.md)
        print(f"wrote {args.md} and {json_path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
