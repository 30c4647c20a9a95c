"""torchtpu.StackedLayers: layers with stacked parameters. Training with AdamW against the
same weights as separate layers on CPU (the oracle), in every mode and under torch.compile;
state_dict layouts; a whole fused training step whose module does not grow with depth;
clear errors."""
import copy

import pytest
import torch
import torch.nn as nn

import torchtpu
from torchtpu import _C

from test_scan import BLOCK_CFG, M, ScaledMLP

# XLA and ATen sum in different orders (forward and grads differ by < 2e-6); AdamW's update
# divides by sqrt(v), which magnifies the relative error of small grads: after 3 steps the
# weights differ by < 2e-6 (measured), well inside 2e-5.
ATOL, RTOL = 2e-5, 2e-5


class Net(nn.Module):
    """A stack (StackedLayers or an nn.ModuleList run as a plain loop) between two linears."""

    def __init__(self, blocks, width):
        super().__init__()
        self.inp = nn.Linear(width, width)
        self.blocks = blocks
        self.head = nn.Linear(width, 3)

    def forward(self, x, *extra):
        x = self.inp(x)
        if isinstance(self.blocks, nn.ModuleList):
            for block in self.blocks:
                x = block(x, *extra)
        else:
            x = self.blocks(x, *extra)
        return self.head(x)


def _layers(kind, depth):
    torch.manual_seed(0)
    if kind == "block":
        return [M.Block(BLOCK_CFG) for _ in range(depth)]
    return [ScaledMLP() for _ in range(depth)]


def _width(kind):
    return BLOCK_CFG.n_embd if kind == "block" else 8


def _nets(kind, depth=3):
    """(per-layer net, the same weights with the blocks stacked)."""
    layers = _layers(kind, depth)
    per_layer = Net(nn.ModuleList(layers), _width(kind))
    stacked = copy.deepcopy(per_layer)
    stacked.blocks = torchtpu.StackedLayers(stacked.blocks)
    return per_layer, stacked


def _batches(kind, steps):
    g = torch.Generator().manual_seed(1)
    shape = (2, BLOCK_CFG.block_size, BLOCK_CFG.n_embd) if kind == "block" else (4, 8)
    extra = () if kind == "block" else (torch.rand(16, generator=g) + 0.5,)
    return [(torch.randn(*shape, generator=g), torch.randn(*shape[:-1], 3, generator=g)) for _ in range(steps)], extra


def _train(net, batches, extra, device, compiled=False):
    """AdamW steps; returns the losses, the grads of the last step and the final state."""
    net = net.to(device)
    # eps well above float32 noise: the attention's key bias has a zero gradient (softmax
    # ignores it) that comes out as +-1e-9 noise, and eps=1e-8 would turn that noise into
    # full-size steps of either sign.
    opt = torch.optim.AdamW(net.parameters(), lr=1e-2, eps=1e-4)
    fwd = torch.compile(net, backend="tpu") if compiled else net
    extra = tuple(e.to(device) for e in extra)
    losses = []
    for x, y in batches:
        opt.zero_grad()
        loss = (fwd(x.to(device), *extra) - y.to(device)).square().mean()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    grads = {n: p.grad.cpu() for n, p in net.named_parameters()}
    return losses, grads, {n: t.cpu() for n, t in net.state_dict().items()}


def _as_stacked(per_layer_state, depth):
    """A per-layer state (blocks.<i>.<name>) in the stacked layout (blocks.layer.<name>)."""
    out = {k: v for k, v in per_layer_state.items() if not k.startswith("blocks.")}
    names = {k.split(".", 2)[2] for k in per_layer_state if k.startswith("blocks.")}
    for name in names:
        out[f"blocks.layer.{name}"] = torch.stack([per_layer_state[f"blocks.{i}.{name}"] for i in range(depth)])
    return out


def _close_dicts(got, want):
    assert sorted(got) == sorted(want)
    for k in want:
        torch.testing.assert_close(got[k], want[k], atol=ATOL, rtol=RTOL, msg=lambda m: f"{k}: {m}")


@pytest.mark.parametrize("kind", ["block", "mlp"])
def test_training_matches_per_layer_cpu(mode, kind):
    per_layer, stacked = _nets(kind)
    # Two steps compile AdamW's first and steady-state graphs; the cheap MLP runs one more.
    batches, extra = _batches(kind, 2 if kind == "block" else 3)
    want_losses, want_grads, want_state = _train(per_layer, batches, extra, "cpu")
    want_grads, want_state = _as_stacked(want_grads, 3), _as_stacked(want_state, 3)
    for device in ("cpu", "tpu"):  # the plain loop off tpu, the scan loop on tpu
        losses, grads, state = _train(copy.deepcopy(stacked), batches, extra, device)
        torch.testing.assert_close(losses, want_losses, atol=ATOL, rtol=RTOL)
        _close_dicts(grads, want_grads)
        _close_dicts(state, want_state)


def test_training_under_torch_compile_matches_per_layer_cpu():
    per_layer, stacked = _nets("mlp")  # the MLP, which also passes an extra tensor (Dynamo's slowest here is compiling)
    batches, extra = _batches("mlp", 2)
    want_losses, want_grads, want_state = _train(per_layer, batches, extra, "cpu")
    losses, grads, state = _train(stacked, batches, extra, "tpu", compiled=True)
    torch.testing.assert_close(losses, want_losses, atol=ATOL, rtol=RTOL)
    _close_dicts(grads, _as_stacked(want_grads, 3))
    _close_dicts(state, _as_stacked(want_state, 3))


def test_state_dict_layouts_round_trip():
    per_layer, stacked = _nets("mlp")
    keys = [k for k in stacked.state_dict() if k.startswith("blocks.")]
    assert sorted(keys) == sorted(f"blocks.layer.{n}" for n in ("fc.weight", "fc.bias", "proj.weight",
                                                                 "proj.bias", "shift"))
    assert stacked.state_dict()["blocks.layer.fc.weight"].shape == (3, 16, 8)
    _close_dicts(stacked.state_dict(), _as_stacked(per_layer.state_dict(), 3))
    # Both layouts load into a fresh stacked net (on tpu), and unstack() gives the per-layer one back.
    for source in (stacked.state_dict(), per_layer.state_dict()):
        torch.manual_seed(5)
        fresh = Net(torchtpu.StackedLayers(ScaledMLP, depth=3), 8).to("tpu")
        fresh.load_state_dict(source)
        _close_dicts({k: v.cpu() for k, v in fresh.state_dict().items()}, stacked.state_dict())
        exported = Net(fresh.blocks.unstack(), 8)
        exported.inp, exported.head = fresh.inp, fresh.head
        _close_dicts({k: v.cpu() for k, v in exported.state_dict().items()}, per_layer.state_dict())
        assert all(p.requires_grad and p.device.type == "tpu" for p in exported.blocks.parameters())
    # unstack() copies: changing the export leaves the stack alone.
    with torch.no_grad():
        exported.blocks[0].fc.weight.add_(1)
    torch.testing.assert_close(fresh.blocks.layer.fc.weight[0].cpu(), stacked.blocks.layer.fc.weight[0])
    # A checkpoint of another depth is refused by the usual strict key check.
    deeper, _ = _nets("mlp", depth=4)
    with pytest.raises(RuntimeError, match=r"Unexpected key\(s\) in state_dict: \"blocks.3."):
        fresh.load_state_dict(deeper.state_dict())


def _step_modules(tmp_path, depth):
    """The modules compiled by two fused AdamW training steps of a depth-`depth` stacked net."""
    dump = tmp_path / f"depth{depth}"
    _C.set_dump_dir(str(dump))
    try:
        _, stacked = _nets("mlp", depth)
        batches, extra = _batches("mlp", 2)
        _train(stacked, batches, extra, "tpu")
    finally:
        _C.set_dump_dir("")
    return [p.read_text() for p in dump.iterdir()]


def _ops(text):
    return sum(line.count('"stablehlo.') + line.count(" stablehlo.") for line in text.splitlines())


@pytest.mark.modes("fused")
def test_whole_training_step_does_not_grow_with_depth(mode, tmp_path):
    _C.clear_memory_cache()  # the modules must be compiled (and dumped) here
    shallow, deep = _step_modules(tmp_path, 4), _step_modules(tmp_path, 8)
    assert sum('"stablehlo.while"' in t for t in shallow) >= 2  # the forward and backward loops
    # The layer's matmuls appear once per module (inside the loop bodies), and the modules as a
    # whole - forward, backward and the AdamW updates - have the same ops at either depth.
    count = lambda texts, f: sorted(f(t) for t in texts)  # noqa: E731
    assert count(shallow, lambda t: t.count("stablehlo.dot_general")) == \
        count(deep, lambda t: t.count("stablehlo.dot_general"))
    assert count(shallow, _ops) == count(deep, _ops)


class _Dropout(nn.Module):
    def forward(self, x):
        return nn.functional.dropout(x, 0.5, training=True)


def test_bad_input_raises():
    with pytest.raises(ValueError, match="layer 2 differs from layer 0 in its parameters"):
        torchtpu.StackedLayers([ScaledMLP(8), ScaledMLP(8), ScaledMLP(4)])
    with pytest.raises(ValueError, match="layer 1 differs from layer 0 in its class"):
        torchtpu.StackedLayers([nn.Linear(8, 8), nn.Tanh()])
    shared = nn.Linear(8, 8)
    with pytest.raises(ValueError, match="layer 1 shares its 'weight' with layer 0"):
        torchtpu.StackedLayers([shared, shared])
    with pytest.raises(ValueError, match="needs at least one layer"):
        torchtpu.StackedLayers([])
    with pytest.raises(ValueError, match="depth must be a positive int"):
        torchtpu.StackedLayers(ScaledMLP, depth=0)
    with pytest.raises(TypeError, match="factory must be a function"):
        torchtpu.StackedLayers(ScaledMLP(), depth=2)
    with pytest.raises(TypeError, match=r"takes a sequence of layers .* got type"):
        torchtpu.StackedLayers(ScaledMLP)
    with pytest.raises(TypeError, match=r"takes a sequence of layers .* got ScaledMLP"):
        torchtpu.StackedLayers(ScaledMLP())
    stack = torchtpu.StackedLayers(ScaledMLP, depth=2).to("tpu")
    scale = torch.ones(16, device="tpu")
    with pytest.raises(TypeError, match="x must be a floating-point tensor, got a tensor of dtype torch.int64"):
        stack(torch.ones(4, 8, dtype=torch.long, device="tpu"), scale)
    with pytest.raises(TypeError, match="x must be a floating-point tensor, got a list"):
        stack([1.0], scale)
    with pytest.raises(RuntimeError, match="mat1 and mat2 shapes cannot be multiplied"):
        stack(torch.ones(4, 5, device="tpu"), scale)
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        torchtpu.StackedLayers(ScaledMLP, depth=2)(torch.ones(4, 8, device="tpu"), scale)
    with pytest.raises(ValueError, match="draws random numbers"):
        torchtpu.StackedLayers(_Dropout, depth=2)(torch.ones(4, 8, device="tpu"))
    # The failed traces left nothing behind: the stack still runs and matches its plain loop.
    x = torch.randn(4, 8)
    torch.testing.assert_close(stack(x.to("tpu"), scale).cpu(), copy.deepcopy(stack).cpu()(x, scale.cpu()),
                               atol=ATOL, rtol=RTOL)
