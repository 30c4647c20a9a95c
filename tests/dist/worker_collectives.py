"""Every collective of the tpu backend, exact for float32, bfloat16 and int64, in each eager
mode, against the values computed on CPU from every rank's (deterministic) input; then
collectives that differ across ranks (each rank's error is recorded in the report)."""
import os
import sys

import torch
import torch.distributed as dist

import torchtpu

sys.path.insert(0, os.path.dirname(__file__))
from common import Report, write  # noqa: E402

DTYPES = (torch.float32, torch.bfloat16, torch.int64)


def data(rank, dtype, n=6):
    """Rank r's input: distinct per rank, exact in every dtype, some negative and zero."""
    base = torch.arange(n, dtype=torch.float64)
    if dtype.is_floating_point:
        return (base * 0.375 + rank * 1.5 - 1.125).to(dtype)
    return (base * 3 + rank * 7 - 5).to(dtype)


def expected_reduce(op, tensors):
    out = tensors[0].clone()
    for t in tensors[1:]:
        if op == dist.ReduceOp.SUM or op == dist.ReduceOp.AVG:
            out = out + t
        elif op == dist.ReduceOp.PRODUCT:
            out = out * t
        elif op == dist.ReduceOp.MAX:
            out = torch.maximum(out, t)
        elif op == dist.ReduceOp.MIN:
            out = torch.minimum(out, t)
    if op == dist.ReduceOp.AVG:
        out = out / len(tensors) if out.is_floating_point() else torch.div(out, len(tensors), rounding_mode="trunc")
    return out


def check_dtype(report, rank, world, dtype, tag):
    inputs = [data(r, dtype) for r in range(world)]
    mine = inputs[rank]

    ops = [dist.ReduceOp.SUM, dist.ReduceOp.AVG, dist.ReduceOp.PRODUCT, dist.ReduceOp.MAX, dist.ReduceOp.MIN]
    for op in ops:
        x = mine.to("tpu")
        dist.all_reduce(x, op=op)
        report.equal(f"{tag} all_reduce {op}", x, expected_reduce(op, inputs))

    x = mine.to("tpu")
    work = dist.all_reduce(x, async_op=True)
    future = work.get_future()
    work.wait()
    report.equal(f"{tag} all_reduce async", x, expected_reduce(dist.ReduceOp.SUM, inputs))
    report.equal(f"{tag} all_reduce future", future.wait()[0], expected_reduce(dist.ReduceOp.SUM, inputs))

    # A view: the result reaches the base tensor, as an in-place op on the slice would.
    base = torch.zeros(10, dtype=dtype, device="tpu")
    base[2:8] = mine.to("tpu")
    dist.all_reduce(base[2:8])
    want = torch.zeros(10, dtype=dtype)
    want[2:8] = expected_reduce(dist.ReduceOp.SUM, inputs)
    report.equal(f"{tag} all_reduce of a view", base, want)

    for src in range(world):
        x = mine.to("tpu")
        dist.broadcast(x, src=src)
        report.equal(f"{tag} broadcast from {src}", x, inputs[src])

    outs = [torch.empty_like(mine, device="tpu") for _ in range(world)]
    dist.all_gather(outs, mine.to("tpu"))
    for r in range(world):
        report.equal(f"{tag} all_gather [{r}]", outs[r], inputs[r])
    out = torch.empty(world * mine.numel(), dtype=dtype, device="tpu")
    dist.all_gather_into_tensor(out, mine.to("tpu"))
    report.equal(f"{tag} all_gather_into_tensor", out, torch.cat(inputs))

    # reduce_scatter: rank r's input list is data(r) chunks; rank j gets the sum of chunk j.
    big = [data(r, dtype, n=2 * world) for r in range(world)]
    chunks = [b.chunk(world) for b in big]
    out = torch.empty(2, dtype=dtype, device="tpu")
    dist.reduce_scatter(out, [c.to("tpu") for c in chunks[rank]])
    report.equal(f"{tag} reduce_scatter", out, expected_reduce(dist.ReduceOp.SUM, [c[rank] for c in chunks]))
    out = torch.empty(2, dtype=dtype, device="tpu")
    dist.reduce_scatter_tensor(out, big[rank].to("tpu"), op=dist.ReduceOp.MAX)
    report.equal(f"{tag} reduce_scatter_tensor max", out, expected_reduce(dist.ReduceOp.MAX, [c[rank] for c in chunks]))

    out = torch.empty(2 * world, dtype=dtype, device="tpu")
    dist.all_to_all_single(out, big[rank].to("tpu"))
    report.equal(f"{tag} all_to_all_single", out, torch.cat([c[rank] for c in chunks]))
    outs = [torch.empty(2, dtype=dtype, device="tpu") for _ in range(world)]
    dist.all_to_all(outs, [c.to("tpu") for c in chunks[rank]])
    for r in range(world):
        report.equal(f"{tag} all_to_all [{r}]", outs[r], chunks[r][rank])

    # send/recv around the ring, then back.
    right, left = (rank + 1) % world, (rank - 1) % world
    x = torch.empty_like(mine, device="tpu")
    if rank % 2 == 0:
        dist.send(mine.to("tpu"), dst=right)
        dist.recv(x, src=left)
    else:
        dist.recv(x, src=left)
        dist.send(mine.to("tpu"), dst=right)
    report.equal(f"{tag} send/recv", x, inputs[left])

    x = mine.to("tpu")
    dist.reduce(x, dst=world - 1, op=dist.ReduceOp.MAX)
    report.equal(f"{tag} reduce", x, expected_reduce(dist.ReduceOp.MAX, inputs) if rank == world - 1 else mine)

    gathered = [torch.empty_like(mine, device="tpu") for _ in range(world)] if rank == 0 else None
    dist.gather(mine.to("tpu"), gathered, dst=0)
    if rank == 0:
        for r in range(world):
            report.equal(f"{tag} gather [{r}]", gathered[r], inputs[r])

    x = torch.empty_like(mine, device="tpu")
    src = world - 1
    dist.scatter(x, [data(10 + r, dtype).to("tpu") for r in range(world)] if rank == src else None, src=src)
    report.equal(f"{tag} scatter", x, data(10 + rank, dtype))


def split_sizes(sender, world):
    """Rows rank `sender` sends to each rank: uneven, with a zero among them."""
    return [(3 * sender + 2 * j) % (world + 3) for j in range(world)]


def check_uneven_all_to_all(report, rank, world, dtype, tag, gloo):
    """all_to_all_single with split sizes and all_to_all of tensors of different shapes
    (MoE expert parallelism), against gloo on the same data as CPU tensors (the oracle)."""
    in_splits = split_sizes(rank, world)
    out_splits = [split_sizes(r, world)[rank] for r in range(world)]
    mine = data(rank, dtype, n=3 * sum(in_splits)).reshape(-1, 3)
    want = torch.empty(sum(out_splits), 3, dtype=dtype)
    dist.all_to_all_single(want, mine, out_splits, in_splits, group=gloo)
    out = torch.empty(sum(out_splits), 3, dtype=dtype, device="tpu")
    dist.all_to_all_single(out, mine.to("tpu"), out_splits, in_splits)
    report.equal(f"{tag} all_to_all_single with split sizes", out, want)
    # Only the output's splits given: the input's dim 0 splits evenly.
    even = data(rank + 3, dtype, n=2 * world)
    sizes = [2] * world
    want = torch.empty(2 * world, dtype=dtype)
    dist.all_to_all_single(want, even, sizes, group=gloo)
    out = torch.empty(2 * world, dtype=dtype, device="tpu")
    dist.all_to_all_single(out, even.to("tpu"), sizes)
    report.equal(f"{tag} all_to_all_single with output split sizes", out, want)

    # Tensor j (to rank j) has shape (rank + j + 1, j + 1); gloo has no list all_to_all,
    # so its all_to_all_single on the flattened tensors is the oracle.
    inputs = [data(10 * rank + j, dtype, n=(rank + j + 1) * (j + 1)).reshape(rank + j + 1, j + 1) for j in range(world)]
    shapes = [(r + rank + 1, rank + 1) for r in range(world)]
    flat = torch.empty(sum(a * b for a, b in shapes), dtype=dtype)
    dist.all_to_all_single(flat, torch.cat([t.reshape(-1) for t in inputs]), [a * b for a, b in shapes],
                           [t.numel() for t in inputs], group=gloo)
    outs = [torch.empty(shape, dtype=dtype, device="tpu") for shape in shapes]
    dist.all_to_all(outs, [t.to("tpu") for t in inputs])
    for r, piece in enumerate(flat.split([a * b for a, b in shapes])):
        report.equal(f"{tag} all_to_all of different shapes [{r}]", outs[r], piece.reshape(shapes[r]))


def check_uneven_all_to_all_errors_and_counters(report, rank, world):
    """Split sizes that do not add up raise c10d's own errors (before anything is exchanged),
    and split sizes that disagree across ranks raise on every rank. In fused mode an uneven
    all_to_all joins the pending graph (its splits go through the store, not the device), so
    the work around it is one executable."""
    x = torch.zeros(4, 2, device="tpu")
    for what, args, message in (("sum", ([1, 1], [3, 3]), "Split sizes doesn't match total dim 0 size"),
                                ("count", ([2] * world, [4] + [0] * world), "Number of tensor splits not equal to group size")):
        try:
            dist.all_to_all_single(torch.zeros(2 * world, 2, device="tpu"), x, *args)
            report.failures.append(f"all_to_all_single with bad split {what}: no error")
        except RuntimeError as error:
            report.equal(f"all_to_all_single with bad split {what}", message in str(error), True)
    # Rank 0 expects two rows from the last rank, which sends one: every rank raises, naming them.
    received = [1] * (world - 1) + [2 if rank == 0 else 1]
    try:
        dist.all_to_all_single(torch.zeros(sum(received), device="tpu"), torch.zeros(world, device="tpu"), received,
                               [1] * world)
        report.failures.append("all_to_all_single with split sizes that differ across ranks: no error")
    except RuntimeError as error:
        report.equal("all_to_all_single with split sizes that differ across ranks",
                     f"rank {world - 1} sends 1 rows to rank 0, which expects 2 from it" in str(error), True)
    with torchtpu.mode("fused"):
        mine = data(rank, torch.float32, n=sum(split_sizes(rank, world)))
        received = [split_sizes(r, world)[rank] for r in range(world)]
        torchtpu.sync(wait=True)
        before = torchtpu.metrics.counters()
        out = torch.empty(sum(received), device="tpu")
        dist.all_to_all_single(out, (mine.to("tpu") * 2), received, split_sizes(rank, world))
        total = (out + 1).sum()
        torchtpu.sync(wait=True)
        after = torchtpu.metrics.counters()
        report.equal("fused uneven all_to_all: executables", after["execute_count"] - before["execute_count"], 1)
        report.equal("fused uneven all_to_all: bytes to host", after["bytes_to_host"] - before["bytes_to_host"], 0)
        blocks = [data(r, torch.float32, n=sum(split_sizes(r, world))).split(split_sizes(r, world))[rank]
                  for r in range(world)]
        want = (torch.cat(blocks) * 2 + 1).sum()
        report.equal("fused uneven all_to_all: value", total, want)


def check_premul_sum(report, rank, world, dtype, tag):
    """ReduceOp.PREMUL_SUM (FSDP's gradient pre-division): each rank's tensor times the
    factor, then summed; a float or a tensor factor; CUDA's TypeError for integers."""
    inputs = [data(r, dtype, n=2 * world) for r in range(world)]
    if not dtype.is_floating_point:
        try:
            dist.all_reduce(inputs[rank].to("tpu"), op=dist._make_nccl_premul_sum(0.5))
            report.failures.append(f"{tag} PREMUL_SUM of integers: no error")
        except TypeError as error:
            report.equal(f"{tag} PREMUL_SUM of integers", str(error).split("\n")[0],
                         "PreMulSum Data type must be half, float, bfloat16 or double")
        return
    # Factors that are powers of two: the products are exact in every dtype.
    for factor in (0.25, torch.tensor([0.5], dtype=dtype)):
        kind = "tensor" if isinstance(factor, torch.Tensor) else "float"
        scale = float(factor)
        want = sum(t * scale for t in inputs)
        x = inputs[rank].to("tpu")
        dist.all_reduce(x, op=dist._make_nccl_premul_sum(factor))
        report.equal(f"{tag} all_reduce PREMUL_SUM ({kind} factor)", x, want)
        out = torch.empty(2, dtype=dtype, device="tpu")
        dist.reduce_scatter_tensor(out, inputs[rank].to("tpu"), op=dist._make_nccl_premul_sum(factor))
        report.equal(f"{tag} reduce_scatter_tensor PREMUL_SUM ({kind} factor)", out, want.chunk(world)[rank])


def check_mismatches(report, rank):
    """Ranks that all_reduce tensors of other shapes, then of other dtypes: each rank gets an
    error naming every rank's call (recorded in report.values), and the group still works."""
    for what, tensor in (("shape", torch.ones(4 + rank)),
                         ("dtype", torch.ones(4, dtype=torch.float32 if rank == 0 else torch.int64))):
        x = tensor.to("tpu")
        dist.all_reduce(x)
        try:
            x.cpu()
            report.failures.append(f"{what} mismatch: no error")
        except RuntimeError as error:
            report.values[what] = str(error)
    y = torch.full((3,), float(rank), device="tpu")
    dist.all_reduce(y)
    report.equal("all_reduce after the mismatches", y.cpu(), torch.full((3,), 1.0))


def main():
    dist.init_process_group()
    rank, world = dist.get_rank(), dist.get_world_size()
    report = Report()
    gloo = dist.new_group(backend="gloo")  # the oracle for CPU tensors
    quick = len(sys.argv) > 2 and sys.argv[2] == "quick"  # one mode and dtype (the two-node test)
    for mode in ("fused",) if quick else ("debug", "strict", "fused"):
        with torchtpu.mode(mode):
            for dtype in (torch.float32,) if quick else DTYPES:
                tag = f"{mode} {dtype}"
                report.run(tag, lambda: check_dtype(report, rank, world, dtype, tag))
                if not quick:
                    report.run(f"{tag} uneven", lambda: check_uneven_all_to_all(report, rank, world, dtype, tag, gloo))
                    report.run(f"{tag} premul", lambda: check_premul_sum(report, rank, world, dtype, tag))
                torchtpu.sync(wait=True)
    if not quick:
        report.run("uneven all_to_all errors", lambda: check_uneven_all_to_all_errors_and_counters(report, rank, world))
        report.run("mismatches", lambda: check_mismatches(report, rank))
    # Objects travel as uint8 tpu tensors (the backend's device).
    objects = [None] * world
    dist.all_gather_object(objects, {"rank": rank})
    report.equal("all_gather_object", objects, [{"rank": r} for r in range(world)])
    dist.barrier()
    write(report, rank, device=str(torchtpu.device()), device_count=torch.tpu.device_count(),
          local_rank=int(os.environ["LOCAL_RANK"]))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
