"""Fused-mode training over varying sequence lengths: shape buckets vs exact sizes (issue 16).

A small causal LM (embedding, nn.MultiheadAttention with a causal mask, layer norm, AdamW)
trains in fused mode on batches of 40 random lengths between 8 and 128 (seeded), reading
the loss every step as a script that prints it would. Two variants, each in a fresh
process with its own empty TORCHTPU_CACHE_DIR (so neither reuses the other's executables):

    pow2   TORCHTPU_BUCKETS=pow2 (the default): a step graph per power-of-two bucket
    off    TORCHTPU_BUCKETS=off: a step graph per distinct length

Reported per variant: graphs compiled, compile seconds, the loop's wall time, and the
ratios off/pow2. Both variants see the same weights and batches: their losses agree.

    python bench/varlen.py                  # alone
    python bench/run.py --only varlen       # as the "varlen" section of make bench
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time

VARIANTS = ("pow2", "off")
STEPS, MIN_LEN, MAX_LEN, SEED = 40, 8, 128, 0


def make_model():
    import torch.nn as nn

    class CausalLM(nn.Module):
        """Embedding, causal multi-head attention, layer norm, a vocabulary head."""

        def __init__(self, vocab=64, d=32, heads=2):
            super().__init__()
            self.vocab = vocab
            self.emb = nn.Embedding(vocab, d)
            self.attn = nn.MultiheadAttention(d, heads, batch_first=True, bias=False)
            self.ln = nn.LayerNorm(d)
            self.head = nn.Linear(d, vocab)

        def forward(self, ids):
            import torch
            T = ids.shape[1]
            h = self.emb(ids)
            mask = torch.triu(torch.full((T, T), float("-inf"), device=ids.device), 1)
            a, _ = self.attn(h, h, h, attn_mask=mask, need_weights=False)
            return self.head(self.ln(h + a))

    return CausalLM()


def lengths(steps=STEPS, seed=SEED):
    rng = random.Random(seed)
    return [rng.randint(MIN_LEN, MAX_LEN) for _ in range(steps)]


def child() -> dict:
    """Runs in the fresh process: the training loop on the tpu in fused mode."""
    t_start = time.perf_counter()
    import torch
    import torch.nn.functional as F

    import torchtpu
    from torchtpu import metrics
    t_import = time.perf_counter() - t_start
    torch.manual_seed(0)
    model = make_model()
    g = torch.Generator().manual_seed(SEED)
    lens = lengths()
    data = [(torch.randint(0, model.vocab, (4, T), generator=g), torch.randint(0, model.vocab, (4, T), generator=g))
            for T in lens]
    c0 = metrics.counters()
    with torchtpu.mode("fused"):
        t0 = time.perf_counter()
        model.to("tpu")
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        losses = []
        for ids, target in data:
            logits = model(ids.to("tpu"))
            loss = F.cross_entropy(logits.reshape(-1, model.vocab), target.to("tpu").reshape(-1))
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        wall = time.perf_counter() - t0
    c1 = metrics.counters()
    return dict(buckets=os.environ.get("TORCHTPU_BUCKETS", "pow2"), steps=len(lens), distinct_lengths=len(set(lens)),
                graphs_compiled=c1["graphs_compiled"] - c0["graphs_compiled"],
                compile_s=c1["compile_seconds"] - c0["compile_seconds"],
                cache_hits_disk=c1["cache_hits_disk"] - c0["cache_hits_disk"], wall_s=wall, import_s=t_import,
                first_loss=losses[0], final_loss=losses[-1], losses=losses)


def run_varlen(timeout=600) -> dict:
    """Both variants, each in a fresh process with a private empty cache; returns a dict."""
    rows = []
    for variant in VARIANTS:
        cache = tempfile.mkdtemp(prefix=f"torchtpu-bench-varlen-{variant}-")
        env = dict(os.environ, TORCHTPU_BUCKETS=variant, TORCHTPU_CACHE_DIR=cache)
        print(f"  TORCHTPU_BUCKETS={variant:5s} {STEPS} steps ...", end=" ", flush=True)
        t0 = time.perf_counter()
        p = subprocess.run([sys.executable, os.path.abspath(__file__), "--child"], env=env, capture_output=True,
                           text=True, timeout=timeout)
        line = [ln for ln in p.stdout.splitlines() if ln.startswith("VARLEN ")]
        if p.returncode != 0 or not line:
            raise RuntimeError(f"TORCHTPU_BUCKETS={variant}: rc={p.returncode}: {(p.stderr or p.stdout).strip()[-800:]}")
        r = json.loads(line[-1][len("VARLEN "):])
        r["process_s"] = time.perf_counter() - t0
        rows.append(r)
        print(f"{r['graphs_compiled']} graphs compiled ({r['compile_s']:.1f} s), loop {r['wall_s']:.1f} s, "
              f"final loss {r['final_loss']:.5f}", flush=True)
    by = {r["buckets"]: r for r in rows}
    out = dict(rows=rows, lengths=lengths(), min_len=MIN_LEN, max_len=MAX_LEN, seed=SEED)
    if "pow2" in by and "off" in by:
        b, e = by["pow2"], by["off"]
        out["compiles_off_over_pow2"] = e["graphs_compiled"] / max(1, b["graphs_compiled"])
        out["wall_off_over_pow2"] = e["wall_s"] / b["wall_s"]
        out["max_loss_diff"] = max(abs(x - y) for x, y in zip(b["losses"], e["losses"]))
        print(f"  off/pow2: {out['compiles_off_over_pow2']:.1f}x the compiles, {out['wall_off_over_pow2']:.2f}x the "
              f"wall time; losses agree to {out['max_loss_diff']:.1e}", flush=True)
    return out


def varlen_table(v: dict) -> str:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from common import markdown_table
    rows = [[f"TORCHTPU_BUCKETS={r['buckets']}", r["steps"], r["distinct_lengths"], r["graphs_compiled"],
             f"{r['compile_s']:.1f}", f"{r['wall_s']:.1f}", f"{r['final_loss']:.5f}"] for r in v["rows"]]
    if "wall_off_over_pow2" in v:
        rows.append(["off / pow2", "", "", f"{v['compiles_off_over_pow2']:.1f}x", "",
                     f"{v['wall_off_over_pow2']:.2f}x", f"max loss diff {v['max_loss_diff']:.1e}"])
    return markdown_table([f"fused LM, {len(v['lengths'])} lengths in [{v['min_len']}, {v['max_len']}] (seed {v['seed']})",
                           "steps", "distinct lengths", "graphs compiled", "compile s", "loop wall s", "final loss"], rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print("VARLEN " + json.dumps(child()), flush=True)
        return
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    print(varlen_table(run_varlen()))


if __name__ == "__main__":
    main()
