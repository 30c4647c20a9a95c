"""Shared helpers of the torchrun worker scripts (tests/dist/worker_*.py).

Each worker writes rank<R>.json into the output folder given as its first argument; the
test (tests/test_distributed.py) reads them."""
import json
import os
import sys
import traceback

import torch


class Report:
    """Collects named checks; a failing check records its message instead of raising, so
    one launch reports every failure."""

    def __init__(self):
        self.failures = []
        self.values = {}
        self.count = 0

    def equal(self, name, actual, expected):
        self.count += 1
        if os.environ.get("TORCHTPU_TEST_VERBOSE"):
            print(os.environ.get("RANK"), name, flush=True)
        actual = actual.detach().cpu() if isinstance(actual, torch.Tensor) else actual
        ok = (isinstance(expected, torch.Tensor) and actual.dtype == expected.dtype and actual.shape == expected.shape
              and torch.equal(actual, expected)) if isinstance(expected, torch.Tensor) else actual == expected
        if not ok:
            self.failures.append(f"{name}: got {actual!r}, expected {expected!r}")

    def close(self, name, actual, expected, atol):
        self.count += 1
        actual = actual.detach().cpu()
        if actual.shape != expected.shape or not torch.allclose(actual, expected, rtol=0, atol=atol):
            diff = (actual - expected).abs().max().item() if actual.shape == expected.shape else "shape"
            self.failures.append(f"{name}: max difference {diff} above {atol}")

    def run(self, name, fn):
        try:
            fn()
        except Exception:
            self.failures.append(f"{name} raised:\n{traceback.format_exc()}")


def write(report, rank, **extra):
    out_dir = sys.argv[1]
    data = {"failures": report.failures, "checks": report.count, "values": report.values}
    data.update(extra)
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(data, f)


def train_on_cpu(model, batches):
    """The single-process oracle: AdamW (lr 1e-2) on cross-entropy over every rank's batch at
    once; returns the final parameters."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for x, y in batches:
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return [p.detach() for p in model.parameters()]

