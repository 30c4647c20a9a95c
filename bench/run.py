"""Side-by-side training-step benchmark (``make bench``).

In one process, for each model (GPT, ResNet), times a full training step
(zero_grad, forward, backward, AdamW step) on:

    torch-tpu   PyTorch on the torchtpu "tpu" device (skipped if torchtpu is absent)
    torch-cpu   PyTorch eager on the CPU
    jax         the same GPT in pure JAX under jax.jit (GPT only)

Every backend starts from the same initial weights and sees the same batches,
so the first-step losses in the table should agree. Prints a markdown table
and writes bench/results/<platform>.json.

    python bench/run.py                      # sizes chosen from the platform
    python bench/run.py --size small --repeats 5
    python bench/run.py --backends torch-cpu,jax --models gpt
"""

from __future__ import annotations

import argparse
import os
import sys

# Let JAX and torchtpu share an accelerator: do not grab most of its memory up front.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

import torch  # noqa: E402

from common import markdown_table, median_step_time, write_results  # noqa: E402
from models import (GPT, GPTConfig, ResNet, ResNetConfig, count_params, make_image_batch,  # noqa: E402
                    make_lm_batch, make_optimizer, train_step)

ALL_BACKENDS = ("torch-tpu", "torch-cpu", "jax")
ALL_MODELS = ("gpt", "resnet")


def load_torchtpu():
    try:
        import torchtpu
    except ImportError as exc:
        print(f"torchtpu not importable ({exc}); skipping the torch-tpu backend")
        return None
    return torchtpu


def model_setups(size: str, batch: int | None):
    """(name, config, model class, batch maker, batch size, items per step, unit)."""
    if size == "small":
        gpt_cfg, res_cfg = GPTConfig.small(), ResNetConfig.small()
        gpt_batch, res_batch = batch or 8, batch or 32
    else:
        gpt_cfg, res_cfg = GPTConfig.gpt2_124m(), ResNetConfig.resnet50()
        gpt_batch, res_batch = batch or 8, batch or 32
    return {
        "gpt": ("gpt", gpt_cfg, GPT, make_lm_batch, gpt_batch, gpt_batch * gpt_cfg.block_size, "tok"),
        "resnet": ("resnet", res_cfg, ResNet, make_image_batch, res_batch, res_batch, "img"),
    }


def time_torch(model_cls, cfg, make_batch, batch_size, device, args):
    torch.manual_seed(0)
    model = model_cls(cfg).to(device)
    opt = make_optimizer(model)
    batches = [tuple(t.to(device) for t in make_batch(cfg, batch_size, seed=s)) for s in range(2)]
    counter = iter(range(1 << 62))

    def step():
        return train_step(model, opt, batches[next(counter) % len(batches)])

    first_loss = step().item()
    seconds = median_step_time(step, warmup=args.warmup, repeats=args.repeats,
                               sync=lambda loss: loss.cpu())
    return seconds, first_loss, count_params(model)


def time_jax(cfg, batch_size, args):
    import jax
    import jax_lm

    torch.manual_seed(0)
    params = jax_lm.params_from_torch(GPT(cfg))
    n_params = sum(int(p.size) for p in params.values())
    opt_state = jax_lm.adamw_init(params)
    train = jax_lm.make_train_step(cfg)
    batches = [jax_lm.to_jax_batch(make_lm_batch(cfg, batch_size, seed=s)) for s in range(2)]
    state = {"params": params, "opt": opt_state, "i": 0}

    def step():
        idx, targets = batches[state["i"] % len(batches)]
        state["params"], state["opt"], loss = train(state["params"], state["opt"], idx, targets)
        state["i"] += 1
        return loss

    first_loss = float(step())
    seconds = median_step_time(step, warmup=args.warmup, repeats=args.repeats,
                               sync=jax.block_until_ready)
    return seconds, first_loss, n_params


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", choices=["auto", "small", "full"], default="auto",
                    help="small configs, or GPT-2 124M / ResNet-50 (auto: full unless on CPU only)")
    ap.add_argument("--models", default=",".join(ALL_MODELS))
    ap.add_argument("--backends", default=",".join(ALL_BACKENDS))
    ap.add_argument("--batch", type=int, default=None, help="override the batch size")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--no-write", action="store_true", help="do not write bench/results/*.json")
    args = ap.parse_args(argv)

    backends = [b for b in args.backends.split(",") if b]
    models = [m for m in args.models.split(",") if m]
    for name in backends:
        if name not in ALL_BACKENDS:
            ap.error(f"unknown backend {name!r}")
    for name in models:
        if name not in ALL_MODELS:
            ap.error(f"unknown model {name!r}")

    torchtpu = load_torchtpu() if "torch-tpu" in backends else None
    if torchtpu is None:
        backends = [b for b in backends if b != "torch-tpu"]
    if torchtpu is not None:
        platform = torchtpu.platform()
    elif "jax" in backends:
        import jax
        platform = jax.default_backend()
    else:
        platform = "cpu"
    size = args.size if args.size != "auto" else ("small" if platform == "cpu" else "full")
    print(f"platform: {platform}, size: {size}, torch threads: {torch.get_num_threads()}")

    setups = model_setups(size, args.batch)
    results = []
    for model_name in models:
        name, cfg, model_cls, make_batch, batch_size, items, unit = setups[model_name]
        for backend in backends:
            if backend == "jax" and model_name != "gpt":
                continue
            print(f"  timing {name} on {backend} ...", flush=True)
            if backend == "jax":
                seconds, first_loss, n_params = time_jax(cfg, batch_size, args)
            else:
                device = "tpu" if backend == "torch-tpu" else "cpu"
                seconds, first_loss, n_params = time_torch(model_cls, cfg, make_batch, batch_size,
                                                           device, args)
            results.append({
                "model": name, "config": {k: list(v) if isinstance(v, tuple) else v
                                          for k, v in vars(cfg).items()},
                "backend": backend, "batch": batch_size, "params": n_params,
                "median_step_s": seconds, "throughput": items / seconds, "unit": f"{unit}/s",
                "first_loss": first_loss, "warmup": args.warmup, "repeats": args.repeats,
            })

    baseline = {r["model"]: r["median_step_s"] for r in results if r["backend"] == "torch-cpu"}
    rows = []
    for r in results:
        base = baseline.get(r["model"])
        speedup = base / r["median_step_s"] if base else None
        r["speedup_vs_torch_cpu"] = speedup
        rows.append([r["model"], r["backend"], r["batch"], r["median_step_s"] * 1e3,
                     f"{r['throughput']:.1f} {r['unit']}",
                     f"{speedup:.2f}x" if speedup else "", f"{r['first_loss']:.5f}"])
    print()
    print(markdown_table(["model", "backend", "batch", "step ms (median)", "throughput",
                          "vs torch-cpu", "first loss"], rows))
    if not args.no_write:
        path = write_results(platform, results, meta={"size": size, "torch": torch.__version__})
        print(f"\nwrote {os.path.relpath(path)}")


if __name__ == "__main__":
    main()
