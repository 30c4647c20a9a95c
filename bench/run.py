"""Side-by-side training-step benchmark (``make bench``).

In ONE process (so that all timings share the machine state), for each model
(GPT language model, ResNet CNN) a full training step (zero_grad, forward,
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
  * per-op overhead: 10,000 small adds in strict mode vs host eager, and the
    fused-mode tracing cost per op,
and prints every ratio against its target (pass/miss).

Writes bench/results/<platform>.json, .md and .png.

    python bench/run.py                         # sizes chosen from the platform
    python bench/run.py --size small --repeats 5
    python bench/run.py --variants tpu-fused,eager --models gpt --skip scaling,firststep
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
from models import (GPT, GPTConfig, ResNet, ResNetConfig, count_params, make_image_batch,  # noqa: E402
                    make_lm_batch, make_optimizer, train_step)

ALL_VARIANTS = ("tpu-strict", "tpu-fused", "tpu-compile", "eager", "inductor", "jax")
TPU_VARIANTS = ("tpu-strict", "tpu-fused", "tpu-compile")
ALL_MODELS = ("gpt", "resnet")
ALL_SECTIONS = ("main", "firststep", "scaling", "perop")
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
        res_cfg = ResNetConfig.small()
        gpt_batch, res_batch, dtype = batch or 8, batch or 16, "float32"
    else:
        gpt_cfg, res_cfg = GPTConfig.gpt2_124m(), ResNetConfig.resnet50()
        gpt_batch, res_batch, dtype = batch or 8, batch or 32, "bfloat16"
    return {
        "gpt": dict(cfg=gpt_cfg, cls=GPT, make_batch=make_lm_batch, batch=gpt_batch,
                    items=gpt_batch * gpt_cfg.block_size, unit="tok", dtype=dtype),
        "resnet": dict(cfg=res_cfg, cls=ResNet, make_batch=make_image_batch, batch=res_batch,
                       items=res_batch, unit="img", dtype=dtype),
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
        model.tie_weights()  # .to("tpu") unties them (see GPT.tie_weights)
        if not tied:
            _UNTIED.add(str(device))
    return model


_UNTIED: set = set()  # devices on which .to() lost GPT's weight tying


def make_batches(setup, device, dtype, n=2):
    out = []
    for s in range(n):
        x, y = setup["make_batch"](setup["cfg"], setup["batch"], seed=s)
        x = x.to(device)
        if x.is_floating_point():
            x = x.to(dtype)
        out.append((x, y.to(device)))
    return out


def run_torch_variant(variant, setup, args, torchtpu, steps_override=None):
    """Returns a result dict (first_step_s, step times, final loss, ...)."""
    dtype = DTYPES[setup["dtype"]]
    device = "tpu" if variant in TPU_VARIANTS else host_device()
    mode = {"tpu-strict": "strict"}.get(variant, "fused")
    warmup, repeats = steps_override or (args.warmup, args.repeats)
    res = {}
    ctx = torchtpu.mode(mode) if torchtpu is not None and device == "tpu" else _null()
    with ctx:
        model = make_torch_model(setup, device, dtype)
        opt = make_optimizer(model)
        batches = make_batches(setup, device, dtype)
        if variant == "tpu-compile":
            fwd = torch.compile(model, backend="tpu")
        elif variant == "inductor":
            torch._dynamo.reset()
            fwd = torch.compile(model)
        else:
            fwd = model
        counter = iter(range(1 << 62))

        def step():
            return train_step(fwd, opt, batches[next(counter) % len(batches)])

        if device == "tpu":
            torch.tpu.synchronize()
            torch.tpu.reset_peak_memory_stats()
        elif device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        c0 = _counters(torchtpu) if device == "tpu" else None
        t0 = time.perf_counter()
        losses = [step().float().cpu().item()]
        res["first_step_s"] = time.perf_counter() - t0
        c1 = _counters(torchtpu) if device == "tpu" else None
        if c1 is not None:
            res["first_step_compile_s"] = c1["compile_seconds"] - c0["compile_seconds"]
            res["first_step_graphs_compiled"] = c1["graphs_compiled"] - c0["graphs_compiled"]
        for _ in range(warmup):
            losses.append(step().float().cpu().item())
        c2 = _counters(torchtpu) if device == "tpu" else None
        times = []
        for _ in range(repeats):
            t = time.perf_counter()
            losses.append(step().float().cpu().item())
            times.append(time.perf_counter() - t)
        c3 = _counters(torchtpu) if device == "tpu" else None
        res["counters_per_step"] = _counter_delta(c2, c3, repeats)
        if c3 is not None:  # every graph compiled by this variant (first step, warm-up, timed)
            res["compile_s_total"] = c3["compile_seconds"] - c0["compile_seconds"]
            res["graphs_compiled_total"] = c3["graphs_compiled"] - c0["graphs_compiled"]
        if device == "tpu":
            res["peak_mem_bytes"] = torch.tpu.max_memory_allocated()
        elif device == "cuda":
            res["peak_mem_bytes"] = torch.cuda.max_memory_allocated()
        res.update(step_times=times, median_step_s=statistics.median(times), losses=losses,
                   final_loss=losses[-1], params=count_params(model), device=device)
        del model, opt, batches, fwd
        gc.collect()
    return res


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def run_jax_variant(setup, args):
    import jax
    import jax.numpy as jnp
    import jax_lm

    cfg = setup["cfg"]
    dtype = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}[setup["dtype"]]
    torch.manual_seed(0)
    params = jax_lm.params_from_torch(GPT(cfg), dtype=dtype)
    n_params = sum(int(p.size) for p in params.values())
    opt_state = jax_lm.adamw_init(params)
    train = jax_lm.make_train_step(cfg)
    batches = [jax_lm.to_jax_batch(make_lm_batch(cfg, setup["batch"], seed=s)) for s in range(2)]
    state = {"params": params, "opt": opt_state, "i": 0}

    def step():
        idx, targets = batches[state["i"] % len(batches)]
        state["params"], state["opt"], loss = train(state["params"], state["opt"], idx, targets)
        state["i"] += 1
        return loss

    t0 = time.perf_counter()
    losses = [float(step())]
    first = time.perf_counter() - t0
    for _ in range(args.warmup):
        losses.append(float(step()))
    times = []
    for _ in range(args.repeats):
        t = time.perf_counter()
        losses.append(float(step()))
        times.append(time.perf_counter() - t)
    peak = None
    try:
        stats = jax.devices()[0].memory_stats()
        peak = stats.get("peak_bytes_in_use") if stats else None
    except Exception:
        pass
    del state
    gc.collect()
    return dict(first_step_s=first, step_times=times, median_step_s=statistics.median(times),
                losses=losses, final_loss=losses[-1], params=n_params,
                device=jax.devices()[0].platform, peak_mem_bytes=peak)


def run_main(models, variants, setups, args, torchtpu, on_result=None):
    results = []
    for model_name in models:
        setup = setups[model_name]
        for variant in variants:
            if variant == "jax" and model_name != "gpt":
                continue
            print(f"  {model_name:6s} {variant:12s} ...", end=" ", flush=True)
            t0 = time.perf_counter()
            try:
                if variant == "jax":
                    res = run_jax_variant(setup, args)
                else:
                    res = run_torch_variant(variant, setup, args, torchtpu)
                res["error"] = None
                msg = (f"step {res['median_step_s'] * 1e3:8.1f} ms, first {res['first_step_s']:6.2f} s, "
                       f"final loss {res['final_loss']:.5f}")
            except Exception as exc:  # recorded in the table, never fatal
                res = {"error": f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ''}",
                       "traceback": traceback.format_exc()[-4000:]}
                msg = f"FAILED: {res['error']}"
                gc.collect()
            print(f"{msg}  [{time.perf_counter() - t0:.0f} s]", flush=True)
            res.update(model=model_name, variant=variant, batch=setup["batch"], dtype=setup["dtype"],
                       config=_cfg_dict(setup["cfg"]), unit=f"{setup['unit']}/s",
                       warmup=args.warmup, repeats=args.repeats)
            if res.get("median_step_s"):
                res["throughput"] = setup["items"] / res["median_step_s"]
            results.append(res)
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
    res = run_torch_variant(variant, setup, args, torchtpu, steps_override=(0, 1))
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
                    r = run_torch_variant("tpu-fused", setup, args, torchtpu,
                                          steps_override=(1, max(3, args.repeats // 2)))
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
            t = time.perf_counter()
            loop(a, b)
            torch.tpu.synchronize()
            out["strict_us"] = (time.perf_counter() - t) / n * 1e6
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


def targets(results, first_steps):
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


def emit(args, meta, platform, size, results, first_steps, scaling, perop, t_begin, final):
    """Builds the report; prints it when final; writes the .json/.md (and .png when final).
    Called after every variant too, so a run killed by a timeout keeps what it measured."""
    if True:
        meta["to_device_untied_gpt_weights"] = sorted(_UNTIED)
        if _UNTIED and final:
            print(f"\nNOTE: model.to() lost GPT's weight tying on {sorted(_UNTIED)}; re-tied (GPT.tie_weights)")
        trows = targets(results, first_steps)
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
        if trows:
            sections += ["## Targets\n", targets_table(trows), ""]
        if first_steps:
            sections += ["## First step in a fresh process (cold cache, then warm disk cache)\n",
                         first_step_table(first_steps), ""]
        if scaling:
            sections += ["## LM scaling (fused)\n", scaling_table(scaling), ""]
        if perop:
            sections += ["## Per-op overhead\n", perop_table(perop), ""]
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
            payload = dict(results=results, targets=trows, first_steps=first_steps, scaling=scaling,
                           perop=perop, loss_check=loss_check)
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
    ap.add_argument("--firststep", default="gpt:tpu-fused,gpt:tpu-compile,resnet:tpu-fused",
                    help="model:variant pairs timed cold/warm in subprocesses")
    ap.add_argument("--batch", type=int, default=None, help="override the batch size")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=6)
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
    for v in variants:
        if v not in ALL_VARIANTS:
            ap.error(f"unknown variant {v!r}")
    for m in models:
        if m not in ALL_MODELS:
            ap.error(f"unknown model {m!r}")

    need_tpu = any(v in TPU_VARIANTS for v in variants) or not {"firststep", "scaling", "perop"} <= skip
    torchtpu = load_torchtpu() if need_tpu else None
    if torchtpu is None:
        variants = [v for v in variants if v not in TPU_VARIANTS]
        skip |= {"firststep", "scaling"}
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
    results, first_steps, scaling, perop = [], [], [], None
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
    if "scaling" not in skip and "gpt" in setups:
        print("\n== LM scaling (fused) ==")
        scaling = run_scaling(setups, args, torchtpu, results)
    if "firststep" not in skip:
        print("\n== first step in fresh processes: cold cache, then warm cache ==")
        specs = [s for s in args.firststep.split(",") if s and s.split(":")[0] in models]
        first_steps = run_first_steps(specs, args)

    emit(args, meta, platform, size, results, first_steps, scaling, perop, t_begin, final=True)
    if _OWN_CACHE:
        import shutil
        shutil.rmtree(_OWN_CACHE, ignore_errors=True)


if __name__ == "__main__":
    main()
