"""Real training on tpu: the bench GPT and ResNet against CPU in every mode, autograd
extras (grad clipping, accumulation, autocast), optimizers and LR schedulers, and RNG
reproducibility of training with dropout.

The CPU run is the oracle: same initial weights (deep copies of one model), same batches,
dropout 0 for the comparisons. Every comparison also asserts that nothing fell back to CPU.
"""
import contextlib
import copy
import functools
import os
import sys

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import torchtpu

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench import models as M  # noqa: E402

# Per-step losses of a whole run may differ from CPU by reduction order only (XLA and
# ATen sum in different orders); observed differences are ~1e-6, these leave headroom
# for 50 steps of AdamW.
LOSS_RTOL, LOSS_ATOL = 1e-4, 1e-4
# Parameters after a few optimizer steps on the small MLP.
PARAM_RTOL, PARAM_ATOL = 1e-5, 1e-5

# The issue asks for 50 steps. In fused mode a step is one cached executable, so 50 are
# cheap; in debug and strict every op is its own launch (and debug waits for each), so
# those modes run fewer steps to keep this file within CI time on a 2-core machine.
STEPS = {"fused": 50, "strict": 4, "debug": 4}

GPT_CFG = M.GPTConfig.small(n_layer=4, n_head=2, n_embd=32, block_size=16, vocab_size=64, dropout=0.0)
GPT_BATCH = 2
RESNET_CFG = M.ResNetConfig.small(image_size=8, widths=(8, 16, 32), stem_width=8)
RESNET_BATCH = 4


def fallbacks():
    return dict(torchtpu.metrics.counters()["fallback_ops"])


@contextlib.contextmanager
def no_new_fallbacks():
    before = fallbacks()
    yield
    after = fallbacks()
    new = {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}
    assert not new, f"ops fell back to CPU: {new}"


@contextlib.contextmanager
def cpu_threads(n):
    # The CPU oracle is much faster single-threaded on a shared 2-core machine.
    old = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


def to_tpu_model(model):
    """model.to("tpu") on a copy, re-tying the GPT's tied embedding (see
    test_module_to_keeps_tied_weights: Module.to("tpu") unties them today)."""
    tpu_model = copy.deepcopy(model).to("tpu")
    if isinstance(tpu_model, M.GPT):
        assert tpu_model.lm_head.weight is tpu_model.tok_emb.weight
    return tpu_model


def gpt(cfg=GPT_CFG, seed=0):
    torch.manual_seed(seed)
    return M.GPT(cfg)


def resnet(seed=0):
    torch.manual_seed(seed)
    return M.ResNet(RESNET_CFG)


def batches(kind, steps):
    if kind == "gpt":
        return [M.make_lm_batch(GPT_CFG, GPT_BATCH, seed=i) for i in range(steps)]
    return [M.make_image_batch(RESNET_CFG, RESNET_BATCH, seed=i) for i in range(steps)]


def train(model, device, data, lr=1e-3):
    model.train()
    opt = M.make_optimizer(model, lr=lr)
    losses = [M.train_step(model, opt, tuple(t.to(device) for t in b)) for b in data]
    return [loss.item() for loss in losses]


@functools.lru_cache(maxsize=None)
def cpu_losses(kind, steps):
    model = gpt() if kind == "gpt" else resnet()
    with cpu_threads(1):
        return train(model, "cpu", batches(kind, steps)), model


# ---------------------------------------------------------------------------------------
# 1. GPT and ResNet train like on CPU
# ---------------------------------------------------------------------------------------


# ResNet: max pooling routes each window's gradient to its argmax, so a ~1e-6 parameter
# difference (reduction order) can flip a near-tie and change one step's gradient by a
# lot; in this config that first happens at step 26 (the losses then drift by ~1e-3..4e-2
# while still tracking CPU). Gradients computed from the *same* state agree to ~1e-5 at
# any step (checked below from the trained CPU state), so this is sensitivity, not a bad
# lowering. Per-step losses are compared tightly for the first RESNET_EXACT_STEPS steps.
RESNET_EXACT_STEPS = 20
RESNET_DRIFT_ATOL = 0.1


@pytest.mark.parametrize("kind", ["gpt", "resnet"])
def test_model_trains_like_cpu(kind, mode):
    steps = STEPS[mode]
    expected, cpu_model = cpu_losses(kind, steps)
    model = to_tpu_model(gpt() if kind == "gpt" else resnet())
    data = batches(kind, steps)
    with no_new_fallbacks():
        actual = train(model, "tpu", data)
    exact = steps if kind == "gpt" else min(steps, RESNET_EXACT_STEPS)
    torch.testing.assert_close(actual[:exact], expected[:exact], rtol=LOSS_RTOL, atol=LOSS_ATOL)
    torch.testing.assert_close(actual, expected, rtol=0, atol=RESNET_DRIFT_ATOL)
    if exact == steps:
        # The trained weights and BatchNorm running statistics follow the CPU run too.
        cpu_state = cpu_model.state_dict()
        for name, value in model.state_dict().items():
            # After all steps of AdamW, per-step rounding differences add up: measured 1.1e-5.
            torch.testing.assert_close(value.cpu(), cpu_state[name], rtol=1e-4, atol=1e-4, msg=name)
    else:
        # From the same (CPU-trained) state, one more step's gradients agree.
        x, y = batches(kind, steps + 1)[-1]
        tpu_model = to_tpu_model(cpu_model)
        with no_new_fallbacks():
            _, loss = tpu_model(x.to("tpu"), y.to("tpu"))
            loss.backward()
        _, cpu_loss = cpu_model(x, y)
        cpu_model.zero_grad()
        cpu_loss.backward()
        torch.testing.assert_close(loss.item(), cpu_loss.item(), rtol=1e-5, atol=1e-5)
        for (name, p), q in zip(cpu_model.named_parameters(), tpu_model.parameters()):
            torch.testing.assert_close(q.grad.cpu(), p.grad, rtol=1e-5, atol=1e-5, msg=name)  # measured 1.5e-6


def test_gpt_with_dropout_still_learns():
    # A fixed batch the model can memorize, dropout on in embeddings, attention
    # probabilities, residuals and the MLP.
    cfg = GPT_CFG.replace(dropout=0.1)
    model = to_tpu_model(gpt(cfg))
    batch = M.make_lm_batch(cfg, GPT_BATCH, seed=0)
    with no_new_fallbacks():
        losses = train(model, "tpu", [batch] * 30, lr=3e-3)
    assert sum(losses[-5:]) / 5 < losses[0] - 1.0, losses


def test_module_to_keeps_tied_weights():
    # GPT ties lm_head.weight to tok_emb.weight. Module._apply keeps a tied Parameter
    # object only when it can `param.data = moved`; a CPU tensor and a tpu tensor have
    # incompatible TensorImpl types (torch._has_compatible_shallow_copy_type is False),
    # so each module gets its own new Parameter and the tie is silently lost: the tpu
    # model trains two matrices, and its gradients differ from CPU's.
    # (torch.__future__.set_swap_module_params_on_conversion(True) keeps the tie.)
    model = gpt().to("tpu")
    assert model.lm_head.weight is model.tok_emb.weight


# ---------------------------------------------------------------------------------------
# 2. Autograd extras
# ---------------------------------------------------------------------------------------


def mlp(seed=0, dropout=0.0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Dropout(dropout), nn.Linear(32, 32),
                         nn.Tanh(), nn.Linear(32, 4))


def mlp_data(steps, batch=8, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(batch, 16, generator=g), torch.randn(batch, 4, generator=g)) for _ in range(steps)]


def assert_same_params(tpu_model, cpu_model, rtol=PARAM_RTOL, atol=PARAM_ATOL):
    for (name, p), q in zip(tpu_model.named_parameters(), cpu_model.parameters()):
        torch.testing.assert_close(p.detach().cpu(), q.detach(), rtol=rtol, atol=atol, msg=name)


def test_clip_grad_norm_matches_cpu(mode):
    def run(model, device):
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        norms = []
        for x, y in mlp_data(4):
            opt.zero_grad()
            F.mse_loss(model(x.to(device)), y.to(device)).backward()
            # max_norm well under the gradient norm, so clipping rescales every step.
            norms.append(torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=0.05))
            opt.step()
        return [n.item() for n in norms]

    cpu_model = mlp()
    expected = run(cpu_model, "cpu")
    assert min(expected) > 0.05
    model = mlp().to("tpu")
    with no_new_fallbacks():
        actual = run(model, "tpu")
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-6)
    assert_same_params(model, cpu_model)


def test_gradient_accumulation_matches_cpu(mode):
    def run(model, device):
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        data = mlp_data(6)
        for i in range(0, len(data), 2):  # two micro-batches per optimizer step
            opt.zero_grad()
            for x, y in data[i:i + 2]:
                (F.mse_loss(model(x.to(device)), y.to(device)) / 2).backward()
            opt.step()

    cpu_model = mlp()
    run(cpu_model, "cpu")
    model = mlp().to("tpu")
    with no_new_fallbacks():
        run(model, "tpu")
    assert_same_params(model, cpu_model)


# torch.autocast("tpu") uses PyTorch's casting policies, registered for AutocastPrivateUse1.
def test_autocast_linear_runs_in_bfloat16():
    assert torch.tpu.get_amp_supported_dtype() == [torch.bfloat16, torch.float16]
    lin = nn.Linear(16, 8).to("tpu")
    x = torch.randn(4, 16, device="tpu")
    with torch.autocast("tpu", dtype=torch.bfloat16):
        y = lin(x)
    assert y.dtype == torch.bfloat16
    expected = nn.Linear(16, 8)
    expected.load_state_dict({k: v.cpu() for k, v in lin.state_dict().items()})
    with torch.autocast("cpu", dtype=torch.bfloat16):
        # CPU's autocast matmul accumulates bfloat16 products in another order: measured one
        # bfloat16 step apart (7.8e-3), 0.19 of this tolerance.
        torch.testing.assert_close(y.cpu(), expected(x.cpu()), rtol=2e-2, atol=2e-2)


def test_training_under_autocast_lowers_the_loss():
    model = mlp().to("tpu")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x, y = (t.to("tpu") for t in mlp_data(1)[0])
    losses = []
    for _ in range(20):
        opt.zero_grad()
        with torch.autocast("tpu", dtype=torch.bfloat16):
            loss = F.mse_loss(model(x).float(), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0], losses


# ---------------------------------------------------------------------------------------
# 3. Optimizers and LR schedulers
# ---------------------------------------------------------------------------------------

OPTIMIZERS = {
    "sgd_momentum": (torch.optim.SGD, dict(lr=0.05, momentum=0.9, weight_decay=1e-3)),
    "sgd_nesterov": (torch.optim.SGD, dict(lr=0.05, momentum=0.9, nesterov=True)),
    "adam": (torch.optim.Adam, dict(lr=1e-2, weight_decay=1e-3)),
    "adamw": (torch.optim.AdamW, dict(lr=1e-2, weight_decay=0.1)),
}
IMPLS = {"default": {}, "for_loop": dict(foreach=False), "foreach": dict(foreach=True)}


def run_optimizer(model, device, cls, kwargs, steps=4, scheduler=None):
    opt = cls(model.parameters(), **kwargs)
    sched = scheduler(opt) if scheduler else None
    compiled, losses = [], []
    for x, y in mlp_data(steps):
        opt.zero_grad()
        loss = F.mse_loss(model(x.to(device)), y.to(device))
        loss.backward()
        opt.step()
        if sched:
            sched.step()
        losses.append(loss.detach())
        compiled.append(torchtpu.metrics.counters()["graphs_compiled"])
    return [loss.item() for loss in losses], compiled


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("name", OPTIMIZERS)
def test_optimizer_matches_cpu(name, impl, mode):
    cls, kwargs = OPTIMIZERS[name]
    kwargs = dict(kwargs, **IMPLS[impl])
    cpu_model = mlp()
    expected, _ = run_optimizer(cpu_model, "cpu", cls, kwargs)
    model = mlp().to("tpu")
    with no_new_fallbacks():
        actual, _ = run_optimizer(model, "tpu", cls, kwargs)
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-6)
    assert_same_params(model, cpu_model)


# fused=True on tpu runs PyTorch's fused kernels' arithmetic, lowered (tests/test_optim_fused.py
# covers every mode, AMP and compiled); the user's settings stay as given.
@pytest.mark.modes("fused")
@pytest.mark.parametrize("name", OPTIMIZERS)
def test_fused_optimizer_matches_cpu(name, mode):
    cls, kwargs = OPTIMIZERS[name]
    cpu_model = mlp()
    cpu_losses, _ = run_optimizer(cpu_model, "cpu", cls, kwargs)
    model = mlp().to("tpu")
    with no_new_fallbacks():
        losses, _ = run_optimizer(model, "tpu", cls, dict(kwargs, fused=True))
    torch.testing.assert_close(losses, cpu_losses, rtol=1e-5, atol=1e-6)
    assert_same_params(model, cpu_model)


@pytest.mark.modes("fused")
@pytest.mark.parametrize("name", ["sgd_momentum", "adamw"])
def test_lr_scheduler_does_not_recompile(name, mode):
    cls, kwargs = OPTIMIZERS[name]
    scheduler = functools.partial(torch.optim.lr_scheduler.CosineAnnealingLR, T_max=10)
    cpu_losses_, _ = run_optimizer(mlp(), "cpu", cls, kwargs, steps=8, scheduler=scheduler)
    with no_new_fallbacks():
        losses, compiled = run_optimizer(mlp().to("tpu"), "tpu", cls, kwargs, steps=8, scheduler=scheduler)
    torch.testing.assert_close(losses, cpu_losses_, rtol=1e-5, atol=1e-6)
    # The first steps compile (no optimizer state yet, then the steady-state step); the
    # learning rate (and Adam's bias corrections) are lifted scalars after that.
    assert compiled[2:] == [compiled[2]] * (len(compiled) - 2), compiled


# ---------------------------------------------------------------------------------------
# 4. RNG
# ---------------------------------------------------------------------------------------


def dropout_run(seed, steps=4):
    model = mlp(seed=0, dropout=0.5).to("tpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    torch.manual_seed(seed)
    losses = []
    for x, y in mlp_data(steps):
        opt.zero_grad()
        loss = F.mse_loss(model(x.to("tpu")), y.to("tpu"))
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    return [loss.item() for loss in losses]


def test_manual_seed_reproduces_training_with_dropout(mode):
    with no_new_fallbacks():
        first, again, other = dropout_run(1), dropout_run(1), dropout_run(2)
    assert first == again
    assert first != other  # dropout is on, and the seed decides its masks


@pytest.mark.modes("fused")
def test_manual_seed_reproduces_gpt_training_with_dropout(mode):
    cfg = GPT_CFG.replace(dropout=0.1)
    data = [M.make_lm_batch(cfg, GPT_BATCH, seed=i) for i in range(3)]

    def run(seed):
        model = to_tpu_model(gpt(cfg))
        torch.manual_seed(seed)
        return train(model, "tpu", data)

    with no_new_fallbacks():
        first, again, other = run(1), run(1), run(2)
    assert first == again
    assert first != other
