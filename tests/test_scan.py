"""torchtpu.scan_layers: a stack of identical layers as one loop. Outputs and gradients
against the same layers unrolled (on tpu) and on CPU (the oracle), in every mode and under
torch.compile; depth-flat modules; clear errors for layers that cannot be scanned."""
import copy
import os
import sys

import pytest
import torch
import torch.nn as nn

import torchtpu
from torchtpu import _C

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench import models as M  # noqa: E402

# XLA and ATen sum in different orders; observed differences are below 2e-6.
ATOL, RTOL = 1e-5, 1e-5
BLOCK_CFG = M.GPTConfig.small(n_layer=3, n_head=2, n_embd=16, block_size=8, vocab_size=32, dropout=0.0)


class ScaledMLP(nn.Module):
    """A residual MLP that also reads an extra tensor shared by all layers."""

    def __init__(self, width=8):
        super().__init__()
        self.fc = nn.Linear(width, 2 * width)
        self.proj = nn.Linear(2 * width, width)
        self.register_buffer("shift", torch.randn(width))

    def forward(self, x, scale):
        return x + self.proj(torch.tanh(self.fc(x) * scale)) + self.shift


def _stack(kind, n):
    torch.manual_seed(0)
    if kind == "block":
        return nn.ModuleList([M.Block(BLOCK_CFG) for _ in range(n)])
    return nn.ModuleList([ScaledMLP() for _ in range(n)])


def _inputs(kind):
    torch.manual_seed(1)
    if kind == "block":
        return torch.randn(2, BLOCK_CFG.block_size, BLOCK_CFG.n_embd), ()
    return torch.randn(4, 8), (torch.rand(16) + 0.5,)


def _run(layers, x, extra, scanned):
    x = x.clone().requires_grad_()
    extra = tuple(e.clone().requires_grad_() for e in extra)
    if scanned:
        y = torchtpu.scan_layers(layers, x, *extra)
    else:
        y = x
        for layer in layers:
            y = layer(y, *extra)
    (y * torch.linspace(-1, 1, y.shape[-1], device=y.device)).sum().backward()
    grads = [x.grad] + [e.grad for e in extra] + [p.grad for p in layers.parameters()]
    return [t.detach().cpu() for t in [y] + grads]


def _close(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("kind", ["block", "mlp"])
def test_scan_matches_unrolled_and_cpu(mode, kind):
    cpu_layers = _stack(kind, 3)
    x, extra = _inputs(kind)
    want = _run(cpu_layers, x, extra, scanned=False)
    tpu_extra = tuple(e.to("tpu") for e in extra)
    unrolled = _run(copy.deepcopy(cpu_layers).to("tpu"), x.to("tpu"), tpu_extra, scanned=False)
    scanned = _run(copy.deepcopy(cpu_layers).to("tpu"), x.to("tpu"), tpu_extra, scanned=True)
    _close(unrolled, want)
    _close(scanned, want)


class _Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = _stack("block", 3)
        self.head = nn.Linear(BLOCK_CFG.n_embd, 4)

    def forward(self, x):
        return self.head(torchtpu.scan_layers(self.blocks, x))


def test_scan_under_torch_compile_matches_cpu():
    cpu_model = _Model()
    x, _ = _inputs("block")
    cpu_out = cpu_model(x)
    cpu_out.square().sum().backward()
    tpu_model = copy.deepcopy(cpu_model).to("tpu")
    for p in tpu_model.parameters():
        p.grad = None
    out = torch.compile(tpu_model, backend="tpu")(x.to("tpu"))
    out.square().sum().backward()
    torch.testing.assert_close(out.detach().cpu(), cpu_out.detach(), atol=ATOL, rtol=RTOL)
    for p, q in zip(cpu_model.parameters(), tpu_model.parameters()):
        torch.testing.assert_close(q.grad.cpu(), p.grad, atol=ATOL, rtol=RTOL)


def _module_texts(tmp_path, depth):
    dump = tmp_path / f"depth{depth}"
    _C.set_dump_dir(str(dump))
    try:
        layers = _stack("mlp", depth).to("tpu")
        x, extra = _inputs("mlp")
        _run(layers, x.to("tpu"), tuple(e.to("tpu") for e in extra), scanned=True)
    finally:
        _C.set_dump_dir("")
    return [p.read_text() for p in dump.iterdir()]


def test_scanned_module_does_not_grow_with_depth(tmp_path):
    _C.clear_memory_cache()  # the modules must be compiled (and dumped) here
    shallow, deep = _module_texts(tmp_path, 2), _module_texts(tmp_path, 6)
    loops = [t for t in shallow + deep if '"stablehlo.while"' in t]
    assert len(loops) >= 2  # the forward and the backward step each compiled a loop
    # The layer's matmuls appear once per module (inside the loop body), whatever the depth.
    count = lambda texts: sorted(t.count("stablehlo.dot_general") for t in texts)  # noqa: E731
    assert count(shallow) == count(deep)


def test_layers_of_different_structure_raise():
    layers = nn.ModuleList([ScaledMLP(8), ScaledMLP(8), ScaledMLP(4)]).to("tpu")
    x, extra = _inputs("mlp")
    with pytest.raises(ValueError, match="layer 2 differs from layer 0 in its parameters"):
        torchtpu.scan_layers(layers, x.to("tpu"), extra[0].to("tpu"))
    mixed = nn.ModuleList([nn.Linear(8, 8), nn.Tanh()]).to("tpu")
    with pytest.raises(ValueError, match="layer 1 differs from layer 0 in its class"):
        torchtpu.scan_layers(mixed, x.to("tpu"))


class _Dropout(nn.Module):
    def forward(self, x):
        return nn.functional.dropout(x, 0.5, training=True)


class _Widen(nn.Module):
    def forward(self, x):
        return torch.cat([x, x], dim=-1)


class _ReadsHost(nn.Module):
    def forward(self, x):
        return x * float(x.sum())


@pytest.mark.parametrize("layer, message", [
    (_Dropout, "draws random numbers"),
    (_Widen, "must return one tensor of its input's shape"),
    (_ReadsHost, "reads a tensor on the host"),
])
def test_layers_that_cannot_be_scanned_raise_and_leave_the_engine_usable(layer, message):
    x = torch.randn(4, 8)
    with pytest.raises(ValueError, match=message):
        torchtpu.scan_layers([layer(), layer()], x.to("tpu"))
    # The failed trace left nothing behind: ordinary work and a scan still run.
    layers = _stack("mlp", 2)
    _, extra = _inputs("mlp")
    want = _run(layers, x, extra, scanned=False)
    _close(_run(copy.deepcopy(layers).to("tpu"), x.to("tpu"), tuple(e.to("tpu") for e in extra), scanned=True), want)
