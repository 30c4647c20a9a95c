"""The first training step of a bench model in this process: wall and process CPU seconds.

CPU time (all threads) is steadier than wall time on a shared machine. Run it twice with
the same TORCHTPU_CACHE_DIR for cold then warm (docs/benchmarks.md, warm start):
    TORCHTPU_CACHE_DIR=/tmp/c python bench/first_step_cpu.py gpt:tpu-compile
"""
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import run as bench  # noqa: E402


def main():
    model, variant = (sys.argv[1] if len(sys.argv) > 1 else "gpt:tpu-compile").split(":")
    torchtpu = bench.load_torchtpu()
    runner = bench.make_runner(variant, bench.model_setups("small", None)[model], torchtpu)
    wall, cpu = time.perf_counter(), time.process_time()
    runner.step()
    c = torchtpu.metrics.counters()
    print("FIRSTSTEP_CPU " + json.dumps(dict(
        wall_s=round(time.perf_counter() - wall, 2), cpu_s=round(time.process_time() - cpu, 2),
        graphs_traced=c.get("compile_graphs_traced"), compile_cache_hits=c.get("compile_cache_hits"),
        cache_hits_disk=c["cache_hits_disk"])))


if __name__ == "__main__":
    main()
