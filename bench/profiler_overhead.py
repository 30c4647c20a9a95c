"""What torchtpu's profiler events cost when no profiler runs: per-op time in strict and
fused mode of this build against the same sources built with every span compiled out
(-DTORCHTPU_TRACING=0, csrc/engine/trace.h), measured side by side in alternating fresh
processes by bench/ab_builds.py.

    python bench/profiler_overhead.py --rounds 6

The build without spans goes to build/notrace (objects) and build/notrace-package (the
package with its _C), so the checkout's own build is untouched.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def build_without_spans() -> str:
    """Builds the checkout with TORCHTPU_TRACING=0; returns the directory holding its package."""
    out = os.path.join(ROOT, "build", "notrace-package")
    package = os.path.join(out, "torchtpu")
    shutil.rmtree(package, ignore_errors=True)
    shutil.copytree(os.path.join(ROOT, "torchtpu"), package,
                    ignore=shutil.ignore_patterns("_native", "__pycache__"))
    shutil.copy(os.path.join(ROOT, "torchtpu_autoload.py"), out)
    subprocess.run(["make", "--no-print-directory", "extension", f"PY={sys.executable}",
                    f"BUILD_DIR={os.path.join('build', 'notrace')}", f"PACKAGE_DIR={package}",
                    "OPT=-O2 -DTORCHTPU_TRACING=0"], cwd=ROOT, check=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()
    without = build_without_spans()
    print("before = spans compiled out, after = this build (spans compiled in, no profiler running)", flush=True)
    subprocess.run([sys.executable, os.path.join(ROOT, "bench", "ab_builds.py"), "perop", "--before", without,
                    "--after", ROOT, "--rounds", str(args.rounds)], check=True)


if __name__ == "__main__":
    main()
