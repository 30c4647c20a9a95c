"""torch.compile(backend="tpu"): after torch._dynamo.reset() mid-training the losses diverge.

    PYTHONPATH=$PWD python bench/repros/compile_reset_diverges.py
"""
import sys; import os; sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import torch, torchtpu
from models import *
cfg = GPTConfig.small(n_layer=2, n_embd=64, n_head=4, block_size=32)
def run(dev, compile_=None, reset_at=None, n=6):
    torch.manual_seed(0); m = GPT(cfg).to(dev).tie_weights(); opt = make_optimizer(m)
    f = torch.compile(m, backend="tpu") if compile_ else m
    bs = [tuple(t.to(dev) for t in make_lm_batch(cfg, 4, seed=s)) for s in range(2)]
    out = []
    for i in range(n):
        if i == reset_at: torch._dynamo.reset()
        out.append(round(train_step(f, opt, bs[i % 2]).cpu().item(), 5))
    return out
print("cpu eager        ", run("cpu"))
print("tpu fused        ", run("tpu"))
print("tpu compile      ", run("tpu", True))
print("tpu compile reset", run("tpu", True, reset_at=3))
