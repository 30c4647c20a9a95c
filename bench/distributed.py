"""Data-parallel training on tpu: what a DDP (and an FSDP2) step costs across processes.

Launches `torchrun` twice on this machine, 2 processes and 1 process, each training the
same MLP with the same per-rank batch in fused mode, and one process driving 2 devices with
torchtpu.spmd (fully_shard: one partitioned executable, the global batch of 2 ranks cut over
the devices), and reports per step (steady state):

    executables     graphs launched per step (1: forward, backward, the gradient
                    all-reduces and AdamW are one program)
    host bytes      bytes copied to the device (the batch) and back (none)
    step time       median seconds per step; 2 ranks vs 1 is the communication overhead
                    at the same per-rank batch (on CPU the two ranks also share the cores)
    memory          per rank, device bytes (torch.tpu.memory_allocated) held between steps
                    (after optimizer.step(): parameters, gradients, AdamW state) and the
                    peak over the steady steps, beside the model's unsharded parameter bytes

    python bench/distributed.py                  # alone
    python bench/distributed.py --processes 8 --spmd 8   # 8 processes vs one process on 8 devices
    python bench/run.py                          # as the "distributed" section of make bench

A device is a rank's share: "per rank" numbers of the SPMD row are per device (the device
holding most).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

SIZES = {
    # width of the MLP, per-rank batch, timed steps
    "small": dict(width=512, batch=32, steps=10),
    "full": dict(width=2048, batch=64, steps=20),
}
WARMUP = 3  # DDP rebuilds its buckets after the first step; steps 2-3 compile the steady step


def _model(width):
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.GELU(), torch.nn.Linear(width, width),
                               torch.nn.GELU(), torch.nn.Linear(width, 16))


def _train(torchtpu, setup, wrap, rank, place=None, devices=None):
    """Per-step seconds and counters of `setup['steps']` steady steps (after WARMUP). `place`
    moves a host batch to the device(s); memory is that of the device of `devices` that holds
    most (default: the current one)."""
    import torch

    devices = [torch.tpu.current_device()] if devices is None else list(devices)
    place = place or (lambda t: t.to("tpu"))
    torchtpu.sync(wait=True)
    start_bytes = {d: torch.tpu.memory_allocated(d) for d in devices}
    model = _model(setup["width"])
    param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    model = wrap(model.to("tpu"))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    generator = torch.Generator().manual_seed(rank)
    batches = [(torch.randn(setup["batch"], setup["width"], generator=generator),
                torch.randint(0, 16, (setup["batch"],), generator=generator)) for _ in range(4)]
    times, before = [], None
    for step in range(WARMUP + setup["steps"]):
        if step == WARMUP:
            before = dict(torchtpu.metrics.counters())
            for d in devices:
                torch.tpu.reset_peak_memory_stats(d)
        x, y = batches[step % len(batches)]
        start = time.perf_counter()
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(place(x)), place(y)).backward()
        opt.step()
        torchtpu.sync(wait=True)
        if step >= WARMUP:
            times.append(time.perf_counter() - start)
    after = torchtpu.metrics.counters()
    per_step = {k: (after[k] - before[k]) / setup["steps"] for k in ("execute_count", "bytes_to_device",
                                                                      "bytes_to_host", "graphs_compiled")}
    batch_bytes = batches[0][0].numel() * 4 + batches[0][1].numel() * 8
    memory = dict(param_bytes=param_bytes,
                  between_steps_bytes=max(torch.tpu.memory_allocated(d) - start_bytes[d] for d in devices),
                  peak_bytes=max(torch.tpu.max_memory_allocated(d) - start_bytes[d] for d in devices))
    return dict(step_s=statistics.median(times), batch_bytes=batch_bytes, **memory, **per_step)


def worker(out_dir, size):
    """One rank under torchrun: DDP, then FSDP2 (world > 1), in fused mode."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import torchtpu

    dist.init_process_group()
    rank, world = dist.get_rank(), dist.get_world_size()
    setup = SIZES[size]
    result = {"world": world, "ddp": _train(torchtpu, setup, DDP, rank)}
    if world > 1:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("tpu", (world,))

        def shard(model):
            for layer in model:
                if isinstance(layer, torch.nn.Linear):
                    fully_shard(layer, mesh=mesh)
            return fully_shard(model, mesh=mesh)

        result["fsdp2"] = _train(torchtpu, setup, shard, rank)
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(result, f)
    dist.destroy_process_group()


def spmd_worker(out_dir, size, devices):
    """One process driving `devices` devices (TORCHTPU_NUM_DEVICES): the MLP fully sharded over
    a 1-D mesh, the global batch of `devices` ranks cut along it; one partitioned executable."""
    import torchtpu
    import torchtpu.spmd as spmd

    mesh = spmd.Mesh((devices,), ("data",))
    setup = dict(SIZES[size], batch=SIZES[size]["batch"] * devices)
    result = _train(torchtpu, setup, lambda model: spmd.fully_shard(model, mesh), 0,
                    place=lambda t: spmd.shard(t, mesh, ("data",)), devices=mesh.devices)
    with open(os.path.join(out_dir, "spmd.json"), "w") as f:
        json.dump(result, f)


def _launch_spmd(devices, size, timeout):
    out_dir = tempfile.mkdtemp(prefix="torchtpu-bench-spmd-")
    env = dict(os.environ, TORCHTPU_NUM_DEVICES=str(devices))
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = repo + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("OMP_NUM_THREADS", "1")  # as the torchrun runs
    command = [sys.executable, os.path.abspath(__file__), "--spmd-worker", out_dir, "--spmd", str(devices),
               "--size", size]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"the SPMD run on {devices} devices failed:\n{done.stderr[-3000:]}")
    return json.load(open(os.path.join(out_dir, "spmd.json")))


def _launch(nproc, size, timeout):
    out_dir = tempfile.mkdtemp(prefix="torchtpu-bench-dist-")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ)
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = repo + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("OMP_NUM_THREADS", "1")  # what torchrun sets for 2 processes; the same for 1
    command = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}", "--master_addr=127.0.0.1",
               f"--master_port={port}", os.path.abspath(__file__), "--worker", out_dir, "--size", size]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"torchrun --nproc_per_node={nproc} failed:\n{done.stderr[-3000:]}")
    return [json.load(open(os.path.join(out_dir, f"rank{r}.json"))) for r in range(nproc)]


def run_distributed(size="small", timeout=600, processes=(1, 2), spmd_devices=2):
    """Launches torchrun with each count of `processes`, and one process on `spmd_devices`
    devices (0: none); returns the per-step numbers (rank 0's, slowest step time)."""
    out = dict(size=size, **SIZES[size])
    for nproc in processes:
        ranks = _launch(nproc, size, timeout)
        for kind in ranks[0]:
            if kind == "world":
                continue
            row = dict(ranks[0][kind])
            row["step_s"] = max(r[kind]["step_s"] for r in ranks)  # a step ends when every rank's has
            for key in ("between_steps_bytes", "peak_bytes"):  # the rank that holds most
                row[key] = max(r[kind][key] for r in ranks)
            out[f"{kind}_{nproc}"] = row
    if spmd_devices:
        out[f"spmd_{spmd_devices}"] = _launch_spmd(spmd_devices, size, timeout)
    for key in _row_keys(out):
        r = out[key]
        print(f"  {key}: {r['step_s'] * 1e3:.1f} ms/step, {r['execute_count']:.1f} executables/step, "
              f"{r['bytes_to_device']:.0f} B to device (batch {r['batch_bytes']} B), {r['bytes_to_host']:.0f} B to host, "
              f"{r['between_steps_bytes'] / 2**20:.2f} MiB between steps, {r['peak_bytes'] / 2**20:.2f} MiB peak "
              f"(parameters {r['param_bytes'] / 2**20:.2f} MiB)", flush=True)
    if "ddp_1" in out and "ddp_2" in out:
        out["overhead"] = out["ddp_2"]["step_s"] / out["ddp_1"]["step_s"]
        print(f"  2 ranks vs 1 (DDP, same per-rank batch): {out['overhead']:.2f}x step time", flush=True)
    return out


def _row_keys(result):
    """The runs present, in table order: DDP and FSDP2 per process count, then SPMD."""
    keys = sorted((k for k in result if k.startswith(("ddp_", "fsdp2_"))),
                  key=lambda k: (int(k.split("_")[1]), k.startswith("fsdp2")))
    return keys + [k for k in result if k.startswith("spmd_")]


def distributed_table(result) -> str:
    from common import markdown_table

    rows = []
    first = _row_keys(result)[0]
    for key in _row_keys(result):
        kind, count = key.split("_")
        name = (f"torchtpu.spmd fully_shard, 1 process x {count} devices" if kind == "spmd" else
                f"{'DDP' if kind == 'ddp' else 'FSDP2'}, {count} process{'es' if count != '1' else ''}")
        r = result[key]
        ratio = f"{r['step_s'] / result[first]['step_s']:.2f}x"
        rows.append([name, f"{r['step_s'] * 1e3:.1f}", ratio, f"{r['execute_count']:.1f}",
                     f"{r['bytes_to_device'] - r['batch_bytes']:.0f}", f"{r['bytes_to_host']:.0f}",
                     f"{r['between_steps_bytes'] / r['param_bytes']:.2f}", f"{r['peak_bytes'] / r['param_bytes']:.2f}"])
    title = f"MLP width {result['width']}, batch {result['batch']} per rank, fused"
    params = result[first]["param_bytes"] / 2**20
    first_name = rows[0][0]
    return markdown_table([title, "ms per step", f"vs {first_name}", "executables per step",
                           "host->device bytes beyond the batch", "device->host bytes",
                           f"per-rank memory between steps (x {params:.1f} MiB of parameters)",
                           "per-rank peak memory (x parameters)"], rows)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", choices=list(SIZES), default="small")
    ap.add_argument("--processes", type=int, nargs="+", default=[1, 2], help="torchrun process counts")
    ap.add_argument("--spmd", type=int, default=2, help="devices of the one-process SPMD run (0: none)")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--spmd-worker", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        return worker(args.worker, args.size)
    if args.spmd_worker:
        return spmd_worker(args.spmd_worker, args.size, args.spmd)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    print(distributed_table(run_distributed(args.size, processes=tuple(args.processes), spmd_devices=args.spmd)))


if __name__ == "__main__":
    main()
