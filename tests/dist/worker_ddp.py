"""DistributedDataParallel on tpu equals single-process training on the concatenated batch
(CPU, the oracle) after 5 AdamW steps, in strict, fused and compiled modes. In fused mode a
training step is one executable and no collective data goes through the host."""
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import torchtpu

sys.path.insert(0, os.path.dirname(__file__))
from common import Report, train_on_cpu, write  # noqa: E402

STEPS = 5
PER_RANK = 4


def make_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.LayerNorm(32),
                               torch.nn.Linear(32, 8))


def batches(world):
    generator = torch.Generator().manual_seed(1)
    for _ in range(STEPS):
        x = torch.randn(world * PER_RANK, 16, generator=generator)
        y = torch.randint(0, 8, (world * PER_RANK,), generator=generator)
        yield x, y


def reference(world):
    return train_on_cpu(make_model(), batches(world))


def train(mode, rank, world, report):
    model = make_model().to("tpu")
    ddp = DDP(model)
    step_model = torch.compile(ddp, backend="tpu") if mode == "compiled" else ddp
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-2)
    per_step = []
    for x, y in batches(world):
        before = dict(torchtpu.metrics.counters())
        mine = slice(rank * PER_RANK, (rank + 1) * PER_RANK)
        xb, yb = x[mine].to("tpu"), y[mine].to("tpu")
        opt.zero_grad()
        torch.nn.functional.cross_entropy(step_model(xb), yb).backward()
        opt.step()
        torchtpu.sync(wait=True)
        after = torchtpu.metrics.counters()
        per_step.append({k: after[k] - before[k] for k in ("execute_count", "bytes_to_host", "bytes_to_device",
                                                           "graphs_compiled")})
        per_step[-1]["input_bytes"] = xb.numel() * 4 + yb.numel() * 8
    for i, (p, want) in enumerate(zip(model.parameters(), reference(world))):
        report.close(f"{mode} parameter {i}", p, want, atol=1e-5)
    return per_step


def main():
    dist.init_process_group()
    rank, world = dist.get_rank(), dist.get_world_size()
    report = Report()
    steps = {}
    for mode in ("strict", "fused", "compiled"):
        with torchtpu.mode("strict" if mode == "strict" else "fused"):
            report.run(mode, lambda: steps.__setitem__(mode, train(mode, rank, world, report)))
    # A script may end without destroy_process_group() while a collective is still pending
    # on a rank that never read its result (rank 1 here): it runs as that process exits.
    last = torch.full((1,), float(rank + 1), device="tpu")
    dist.all_reduce(last)
    if rank == 0:
        report.run("a collective pending at a peer's exit",
                   lambda: report.equal("its result", last.cpu(), torch.full((1,), world * (world + 1) / 2)))
    write(report, rank, steps=steps)


if __name__ == "__main__":
    main()
