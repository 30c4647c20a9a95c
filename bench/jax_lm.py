"""The GPT of bench/models.py written again in pure JAX, as a reference point.

Parameters are a flat dict keyed by the PyTorch parameter names (the tied
LM head is not a separate entry: it reuses ``tok_emb.weight``), so weights can
be copied from a PyTorch ``GPT`` with ``params_from_torch`` and the two
implementations can be compared step for step.

The optimiser is AdamW written out by hand, with the hyperparameters and the
decay/no-decay parameter split taken from bench/models.py (``ADAMW`` and
``uses_weight_decay``), and the same update formula as ``torch.optim.AdamW``.

Public API:
    params_from_torch(model) -> params
    forward(params, cfg, idx) -> logits
    loss_fn(params, cfg, idx, targets) -> scalar loss
    adamw_init(params) -> opt_state
    adamw_update(params, grads, opt_state, lr, betas, eps, weight_decay) -> (params, opt_state)
    make_train_step(cfg, lr=None, betas=None, eps=None, weight_decay=None)
        -> jitted (params, opt_state, idx, targets) -> (params, opt_state, loss),
           params and opt_state donated
"""

from __future__ import annotations

import math
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

from models import ADAMW, GPTConfig, uses_weight_decay  # noqa: E402

jax.config.update("jax_enable_x64", False)


def params_from_torch(model, dtype=jnp.float32) -> dict[str, jax.Array]:
    """Copy a PyTorch GPT's parameters into a flat ``{name: array}`` dict (float32 by default)."""
    params = {}
    for name, p in model.named_parameters():  # the tied lm_head.weight is skipped here
        params[name] = jnp.asarray(p.detach().float().cpu().numpy().astype(np.float32), dtype=dtype)
    return params


# --------------------------------------------------------------------------
# Model
# --------------------------------------------------------------------------


def _linear(params, prefix, x):
    y = x @ params[prefix + ".weight"].T
    bias = params.get(prefix + ".bias")
    return y if bias is None else y + bias


def _layer_norm(params, prefix, x, eps=1e-5):
    mean = x.mean(axis=-1, keepdims=True)
    var = jnp.square(x - mean).mean(axis=-1, keepdims=True)
    y = (x - mean) * jax.lax.rsqrt(var + eps) * params[prefix + ".weight"]
    bias = params.get(prefix + ".bias")
    return y if bias is None else y + bias


def _attention(params, prefix, cfg: GPTConfig, x):
    B, T, C = x.shape
    H, D = cfg.n_head, C // cfg.n_head
    qkv = _linear(params, prefix + ".qkv", x)
    q, k, v = jnp.split(qkv, 3, axis=-1)
    q, k, v = (t.reshape(B, T, H, D).transpose(0, 2, 1, 3) for t in (q, k, v))
    scores = (q @ k.transpose(0, 1, 3, 2)) / math.sqrt(D)  # (B, H, T, T)
    causal = jnp.tril(jnp.ones((T, T), dtype=bool))
    scores = jnp.where(causal, scores, -jnp.inf)
    y = jax.nn.softmax(scores, axis=-1) @ v  # (B, H, T, D)
    y = y.transpose(0, 2, 1, 3).reshape(B, T, C)
    return _linear(params, prefix + ".proj", y)


def _mlp(params, prefix, x):
    h = jax.nn.gelu(_linear(params, prefix + ".fc", x), approximate=False)
    return _linear(params, prefix + ".proj", h)


def forward(params, cfg: GPTConfig, idx):
    """Logits ``(B, T, vocab)`` for int32 token ids ``idx`` of shape ``(B, T)``."""
    T = idx.shape[1]
    wte = params["tok_emb.weight"]
    x = wte[idx] + params["pos_emb.weight"][:T]
    for i in range(cfg.n_layer):
        p = f"blocks.{i}"
        x = x + _attention(params, p + ".attn", cfg, _layer_norm(params, p + ".ln1", x))
        x = x + _mlp(params, p + ".mlp", _layer_norm(params, p + ".ln2", x))
    x = _layer_norm(params, "ln_f", x)
    return x @ wte.T  # LM head tied to the token embedding


def loss_fn(params, cfg: GPTConfig, idx, targets):
    """Mean cross-entropy over all positions."""
    logp = jax.nn.log_softmax(forward(params, cfg, idx), axis=-1)
    picked = jnp.take_along_axis(logp, targets[..., None], axis=-1)
    return -picked.mean()


# --------------------------------------------------------------------------
# AdamW (same arithmetic as torch.optim.AdamW with default flags)
# --------------------------------------------------------------------------


def adamw_init(params):
    zeros = lambda p: jnp.zeros_like(p)  # noqa: E731
    return {
        "step": jnp.zeros((), jnp.float32),
        "m": jax.tree_util.tree_map(zeros, params),
        "v": jax.tree_util.tree_map(zeros, params),
    }


def adamw_update(params, grads, state, lr, betas, eps, weight_decay):
    """One AdamW step. Decay applies to the params for which ``uses_weight_decay`` holds."""
    b1, b2 = betas
    step = state["step"] + 1.0
    bc1 = 1.0 - b1**step
    bc2 = 1.0 - b2**step
    new_params, new_m, new_v = {}, {}, {}
    for name, p in params.items():
        g = grads[name]
        wd = weight_decay if uses_weight_decay(name, p) else 0.0
        p = p * (1.0 - lr * wd)  # decoupled weight decay
        m = b1 * state["m"][name] + (1.0 - b1) * g
        v = b2 * state["v"][name] + (1.0 - b2) * g * g
        denom = jnp.sqrt(v) / jnp.sqrt(bc2) + eps
        # Keep each state's dtype (bf16 params stay bf16: the step's f32 scalars would promote).
        new_params[name] = (p - (lr / bc1) * m / denom).astype(p.dtype)
        new_m[name], new_v[name] = m.astype(p.dtype), v.astype(p.dtype)
    return new_params, {"step": step, "m": new_m, "v": new_v}


def make_train_step(cfg: GPTConfig, lr=None, betas=None, eps=None, weight_decay=None):
    """A jitted ``(params, opt_state, idx, targets) -> (params, opt_state, loss)``.

    ``params`` and ``opt_state`` are donated: do not reuse the arrays passed in.
    Hyperparameters default to ``models.ADAMW``.
    """
    if cfg.dropout != 0.0:
        raise NotImplementedError("the JAX reference model has no dropout")
    lr = ADAMW["lr"] if lr is None else lr
    betas = ADAMW["betas"] if betas is None else betas
    eps = ADAMW["eps"] if eps is None else eps
    weight_decay = ADAMW["weight_decay"] if weight_decay is None else weight_decay

    def step(params, opt_state, idx, targets):
        loss, grads = jax.value_and_grad(loss_fn)(params, cfg, idx, targets)
        params, opt_state = adamw_update(params, grads, opt_state, lr, betas, eps, weight_decay)
        return params, opt_state, loss

    return jax.jit(step, donate_argnums=(0, 1))


def to_jax_batch(batch):
    """A ``(idx, targets)`` pair of torch/numpy int tensors -> int32 jax arrays."""
    return tuple(jnp.asarray(np.asarray(t.cpu() if hasattr(t, "cpu") else t), dtype=jnp.int32)
                 for t in batch)
