"""Input-heavy training loop: large images, a small model, with and without prefetching.

A loader that makes each batch on the host (as decoding and augmenting would), a small
CNN, fused mode, the loss read every step (as a script that prints it does). Side by side
in one process:

    load only      iterating the loader alone (host time per batch)
    step only      the training step on a batch already on the device
    no prefetch    for x, y in loader: x, y = x.to("tpu"), y.to("tpu"); step
    prefetch=2     for x, y in torchtpu.data.DeviceLoader(loader, prefetch=2): step

Serial work costs about load + upload + step per batch; with prefetching the loader and
uploads run while the step does, so the bound is max(load + upload, step).

    python bench/input_pipeline.py                  # alone
    python bench/run.py                             # as the "input" section of make bench
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

SIZES = {
    # batch, image side, batches per timed pass
    "small": dict(batch=16, side=224, batches=8),
    "full": dict(batch=64, side=224, batches=10),
}


class SyntheticImages(torch.utils.data.Dataset):
    """Batches made on the host from a seed: the cost stands in for decode and augment."""

    def __init__(self, batches, batch, side):
        self.batches, self.batch, self.side = batches, batch, side

    def __len__(self):
        return self.batches

    def __getitem__(self, index):
        generator = torch.Generator().manual_seed(index)
        images = torch.randn(self.batch, 3, self.side, self.side, generator=generator)
        images = (images * 0.5 + 0.1).clamp_(-2, 2)  # a little "augmentation" work
        labels = torch.randint(0, 10, (self.batch,), generator=generator)
        return images, labels


def small_cnn():
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, kernel_size=4, stride=4), torch.nn.ReLU(),
        torch.nn.Conv2d(16, 32, kernel_size=4, stride=4), torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(32, 10))


def _loader(setup):
    data = SyntheticImages(setup["batches"], setup["batch"], setup["side"])
    return torch.utils.data.DataLoader(data, batch_size=None, shuffle=False)


def _step(model, optimizer, images, labels):
    optimizer.zero_grad(set_to_none=True)
    loss = torch.nn.functional.cross_entropy(model(images), labels)
    loss.backward()
    optimizer.step()
    return loss.item()


def _timed(fn, repeats):
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def run_input(torchtpu, size="small", repeats=3):
    """Seconds per batch for each way of feeding the same loop; returns a dict."""
    from torchtpu.data import DeviceLoader

    setup = SIZES[size]
    torch.manual_seed(0)
    model = small_cnn().to("tpu")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = _loader(setup)
    n = setup["batches"]
    fixed = next(iter(loader))
    fixed_tpu = (fixed[0].to("tpu"), fixed[1].to("tpu"))

    def load_only():
        for _ in loader:
            pass

    def step_only():
        for _ in range(n):
            _step(model, optimizer, *fixed_tpu)

    def no_prefetch():
        for images, labels in loader:
            _step(model, optimizer, images.to("tpu"), labels.to("tpu"))

    def prefetch():
        for images, labels in DeviceLoader(loader, prefetch=2):
            _step(model, optimizer, images, labels)

    with torchtpu.mode("fused"):
        step_only()  # compiles the step
        torch.tpu.synchronize()
        out = dict(size=size, batch=setup["batch"], side=setup["side"], batches=n,
                   mb_per_batch=fixed[0].numel() * fixed[0].element_size() / 2**20)
        for name, fn in (("load_only", load_only), ("step_only", step_only),
                         ("no_prefetch", no_prefetch), ("prefetch_2", prefetch)):
            out[name + "_s"] = _timed(fn, repeats) / n
            torch.tpu.synchronize()
    out["speedup"] = out["no_prefetch_s"] / out["prefetch_2_s"]
    print(f"  {setup['batch']}x3x{setup['side']}x{setup['side']} float32 ({out['mb_per_batch']:.0f} MB/batch): "
          f"load {out['load_only_s'] * 1e3:.0f} ms, step {out['step_only_s'] * 1e3:.0f} ms, "
          f"no prefetch {out['no_prefetch_s'] * 1e3:.0f} ms, prefetch=2 {out['prefetch_2_s'] * 1e3:.0f} ms "
          f"per batch ({out['speedup']:.2f}x)", flush=True)
    return out


def input_table(result) -> str:
    from common import markdown_table

    ms = lambda key: f"{result[key] * 1e3:.1f}"  # noqa: E731
    rows = [["load only (host)", ms("load_only_s"), ""],
            ["step only (batch on device)", ms("step_only_s"), ""],
            ["no prefetch: .to('tpu') in the loop", ms("no_prefetch_s"), "1.00x"],
            ["DeviceLoader(prefetch=2)", ms("prefetch_2_s"), f"{result['speedup']:.2f}x"]]
    title = (f"{result['batch']}x3x{result['side']}x{result['side']} images "
             f"({result['mb_per_batch']:.0f} MB/batch), small CNN, fused")
    return markdown_table([title, "ms per batch", "speed vs no prefetch"], rows)


def main(argv=None):
    import os
    import sys

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", choices=["auto", *SIZES], default="auto")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    import torchtpu

    size = args.size if args.size != "auto" else ("small" if torchtpu.platform() == "cpu" else "full")
    result = run_input(torchtpu, size, args.repeats)
    print("\n" + input_table(result))


if __name__ == "__main__":
    main()
