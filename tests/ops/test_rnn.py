"""LSTM, GRU and their cells on tpu (ATen's fused-cell path: _thnn_fused_lstm_cell /
_thnn_fused_gru_cell and their backward ops, lowered in lowering/rnn.cpp) against CPU:
bidirectional, multi-layer, packed sequences, with and without bias and initial state,
forward and backward, in every eager mode and compiled."""
import pytest
import torch
import torch.nn as nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

import torchtpu
from utils import assert_close


def pair(cls, *args, **kwargs):
    """The same module on CPU and on tpu (weights copied)."""
    torch.manual_seed(0)
    cpu = cls(*args, **kwargs)
    tpu = cls(*args, **kwargs)
    tpu.load_state_dict(cpu.state_dict())
    return cpu, tpu.to("tpu")


def compare(cpu, tpu, run, inputs, tol=2e-5):
    """run(module, *inputs) -> tensor outputs; compares outputs, input and parameter gradients,
    and checks that nothing fell back to CPU."""
    before = dict(torchtpu.metrics.counters()["fallback_ops"])
    outs = []
    for module, device in ((cpu, "cpu"), (tpu, "tpu")):
        ins = [x.detach().to(device).requires_grad_(x.is_floating_point()) for x in inputs]
        out = run(module, *ins)
        sum(o.float().mul(k + 1).sum() for k, o in enumerate(out)).backward()
        outs.append((out, [x.grad for x in ins], [p.grad for p in module.parameters()]))
    (oc, gc, pc), (ot, gt, pt) = outs
    assert_close(list(ot), list(oc), rtol=tol, atol=tol)
    assert_close(gt, gc, rtol=tol, atol=tol)
    assert_close(pt, pc, rtol=tol, atol=tol)
    after = torchtpu.metrics.counters()["fallback_ops"]
    assert {k: v for k, v in after.items() if v != before.get(k, 0)} == {}


CONFIGS = {"deep-bidirectional": dict(num_layers=2, bidirectional=True),
           "batch_first-nobias": dict(batch_first=True, bias=False, num_layers=2),
           "proj": dict(proj_size=3, num_layers=2)}  # proj_size: LSTM only


@pytest.mark.parametrize("cls, config", [(nn.LSTM, c) for c in CONFIGS] + [(nn.GRU, c) for c in CONFIGS if c != "proj"],
                         ids=lambda v: getattr(v, "__name__", v))
def test_rnn_modules(mode, cls, config):
    kwargs = CONFIGS[config]
    cpu, tpu = pair(cls, 5, 6, **kwargs)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(4, 3, 5, generator=g)
    layers = kwargs.get("num_layers", 1) * (2 if kwargs.get("bidirectional") else 1)
    h_size = kwargs.get("proj_size", 6)
    h0 = torch.randn(layers, 3 if not kwargs.get("batch_first") else 4, h_size, generator=g)

    def run(m, x, h0):
        if cls is nn.LSTM:
            c0 = torch.ones(layers, h0.shape[1], 6, device=x.device) * 0.5
            y, (h, c) = m(x, (h0, c0))
            return [y, h, c]
        y, h = m(x, h0)
        return [y, h]
    compare(cpu, tpu, run, [x, h0])


@pytest.mark.parametrize("cls", [nn.LSTM, nn.GRU])
def test_packed_sequences(mode, cls):
    cpu, tpu = pair(cls, 4, 5, bidirectional=True)
    lengths = torch.tensor([5, 3, 2])
    x = torch.randn(5, 3, 4, generator=torch.Generator().manual_seed(2))

    def run(m, x):
        packed = pack_padded_sequence(x, lengths, enforce_sorted=True)
        out, state = m(packed)
        padded, _ = pad_packed_sequence(out)
        return [padded] + (list(state) if cls is nn.LSTM else [state])
    compare(cpu, tpu, run, [x])


@pytest.mark.parametrize("cls", [nn.LSTMCell, nn.GRUCell])
def test_cells(mode, cls):
    cpu, tpu = pair(cls, 5, 4)
    g = torch.Generator().manual_seed(3)
    xs, h = torch.randn(3, 2, 5, generator=g), torch.randn(2, 4, generator=g)

    def run(m, xs, h):
        state = (h, h * 0.5) if cls is nn.LSTMCell else h
        outs = []
        for x in xs:  # a few steps, so gradients flow through the recurrence
            state = m(x, state)
            outs.append(state[0] if cls is nn.LSTMCell else state)
        return outs
    compare(cpu, tpu, run, [xs, h])
    # No initial state, no bias, and a cell in bfloat16 (gates in float32, as CUDA's kernels).
    cpu, tpu = pair(cls, 5, 4, bias=False)
    compare(cpu, tpu, lambda m, x: [m(x)[0] if cls is nn.LSTMCell else m(x)], [xs[0]])
    cpu, tpu = pair(cls, 5, 4)
    cpu, tpu = cpu.bfloat16(), tpu.bfloat16()
    compare(cpu, tpu, lambda m, x: [m(x)[0] if cls is nn.LSTMCell else m(x)], [xs[0].bfloat16()], tol=2e-2)


@pytest.mark.modes("fused")
@pytest.mark.parametrize("cls", [nn.LSTM, nn.GRU])
def test_compiled(mode, cls):
    cpu, tpu = pair(cls, 5, 6, num_layers=2, bidirectional=True)
    compiled = torch.compile(tpu, backend="tpu")
    x = torch.randn(4, 3, 5, generator=torch.Generator().manual_seed(4))
    compare(cpu, compiled, lambda m, x: [m(x)[0]], [x])
