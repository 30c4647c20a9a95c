"""Two builds of torchtpu side by side: per-op cost or a fused training step, measured in
fresh processes that alternate between the builds (same machine, same run), so a refactor's
speed change is told from the machine's noise.

    cp -r torchtpu torchtpu_autoload.py /tmp/before/     # a copy of the old build
    python bench/ab_builds.py --before /tmp/before --after . perop --rounds 6
    python bench/ab_builds.py --before /tmp/before --after . gpt --rounds 4   # or resnet

Each build directory holds a `torchtpu` package with its `_C` extension (it goes first on
PYTHONPATH). Reported: the median and the minimum over rounds of each round's best wall and
process-CPU times; for the training steps also the main thread's CPU time per step (median of
its steps: the host's tracing and launching, without XLA:CPU's threads running the step),
the steadiest of them on a loaded machine. On a shared machine a process may land on a busy core for its whole
life (times then jump by ~1.5x for both builds): compare minimums as well as medians.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
KEYS = {"perop": ["strict_wall_us", "strict_cpu_us", "fused_wall_us", "fused_cpu_us", "eager_wall_us",
                  "strict_over_eager"],
        "gpt": ["median_step_s", "min_step_s", "min_cpu_s", "median_host_cpu_s"],
        "resnet": ["median_step_s", "min_step_s", "min_cpu_s", "median_host_cpu_s"]}


def measure(what: str) -> dict:
    """Runs in the child process: one measurement with the torchtpu on PYTHONPATH."""
    sys.path.insert(0, HERE)
    import run as bench  # noqa: E402  (bench/run.py: models, runners, timed steps)
    import torch
    import torchtpu
    out = {"torchtpu": os.path.dirname(torchtpu.__file__)}
    if what == "perop":
        n = 5000
        a, b = torch.randn(16, device="tpu"), torch.randn(16, device="tpu")

        def loop():
            for _ in range(n):
                c = a + b
            return c
        # PyTorch CPU eager on the same add, in the same process: the per-op floor compared to.
        ca, cb = a.cpu(), b.cpu()
        walls = []
        for _ in range(4):  # the first pass warms up
            w = time.perf_counter()
            for _ in range(n):
                c = ca + cb
            walls.append((time.perf_counter() - w) / n * 1e6)
        out["eager_wall_us"] = min(walls[1:])
        for mode in ("strict", "fused"):
            with torchtpu.mode(mode):
                loop().cpu()
                walls, cpus = [], []
                for _ in range(3):
                    w, c = time.perf_counter(), time.process_time()
                    loop()
                    torch.tpu.synchronize()
                    walls.append((time.perf_counter() - w) / n * 1e6)
                    cpus.append((time.process_time() - c) / n * 1e6)
                out[mode + "_wall_us"], out[mode + "_cpu_us"] = min(walls), min(cpus)
                torchtpu.sync(wait=True)
        out["strict_over_eager"] = out["strict_wall_us"] / out["eager_wall_us"]
        return out
    setup = bench.model_setups("small", None)[what]
    runner = bench.make_runner("tpu-fused", setup, torchtpu)
    res = bench.prepare(runner, warmup=2)
    cpus, host = [], []
    for _ in range(8):
        c, h = time.process_time(), time.thread_time()
        bench.timed_step(runner, res)
        cpus.append(time.process_time() - c)
        host.append(time.thread_time() - h)
    res = bench.finish(res)
    out.update(median_step_s=res["median_step_s"], min_step_s=min(res["step_times"]), min_cpu_s=min(cpus),
               median_host_cpu_s=statistics.median(host))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=sorted(KEYS))
    parser.add_argument("--before", required=True, help="directory holding the old torchtpu package")
    parser.add_argument("--after", required=True, help="directory holding the new torchtpu package")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print("RESULT " + json.dumps(measure(args.what)), flush=True)
        return
    builds = {"before": os.path.abspath(args.before), "after": os.path.abspath(args.after)}
    got = {b: {k: [] for k in KEYS[args.what]} for b in builds}
    for r in range(args.rounds):
        order = list(builds.items()) if r % 2 == 0 else list(reversed(builds.items()))
        for name, path in order:
            env = dict(os.environ, PYTHONPATH=path)
            env.pop("TORCHTPU_CACHE_DIR", None)  # bench/run.py makes a private one per process
            p = subprocess.run([sys.executable, os.path.abspath(__file__), args.what, "--child", "--before", path,
                                "--after", path], cwd="/", env=env, capture_output=True, text=True, timeout=1800)
            lines = [line for line in p.stdout.splitlines() if line.startswith("RESULT ")]
            if not lines:
                sys.exit(f"{name} failed:\n{p.stdout[-2000:]}\n{p.stderr[-3000:]}")
            result = json.loads(lines[0][len("RESULT "):])
            if not result["torchtpu"].startswith(path):
                sys.exit(f"{name} imported torchtpu from {result['torchtpu']}, not {path}")
            for k in KEYS[args.what]:
                got[name][k].append(result[k])
            print(r, name, {k: round(result[k], 4) for k in KEYS[args.what]}, flush=True)
    for k in KEYS[args.what]:
        for stat in (statistics.median, min):
            before, after = (stat(got[b][k]) for b in ("before", "after"))
            print(f"{args.what} {k} ({stat.__name__} of rounds): before {before:.4g}  after {after:.4g}  "
                  f"after/before {after / before:.3f}")


if __name__ == "__main__":
    main()
