"""The two runtimes side by side (TORCHTPU_RUNTIME=jaxlib vs pjrt): the per-op cost of a small
add in strict mode against PyTorch eager on the host (measured in the same process, so the
ratio is robust on a busy machine), the GPT training step in strict, fused and compiled mode,
and the first step's compile time with an empty cache. The runtime is chosen when torchtpu
loads, so each runtime runs in its own fresh processes, taken in turns (jaxlib, pjrt,
jaxlib, pjrt, ...), each with an empty cache. Part of `make bench` (section "runtimes");
runs alone too:

    python bench/runtimes.py [--rounds 3] [--ops 10000] [--size small|full]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
RUNTIMES = ("jaxlib", "pjrt")
STEP_VARIANTS = ("tpu-strict", "tpu-fused", "tpu-compile")
# Timed steps per variant. On a shared machine the median wall time of a few steps swings
# by 2x with the load (measured: a runtime "slower" in one run was faster in the next), so the
# table also gives the best step and the CPU time per step (all threads), which the load
# stretches far less.
STEP_REPEATS = 10


def child(runtime: str, ops: int, steps: bool, size: str) -> None:
    """In a fresh process under TORCHTPU_RUNTIME=<runtime>: prints one RUNTIME line of JSON."""
    sys.path.insert(0, HERE)
    import run  # the main benchmark's models, runners and per-op loop

    torchtpu = run.load_torchtpu()
    out = {"runtime": torchtpu._C.runtime_info()["runtime"], "perop": run.run_perop(torchtpu, n=ops)}
    if steps:
        args = argparse.Namespace(size=size, batch=None)
        setup = run.model_setups(size, None)["gpt"]
        for variant in STEP_VARIANTS:
            runner = run.make_runner(variant, setup, torchtpu)
            try:
                res = run.prepare(runner, warmup=1)
                cpu = time.process_time()
                for _ in range(STEP_REPEATS):
                    run.timed_step(runner, res)
                cpu_step_s = (time.process_time() - cpu) / STEP_REPEATS
                res = run.finish(res)
            finally:
                runner.close()
            out[variant] = {"median_step_s": res["median_step_s"], "best_step_s": min(res["step_times"]),
                            "cpu_step_s": cpu_step_s, "first_step_s": res["first_step_s"],
                            "first_step_compile_s": res.get("first_step_compile_s"),
                            "final_loss": res["final_loss"]}
    print("RUNTIME " + json.dumps(out), flush=True)


def run_child(runtime: str, ops: int, steps: bool, timeout: float, size: str) -> dict:
    cache = tempfile.mkdtemp(prefix="torchtpu-bench-runtimes-")
    env = dict(os.environ, TORCHTPU_RUNTIME=runtime, TORCHTPU_CACHE_DIR=cache)
    cmd = [sys.executable, os.path.abspath(__file__), "--child", runtime, "--ops", str(ops), "--size", size] + \
        (["--steps"] if steps else [])
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    line = [ln for ln in p.stdout.splitlines() if ln.startswith("RUNTIME ")]
    if p.returncode != 0 or not line:
        raise RuntimeError(f"{runtime}: rc={p.returncode}: {(p.stderr or p.stdout).strip()[-800:]}")
    result = json.loads(line[-1][len("RUNTIME "):])
    if result["runtime"] != runtime:
        raise RuntimeError(f"asked for the {runtime} runtime, the child ran {result['runtime']}")
    return result


def run_runtimes(rounds: int = 3, ops: int = 10_000, timeout: float = 900, size: str = "small") -> dict:
    """Per runtime: the median over `rounds` per-op children, and one child timing the steps."""
    perop = {r: [] for r in RUNTIMES}
    steps = {}
    for round_index in range(rounds):
        for runtime in RUNTIMES if round_index % 2 == 0 else reversed(RUNTIMES):
            result = run_child(runtime, ops, steps=round_index == 0, timeout=timeout, size=size)
            perop[runtime].append(result["perop"])
            if round_index == 0:
                steps[runtime] = {v: result[v] for v in STEP_VARIANTS}
            p = result["perop"]
            print(f"  {runtime:6s} round {round_index}: strict add {p['strict_us']:.2f} us vs eager "
                  f"{p['host_eager_us']:.2f} us ({p['strict_us'] / p['host_eager_us']:.1f}x)", flush=True)
    summary = {}
    for runtime in RUNTIMES:
        rows = perop[runtime]
        summary[runtime] = {
            "strict_us": statistics.median(r["strict_us"] for r in rows),
            "host_eager_us": statistics.median(r["host_eager_us"] for r in rows),
            "strict_over_eager": statistics.median(r["strict_us"] / r["host_eager_us"] for r in rows),
            "strict_cpu_us": statistics.median(r["strict_cpu_us"] for r in rows),
            "fused_trace_us": statistics.median(r["fused_trace_us"] for r in rows),
            "steps": steps.get(runtime, {}),
        }
    return {"rounds": rounds, "ops": ops, "size": size, "runtimes": summary}


def runtimes_table(result: dict) -> str:
    from common import markdown_table

    jaxlib, pjrt = (result["runtimes"][r] for r in RUNTIMES)
    rows = [
        ["strict add (16 floats), us/op", f"{jaxlib['strict_us']:.2f}", f"{pjrt['strict_us']:.2f}"],
        ["PyTorch eager add, same process, us/op", f"{jaxlib['host_eager_us']:.2f}", f"{pjrt['host_eager_us']:.2f}"],
        ["strict / eager (goal <= 3x)", f"{jaxlib['strict_over_eager']:.1f}x", f"{pjrt['strict_over_eager']:.1f}x"],
        ["strict add, CPU time of all threads, us/op", f"{jaxlib['strict_cpu_us']:.2f}", f"{pjrt['strict_cpu_us']:.2f}"],
        ["fused tracing, us/op", f"{jaxlib['fused_trace_us']:.2f}", f"{pjrt['fused_trace_us']:.2f}"],
    ]
    for variant in STEP_VARIANTS:
        a, b = jaxlib["steps"].get(variant), pjrt["steps"].get(variant)
        if a and b:
            rows.append([f"gpt {variant} step, ms", f"{a['median_step_s'] * 1e3:.1f}", f"{b['median_step_s'] * 1e3:.1f}"])
            rows.append([f"gpt {variant} best step, ms", f"{a['best_step_s'] * 1e3:.1f}", f"{b['best_step_s'] * 1e3:.1f}"])
            rows.append([f"gpt {variant} CPU time per step (all threads), ms", f"{a['cpu_step_s'] * 1e3:.1f}",
                         f"{b['cpu_step_s'] * 1e3:.1f}"])
            rows.append([f"gpt {variant} first step (cold), s", f"{a['first_step_s']:.2f}", f"{b['first_step_s']:.2f}"])
            rows.append([f"gpt {variant} final loss", f"{a['final_loss']:.5f}", f"{b['final_loss']:.5f}"])
    return markdown_table([f"{result['ops']} ops, median of {result['rounds']} processes each", "jaxlib", "pjrt"], rows)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--ops", type=int, default=10_000)
    ap.add_argument("--size", choices=["small", "full"], default="small", help="the GPT of bench/run.py")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--steps", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        return child(args.child, args.ops, args.steps, args.size)
    sys.path.insert(0, HERE)
    result = run_runtimes(args.rounds, args.ops, size=args.size)
    print(runtimes_table(result))


if __name__ == "__main__":
    main()
