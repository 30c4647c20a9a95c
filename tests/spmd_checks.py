"""Single-process SPMD checks, run by tests/test_spmd.py in a fresh interpreter started with
TORCHTPU_NUM_DEVICES=N (the device count is fixed when torchtpu starts). Runs the sections
named on the command line and prints one line `RESULTS <json>`; the tests judge the numbers.

The mesh is (N/2, 2) ("data", "model") for N >= 4, else (N,) ("data",): the same code runs
unchanged on one device.
"""
import copy
import io
import json
import math
import os
import sys
import tempfile
import warnings

import torch

import torchtpu
import torchtpu.spmd as spmd

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))
from models import GPT, GPTConfig, make_lm_batch, make_optimizer, train_step  # noqa: E402

N = torch.tpu.device_count()
MESH = spmd.Mesh((N // 2, 2), ("data", "model")) if N >= 4 else spmd.Mesh((N,), ("data",))
MODEL_AXIS = "model" if "model" in MESH.axis_names else None
results = {}


def max_error(got, want):
    got = got.cpu()
    if got.dtype != want.dtype or got.shape != want.shape:
        return f"dtype/shape {got.dtype}{list(got.shape)} != {want.dtype}{list(want.shape)}"
    if not want.is_floating_point():
        return 0.0 if torch.equal(got, want) else float((got - want).abs().max())
    return float((got.double() - want.double()).abs().max())


def section_ops(modes=("debug", "strict", "fused")):
    """Ops on sharded tensors against PyTorch on CPU, in each eager mode: name -> max |error|,
    and whether each result still lives on the mesh."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(8, 6, generator=g)
    w = torch.randn(6, 4, generator=g)
    u = torch.randn(6, generator=g)
    big = torch.arange(8, dtype=torch.int64) + 2 ** 40
    cases = {
        "mul_add_scalar": lambda x, w, u, big: x * 0.5 + 1,
        "matmul": lambda x, w, u, big: x @ w,
        "sum_sharded_dim": lambda x, w, u, big: x.sum(0),
        "sum_whole_dim": lambda x, w, u, big: x.sum(1),
        "softmax": lambda x, w, u, big: torch.softmax(x, -1),
        "transpose": lambda x, w, u, big: x.t().contiguous(),
        "view_across_shards": lambda x, w, u, big: x.view(4, 12),
        "slice": lambda x, w, u, big: x[2:5],
        "with_unsharded": lambda x, w, u, big: x + u,
        "where": lambda x, w, u, big: torch.where(x > 0, x, torch.zeros_like(x)),
        "inplace": lambda x, w, u, big: x.clone().add_(1).mul_(2),
        "cumsum": lambda x, w, u, big: x.cumsum(0),
        "int64_exact": lambda x, w, u, big: big + 1,
        "bfloat16": lambda x, w, u, big: (x.bfloat16() * 3).float(),
    }
    out = {}
    for mode in modes:
        with torchtpu.mode(mode):
            xs = spmd.shard(x, MESH, ("data", None))
            ws = spmd.shard(w, MESH, (None, MODEL_AXIS))
            us = u.to(f"tpu:{MESH.devices[0]}")  # one device: replicated onto the mesh
            bigs = spmd.shard(big, MESH, ("data",))
            errors, on_mesh = {}, {}
            for name, fn in cases.items():
                got = fn(xs, ws, us, bigs)
                errors[name] = max_error(got, fn(x, w, u, big))
                on_mesh[name] = spmd.mesh_devices(got) == MESH.devices
            out[mode] = {"errors": errors, "on_mesh": on_mesh}
    results["ops"] = out


def section_ops_fused():
    section_ops(modes=("fused",))


def section_layout():
    """Where the pieces of a sharded tensor are, what each device holds and is charged for."""
    x = torch.arange(8 * 6, dtype=torch.float32).reshape(8, 6)
    before = [torch.tpu.memory_allocated(d) for d in range(N)]
    xs = spmd.shard(x, MESH, ("data", None))
    after = [torch.tpu.memory_allocated(d) for d in range(N)]
    layout = spmd.sharding(xs)
    pieces = spmd.shards(xs)
    rows, copies = 8 // MESH.shape[0], N // MESH.shape[0]  # rows per piece, devices per piece
    results["layout"] = {
        "device": str(xs.device), "shape": list(xs.shape), "hlo": layout.hlo, "tiles": list(layout.tiles),
        "replicas": layout.replicas,
        "shard_devices": [str(p.device) for p in pieces],
        "shards_match": all(torch.equal(p.cpu(), x[(i // copies) * rows:(i // copies + 1) * rows])
                            for i, p in enumerate(pieces)),
        "charged": [a - b for a, b in zip(after, before)],
        "printed": str(xs) == str(x)[:-1] + f", device='{xs.device}')",
        "cpu_equal": torch.equal(xs.cpu(), x),
    }
    # Resharding a value on the mesh, and sharding one still pending on its first device, are
    # graph ops (XLA moves the data); a sharding constraint on an activation passes gradients.
    other_axis = MODEL_AXIS or "data"
    resharded = spmd.shard(xs, MESH, (None, other_axis))
    pending = spmd.shard(torch.ones(8, 6, device=xs.device) * 2, MESH, ("data",))
    leaf = torch.ones(8, 6, device=xs.device, requires_grad=True)
    activation = spmd.shard(leaf * 3, MESH, ("data",))
    activation.sum().backward()
    results["layout"].update({
        "resharded_hlo": spmd.sharding(resharded).hlo, "resharded_equal": torch.equal(resharded.cpu(), x),
        "pending_hlo": spmd.sharding(pending).hlo, "pending_equal": torch.equal(pending.cpu(), torch.full((8, 6), 2.0)),
        "constraint_grad": torch.equal(leaf.grad.cpu(), torch.full((8, 6), 3.0)),
        "leaf_requires_grad": spmd.shard(leaf.detach().requires_grad_(), MESH).requires_grad,
    })


def gpt_losses(sharded, steps=3):
    cfg = GPTConfig(vocab_size=128, block_size=16, n_layer=2, n_head=2, n_embd=64)
    torch.manual_seed(0)
    base = GPT(cfg)
    device = f"tpu:{MESH.devices[0]}"
    before = [torch.tpu.memory_allocated(d) for d in range(N)]
    model = copy.deepcopy(base).to(device).tie_weights()
    if sharded:
        spmd.fully_shard(model, MESH)
    opt = make_optimizer(model)
    losses, executes, compiles = [], [], []
    for step in range(steps):
        x, y = make_lm_batch(cfg, 8, seed=step)
        c = torchtpu.metrics.counters()
        loss = train_step(model, opt, (x.to(device), y.to(device)))
        losses.append(loss.item())
        d = torchtpu.metrics.counters()
        executes.append(d["execute_count"] - c["execute_count"])
        compiles.append(d["graphs_compiled"] + d["cache_hits_disk"] - c["graphs_compiled"] - c["cache_hits_disk"])
    held = [torch.tpu.memory_allocated(d) - b for d, b in enumerate(before)]
    params = {n: p.detach().cpu() for n, p in model.named_parameters()}
    layouts = {n: spmd.sharding(p).hlo if sharded else None for n, p in model.named_parameters()}
    state_layouts = sorted({spmd.sharding(s["exp_avg"]).hlo for s in opt.state.values()}) if sharded else []
    return dict(losses=losses, executes=executes, compiles=compiles, held=held, params=params, layouts=layouts,
                state_layouts=state_layouts)


def section_gpt():
    """The benchmark GPT (tiny) trained 3 fused steps on one device and fully sharded."""
    one = gpt_losses(False)
    torchtpu.sync(wait=True)
    many = gpt_losses(True)
    results["gpt"] = {
        "losses_one": one["losses"], "losses_mesh": many["losses"],
        "param_error": max(float((one["params"][n] - many["params"][n]).abs().max()) for n in one["params"]),
        "executes_per_step": many["executes"], "compiles_per_step": many["compiles"],
        "held_one": sum(one["held"]), "held_mesh": many["held"],
        "layouts": many["layouts"], "state_layouts": many["state_layouts"],
    }


def mlp_run(opt_cls, sharded, compiled=False, steps=2):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 8))
    model = model.to(f"tpu:{MESH.devices[0]}")
    if sharded:
        spmd.fully_shard(model, MESH)
    opt = opt_cls(model.parameters(), lr=0.01)
    forward = torch.compile(model, backend="tpu") if compiled else model
    losses = []
    for step in range(steps):
        g = torch.Generator().manual_seed(step)
        x, y = torch.randn(8, 16, generator=g), torch.randn(8, 8, generator=g)
        x, y = (spmd.shard(x, MESH, ("data",)), spmd.shard(y, MESH, ("data",))) if sharded else (x.to("tpu"), y.to("tpu"))
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(forward(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, [p.detach().cpu() for p in model.parameters()]


def compare_mlp(opt_cls, compiled=False):
    a_losses, a_params = mlp_run(opt_cls, False)
    b_losses, b_params = mlp_run(opt_cls, True, compiled)
    return {"loss_error": max(abs(a - b) for a, b in zip(a_losses, b_losses)),
            "param_error": max(float((p - q).abs().max()) for p, q in zip(a_params, b_params))}


def section_optimizers():
    """SGD, Adam and AdamW on a sharded MLP in strict and debug mode, against one device."""
    out = {}
    for mode in ("strict", "debug"):
        with torchtpu.mode(mode):
            for opt_cls in (torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW):
                out[f"{mode}/{opt_cls.__name__}"] = compare_mlp(opt_cls)
    results["optimizers"] = out


def section_compile():
    """torch.compile(backend="tpu") of a sharded MLP: captured and replayed, as one device."""
    before = torchtpu._C.capture_stats()
    out = compare_mlp(torch.optim.AdamW, compiled=True)
    after = torchtpu._C.capture_stats()
    out.update({k: after[k] - before[k] for k in ("captures", "replays", "misses", "uncapturable")})
    results["compile"] = out


def section_cpu_model():
    """fully_shard of a model still on CPU (BatchNorm: replicated buffers updated in place),
    trained 2 steps against the same model on one device."""
    def make():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.BatchNorm1d(32), torch.nn.Linear(32, 8))

    def train(model, place):
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        for step in range(2):
            g = torch.Generator().manual_seed(step)
            loss = model(place(torch.randn(16, 16, generator=g))).square().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        return {k: v.cpu() for k, v in model.state_dict().items()}

    want = train(make().to(f"tpu:{MESH.devices[0]}"), lambda t: t.to(f"tpu:{MESH.devices[0]}"))
    model = make()
    weight = model[0].weight
    torch.tpu.reset_peak_memory_stats(MESH.devices[0])
    spmd.fully_shard(model, MESH)
    peak = torch.tpu.max_memory_allocated(MESH.devices[0])
    identity = model[0].weight is weight and isinstance(weight, torch.nn.Parameter)
    got = train(model, lambda t: spmd.shard(t, MESH, (MESH.axis_names,)))
    params = sum(p.numel() * 4 for p in model.parameters())
    results["cpu_model"] = {
        "identity": identity, "first_device_peak": peak, "param_bytes": params,
        "errors": {k: float((got[k].double() - want[k].double()).abs().max()) for k in want},
        "buffers_on_mesh": all(spmd.mesh_devices(b) == MESH.devices for b in model.buffers()),
    }


def section_checkpoint():
    """torch.save / DCP of a sharded model: loads into one device and into another mesh."""
    import torch.distributed.checkpoint as dcp

    def make():
        torch.manual_seed(1)
        return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Linear(32, 8)).to(f"tpu:{MESH.devices[0]}")

    model = make()
    want = {k: v.cpu() for k, v in model.state_dict().items()}
    spmd.fully_shard(model, MESH)
    other = spmd.Mesh((N,), ("x",)) if N > 1 else MESH

    def equal(m):
        return all(torch.equal(v.cpu(), want[k]) for k, v in m.state_dict().items())

    def fresh(mesh):
        torch.manual_seed(2)  # other weights than `want`
        m = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Linear(32, 8)).to(f"tpu:{MESH.devices[0]}")
        return spmd.fully_shard(m, mesh) if mesh else m

    out = {}
    buffer = io.BytesIO()
    torch.save(model.state_dict(), buffer)
    buffer.seek(0)
    loaded = torch.load(buffer)
    out["save_global_values"] = all(torch.equal(loaded[k].cpu(), want[k]) for k in want)
    one, meshed = fresh(None), fresh(other)
    one.load_state_dict(loaded)
    meshed.load_state_dict(loaded)
    out["save_into_one_device"] = equal(one)
    out["save_into_other_mesh"] = equal(meshed)
    out["other_mesh_layout_kept"] = all(spmd.mesh_devices(p) == other.devices for p in meshed.parameters())
    with tempfile.TemporaryDirectory() as folder, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "torch.distributed is ... uninitialized, assuming ... a single process"
        dcp.save(model.state_dict(), checkpoint_id=folder)
        for name, target in (("dcp_into_one_device", fresh(None)), ("dcp_into_other_mesh", fresh(other))):
            state = target.state_dict()
            dcp.load(state, checkpoint_id=folder)
            out[name] = equal(target)
    results["checkpoint"] = out


def error_of(fn):
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - the type and message are what is checked
        return [type(e).__name__, str(e)]
    return None


def section_errors():
    x = torch.randn(5, 4)  # 5 rows: no mesh axis here divides them
    out = {
        "indivisible": error_of(lambda: spmd.shard(x.to("tpu"), MESH, ("data", None), name="features")),
        "too_large": error_of(lambda: spmd.Mesh((N + 1,), ("data",))),
        "unknown_axis": error_of(lambda: spmd.shard(x.to("tpu"), MESH, ("rows",))),
    }
    if N >= 3:
        a = spmd.Mesh((2,), ("data",), devices=[0, 1])
        b = spmd.Mesh((2,), ("data",), devices=[0, 2])
        xa = spmd.shard(torch.ones(4, 2), a, ("data",))
        xb = spmd.shard(torch.ones(4, 2), b, ("data",))
        out["two_meshes"] = error_of(lambda: (xa + xb).cpu())
    results["errors"] = out


def section_readme():
    """The README's notebook cell (the block after "## All devices from one process"), as is."""
    import re
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    text = open(os.path.join(root, "README.md")).read()
    code = re.search(r"```python\n(.*?)```", text[text.index("## All devices from one process"):], re.S).group(1)
    namespace = {}
    exec(compile(code, "README.md", "exec"), namespace)
    model = namespace["model"]
    results["readme"] = {
        "loss": namespace["loss"].item(),
        "layouts": [spmd.sharding(p).hlo for p in model.parameters()],
        "held": [torch.tpu.memory_allocated(d) for d in range(N)],
    }


SECTIONS = {name[len("section_"):]: fn for name, fn in globals().items() if name.startswith("section_")}

if __name__ == "__main__":
    for name in sys.argv[1:]:
        SECTIONS[name]()
    print("RESULTS " + json.dumps(results))
