"""DTensor, functional collectives, FSDP2, tensor parallel and distributed checkpoints on
init_device_mesh("tpu", (2,)), in one launch (each launch pays start-up and compiles).

    worker_sharded.py OUT

Training checks compare with single-process training on CPU (the oracle) on the
concatenated batch. Rank r also saves an FSDP2 state dict with torch.distributed.checkpoint
into OUT/checkpoint, and rank 0 the full parameters saved into OUT/expected.pt, for the
test to load into one process; and it loads OUT/single, which the test saved from one process
(a model made by make_model(seed=5)), into an FSDP2 model."""
import os
import sys

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

import torchtpu

sys.path.insert(0, os.path.dirname(__file__))
from common import Report, train_on_cpu, write  # noqa: E402

STEPS = 5
PER_RANK = 4


def make_model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 8))


def batches(world):
    generator = torch.Generator().manual_seed(1)
    for _ in range(STEPS):
        yield (torch.randn(world * PER_RANK, 16, generator=generator),
               torch.randint(0, 8, (world * PER_RANK,), generator=generator))


def reference(world):
    return train_on_cpu(make_model(), batches(world))


def check_functional_collectives(report, rank, world, group_name):
    ops = torch.ops._c10d_functional
    x = torch.arange(6, dtype=torch.float32) + 10 * rank
    everyone = [torch.arange(6, dtype=torch.float32) + 10 * r for r in range(world)]
    got = ops.wait_tensor(ops.all_reduce(x.to("tpu"), "sum", group_name))
    report.equal("functional all_reduce", got, sum(everyone))
    got = ops.wait_tensor(ops.all_gather_into_tensor(x.to("tpu"), world, group_name))
    report.equal("functional all_gather_into_tensor", got, torch.cat(everyone))
    got = ops.wait_tensor(ops.reduce_scatter_tensor(x.to("tpu"), "sum", world, group_name))
    report.equal("functional reduce_scatter_tensor", got, sum(everyone).chunk(world)[rank])
    got = ops.wait_tensor(ops.all_to_all_single(x.to("tpu"), [3, 3], [3, 3], group_name))
    report.equal("functional all_to_all_single", got, torch.cat([e.chunk(world)[rank] for e in everyone]))
    got = ops.wait_tensor(ops.broadcast(x.to("tpu"), 1, group_name))
    report.equal("functional broadcast", got, everyone[1])


def check_compiled_functional_collectives(report, rank, world, mesh):
    import torch.distributed._functional_collectives as funcol

    def step(x):
        y = funcol.all_reduce(x * 2, "sum", mesh)
        return funcol.all_gather_single(y + 1, 0, mesh).view(world, -1).sum(0) * 3

    compiled = torch.compile(step, backend="tpu")
    x = torch.arange(4.0) + rank
    expected = (sum(torch.arange(4.0) + r for r in range(world)) * 2 + 1) * world * 3
    report.equal("compiled functional collectives", compiled(x.to("tpu")), expected)
    before = torchtpu.metrics.counters()["execute_count"]
    report.equal("compiled functional collectives, again", compiled(x.to("tpu")), expected)
    # The compiled graph, collectives and all, is one executable.
    report.equal("executables per compiled call", torchtpu.metrics.counters()["execute_count"] - before, 1)


def check_compiled_uneven_all_to_all(report, rank, world, mesh):
    # MoE-style uneven all_to_all_single (a functional collective) in a compiled graph: rank r
    # sends SPLITS[r][j] rows to rank j (inputs of different sizes per rank); the second call
    # replays the captured executable.
    import torch.distributed._functional_collectives as funcol

    splits = [[1, 3], [2, 0]]  # for 2 ranks (the launch's)
    everyone = [torch.arange(4.0), torch.arange(2.0) + 10]
    received = [splits[r][rank] for r in range(world)]

    def step(x):
        return funcol.all_to_all_single(x * 2, received, splits[rank], mesh.get_group()) + 1

    compiled = torch.compile(step, backend="tpu")
    want = torch.cat([everyone[r].split(splits[r])[rank] for r in range(world)]) * 2 + 1
    report.equal("compiled uneven all_to_all_single", compiled(everyone[rank].to("tpu")), want)
    report.equal("compiled uneven all_to_all_single, again", compiled(everyone[rank].to("tpu")), want)


def check_dtensor(report, rank, world, mesh):
    for dtype in (torch.float32, torch.int64):
        full = torch.arange(48).reshape(4, 12).to(dtype) * 3 - 7
        tag = str(dtype).replace("torch.", "")
        d = distribute_tensor(full.to("tpu"), mesh, [Shard(0)])
        report.equal(f"{tag} Shard(0) local", d.to_local(), full.chunk(world, 0)[rank])
        report.equal(f"{tag} full_tensor", d.full_tensor(), full)
        report.equal(f"{tag} Shard(0)->Replicate", d.redistribute(mesh, [Replicate()]).to_local(), full)
        report.equal(f"{tag} Shard(0)->Shard(1)", d.redistribute(mesh, [Shard(1)]).to_local(),
                     full.chunk(world, 1)[rank])
        r = distribute_tensor(full.to("tpu"), mesh, [Replicate()])
        report.equal(f"{tag} Replicate local", r.to_local(), full)
        report.equal(f"{tag} Replicate->Shard(1)", r.redistribute(mesh, [Shard(1)]).to_local(),
                     full.chunk(world, 1)[rank])
        report.equal(f"{tag} sharded sum", d.sum().full_tensor(), full.sum())
    a = torch.randn(8, 16, generator=torch.Generator().manual_seed(2))
    b = torch.randn(16, 4, generator=torch.Generator().manual_seed(3))
    product = distribute_tensor(a.to("tpu"), mesh, [Shard(0)]) @ distribute_tensor(b.to("tpu"), mesh, [Replicate()])
    report.close("Shard(0) @ Replicate", product.full_tensor(), a @ b, atol=1e-5)  # float32 rounding


def _allocated():
    torchtpu.sync(wait=True)
    return torch.tpu.memory_allocated()


def _local_bytes(tensors):
    locals_ = [t.to_local() if hasattr(t, "to_local") else t for t in tensors]
    return sum(t.numel() * t.element_size() for t in locals_ if t.device.type == "tpu")


def check_fsdp2_memory(report, mode, model, opt, start, sharded):
    """Between steps (after optimizer.step()) FSDP2 holds no unsharded parameter: the device
    memory beyond what the model held right after fully_shard is its gradients and AdamW
    state (sharded), give or take a shard."""
    unsharded = sum(p.numel() * p.element_size() for p in model.parameters())  # global sizes
    grads = _local_bytes([p.grad for p in model.parameters() if p.grad is not None])
    state = _local_bytes([t for s in opt.state.values() for t in s.values() if isinstance(t, torch.Tensor)])
    beyond = _allocated() - start - sharded - grads - state
    report.values[f"{mode} FSDP2 memory"] = dict(unsharded_params=unsharded, sharded_model=sharded, grads=grads,
                                                 adamw_state=state, beyond=beyond)
    # Measured: half the unsharded bytes in strict and fused mode, and 3.5x them before tpu
    # storages could be freed (FSDP2 kept the unsharded parameters). Keeping them costs at
    # least their own size, hence that bound.
    report.equal(f"{mode} FSDP2 frees unsharded parameters between steps ({beyond} B held beyond the sharded "
                 f"model, gradients and AdamW state; unsharded parameters are {unsharded} B)", beyond < unsharded, True)


def train_fsdp2(report, mode, rank, world, mesh, out_dir):
    start = _allocated()
    model = make_model().to("tpu")
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    sharded = _allocated() - start
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    mine = slice(rank * PER_RANK, (rank + 1) * PER_RANK)
    for step, (x, y) in enumerate(batches(world)):
        before = torchtpu.metrics.counters()
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x[mine].to("tpu")), y[mine].to("tpu")).backward()
        opt.step()
        torchtpu.sync(wait=True)
        after = torchtpu.metrics.counters()
        if mode == "fused" and step >= 2:
            # Steps 3-5: all-gathers, forward, backward, reduce-scatters and AdamW are one
            # executable, and nothing comes back to the host.
            report.equal(f"fused FSDP2 step {step + 1}: executables", after["execute_count"] - before["execute_count"], 1)
            report.equal(f"fused FSDP2 step {step + 1}: bytes to host", after["bytes_to_host"] - before["bytes_to_host"], 0)
    check_fsdp2_memory(report, mode, model, opt, start, sharded)
    expected = reference(world)
    for i, (p, want) in enumerate(zip(model.parameters(), expected)):
        report.equal(f"{mode} FSDP2 parameter {i} is sharded", list(p.placements), [Shard(0)])
        report.close(f"{mode} FSDP2 parameter {i}", p.full_tensor(), want, atol=1e-5)  # AdamW in float32
    if mode == "fused":
        dcp.save({"model": model.state_dict()}, checkpoint_id=os.path.join(out_dir, "checkpoint"))
        full = {name: value.full_tensor().cpu() for name, value in model.state_dict().items()}  # every rank
        if rank == 0:
            torch.save(full, os.path.join(out_dir, "expected.pt"))


def train_tensor_parallel(report, mode, world, mesh):
    # Every rank sees the whole batch; the two Linear layers are split column- then row-wise.
    # "compiled": the whole model as one graph (fullgraph), DTensor collectives included.
    model = parallelize_module(make_model().to("tpu"), mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    forward = torch.compile(model, backend="tpu", fullgraph=True) if mode == "compiled" else model
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for x, y in batches(world):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(forward(x.to("tpu")), y.to("tpu")).backward()
        opt.step()
    for i, (p, want) in enumerate(zip(model.parameters(), reference(world))):
        report.close(f"{mode} tensor parallel parameter {i}", p.full_tensor(), want, atol=1e-5)  # float32 AdamW


def train_fsdp2_compiled(report, rank, world, mesh):
    # The usual FSDP2 + torch.compile recipe: each block compiled whole (fullgraph: no graph
    # break, so its forward and backward are tpu graphs), then sharded; FSDP2's hooks run
    # eagerly between the blocks.
    from torch._dynamo.utils import counters

    counters.clear()
    model = make_model().to("tpu")
    for i, layer in enumerate(model):
        if isinstance(layer, torch.nn.Linear):
            model[i] = torch.compile(layer, backend="tpu", fullgraph=True)
            fully_shard(model[i], mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    mine = slice(rank * PER_RANK, (rank + 1) * PER_RANK)
    for x, y in batches(world):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x[mine].to("tpu")), y[mine].to("tpu")).backward()
        opt.step()
    report.equal("compiled FSDP2: graphs compiled", counters["stats"]["unique_graphs"], 2)
    for i, (p, want) in enumerate(zip(model.parameters(), reference(world))):
        report.close(f"compiled FSDP2 parameter {i}", p.full_tensor(), want, atol=1e-5)  # AdamW in float32


def check_work_registry_drained(report):
    # Finished tpu Works leave c10d's registry of functional collectives' Works (DTensor's
    # outputs are never waited on tpu); the barrier is the next collective.
    dist.barrier()
    report.equal("c10d work registry after tensor parallel training",
                 torch._C._distributed_c10d._get_work_registry_size(), 0)


def check_fsdp2_gradient_divide_factor(report, rank, world, mesh):
    # A divide factor other than the world size makes FSDP2 reduce-scatter gradients with
    # ReduceOp.PREMUL_SUM(1 / factor): the sum over ranks of each rank's gradient / factor.
    factor = 4.0
    model = make_model().to("tpu")
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh).set_gradient_divide_factor(factor)
    fully_shard(model, mesh=mesh).set_gradient_divide_factor(factor)
    x, y = next(batches(world))
    mine = slice(rank * PER_RANK, (rank + 1) * PER_RANK)
    torch.nn.functional.cross_entropy(model(x[mine].to("tpu")), y[mine].to("tpu")).backward()
    oracle = make_model()
    torch.nn.functional.cross_entropy(oracle(x), y).backward()  # the mean over every rank's rows
    for i, (p, want) in enumerate(zip(model.parameters(), oracle.parameters())):
        # Rank r's gradient is its mean over PER_RANK rows, so the sum is world x the oracle's.
        report.close(f"FSDP2 gradient / divide factor {i}", p.grad.full_tensor(), want.grad * world / factor,
                     atol=1e-6)  # measured 2.3e-8: float32 sums


def load_single_process_checkpoint(report, mesh, out_dir):
    model = make_model().to("tpu")
    fully_shard(model, mesh=mesh)
    state = {"model": model.state_dict()}
    dcp.load(state, checkpoint_id=os.path.join(out_dir, "single"))
    model.load_state_dict(state["model"])
    for i, (p, want) in enumerate(zip(model.parameters(), make_model(seed=5).parameters())):
        report.equal(f"1-process checkpoint: parameter {i}", p.full_tensor(), want.detach())


def main():
    out_dir = sys.argv[1]
    dist.init_process_group()
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("tpu", (world,))
    report = Report()
    report.run("functional collectives",
               lambda: check_functional_collectives(report, rank, world, mesh.get_group().group_name))
    report.run("compiled functional collectives", lambda: check_compiled_functional_collectives(report, rank, world, mesh))
    report.run("compiled uneven all_to_all", lambda: check_compiled_uneven_all_to_all(report, rank, world, mesh))
    report.run("dtensor", lambda: check_dtensor(report, rank, world, mesh))
    for mode in ("strict", "fused"):
        with torchtpu.mode(mode):
            report.run(f"{mode} FSDP2", lambda: train_fsdp2(report, mode, rank, world, mesh, out_dir))
    report.run("load a 1-process checkpoint", lambda: load_single_process_checkpoint(report, mesh, out_dir))
    for mode in ("strict", "fused"):
        with torchtpu.mode(mode):
            report.run(f"{mode} tensor parallel", lambda: train_tensor_parallel(report, mode, world, mesh))
    report.run("compiled FSDP2", lambda: train_fsdp2_compiled(report, rank, world, mesh))
    report.run("compiled tensor parallel", lambda: train_tensor_parallel(report, "compiled", world, mesh))
    report.run("c10d work registry", lambda: check_work_registry_drained(report))
    report.run("FSDP2 gradient divide factor", lambda: check_fsdp2_gradient_divide_factor(report, rank, world, mesh))
    write(report, rank)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
