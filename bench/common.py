"""Timing, table and result-file helpers for the benchmarks.

Public API:
    step_times(fn, warmup, repeats, sync) -> list of seconds, one per timed call
    median_step_time(fn, warmup, repeats, sync) -> median seconds per call
    markdown_table(headers, rows) -> str
    results_path(platform) -> path of bench/results/<platform>.json
    write_results(platform, results, meta=None) -> path written

All timings of one benchmark run are meant to be taken side by side in a
single process (see bench/run.py), so that they share the same machine state.
"""

from __future__ import annotations

import json
import os
import platform as _platform
import statistics
import time
from typing import Any, Callable, Iterable, Sequence

RESULTS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def step_times(fn: Callable[[], Any], warmup: int = 3, repeats: int = 10,
               sync: Callable[[Any], Any] | None = None) -> list[float]:
    """Call ``fn`` ``warmup`` times untimed, then ``repeats`` times timed.

    ``sync`` is called with each call's return value before the clock stops
    (e.g. ``lambda loss: loss.item()`` or ``jax.block_until_ready``), so that
    asynchronous or lazy backends are measured to completion. It is also
    applied after the warmup calls, so compilation is not counted.
    """
    sync = sync or (lambda out: out)
    for _ in range(warmup):
        sync(fn())
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        sync(fn())
        times.append(time.perf_counter() - start)
    return times


def median_step_time(fn: Callable[[], Any], warmup: int = 3, repeats: int = 10,
                     sync: Callable[[Any], Any] | None = None) -> float:
    """Median wall-clock seconds of one ``fn`` call (see ``step_times``)."""
    return statistics.median(step_times(fn, warmup, repeats, sync))


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "" if value is None else str(value)


def markdown_table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A GitHub-flavoured markdown table with columns padded to equal width."""
    cells = [[str(h) for h in headers]] + [[_cell(v) for v in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    fmt = lambda row: "| " + " | ".join(c.ljust(w) for c, w in zip(row, widths)) + " |"  # noqa: E731
    lines = [fmt(cells[0]), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    lines += [fmt(row) for row in cells[1:]]
    return "\n".join(lines)


def results_path(platform: str) -> str:
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in platform)
    return os.path.join(RESULTS_DIR, f"{safe}.json")


def write_results(platform: str, results: Any, meta: dict | None = None) -> str:
    """Write ``{"platform", "meta", "results"}`` to bench/results/<platform>.json."""
    os.makedirs(RESULTS_DIR, exist_ok=True)
    info = {
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "host_cpu_count": os.cpu_count(),
        "python": _platform.python_version(),
    }
    info.update(meta or {})
    path = results_path(platform)
    with open(path, "w") as f:
        json.dump({"platform": platform, "meta": info, "results": results}, f, indent=2)
        f.write("\n")
    return path
