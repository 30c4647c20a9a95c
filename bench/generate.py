"""Text generation: Hugging Face generate() on tpu against CPU eager and the XLA floor (issue 27).

The benchmark LM is a Hugging Face GPT-2 built from bench/models.py's GPT sizes (random
weights, seeded). Batch 8, a prompt of 128 tokens, 128 new tokens, greedy. In ONE process,
each variant generates once untimed (compiles) and then `repeats` times timed:

    tpu-fused    model.generate() on tpu in fused mode with transformers' default dynamic
                 cache (fused graphs padded to buckets: one executable per decode step)
    tpu-compile  model.generate(cache_implementation="static") on tpu: transformers compiles
                 the decode step with torch.compile(backend="tpu"); the static cache is
                 updated in place (donated buffers)
    eager        model.generate() with PyTorch eager on the host (CPU)
    jax          the same GPT-2 decode loop in pure JAX: a jitted prefill and a jitted
                 decode step over a static KV cache that is donated (the XLA floor)

Reported per variant: ms per new token (a whole generate() divided by 128, prefill
included), tokens/s, whether the tokens equal CPU eager's; for tpu variants per new token:
executables run, host reads (downloads; the stopping check's is deferred, so it does not
stall the host), host bytes moved and donated buffers, and the graphs compiled in the timed
runs (0 when nothing recompiles).

    python bench/generate.py                # alone
    python bench/run.py --only generate     # as the "generate" section of make bench
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
import warnings

os.environ.setdefault("HF_HUB_OFFLINE", "1")

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

import torch  # noqa: E402

from common import markdown_table  # noqa: E402

VARIANTS = ("tpu-fused", "tpu-compile", "eager", "jax")
BATCH, PROMPT, NEW = 8, 128, 128


def lm_sizes(size: str) -> dict:
    """bench/models.py's GPT sizes (the training benchmark's LM) as a GPT-2 config."""
    from models import GPTConfig

    cfg = GPTConfig.small(n_layer=4, n_embd=128, n_head=4) if size == "small" else GPTConfig.gpt2_124m()
    return dict(vocab_size=cfg.vocab_size, n_layer=cfg.n_layer, n_embd=cfg.n_embd, n_head=cfg.n_head,
                dtype=torch.float32 if size == "small" else torch.bfloat16)


def make_model(sizes: dict):
    import transformers

    config = transformers.GPT2Config(vocab_size=sizes["vocab_size"], n_positions=PROMPT + NEW, n_embd=sizes["n_embd"],
                                     n_layer=sizes["n_layer"], n_head=sizes["n_head"], resid_pdrop=0.0,
                                     embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=None, eos_token_id=None,
                                     pad_token_id=None)
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(config).eval().to(sizes["dtype"])


def prompt_ids(vocab: int) -> torch.Tensor:
    return torch.randint(0, vocab, (BATCH, PROMPT), generator=torch.Generator().manual_seed(0))


def _generate(model, ids, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW, min_new_tokens=NEW,
                              do_sample=False, pad_token_id=0, **kwargs)


# --------------------------------------------------------------------------
# The same decode loop in pure JAX (GPT-2, static KV cache, donated)
# --------------------------------------------------------------------------


def jax_decoder(model):
    """(prefill, step) jitted for the GPT-2 `model`'s weights: prefill(params, ids) ->
    (k cache, v cache, first token); step(params, k, v, token, pos) -> (k, v, next token),
    the caches donated."""
    import jax
    import jax.numpy as jnp

    cfg = model.config
    L, H, C = cfg.n_layer, cfg.n_head, cfg.n_embd
    D, S = C // H, PROMPT + NEW
    dtype = jnp.bfloat16 if next(model.parameters()).dtype == torch.bfloat16 else jnp.float32
    params = {k: jnp.asarray(v.detach().float().cpu().numpy(), dtype=dtype) for k, v in model.state_dict().items()
              if not k.endswith(".attn.bias") and not k.endswith("masked_bias")}

    def ln(prm, x, p):
        mean = x.mean(-1, keepdims=True)
        var = jnp.square(x - mean).mean(-1, keepdims=True)
        return (x - mean) * jax.lax.rsqrt(var + cfg.layer_norm_epsilon) * prm[p + ".weight"] + prm[p + ".bias"]

    def conv1d(prm, x, p):  # transformers' Conv1D: x @ W + b, W of shape (in, out)
        return x @ prm[p + ".weight"] + prm[p + ".bias"]

    def block(prm, i, x, k_cache, v_cache, pos, mask):
        p = f"transformer.h.{i}"
        B, T, _ = x.shape
        q, k, v = jnp.split(conv1d(prm, ln(prm, x, p + ".ln_1"), p + ".attn.c_attn"), 3, axis=-1)
        q, k, v = (t.reshape(B, T, H, D).transpose(0, 2, 1, 3) for t in (q, k, v))
        k_cache = jax.lax.dynamic_update_slice(k_cache, k, (0, 0, pos, 0))
        v_cache = jax.lax.dynamic_update_slice(v_cache, v, (0, 0, pos, 0))
        scores = (q @ k_cache.transpose(0, 1, 3, 2)) / math.sqrt(D)  # (B, H, T, S)
        scores = jnp.where(mask, scores, jnp.finfo(scores.dtype).min)
        y = jax.nn.softmax(scores.astype(jnp.float32), axis=-1).astype(dtype) @ v_cache
        x = x + conv1d(prm, y.transpose(0, 2, 1, 3).reshape(B, T, C), p + ".attn.c_proj")
        h = jax.nn.gelu(conv1d(prm, ln(prm, x, p + ".ln_2"), p + ".mlp.c_fc"), approximate=True)
        return x + conv1d(prm, h, p + ".mlp.c_proj"), k_cache, v_cache

    def forward(prm, k_all, v_all, ids, pos):
        B, T = ids.shape
        positions = pos + jnp.arange(T)
        x = prm["transformer.wte.weight"][ids] + prm["transformer.wpe.weight"][positions]
        mask = (jnp.arange(S)[None, :] <= positions[:, None])[None, None]  # (1, 1, T, S)
        ks, vs = [], []
        for i in range(L):
            x, k, v = block(prm, i, x, k_all[i], v_all[i], pos, mask)
            ks.append(k)
            vs.append(v)
        x = ln(prm, x[:, -1], "transformer.ln_f")
        logits = x @ prm["transformer.wte.weight"].T
        return jnp.stack(ks), jnp.stack(vs), jnp.argmax(logits.astype(jnp.float32), -1)

    @jax.jit
    def prefill(prm, ids):
        zeros = jnp.zeros((L, ids.shape[0], H, S, D), dtype)
        return forward(prm, zeros, zeros, ids, 0)

    def step_fn(prm, k_all, v_all, token, pos):
        return forward(prm, k_all, v_all, token[:, None], pos)

    step = jax.jit(step_fn, donate_argnums=(1, 2))

    def generate(ids):
        k, v, token = prefill(params, ids)
        tokens = [token]
        for t in range(NEW - 1):
            k, v, token = step(params, k, v, token, jnp.int32(PROMPT + t))
            tokens.append(token)
        return jax.block_until_ready(jnp.stack(tokens, 1))

    return generate


# --------------------------------------------------------------------------
# Running the variants
# --------------------------------------------------------------------------


def _counters(torchtpu):
    c = torchtpu.metrics.counters()
    return {k: c[k] for k in ("graphs_compiled", "execute_count", "downloads", "bytes_to_device", "bytes_to_host",
                              "donated_buffers")}


def run_variant(variant, model, ids, torchtpu, repeats):
    """(ms per new token over the timed runs, new tokens of the last run, counters per token)."""
    if variant == "jax":
        import jax.numpy as jnp
        import numpy as np

        generate = jax_decoder(model)
        jids = jnp.asarray(ids.numpy(), dtype=jnp.int32)

        def run():
            return torch.from_numpy(np.array(generate(jids))).long()
    elif variant == "eager":
        def run():
            return _generate(model, ids)[:, PROMPT:]
    else:
        tpu_model = model.to("tpu")
        tpu_ids = ids.to("tpu")
        kwargs = {"cache_implementation": "static"} if variant == "tpu-compile" else {}

        def run():
            with torchtpu.mode("fused"):
                return _generate(tpu_model, tpu_ids, **kwargs)[:, PROMPT:].cpu()
    out = run()  # compiles
    before = _counters(torchtpu) if variant.startswith("tpu") else None
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        out = run()
        times.append(time.perf_counter() - start)
    per_token = None
    if before is not None:
        after = _counters(torchtpu)
        per_token = {k: (after[k] - before[k]) / (repeats * NEW) for k in after}
        per_token["graphs_compiled_timed"] = after["graphs_compiled"] - before["graphs_compiled"]
    if variant.startswith("tpu"):
        model.to("cpu")
    return statistics.median(times) / NEW * 1e3, out, per_token


def run_generate(torchtpu, size: str = "small", repeats: int = 3, variants=VARIANTS) -> dict:
    sizes = lm_sizes(size)
    model = make_model(sizes)
    ids = prompt_ids(sizes["vocab_size"])
    rows, reference = [], None
    for variant in ("eager",) + tuple(v for v in variants if v != "eager"):
        if variant.startswith("tpu") and torchtpu is None:
            continue
        print(f"  generate: {variant} ...", flush=True)
        try:
            ms, tokens, per_token = run_variant(variant, model, ids, torchtpu, repeats)
        except Exception as exc:  # one variant failing must not lose the others
            rows.append(dict(variant=variant, error=f"{type(exc).__name__}: {str(exc)[:300]}"))
            continue
        if variant == "eager":
            reference = tokens
        equal = None if reference is None else bool(torch.equal(tokens, reference))
        rows.append(dict(variant=variant, ms_per_token=ms, tokens_per_s=BATCH * 1e3 / ms, equal_to_eager=equal,
                         per_token=per_token))
        print(f"    {ms:.2f} ms/token, {BATCH * 1e3 / ms:.0f} tokens/s, tokens equal eager: {equal}", flush=True)
    return dict(batch=BATCH, prompt=PROMPT, new=NEW, size=size, model={k: str(v) for k, v in sizes.items()},
                load=os.getloadavg()[0], rows=rows)


def ms_of(result, variant):
    row = next((r for r in (result or {}).get("rows", []) if r["variant"] == variant and "ms_per_token" in r), None)
    return row["ms_per_token"] if row else None


def generate_table(result) -> str:
    rows = []
    for r in result["rows"]:
        if "error" in r:
            rows.append([r["variant"], "", "", "", "", "", "", "", "", r["error"]])
            continue
        p = r["per_token"] or {}
        f = (lambda k, fmt="{:.2f}": fmt.format(p[k]) if k in p else "")
        rows.append([r["variant"], f"{r['ms_per_token']:.2f}", f"{r['tokens_per_s']:.0f}", r["equal_to_eager"],
                     f("execute_count"), f("downloads"), f("bytes_to_device", "{:.0f}"), f("bytes_to_host", "{:.0f}"),
                     f("donated_buffers"), p.get("graphs_compiled_timed", "")])
    title = (f"batch {result['batch']}, prompt {result['prompt']}, {result['new']} new tokens, greedy; "
             f"load average {result['load']:.1f} at the end\n\n")
    return title + markdown_table(["variant", "ms / new token", "tokens/s", "tokens = eager", "executes / token",
                                   "host reads / token", "bytes to device / token", "bytes to host / token",
                                   "donated / token", "compiles (timed runs)"], rows)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", choices=["small", "full"], default="small")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    args = ap.parse_args(argv)
    try:
        import torchtpu
    except ImportError:
        torchtpu = None
    result = run_generate(torchtpu, args.size, args.repeats, tuple(v for v in args.variants.split(",") if v))
    print(generate_table(result))


if __name__ == "__main__":
    main()
