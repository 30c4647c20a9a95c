"""Where a strict-mode op's time goes: py-spy --native over a loop of small adds, samples
classified by the layers their frames show (issue 18; the table in docs/benchmarks.md).

    python bench/strict_profile.py                  # needs py-spy (requirements.txt)
    python bench/strict_profile.py --raw out.raw    # keep py-spy's raw samples

Only samples taken on the loop's line count. A sample goes to the innermost layer it
shows, in the order of CATEGORIES. jaxlib's native frames come unattached to the Python
frames above them, so "jaxlib" is everything below the call into jaxlib. The sampler slows
the loop several-fold: read the shares, not the times.
"""
from __future__ import annotations

import argparse
import collections
import os
import subprocess
import sys
import tempfile
import time

# (category, substrings of a frame that put a sample in it), first match wins.
CATEGORIES = [
    ("jaxlib: freeing result arrays", ("PyArray_tp_dealloc", "~PyArray", "PjRtArray::~")),
    ("jaxlib: wrapping results as jax.Arrays", ("Disassemble", "ConsumeWithHandlers", "ResultHandler",
                                                "make_single_device_sharding", "module_import")),
    ("jaxlib: execute call", ("libjax_common", "jaxlib")),
    ("GIL handling", ("gil_scoped", "PyGILState", "PyEval_RestoreThread", "take_gil")),
    ("torchtpu: argument/result marshalling (pybind11)", ("JaxlibRuntime::execute", "pybind11")),
    ("torchtpu: record, graph, cache lookup", ("torchtpu::",)),
    ("PyTorch: freeing the result tensor", ("THPVariable_dealloc", "~FunctionalTensorWrapper", "~TensorImpl")),
    ("PyTorch: dispatch (Python binding, autograd, functionalization)", ("libtorch", "libc10", "at::", "c10::")),
]


def loop(n: int) -> None:
    import torch
    import torchtpu
    a, b = torch.randn(16, device="tpu"), torch.randn(16, device="tpu")
    with torchtpu.mode("strict"):
        for _ in range(200):
            c = a + b
        torch.tpu.synchronize()
        t = time.perf_counter()
        for _ in range(n):
            c = a + b  # LOOP
        torch.tpu.synchronize()
    print(f"strict: {(time.perf_counter() - t) / n * 1e6:.1f} us/op under the sampler ({c.shape})")


def loop_line() -> str:
    with open(__file__) as f:
        for i, line in enumerate(f, 1):
            if line.rstrip().endswith("# LOOP"):
                return f"strict_profile.py:{i}"
    raise RuntimeError("loop line not found")


def classify(raw_path: str) -> tuple[int, collections.Counter]:
    needle, total, shares = loop_line(), 0, collections.Counter()
    with open(raw_path) as f:
        for line in f:
            stack, n = line.rstrip().rsplit(" ", 1)
            if needle not in stack:
                continue
            total += int(n)
            shares[next((name for name, keys in CATEGORIES if any(k in stack for k in keys)),
                        "Python interpreter / other")] += int(n)
    return total, shares


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ops", type=int, default=40000)
    ap.add_argument("--rate", type=int, default=500, help="py-spy samples per second")
    ap.add_argument("--raw", default=None, help="keep py-spy's raw output here")
    ap.add_argument("--loop", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.loop:
        return loop(args.ops)
    raw = args.raw or os.path.join(tempfile.mkdtemp(prefix="torchtpu-strict-profile-"), "samples.raw")
    py_spy = os.path.join(os.path.dirname(sys.executable), "py-spy")
    subprocess.run([py_spy if os.path.exists(py_spy) else "py-spy", "record", "--native", "-r", str(args.rate),
                    "-f", "raw", "-o", raw, "--", sys.executable, os.path.abspath(__file__), "--loop",
                    "--ops", str(args.ops)], check=True)
    total, shares = classify(raw)
    print(f"\n{total} samples on the loop's line\n\n| share of a strict op | |\n|---|---|")
    for name, n in shares.most_common():
        print(f"| {name} | {n / max(1, total) * 100:.0f}% |")


if __name__ == "__main__":
    main()
