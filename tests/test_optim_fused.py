"""Fused optimizers on tpu (torch._fused_adam_, _fused_adamw_, _fused_sgd_, _fused_adagrad_,
lowered in csrc/lowering/optimizer.cpp) against PyTorch's CPU fused kernels: parameters,
optimizer state and the user's settings after several steps, in every eager mode and compiled;
AMP's grad_scale / found_inf; one graph per training step in fused mode."""
import contextlib
import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torchtpu

# The steps' arithmetic is CPU's, but XLA may contract a product and a sum into one rounding
# where CPU's vector loop does not, and the reverse (its lerp is an FMA): parameters and state
# differ by a few float32 ulps after 4 steps (1.2e-7 measured); 1e-6 leaves room for that.
ATOL = RTOL = 1e-6

OPTIMIZERS = {
    "adam": (torch.optim.Adam, dict(lr=1e-2, weight_decay=1e-3)),
    "adam_amsgrad_maximize": (torch.optim.Adam, dict(lr=1e-2, amsgrad=True, maximize=True)),
    "adamw": (torch.optim.AdamW, dict(lr=1e-2, weight_decay=0.1)),
    "adamw_tensor_lr": (torch.optim.AdamW, dict(lr=torch.tensor(1e-2), betas=(0.8, 0.9), amsgrad=True)),
    "sgd": (torch.optim.SGD, dict(lr=0.05)),
    "sgd_momentum": (torch.optim.SGD, dict(lr=0.05, momentum=0.9, dampening=0.1, weight_decay=1e-3)),
    "sgd_nesterov_maximize": (torch.optim.SGD, dict(lr=0.05, momentum=0.9, nesterov=True, maximize=True)),
    "adagrad": (torch.optim.Adagrad, dict(lr=0.1, lr_decay=0.01, weight_decay=1e-3)),
}


def mlp(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))


def batches(steps, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(6, 8, generator=g), torch.randn(6, 4, generator=g)) for _ in range(steps)]


def fallbacks():
    return dict(torchtpu.metrics.counters()["fallback_ops"])


@contextlib.contextmanager
def no_new_fallbacks(allowed=()):
    before = fallbacks()
    yield
    new = {op: n - before.get(op, 0) for op, n in fallbacks().items() if n != before.get(op, 0) and op not in allowed}
    assert not new, f"ops fell back to CPU: {new}"


def make_optimizer(cls, kwargs, model):
    kwargs = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
    return cls(model.parameters(), fused=True, **kwargs)


def train(model, optimizer, device, steps, step_fn=None):
    def step(x, y):
        optimizer.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        return loss.detach()

    step_fn = step_fn(step) if step_fn else step
    return [step_fn(x.to(device), y.to(device)).item() for x, y in batches(steps)]


def assert_matches_cpu(tpu_model, tpu_opt, cpu_model, cpu_opt):
    for (name, p), q in zip(tpu_model.named_parameters(), cpu_model.parameters()):
        torch.testing.assert_close(p.detach().cpu(), q.detach(), rtol=RTOL, atol=ATOL, msg=name)
    tpu_state, cpu_state = tpu_opt.state_dict(), cpu_opt.state_dict()
    # The user's settings come back as given: fused stays True, foreach stays None.
    assert tpu_state["param_groups"] == cpu_state["param_groups"]
    assert tpu_opt.param_groups[0]["fused"] is True
    for index, entries in cpu_state["state"].items():
        assert tpu_state["state"][index].keys() == entries.keys()
        for key, expected in entries.items():
            actual = tpu_state["state"][index][key]
            assert actual.device.type == "tpu", (index, key)  # fused steps keep their state on the device
            torch.testing.assert_close(actual.cpu(), expected, rtol=RTOL, atol=ATOL, msg=f"state[{index}][{key}]")


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_fused_optimizer_matches_cpu(name, mode):
    cls, kwargs = OPTIMIZERS[name]
    cpu_model = mlp()
    cpu_opt = make_optimizer(cls, kwargs, cpu_model)
    expected = train(cpu_model, cpu_opt, "cpu", steps=4)
    model = mlp().to("tpu")
    opt = make_optimizer(cls, kwargs, model)
    with no_new_fallbacks():
        losses = train(model, opt, "tpu", steps=4)
    torch.testing.assert_close(losses, expected, rtol=1e-5, atol=1e-6)
    assert_matches_cpu(model, opt, cpu_model, cpu_opt)


@pytest.mark.modes("fused")
def test_a_fused_training_step_is_one_graph(mode):
    # Forward, backward and the fused AdamW step: one executable per step, compiled once; a
    # changing learning rate (a scheduler) is a lifted scalar, not a recompile.
    model = mlp().to("tpu")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1, fused=True)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=10)
    data = [(x.to("tpu"), y.to("tpu")) for x, y in batches(6)]
    counts = []
    for x, y in data:
        before = torchtpu.metrics.counters()
        opt.zero_grad()
        F.mse_loss(model(x), y).backward()
        opt.step()
        sched.step()
        after = torchtpu.metrics.counters()
        counts.append((after["execute_count"] - before["execute_count"],
                       after["graphs_compiled"] - before["graphs_compiled"]))
    torchtpu.sync(wait=True)
    # Step 1 creates the state (zeros, steps) beside the update; from step 2 on the graph is
    # the same each step.
    assert [executed for executed, _ in counts] == [1] * len(counts), counts
    assert [compiled for _, compiled in counts[2:]] == [0] * (len(counts) - 2), counts


def fused_call_args(device, amsgrad, grad_scale=None, found_inf=None):
    g = torch.Generator().manual_seed(3)
    shapes = [(4, 5), (5,), (2, 3, 2)]
    params = [torch.randn(s, generator=g) for s in shapes]
    grads = [torch.randn(s, generator=g) for s in shapes]
    exp_avgs = [torch.randn(s, generator=g).abs() * 0.1 for s in shapes]
    exp_avg_sqs = [torch.rand(s, generator=g) * 0.01 for s in shapes]
    max_exp_avg_sqs = [torch.rand(s, generator=g) * 0.02 for s in shapes] if amsgrad else []
    steps = [torch.tensor(float(k + 1)) for k in range(len(shapes))]  # each tensor its own step
    lists = [params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps]
    lists = [[t.to(device) for t in tensors] for tensors in lists]
    scaling = {k: torch.tensor(v).to(device) for k, v in (("grad_scale", grad_scale), ("found_inf", found_inf))
               if v is not None}
    return lists, scaling


@pytest.mark.parametrize("op", ["_fused_adam_", "_fused_adamw_"])
@pytest.mark.parametrize("case", ["plain", "amsgrad_maximize_tensor_lr", "grad_scale", "found_inf"])
def test_calling_the_fused_op_directly(op, case, mode):
    amsgrad = case == "amsgrad_maximize_tensor_lr"
    grad_scale = 1024.0 if case in ("grad_scale", "found_inf") else None
    found_inf = 1.0 if case == "found_inf" else None

    def run(device):
        lists, scaling = fused_call_args(device, amsgrad, grad_scale, found_inf)
        # A tensor lr stays on CPU, as PyTorch's optimizers leave a CPU one.
        lr = torch.tensor(0.02) if amsgrad else 0.02
        getattr(torch, op)(*lists, lr=lr, beta1=0.9, beta2=0.99, weight_decay=0.05, eps=1e-8, amsgrad=amsgrad,
                           maximize=amsgrad, **scaling)
        return [t.cpu() for tensors in lists for t in tensors]

    expected = run("cpu")
    with no_new_fallbacks():
        actual = run("tpu")
    torch.testing.assert_close(actual, expected, rtol=RTOL, atol=ATOL)
    if found_inf is not None:  # the step is skipped: nothing changes, the gradients stay scaled
        torch.testing.assert_close(actual, [t.cpu() for ts in fused_call_args("cpu", False)[0] for t in ts],
                                   rtol=0, atol=0)


@pytest.mark.parametrize("found_inf", [0.0, 1.0])
def test_fused_sgd_and_adagrad_with_grad_scale(found_inf, mode):
    def run(device):
        g = torch.Generator().manual_seed(4)
        shapes = [(3, 4), (7,)]
        params, grads, buffers, sums = ([torch.randn(s, generator=g).to(device) for s in shapes] for _ in range(4))
        grads = [grad * 512 for grad in grads]
        sums = [s.abs() for s in sums]
        steps = [torch.tensor(3.0).to(device) for _ in params]
        scaling = dict(grad_scale=torch.tensor(512.0).to(device), found_inf=torch.tensor(found_inf).to(device))
        torch._fused_sgd_(params, grads, buffers, weight_decay=0.01, momentum=0.9, lr=torch.tensor(0.1),
                          dampening=0.2, nesterov=True, maximize=False, is_first_step=False, **scaling)
        torch._fused_adagrad_(params, grads, sums, steps, lr=0.1, lr_decay=0.01, weight_decay=0.01, eps=1e-10,
                              maximize=True, **scaling)
        return [t.cpu() for t in params + grads + buffers + sums + steps]

    expected = run("cpu")
    with no_new_fallbacks():
        actual = run("tpu")
    torch.testing.assert_close(actual, expected, rtol=RTOL, atol=ATOL)


def test_mismatched_lists_raise_cpus_error():
    for device in ("cpu", "tpu"):
        lists, _ = fused_call_args(device, amsgrad=False)
        lists[2] = lists[2][:2]  # one exp_avg short
        with pytest.raises(RuntimeError, match=r"Expected exp_avgs.size\(\) == n_tensors to be true"):
            torch._fused_adamw_(*lists, lr=0.1, beta1=0.9, beta2=0.99, weight_decay=0.0, eps=1e-8, amsgrad=False,
                                maximize=False)
            lists[0][0].cpu()


@pytest.mark.modes("fused", "strict")
def test_amp_grad_scaler_with_a_fused_optimizer(mode):
    # GradScaler hands the fused step its scale and found_inf: the gradients are unscaled in
    # the step, and a step whose gradients overflowed is skipped (then the scale backs off).
    def run(device):
        model = mlp()
        model = copy.deepcopy(model).to(device)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1, fused=True)
        scaler = torch.amp.GradScaler(device, init_scale=2.0 ** 10, growth_interval=2)
        scales = []
        for k, (x, y) in enumerate(batches(5)):
            opt.zero_grad()
            loss = F.mse_loss(model(x.to(device)), y.to(device))
            if k == 2:
                loss = loss * float("inf")  # an overflowing step
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            scales.append(scaler.get_scale())
        return model, opt, scales

    cpu_model, cpu_opt, cpu_scales = run("cpu")
    with no_new_fallbacks():
        model, opt, scales = run("tpu")
    assert scales == cpu_scales
    assert_matches_cpu(model, opt, cpu_model, cpu_opt)


@pytest.mark.modes("fused")
@pytest.mark.parametrize("name", ["adamw", "sgd_momentum"])
def test_compiled_training_step_with_a_fused_optimizer(name, mode):
    cls, kwargs = OPTIMIZERS[name]
    cpu_model = mlp()
    cpu_opt = make_optimizer(cls, kwargs, cpu_model)
    expected = train(cpu_model, cpu_opt, "cpu", steps=4)
    model = mlp().to("tpu")
    opt = make_optimizer(cls, kwargs, model)
    torch._dynamo.reset()
    with no_new_fallbacks():
        losses = train(model, opt, "tpu", steps=4, step_fn=lambda step: torch.compile(step, backend="tpu"))
    torch.testing.assert_close(losses, expected, rtol=1e-5, atol=1e-6)
    assert_matches_cpu(model, opt, cpu_model, cpu_opt)


@pytest.mark.parametrize("case", ["finite", "nan", "inf_half", "grows", "grows_to_inf"])
def test_grad_scaler_ops_match_cpu(case, mode):
    # GradScaler's inf check (with unscaling) and scale update, lowered beside the fused steps.
    def run(device):
        g = torch.Generator().manual_seed(5)
        dtype = torch.float16 if case == "inf_half" else torch.float32
        grads = [torch.randn(3, 4, generator=g).to(dtype), torch.randn(5, generator=g).to(dtype)]
        if case == "nan":
            grads[1][2] = float("nan")
        if case == "inf_half":
            grads[0][1, 1] = float("inf")
        grads = [t.to(device) for t in grads]
        found_inf = torch.zeros(1).to(device)
        torch._amp_foreach_non_finite_check_and_unscale_(grads, found_inf, torch.full((1,), 0.125).to(device))
        scale = torch.full((1,), 3e38 if case == "grows_to_inf" else 1024.0).to(device)
        tracker = torch.tensor([1 if case.startswith("grows") else 0], dtype=torch.int32).to(device)
        torch._amp_update_scale_(scale, tracker, found_inf, 2.0, 0.5, 2)
        return [t.cpu() for t in grads + [found_inf, scale, tracker]]

    expected = run("cpu")
    with no_new_fallbacks():
        actual = run("tpu")
    torch.testing.assert_close(actual, expected, rtol=0, atol=0, equal_nan=True)


@pytest.mark.modes("fused")
def test_compiled_call_of_the_fused_op_is_one_graph(mode):
    # PyTorch keeps torch.compile out of its optimizers' fused path (torch.compiler.disable), but
    # a compiled function that calls the op itself traces it: AOTAutograd functionalizes it
    # (through torchtpu's Functionalize kernel, an empty max_exp_avg_sqs included) into one graph.
    from torch._dynamo.utils import counters

    def step(*lists):
        torch._fused_adamw_(*lists, lr=0.02, beta1=0.9, beta2=0.99, weight_decay=0.05, eps=1e-8, amsgrad=False,
                            maximize=False)

    expected, _ = fused_call_args("cpu", amsgrad=False)
    step(*expected)
    actual, _ = fused_call_args("tpu", amsgrad=False)
    torch._dynamo.reset()
    counters.clear()
    with no_new_fallbacks():
        torch.compile(step, backend="tpu")(*actual)
    assert counters["stats"]["unique_graphs"] == 1 and not counters["graph_break"], dict(counters["graph_break"])
    torch.testing.assert_close([t.cpu() for ts in actual for t in ts], [t for ts in expected for t in ts],
                               rtol=RTOL, atol=ATOL)


@pytest.mark.modes("fused")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_parameters_compute_in_float32_and_round_once(dtype, mode):
    # CPU's kernel computes half-precision parameters in float32 and rounds each result once.
    # Measured bit-equal; one ulp of the dtype is allowed for a float32 difference that lands
    # on a rounding boundary.
    def run(device):
        lists, scaling = fused_call_args("cpu", amsgrad=True, grad_scale=4.0)
        lists = [[t.to(dtype) if k < 5 else t for t in ts] for k, ts in enumerate(lists)]  # steps stay float32
        lists = [[t.to(device) for t in ts] for ts in lists]
        torch._fused_adam_(*lists, lr=1e-2, beta1=0.9, beta2=0.99, weight_decay=0.1, eps=1e-8, amsgrad=True,
                           maximize=False, **{k: v.to(device) for k, v in scaling.items()})
        return [t.cpu() for ts in lists for t in ts]

    expected = run("cpu")
    with no_new_fallbacks():
        actual = run("tpu")
    ulp = {torch.bfloat16: 2.0 ** -7, torch.float16: 2.0 ** -10}[dtype]
    torch.testing.assert_close(actual, expected, rtol=ulp, atol=0)
