"""Side-by-side training-step benchmark (``make bench``).

In ONE process (so that all timings share the machine state), for each model
(GPT language model, ResNet CNN, LSTM language model) a full training step (zero_grad, forward,
backward, AdamW step) is timed for these variants:

    tpu-strict   torchtpu "tpu" device, strict mode (one executable per op)
    tpu-fused    torchtpu "tpu" device, fused mode (the default)
    tpu-compile  torch.compile(model, backend="tpu") on the tpu device
    eager        PyTorch eager on the host device (CPU, or CUDA when present)
    inductor     torch.compile(model) (Inductor) on the host device
    jax          the same GPT in pure JAX under jax.jit (GPT only)

Every variant starts from the same initial weights and runs the same batches
for the same number of steps, so the final losses must agree.

Besides the table it measures
  * first-step latency in fresh subprocesses: cold (empty TORCHTPU_CACHE_DIR),
    then warm (same directory, now filled by the cold run),
  * LM scaling: step and compile time as layers double and as batch doubles,
  * depth-flat compiles: the GPT at 2/4/8/16 layers with its blocks unrolled, run as one loop
    (torchtpu.scan_layers) and stored stacked (torchtpu.StackedLayers), compile and step
    time side by side,
  * per-op overhead: 10,000 small adds in strict mode vs host eager, and the
    fused-mode tracing cost per op,
  * runtimes: TORCHTPU_RUNTIME=jaxlib vs pjrt side by side in fresh processes (strict add vs
    eager, GPT strict/fused/compiled steps, cold first step; bench/runtimes.py, runs alone too),
  * input pipeline: large images through a small CNN, uploading in the loop vs
    torchtpu.data.DeviceLoader(prefetch=2) (bench/input_pipeline.py; runs alone too),
  * distributed: DDP and FSDP2 steps under torchrun, 2 processes vs 1 (executables and
    host bytes per step; bench/distributed.py, runs alone too),
  * varying lengths: a small causal LM trained in fused mode over 40 random sequence
    lengths, TORCHTPU_BUCKETS=pow2 vs off, each in a fresh process with an empty cache
    (bench/varlen.py; runs alone too),
  * text generation: Hugging Face generate() on the benchmark LM (batch 8, prompt 128, 128
    new tokens) in fused mode and with the decode step compiled, against CPU eager and the
    same decode loop in pure JAX (bench/generate.py; runs alone too),
and prints every ratio against its target (pass/miss).

Writes bench/results/<platform>.json, .md and .png.

    python bench/run.py                         # sizes chosen from the platform
    python bench/run.py --size small --repeats 5
    python bench/run.py --variants tpu-fused,eager --models gpt --skip scaling,firststep
    python bench/run.py --only varlen               # one section alone
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import traceback

# Let JAX and torchtpu share an accelerator: do not grab most of its memory up front.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
# A private, empty compilation cache for this process (unless one is given), so that the
# in-process first-step times are cold compiles and do not depend on earlier runs.
_OWN_CACHE = None
if "TORCHTPU_CACHE_DIR" not in os.environ:
    _OWN_CACHE = tempfile.mkdtemp(prefix="torchtpu-bench-cache-")
    os.environ["TORCHTPU_CACHE_DIR"] = _OWN_CACHE

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

import torch  # noqa: E402

from common import RESULTS_DIR, markdown_table, results_path, write_results  # noqa: E402
from distributed import distributed_table, run_distributed  # noqa: E402
from input_pipeline import input_table, run_input  # noqa: E402
from runtimes import run_runtimes, runtimes_table  # noqa: E402
from varlen import run_varlen, varlen_table  # noqa: E402
from generate import generate_table, ms_of, run_generate  # noqa: E402
from models import (GPT, GPTConfig, LSTMLM, LSTMConfig, ResNet, ResNetConfig, count_params,  # noqa: E402
                    make_image_batch, make_lm_batch, make_optimizer, train_step)

ALL_VARIANTS = ("tpu-strict", "tpu-fused", "tpu-compile", "eager", "inductor", "jax")
TPU_VARIANTS = ("tpu-strict", "tpu-fused", "tpu-compile")
ALL_MODELS = ("gpt", "resnet", "lstm")
ALL_SECTIONS = ("main", "firststep", "scaling", "scan", "perop", "runtimes", "input", "distributed", "varlen",
                "generate")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def load_torchtpu():
    try:
        import torchtpu
    except ImportError as exc:
        print(f"torchtpu not importable ({exc}); skipping the tpu variants")
        return None
    return torchtpu


def host_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


# --------------------------------------------------------------------------
# Configurations
# --------------------------------------------------------------------------


def model_setups(size: str, batch: int | None):
    """{model: dict(cfg, cls, make_batch, batch, items/step, unit, dtype)}."""
    if size == "small":
        # Sized for a 2-core CPU: the whole `make bench` stays under 10 minutes.
        gpt_cfg = GPTConfig.small(n_layer=4, n_embd=128, n_head=4, block_size=64)
        res_cfg, lstm_cfg = ResNetConfig.small(), LSTMConfig.small()
        gpt_batch, res_batch, lstm_batch, dtype = batch or 8, batch or 16, batch or 16, "float32"
    else:
        gpt_cfg, res_cfg, lstm_cfg = GPTConfig.gpt2_124m(), ResNetConfig.resnet50(), LSTMConfig.large()
        gpt_batch, res_batch, lstm_batch, dtype = batch or 8, batch or 32, batch or 32, "bfloat16"
    return {
        "gpt": dict(cfg=gpt_cfg, cls=GPT, make_batch=make_lm_batch, batch=gpt_batch,
                    items=gpt_batch * gpt_cfg.block_size, unit="tok", dtype=dtype),
        "resnet": dict(cfg=res_cfg, cls=ResNet, make_batch=make_image_batch, batch=res_batch,
                       items=res_batch, unit="img", dtype=dtype),
        "lstm": dict(cfg=lstm_cfg, cls=LSTMLM, make_batch=make_lm_batch, batch=lstm_batch,
                     items=lstm_batch * lstm_cfg.block_size, unit="tok", dtype=dtype),
    }


def _cfg_dict(cfg) -> dict:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in vars(cfg).items()}


# --------------------------------------------------------------------------
# One variant
# --------------------------------------------------------------------------


def _counters(torchtpu):
    if torchtpu is None:
        return None
    c = torchtpu.metrics.counters()
    return {k: (dict(v) if isinstance(v, dict) else v) for k, v in c.items()}


def _counter_delta(before, after, steps):
    if before is None or after is None:
        return None
    out = {}
    for key in ("ops_traced", "graphs_compiled", "execute_count", "cache_hits_memory",
                "cache_hits_disk", "compile_seconds", "bytes_to_device", "bytes_to_host"):
        if key in after:
            out[key + "_per_step"] = (after[key] - before.get(key, 0)) / steps
    fb = {op: n - before.get("fallback_ops", {}).get(op, 0)
          for op, n in after.get("fallback_ops", {}).items()}
    out["fallback_ops"] = {op: n for op, n in fb.items() if n}
    return out


def make_torch_model(setup, device, dtype):
    torch.manual_seed(0)
    model = setup["cls"](setup["cfg"]).to(device=device, dtype=dtype)
    if isinstance(model, GPT):
        tied = model.lm_head.weight is model.tok_emb.weight
        model.tie_weights()  # no-op when .to() kept the tie (torchtpu re-ties after .to())
        if not tied:
            _UNTIED.add(str(device))
    return model


_UNTIED: set = set()  # devices on which .to() lost GPT's weight tying

BLOCKS = ("unrolled", "scanned", "stacked")  # how the GPT runs its blocks (bench section "scan")


def set_blocks(model, blocks, torchtpu):
    """Runs the GPT's blocks as a plain loop (unrolled), as one loop over per-layer
    parameters (torchtpu.scan_layers: scanned) or over parameters stored stacked
    (torchtpu.StackedLayers: stacked). Before the optimizer is made: stacked replaces them."""
    if blocks == "scanned":
        model.run_blocks = lambda x: torchtpu.scan_layers(model.blocks, x)
    elif blocks == "stacked":
        model.blocks = torchtpu.StackedLayers(model.blocks)
        model.run_blocks = lambda x: model.blocks(x)
    elif blocks != "unrolled":
        raise ValueError(f"unknown blocks {blocks!r}; one of {BLOCKS}")


def make_batches(setup, device, dtype, n=2):
    out = []
    for s in range(n):
        x, y = setup["make_batch"](setup["cfg"], setup["batch"], seed=s)
        x = x.to(device)
        if x.is_floating_point():
            x = x.to(dtype)
        out.append((x, y.to(device)))
    return out


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class TorchRunner:
    """One PyTorch variant: model, optimizer, batches; ``step()`` runs one synced step."""

    def __init__(self, variant, setup, torchtpu):
        dtype = DTYPES[setup["dtype"]]
        self.variant, self.torchtpu = variant, torchtpu
        self.device = "tpu" if variant in TPU_VARIANTS else host_device()
        self.mode = {"tpu-strict": "strict"}.get(variant, "fused")
        self.base_mem = self.memory()
        with self.ctx():
            self.model = make_torch_model(setup, self.device, dtype)
            set_blocks(self.model, setup.get("blocks", "unrolled"), torchtpu)
            self.opt = make_optimizer(self.model)
            self.batches = make_batches(setup, self.device, dtype)
            if variant == "tpu-compile":
                self.fwd = torch.compile(self.model, backend="tpu")
            elif variant == "inductor":
                self.fwd = torch.compile(self.model)
            else:
                self.fwd = self.model
        self.params = count_params(self.model)
        self.i = 0
        self.reset_peak()

    def ctx(self):
        return self.torchtpu.mode(self.mode) if self.device == "tpu" else _null()

    def step(self) -> float:
        with self.ctx():
            loss = train_step(self.fwd, self.opt, self.batches[self.i % len(self.batches)])
            self.i += 1
            return loss.float().cpu().item()  # the sync point

    def counters(self):
        return _counters(self.torchtpu) if self.device == "tpu" else None

    def memory(self):
        if self.device == "tpu":
            torch.tpu.synchronize()
            return torch.tpu.memory_allocated()
        if self.device == "cuda":
            torch.cuda.synchronize()
            return torch.cuda.memory_allocated()
        return None

    def reset_peak(self):
        if self.device == "tpu":
            torch.tpu.synchronize()
            torch.tpu.reset_peak_memory_stats()
        elif self.device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()

    def peak_memory(self):
        """Peak bytes allocated since reset_peak, above what was allocated before this variant."""
        if self.device == "tpu":
            return torch.tpu.max_memory_allocated() - self.base_mem
        if self.device == "cuda":
            return torch.cuda.max_memory_allocated() - self.base_mem
        return None

    def close(self):
        del self.model, self.opt, self.batches, self.fwd
        gc.collect()


class JaxRunner:
    """The pure-JAX GPT (bench/jax_lm.py) with the same weights, batches and AdamW."""

    def __init__(self, variant, setup, torchtpu=None):
        import jax
        import jax.numpy as jnp
        import jax_lm

        self.variant, self.device = variant, None
        cfg = setup["cfg"]
        dtype = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}[setup["dtype"]]
        torch.manual_seed(0)
        params = jax_lm.params_from_torch(GPT(cfg), dtype=dtype)
        self.params = sum(int(p.size) for p in params.values())
        self.train = jax_lm.make_train_step(cfg)
        self.batches = [jax_lm.to_jax_batch(make_lm_batch(cfg, setup["batch"], seed=s)) for s in range(2)]
        self.state = {"params": params, "opt": jax_lm.adamw_init(params)}
        self.i = 0
        self.device = jax.devices()[0].platform
        self._jax = jax

    def step(self) -> float:
        idx, targets = self.batches[self.i % len(self.batches)]
        self.state["params"], self.state["opt"], loss = self.train(self.state["params"], self.state["opt"],
                                                                   idx, targets)
        self.i += 1
        return float(loss)

    def counters(self):
        return None

    def reset_peak(self):
        pass

    def peak_memory(self):
        try:
            stats = self._jax.devices()[0].memory_stats()
            return stats.get("peak_bytes_in_use") if stats else None
        except Exception:
            return None

    def close(self):
        del self.state
        gc.collect()


def make_runner(variant, setup, torchtpu):
    return (JaxRunner if variant == "jax" else TorchRunner)(variant, setup, torchtpu)


def prepare(runner, warmup):
    """First step (timed: compilation included) and the warm-up steps; returns a result dict."""
    res = {}
    c0 = runner.counters()
    t0 = time.perf_counter()
    res["losses"] = [runner.step()]
    res["first_step_s"] = time.perf_counter() - t0
    c1 = runner.counters()
    if c1 is not None:
        res["first_step_compile_s"] = c1["compile_seconds"] - c0["compile_seconds"]
        res["first_step_graphs_compiled"] = c1["graphs_compiled"] - c0["graphs_compiled"]
    for _ in range(warmup):
        res["losses"].append(runner.step())
    c2 = runner.counters()
    if c2 is not None:  # every graph compiled by this variant (first step and warm-up)
        res["compile_s_total"] = c2["compile_seconds"] - c0["compile_seconds"]
        res["graphs_compiled_total"] = c2["graphs_compiled"] - c0["graphs_compiled"]
    res["peak_mem_bytes"] = runner.peak_memory()
    res["params"], res["device"] = runner.params, runner.device
    res["step_times"] = []
    res["_c"] = None
    return res


def timed_step(runner, res):
    """One timed step; accumulates its time and the torchtpu counters it moved."""
    c0 = runner.counters()
    t = time.perf_counter()
    res["losses"].append(runner.step())
    res["step_times"].append(time.perf_counter() - t)
    c1 = runner.counters()
    if c0 is not None:
        d = _counter_delta(c0, c1, 1)
        acc = res["_c"] or {}
        for k, v in d.items():
            if k == "fallback_ops":
                fb = acc.setdefault(k, {})
                for op, n in v.items():
                    fb[op] = fb.get(op, 0) + n
            else:
                acc[k] = acc.get(k, 0) + v
        res["_c"] = acc


def finish(res):
    n = len(res["step_times"])
    c = res.pop("_c", None)
    if c:
        c = {k: (v if k == "fallback_ops" else v / n) for k, v in c.items()}
    res["counters_per_step"] = c
    res["median_step_s"] = statistics.median(res["step_times"])
    res["final_loss"] = res["losses"][-1]
    return res


def run_single(variant, setup, args, torchtpu, warmup, repeats):
    """One variant alone: prepare, time ``repeats`` steps, close."""
    runner = make_runner(variant, setup, torchtpu)
    try:
        res = prepare(runner, warmup)
        for _ in range(repeats):
            timed_step(runner, res)
        return finish(res)
    finally:
        runner.close()


def _error(exc):
    text = str(exc).strip()
    return {"error": f"{type(exc).__name__}: {text.splitlines()[0][:300] if text else ''}",
            "traceback": traceback.format_exc()[-4000:]}


def run_main(models, variants, setups, args, torchtpu, on_result=None):
    """Per model: prepare every variant in turn (first step, warm-up), then time the steps
    INTERLEAVED (one step of each variant per round, the order rotating every round), so
    that the load of a shared machine falls on all variants alike."""
    results = []
    for model_name in models:
        setup = setups[model_name]
        live = []  # (runner, result)
        meta = dict(model=model_name, batch=setup["batch"], dtype=setup["dtype"], config=_cfg_dict(setup["cfg"]),
                    unit=f"{setup['unit']}/s", warmup=args.warmup, repeats=args.repeats)
        for variant in variants:
            if variant == "jax" and model_name != "gpt":
                continue
            print(f"  {model_name:6s} {variant:12s} first step + {args.warmup} warm-up ...", end=" ", flush=True)
            t0 = time.perf_counter()
            try:
                # No torch._dynamo.reset() here: it would drop the tpu-compile variant's
                # compiled graphs, and a tpu model re-traced mid-training diverges (see
                # docs/benchmarks.md, "torchtpu issues found").
                runner = make_runner(variant, setup, torchtpu)
                res = prepare(runner, args.warmup)
                live.append((runner, res))
                msg = f"first step {res['first_step_s']:6.2f} s, loss {res['losses'][0]:.5f}"
            except Exception as exc:  # recorded in the table, never fatal
                res = _error(exc)
                msg = f"FAILED: {res['error']}"
                gc.collect()
            res.update(meta, variant=variant)
            results.append(res)
            print(f"{msg}  [{time.perf_counter() - t0:.0f} s]", flush=True)
        print(f"  {model_name:6s} timing {len(live)} variants interleaved, {args.repeats} rounds ...", flush=True)
        failed = set()
        for rnd in range(args.repeats):
            k = rnd % max(1, len(live))
            for runner, res in live[k:] + live[:k]:
                if id(res) in failed:
                    continue
                # Untimed pause: lets the previous variant's spinning worker threads (XLA's
                # CPU pool, OpenMP) park, so they do not steal this step's 2 cores.
                time.sleep(args.settle)
                try:
                    timed_step(runner, res)
                except Exception as exc:
                    res.update(_error(exc))
                    failed.add(id(res))
        for runner, res in live:
            if id(res) not in failed:
                finish(res)
                res["error"] = None
                res["throughput"] = setup["items"] / res["median_step_s"]
                print(f"  {model_name:6s} {res['variant']:12s} step {res['median_step_s'] * 1e3:8.1f} ms "
                      f"(min {min(res['step_times']) * 1e3:.1f}, max {max(res['step_times']) * 1e3:.1f}), "
                      f"final loss {res['final_loss']:.5f}", flush=True)
            else:
                res.pop("_c", None)
            runner.close()
        if on_result is not None:
            on_result(results)
    return results


# --------------------------------------------------------------------------
# First step in fresh subprocesses: cold, then warm disk cache
# --------------------------------------------------------------------------


def first_step_child(spec: str, args):
    """Runs in the child: one first step of model:variant, prints a JSON line."""
    t_start = time.perf_counter()
    model_name, variant = spec.split(":")
    torchtpu = load_torchtpu()
    t_import = time.perf_counter() - t_start
    setup = model_setups(args.size, args.batch)[model_name]
    res = run_single(variant, setup, args, torchtpu, warmup=0, repeats=1)
    c = torchtpu.metrics.counters()
    out = dict(first_step_s=res["first_step_s"], compile_s=res.get("first_step_compile_s"),
               graphs_compiled=res.get("first_step_graphs_compiled"),
               cache_hits_disk=c["cache_hits_disk"], import_s=t_import,
               process_s=time.perf_counter() - t_start, first_loss=res["losses"][0])
    print("FIRSTSTEP " + json.dumps(out), flush=True)


def run_first_steps(specs, args):
    rows = []
    for spec in specs:
        cache = tempfile.mkdtemp(prefix="torchtpu-bench-firststep-")
        entry = {"spec": spec}
        for kind in ("cold", "warm"):
            env = dict(os.environ, TORCHTPU_CACHE_DIR=cache)
            cmd = [sys.executable, os.path.abspath(__file__), "--first-step-child", spec,
                   "--size", args.size] + (["--batch", str(args.batch)] if args.batch else [])
            print(f"  {spec:20s} {kind} ...", end=" ", flush=True)
            t0 = time.perf_counter()
            try:
                p = subprocess.run(cmd, env=env, capture_output=True, text=True,
                                   timeout=args.child_timeout)
                line = [ln for ln in p.stdout.splitlines() if ln.startswith("FIRSTSTEP ")]
                if p.returncode != 0 or not line:
                    raise RuntimeError(f"rc={p.returncode}: {(p.stderr or p.stdout).strip()[-500:]}")
                entry[kind] = json.loads(line[-1][len("FIRSTSTEP "):])
                print(f"first step {entry[kind]['first_step_s']:.2f} s (compile "
                      f"{entry[kind]['compile_s'] or 0:.2f} s, disk hits {entry[kind]['cache_hits_disk']}), "
                      f"process {time.perf_counter() - t0:.1f} s", flush=True)
            except Exception as exc:
                entry[kind] = {"error": str(exc)[:600]}
                print(f"FAILED: {str(exc)[:300]}", flush=True)
        if "first_step_s" in entry.get("cold", {}) and "first_step_s" in entry.get("warm", {}):
            entry["warm_over_cold"] = entry["warm"]["first_step_s"] / entry["cold"]["first_step_s"]
        rows.append(entry)
    return rows


# --------------------------------------------------------------------------
# Scaling (fused mode)
# --------------------------------------------------------------------------


def run_scaling(setups, args, torchtpu, main_results):
    base = setups["gpt"]
    cfg0, b0 = base["cfg"], base["batch"]
    mid = 4  # layers 2, 4, 8 at the base batch; batch b/2, b, 2b at 4 layers
    points = [("layers", 2, b0), ("layers", 4, b0), ("layers", 8, b0),
              ("batch", mid, max(1, b0 // 2)), ("batch", mid, b0), ("batch", mid, b0 * 2)]
    reuse = next((r for r in main_results if r["model"] == "gpt" and r["variant"] == "tpu-fused"
                  and r.get("median_step_s")), None)
    done = {}
    rows = []
    for axis, layers, batch in points:
        key = (layers, batch)
        if key not in done:
            if key == (cfg0.n_layer, b0) and reuse is not None:  # the main run's fused GPT
                r = reuse
            else:
                setup = dict(base, cfg=cfg0.replace(n_layer=layers), batch=batch,
                             items=batch * cfg0.block_size)
                print(f"  gpt fused layers={layers:2d} batch={batch:3d} ...", end=" ", flush=True)
                try:
                    r = run_single("tpu-fused", setup, args, torchtpu, warmup=1,
                                   repeats=max(3, args.repeats // 2))
                    print(f"step {r['median_step_s'] * 1e3:.1f} ms, compile {r['compile_s_total']:.2f} s "
                          f"({r['graphs_compiled_total']} graphs)",
                          flush=True)
                except Exception as exc:
                    r = {"error": f"{type(exc).__name__}: {exc}"[:300]}
                    print("FAILED", r["error"], flush=True)
            done[key] = r
        r = done[key]
        rows.append(dict(axis=axis, layers=layers, batch=batch, median_step_s=r.get("median_step_s"),
                         compile_s=r.get("compile_s_total"), first_step_s=r.get("first_step_s"),
                         error=r.get("error")))
    return rows


def scan_setup(base, size, layers, blocks):
    """The section's GPT: on CPU narrower than the main table's (width 64, batch 4x32), so
    that 12 cold compiles up to 16 unrolled layers fit in a few minutes."""
    cfg = base["cfg"].replace(n_layer=layers)
    if size == "small":
        cfg = cfg.replace(n_embd=64, n_head=2, block_size=32)
        return dict(base, cfg=cfg, batch=4, items=4 * 32, blocks=blocks)
    return dict(base, cfg=cfg, blocks=blocks)


def run_scan(setups, args, torchtpu):
    """The GPT at 2/4/8/16 layers, blocks unrolled, scanned (torchtpu.scan_layers) and stacked
    (torchtpu.StackedLayers), fused mode; per depth the three run back to back, so that they
    share the machine's state. Compile time counts every graph of the first steps."""
    base = setups["gpt"]
    rows = []
    for layers in (2, 4, 8, 16):
        for blocks in BLOCKS:
            setup = scan_setup(base, args.size, layers, blocks)
            print(f"  gpt fused layers={layers:2d} {blocks:8s} ...", end=" ", flush=True)
            try:
                r = _run_scan_variant(setup, args, torchtpu)
                print(f"step {r['median_step_s'] * 1e3:.1f} ms, compile {r['compile_s_total']:.2f} s "
                      f"({r['graphs_compiled_total']} graphs), first steps {r['prepare_cpu_s']:.2f} CPU s, "
                      f"loss {r['final_loss']:.4f}", flush=True)
            except Exception as exc:
                r = {"error": f"{type(exc).__name__}: {exc}"[:300]}
                print("FAILED", r["error"], flush=True)
            ops = (r.get("counters_per_step") or {}).get("ops_traced_per_step")
            rows.append(dict(layers=layers, blocks=blocks, median_step_s=r.get("median_step_s"),
                             compile_s=r.get("compile_s_total"), graphs=r.get("graphs_compiled_total"),
                             prepare_cpu_s=r.get("prepare_cpu_s"),
                             ops_per_step=ops, first_step_s=r.get("first_step_s"),
                             final_loss=r.get("final_loss"), config=_cfg_dict(setup["cfg"]), batch=setup["batch"],
                             error=r.get("error")))
    return rows


def _run_scan_variant(setup, args, torchtpu):
    """run_single, plus the CPU time of the first steps (this process, all threads): on a
    shared machine the compile's wall time swings 2-3x with the load, its CPU time far less."""
    runner = make_runner("tpu-fused", setup, torchtpu)
    try:
        cpu0 = time.process_time()
        res = prepare(runner, warmup=1)
        res["prepare_cpu_s"] = time.process_time() - cpu0
        for _ in range(max(3, args.repeats // 2)):
            timed_step(runner, res)
        return finish(res)
    finally:
        runner.close()


def scan_table(rows):
    """One row per depth; per variant the compile time (wall) and the first steps' CPU time,
    each with its growth from half the depth, the step time and the ops traced per step."""
    by = {(r["layers"], r.get("blocks")): r for r in rows}
    out = []
    for layers in sorted({r["layers"] for r in rows}):
        compile_cells, cpu_cells, step_cells, op_cells, losses = [], [], [], [], []
        for blocks in BLOCKS:
            r, prev = by.get((layers, blocks), {}), by.get((layers // 2, blocks), {})
            for key, cells in (("compile_s", compile_cells), ("prepare_cpu_s", cpu_cells)):
                c = r.get(key)
                grow = f" ({c / prev[key]:.2f}x)" if c and prev.get(key) else ""
                cells.append(f"{c:.1f}{grow}" if c is not None else (r.get("error") or "")[:40])
            step_cells.append(f"{r['median_step_s'] * 1e3:.1f}" if r.get("median_step_s") else "")
            op_cells.append(f"{r['ops_per_step']:.0f}" if r.get("ops_per_step") is not None else "")
            losses.append(f"{r['final_loss']:.4f}" if r.get("final_loss") is not None else "-")
        out.append([layers, *compile_cells, *cpu_cells, *step_cells, *op_cells, " / ".join(losses)])
    names = ["unrolled", "scan_layers", "StackedLayers"]
    return markdown_table(["layers"] + [f"compile s {n} (x from half depth)" for n in names]
                          + [f"first steps CPU s {n} (x)" for n in names] + [f"step ms {n}" for n in names] + [f"ops/step {n}" for n in names]
                          + ["final loss (same order)"], out)


# --------------------------------------------------------------------------
# Per-op overhead
# --------------------------------------------------------------------------


def run_perop(torchtpu, n=10_000):
    host = host_device()

    def loop(a, b):
        for _ in range(n):
            c = a + b  # noqa: F841
        return c

    out = {"n_ops": n, "host_device": host}
    a, b = torch.randn(16, device=host), torch.randn(16, device=host)
    loop(a, b)
    t = time.perf_counter()
    loop(a, b)
    if host == "cuda":
        torch.cuda.synchronize()
    out["host_eager_us"] = (time.perf_counter() - t) / n * 1e6
    if torchtpu is not None:
        a, b = a.to("tpu"), b.to("tpu")
        with torchtpu.mode("strict"):
            loop(a, b).cpu()
            torch.tpu.synchronize()
            c0 = torchtpu.metrics.counters()
            t, cpu = time.perf_counter(), time.process_time()
            loop(a, b)
            torch.tpu.synchronize()
            out["strict_us"] = (time.perf_counter() - t) / n * 1e6
            # CPU time of every thread of the process (XLA's included): the work an op costs,
            # which a loaded machine stretches far less than the wall time.
            out["strict_cpu_us"] = (time.process_time() - cpu) / n * 1e6
            c1 = torchtpu.metrics.counters()
            out["strict_executes"] = c1["execute_count"] - c0["execute_count"]
        with torchtpu.mode("fused"):
            loop(a, b).cpu()
            c0 = torchtpu.metrics.counters()
            t = time.perf_counter()
            c = loop(a, b)
            out["fused_trace_us"] = (time.perf_counter() - t) / n * 1e6
            t = time.perf_counter()
            c.cpu()
            out["fused_flush_ms"] = (time.perf_counter() - t) * 1e3
            c1 = torchtpu.metrics.counters()
            out["fused_ops_traced"] = c1["ops_traced"] - c0["ops_traced"]
            out["fused_executes"] = c1["execute_count"] - c0["execute_count"]
    print(f"  {n} adds of 16 floats: host eager {out['host_eager_us']:.2f} us/op"
          + (f", strict {out['strict_us']:.2f} us/op ({out['strict_us'] / out['host_eager_us']:.1f}x host), "
             f"fused tracing {out['fused_trace_us']:.2f} us/op" if "strict_us" in out else ""), flush=True)
    return out


# --------------------------------------------------------------------------
# Targets, tables, chart
# --------------------------------------------------------------------------


def _t(results, model, variant):
    r = next((r for r in results if r["model"] == model and r["variant"] == variant), None)
    return r.get("median_step_s") if r else None


def targets(results, first_steps, generate=None):
    """[(name, ratio, op, threshold, definition)]; ratio None when not measured."""
    rows = []

    def add(name, ratio, op, thr, how):
        ok = None if ratio is None else (ratio >= thr if op == ">=" else ratio <= thr)
        rows.append(dict(name=name, ratio=ratio, op=op, target=thr, definition=how,
                         status="n/a" if ok is None else ("pass" if ok else "MISS")))

    def div(a, b):
        return a / b if a and b else None

    for model in ("gpt", "resnet"):
        add(f"{model}: fused speed vs strict", div(_t(results, model, "tpu-strict"), _t(results, model, "tpu-fused")),
            ">=", 2.0, "t_strict / t_fused")
    add("gpt: compile speed vs strict", div(_t(results, "gpt", "tpu-strict"), _t(results, "gpt", "tpu-compile")),
        ">=", 3.0, "t_strict / t_compile")
    add("resnet: compile step time vs strict", div(_t(results, "resnet", "tpu-compile"), _t(results, "resnet", "tpu-strict")),
        "<=", 0.6, "t_compile / t_strict")
    add("gpt: compile speed vs pure JAX", div(_t(results, "gpt", "jax"), _t(results, "gpt", "tpu-compile")),
        ">=", 0.9, "t_jax / t_compile")
    add("gpt: fused step time vs pure JAX", div(_t(results, "gpt", "tpu-fused"), _t(results, "gpt", "jax")),
        "<=", 1.1, "t_fused / t_jax (within 10%)")
    for fs in first_steps:
        add(f"{fs['spec']}: warm-cache first step vs cold", fs.get("warm_over_cold"), "<=", 0.2,
            "first_step_warm / first_step_cold (subprocesses)")
    if generate:
        add("generate: compiled decode vs pure JAX", div(ms_of(generate, "tpu-compile"), ms_of(generate, "jax")),
            "<=", 1.2, "ms per token, tpu-compile / jax")
        add("generate: fused vs compiled decode", div(ms_of(generate, "tpu-fused"), ms_of(generate, "tpu-compile")),
            "<=", 1.5, "ms per token, tpu-fused / tpu-compile")
    return rows


def _mb(x):
    return f"{x / 2**20:.1f}" if x else ""


def main_table(results):
    base = {r["model"]: r.get("median_step_s") for r in results if r["variant"] == "eager"}
    rows = []
    for r in results:
        if r.get("error"):
            rows.append([r["model"], r["variant"], r["batch"], "", "", "", "", "", "", "error: " + r["error"][:160]])
            continue
        b = base.get(r["model"])
        rows.append([r["model"], r["variant"], r["batch"], f"{r['median_step_s'] * 1e3:.1f}",
                     f"{r['throughput']:.0f} {r['unit']}", f"{b / r['median_step_s']:.2f}x" if b else "",
                     f"{r['first_step_s']:.2f}", _mb(r.get("peak_mem_bytes")), f"{r['final_loss']:.5f}", ""])
    return markdown_table(["model", "variant", "batch", "step ms (median)", "throughput", "vs eager",
                           "first step s (in-process)", "peak MiB", "final loss", "note"], rows)


def counters_table(results):
    rows = []
    for r in results:
        c = r.get("counters_per_step")
        if not c:
            continue
        rows.append([r["model"], r["variant"], f"{c.get('ops_traced_per_step', 0):.0f}",
                     f"{c.get('graphs_compiled_per_step', 0):.1f}", f"{c.get('execute_count_per_step', 0):.0f}",
                     f"{c.get('cache_hits_memory_per_step', 0):.0f}",
                     ", ".join(f"{k}: {v}" for k, v in c.get("fallback_ops", {}).items()) or "none"])
    return markdown_table(["model", "variant", "ops traced/step", "graphs compiled/step", "executes/step",
                           "memory-cache hits/step", "fallback ops (timed steps)"], rows)


def targets_table(trows):
    return markdown_table(["target", "definition", "measured", "goal", "status"],
                          [[t["name"], t["definition"], "" if t["ratio"] is None else f"{t['ratio']:.3f}",
                            f"{t['op']} {t['target']}", t["status"]] for t in trows])


def first_step_table(first_steps):
    rows = []
    for fs in first_steps:
        c, w = fs.get("cold", {}), fs.get("warm", {})
        f = lambda d, k: f"{d[k]:.2f}" if isinstance(d.get(k), (int, float)) else d.get("error", "")[:80]  # noqa: E731
        rows.append([fs["spec"], f(c, "first_step_s"), f(c, "compile_s"), f(w, "first_step_s"), f(w, "compile_s"),
                     w.get("cache_hits_disk", ""), f"{fs['warm_over_cold']:.3f}" if fs.get("warm_over_cold") else "",
                     f(c, "process_s"), f(w, "process_s")])
    return markdown_table(["model:variant", "cold first step s", "cold compile s", "warm first step s",
                           "warm compile s", "warm disk-cache hits", "warm/cold", "cold process s", "warm process s"], rows)


def scaling_table(scaling):
    rows, prev = [], {}
    for s in scaling:
        p = prev.get(s["axis"])
        g_step = f"{s['median_step_s'] / p['median_step_s']:.2f}x" if p and s["median_step_s"] and p["median_step_s"] else ""
        g_comp = f"{s['compile_s'] / p['compile_s']:.2f}x" if p and s["compile_s"] and p["compile_s"] else ""
        rows.append([s["axis"], s["layers"], s["batch"],
                     f"{s['median_step_s'] * 1e3:.1f}" if s["median_step_s"] else s.get("error") or "",
                     g_step, f"{s['compile_s']:.2f}" if s["compile_s"] is not None else "", g_comp])
        prev[s["axis"]] = s
    return markdown_table(["doubling", "layers", "batch", "step ms", "step growth", "compile s (all graphs)", "compile growth"], rows)


def perop_table(p):
    rows = [["host eager (" + p["host_device"] + ")", f"{p['host_eager_us']:.2f}", "1.00x"]]
    if "strict_us" in p:
        rows.append(["tpu strict (compile-cached, async launch)", f"{p['strict_us']:.2f}",
                     f"{p['strict_us'] / p['host_eager_us']:.1f}x"])
        rows.append(["tpu fused, tracing only", f"{p['fused_trace_us']:.2f}",
                     f"{p['fused_trace_us'] / p['host_eager_us']:.1f}x"])
    return markdown_table([f"{p['n_ops']} adds of 16 floats", "us/op", "vs host eager"], rows)


def write_chart(path, results, scaling, title):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no chart")
        return None
    models = sorted({r["model"] for r in results}, key=ALL_MODELS.index)
    ncols = len(models) + (1 if scaling else 0)
    if ncols == 0:
        return None
    fig, axes = plt.subplots(1, ncols, figsize=(5 * ncols, 4), dpi=100, squeeze=False)
    for ax, model in zip(axes[0], models):
        rs = [r for r in results if r["model"] == model]
        names = [r["variant"] for r in rs]
        vals = [r.get("throughput") or 0 for r in rs]
        bars = ax.bar(names, vals, color=["C0" if v in TPU_VARIANTS else "C1" if v != "jax" else "C2" for v in names])
        for bar, r in zip(bars, rs):
            ax.text(bar.get_x() + bar.get_width() / 2, bar.get_height(),
                    "error" if r.get("error") else f"{r['median_step_s'] * 1e3:.0f} ms",
                    ha="center", va="bottom", fontsize=7)
        ax.set_title(f"{model} training step")
        ax.set_ylabel(rs[0]["unit"] if rs else "")
        ax.tick_params(axis="x", rotation=35, labelsize=8)
    if scaling:
        ax = axes[0][-1]
        for axis, marker in (("layers", "o"), ("batch", "s")):
            pts = [s for s in scaling if s["axis"] == axis and s["median_step_s"]]
            if pts:
                ax.plot([s[axis] for s in pts], [s["median_step_s"] * 1e3 for s in pts], marker=marker,
                        label=f"step ms vs {axis}")
                ax.plot([s[axis] for s in pts], [(s["compile_s"] or 0) * 1e3 for s in pts], marker=marker,
                        linestyle="--", label=f"compile ms vs {axis}")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title("gpt fused scaling")
        ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


# --------------------------------------------------------------------------


def versions(torchtpu):
    v = {"torch": torch.__version__, "python": sys.version.split()[0]}
    try:
        import jax
        import jaxlib
        v["jax"], v["jaxlib"] = jax.__version__, jaxlib.__version__
    except Exception:
        pass
    if torchtpu is not None:
        v["torchtpu"] = torchtpu.__version__
    try:
        v["cpu"] = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "")
    except OSError:
        pass
    if torch.cuda.is_available():
        v["gpu"] = torch.cuda.get_device_name(0)
    return v


def emit(args, meta, platform, size, results, first_steps, scaling, perop, t_begin, final, input_pipeline=None,
         distributed=None, scan=None, varlen=None, runtimes=None, generate=None):
    """Builds the report; prints it when final; writes the .json/.md (and .png when final).
    Called after every variant too, so a run killed by a timeout keeps what it measured."""
    if True:
        meta["to_device_untied_gpt_weights"] = sorted(_UNTIED)
        if _UNTIED and final:
            print(f"\nNOTE: model.to() lost GPT's weight tying on {sorted(_UNTIED)}; re-tied (GPT.tie_weights)")
        trows = targets(results, first_steps, generate)
        losses = {}
        for r in results:
            if r.get("final_loss") is not None:
                losses.setdefault(r["model"], []).append(r["final_loss"])
        loss_check = {m: dict(min=min(v), max=max(v), spread=max(v) - min(v)) for m, v in losses.items()}

        sections = []
        if results:
            sections += ["## Training step, side by side\n", main_table(results), "",
                         "Final loss after " f"{1 + args.warmup + args.repeats} identical steps; spread per model: "
                         + ", ".join(f"{m} {d['spread']:.2e}" for m, d in loss_check.items()), "",
                         "### torchtpu counters per timed step\n", counters_table(results), ""]
        if any(t["status"] != "n/a" for t in trows):  # a partial run (--only) measures none
            sections += ["## Targets\n", targets_table(trows), ""]
        if first_steps:
            sections += ["## First step in a fresh process (cold cache, then warm disk cache)\n",
                         first_step_table(first_steps), ""]
        if scaling:
            sections += ["## LM scaling (fused)\n", scaling_table(scaling), ""]
        if scan:
            sections += ["## Depth-flat compiles: GPT blocks unrolled vs scan_layers vs StackedLayers (fused)\n",
                         scan_table(scan), ""]
        if perop:
            sections += ["## Per-op overhead\n", perop_table(perop), ""]
        if runtimes:
            sections += ["## Runtimes: jaxlib vs pjrt (fresh processes, side by side)\n", runtimes_table(runtimes), ""]
        if input_pipeline:
            sections += ["## Input pipeline: prefetch vs none\n", input_table(input_pipeline), ""]
        if distributed:
            sections += ["## Distributed: torchrun, 2 processes vs 1, and one process on 2 devices (SPMD)\n",
                         distributed_table(distributed), ""]
        if varlen:
            sections += ["## Fused mode over varying lengths: buckets vs exact sizes\n", varlen_table(varlen), ""]
        if generate:
            sections += ["## Text generation: generate() per new token\n", generate_table(generate), ""]
        errors = [r for r in results if r.get("error")]
        if errors:
            sections += ["## Errors\n"] + [f"- {r['model']} {r['variant']}: `{r['error']}`" for r in errors] + [""]
        report = "\n".join(sections)
        if final:
            print("\n" + report)
            print(f"total benchmark time {time.perf_counter() - t_begin:.0f} s")

        if not args.no_write:
            meta["total_s"] = time.perf_counter() - t_begin
            header = (f"# torchtpu benchmarks: platform {platform}, size {size}\n\n"
                      f"{time.strftime('%Y-%m-%d %H:%M')}; " + ", ".join(f"{k} {v}" for k, v in meta.items()) + "\n\n")
            payload = dict(results=results, targets=trows, first_steps=first_steps, scaling=scaling, scan=scan,
                           perop=perop, runtimes=runtimes, input_pipeline=input_pipeline, distributed=distributed,
                           varlen=varlen, generate=generate, loss_check=loss_check)
            name = f"{platform}-{args.tag}" if args.tag else platform
            jpath = write_results(name, [payload], meta=meta)
            base = os.path.splitext(results_path(name))[0]
            with open(base + ".md", "w") as f:
                f.write(header + report + "\n")
            try:
                png = None if not final else write_chart(base + ".png", results, scaling, f"torchtpu {platform} ({size}), {meta.get('gpu') or meta.get('cpu', '')}")
            except Exception as exc:  # the chart is a convenience; never lose the results for it
                print("chart FAILED:", exc)
                png = None
            if final:
                print("wrote", ", ".join(os.path.relpath(p) for p in (jpath, base + ".md", png) if p))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", choices=["auto", "small", "full"], default="auto",
                    help="small configs, or GPT-2 124M seq 1024 bf16 / ResNet-50 224x224 "
                         "(auto: full unless the platform is cpu)")
    ap.add_argument("--models", default=",".join(ALL_MODELS))
    ap.add_argument("--variants", default=",".join(ALL_VARIANTS))
    ap.add_argument("--skip", default="", help=f"sections to skip, of {','.join(ALL_SECTIONS)}")
    ap.add_argument("--only", default="", help="run only these sections (comma-separated), skipping the others; "
                    "results go to bench/results/<platform>-<sections>.* unless --tag is given")
    ap.add_argument("--firststep", default="gpt:tpu-fused,gpt:tpu-compile,resnet:tpu-fused",
                    help="model:variant pairs timed cold/warm in subprocesses")
    ap.add_argument("--batch", type=int, default=None, help="override the batch size")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=12)
    ap.add_argument("--settle", type=float, default=0.2, help="untimed pause before each interleaved step")
    ap.add_argument("--child-timeout", type=float, default=300)
    ap.add_argument("--no-write", action="store_true", help="do not write bench/results/*")
    ap.add_argument("--tag", default="", help="write bench/results/<platform>-<tag>.* instead")
    ap.add_argument("--first-step-child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args.first_step_child:
        if args.size == "auto":
            args.size = "small"
        return first_step_child(args.first_step_child, args)

    t_begin = time.perf_counter()
    variants = [v for v in args.variants.split(",") if v]
    models = [m for m in args.models.split(",") if m]
    skip = {s for s in args.skip.split(",") if s}
    only = {s for s in args.only.split(",") if s}
    for s in skip | only:
        if s not in ALL_SECTIONS:
            ap.error(f"unknown section {s!r}; sections: {', '.join(ALL_SECTIONS)}")
    if only:
        skip |= set(ALL_SECTIONS) - only
        # A partial run writes bench/results/<platform>-<sections>.*, not the full run's files.
        args.tag = args.tag or "-".join(sorted(only))
    for v in variants:
        if v not in ALL_VARIANTS:
            ap.error(f"unknown variant {v!r}")
    for m in models:
        if m not in ALL_MODELS:
            ap.error(f"unknown model {m!r}")

    need_tpu = (any(v in TPU_VARIANTS for v in variants) and "main" not in skip) or \
        not {"firststep", "scaling", "scan", "perop", "runtimes", "input", "distributed", "varlen", "generate"} <= skip
    torchtpu = load_torchtpu() if need_tpu else None
    if torchtpu is None:
        variants = [v for v in variants if v not in TPU_VARIANTS]
        skip |= {"firststep", "scaling", "scan", "runtimes", "input", "distributed", "varlen"}
    if torchtpu is not None:
        platform = torchtpu.platform()
    elif "jax" in variants:
        import jax
        platform = jax.default_backend()
    else:
        platform = "cpu"
    size = args.size if args.size != "auto" else ("small" if platform == "cpu" else "full")
    args.size = size
    meta = versions(torchtpu)
    meta.update(platform=platform, size=size, host_device=host_device(), torch_threads=torch.get_num_threads(),
                warmup=args.warmup, repeats=args.repeats)
    print(f"platform: {platform}, size: {size}, host device: {host_device()}, torch threads: "
          f"{torch.get_num_threads()}, " + ", ".join(f"{k} {v}" for k, v in meta.items()
                                                      if k in ("torch", "jax", "jaxlib", "gpu")))

    setups = model_setups(size, args.batch)
    results, first_steps, scaling, perop, input_pipeline, distributed, scan, varlen = [], [], [], None, None, None, [], None
    runtimes, generate = None, None
    if "main" not in skip:
        print("\n== training steps, side by side ==")
        results = run_main(models, variants, setups, args, torchtpu,
                           on_result=lambda rs: emit(args, meta, platform, size, rs, [], [], None, t_begin,
                                                     final=False))
    if "perop" not in skip:
        print("\n== per-op overhead ==")
        try:
            perop = run_perop(torchtpu)
        except Exception as exc:
            print("per-op benchmark FAILED:", exc)
    if "runtimes" not in skip:
        print("\n== runtimes: jaxlib vs pjrt, side by side in fresh processes ==")
        try:
            runtimes = run_runtimes(size=size, timeout=args.child_timeout * 3)
        except Exception as exc:
            print("runtimes benchmark FAILED:", str(exc)[:800])
    if "input" not in skip:
        print("\n== input pipeline: prefetch vs none ==")
        try:
            input_pipeline = run_input(torchtpu, size)
        except Exception as exc:
            print("input pipeline benchmark FAILED:", exc)
    if "distributed" not in skip:
        print("\n== distributed: torchrun, 2 processes vs 1 ==")
        try:
            distributed = run_distributed(size, timeout=args.child_timeout * 2)
        except Exception as exc:
            print("distributed benchmark FAILED:", exc)
    if "varlen" not in skip:
        print("\n== fused mode over varying lengths: TORCHTPU_BUCKETS=pow2 vs off, fresh processes ==")
        try:
            varlen = run_varlen(timeout=max(args.child_timeout, 900))  # 40 compiles when exact
        except Exception as exc:
            print("varying-lengths benchmark FAILED:", str(exc)[:800])
    if "generate" not in skip:
        print("\n== text generation: generate() fused, compiled decode, CPU eager, pure JAX ==")
        try:
            generate = run_generate(torchtpu, size)
        except Exception as exc:
            print("generation benchmark FAILED:", str(exc)[:800])
    if "scaling" not in skip and "gpt" in setups:
        print("\n== LM scaling (fused) ==")
        scaling = run_scaling(setups, args, torchtpu, results)
    if "scan" not in skip and "gpt" in setups and torchtpu is not None:
        print("\n== depth-flat compiles: blocks unrolled vs scan_layers vs StackedLayers (fused) ==")
        scan = run_scan(setups, args, torchtpu)
    if "firststep" not in skip:
        print("\n== first step in fresh processes: cold cache, then warm cache ==")
        specs = [s for s in args.firststep.split(",") if s and s.split(":")[0] in models]
        first_steps = run_first_steps(specs, args)

    emit(args, meta, platform, size, results, first_steps, scaling, perop, t_begin, final=True,
         input_pipeline=input_pipeline, distributed=distributed, scan=scan, varlen=varlen, runtimes=runtimes,
         generate=generate)
    if _OWN_CACHE:
        import shutil
        shutil.rmtree(_OWN_CACHE, ignore_errors=True)


if __name__ == "__main__":
    main()
