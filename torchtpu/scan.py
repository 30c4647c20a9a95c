"""scan_layers: a stack of identical layers run as one loop (stablehlo.while) over stacked weights.

The layer is traced once per call into a body (torchtpu._C.scan_body_*): the compiled module
holds one copy of it, so compile time does not grow with depth. The backward is a second
loop, in reverse, over a traced body that recomputes one layer's forward and its
vector-Jacobian product from the layer's input (saved by the forward loop, one row per layer).
"""
from __future__ import annotations

import torch
from torch.func import functional_call

from torchtpu import _C

__all__ = ["scan_layers"]


def scan_layers(layers, x: torch.Tensor, *extra):
    """Runs ``for layer in layers: x = layer(x, *extra)`` as one loop on the tpu device.

    ``layers`` (an ``nn.ModuleList`` or a sequence of modules) must share one structure: the
    same class, the same parameter and buffer names, shapes and dtypes. Each layer returns
    one tensor of x's shape and dtype. Tensors in ``extra`` are the same for every layer
    (an attention mask, say; their gradients are summed over layers); other values are
    passed through. Gradients reach each layer's own parameters.

    Under torch.compile, or off the tpu device, this is the plain loop (Dynamo traces the
    layers as usual). Layers that draw random numbers (dropout > 0) or read tensors on the
    host raise ValueError.
    """
    layers = list(layers)
    param_names, buffer_names = _check_structure(layers)
    if not layers:
        return x
    if torch.compiler.is_compiling() or x.device.type != "tpu":
        return _unrolled(layers, x, extra)
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        raise TypeError(f"torchtpu.scan_layers: x must be a floating-point tensor, got {type(x).__name__}")
    tensor_at = [i for i, e in enumerate(extra) if isinstance(e, torch.Tensor)]
    plan = _Plan(layers[0], param_names, buffer_names, len(layers), extra, tensor_at)
    flat = [p for layer in layers for p in _named(layer.named_parameters(), param_names)]
    stacked_buffers = [torch.stack(bs) for bs in zip(*(_named(l.named_buffers(), buffer_names) for l in layers))]
    return _ScanLayers.apply(plan, x, *[extra[i] for i in tensor_at], *flat, *stacked_buffers)


def _unrolled(layers, x, extra):
    for layer in layers:
        x = layer(x, *extra)
    return x


def _named(items, names):
    table = dict(items)
    return [table[n] for n in names]


def _signature(layer):
    params = [(n, tuple(p.shape), p.dtype, p.requires_grad) for n, p in layer.named_parameters()]
    buffers = [(n, tuple(b.shape), b.dtype) for n, b in layer.named_buffers()]
    return type(layer), layer.training, params, buffers


def _check_structure(layers):
    """(parameter names, buffer names) shared by all layers; ValueError when they differ."""
    for i, layer in enumerate(layers):
        if not isinstance(layer, torch.nn.Module):
            raise TypeError(f"torchtpu.scan_layers: layer {i} is a {type(layer).__name__}, not an nn.Module")
    if not layers:
        return [], []
    first = _signature(layers[0])
    for i, layer in enumerate(layers[1:], start=1):
        sig = _signature(layer)
        if sig == first:
            continue
        what = ("class", "training mode", "parameters (name, shape, dtype, requires_grad)",
                "buffers (name, shape, dtype)")
        for name, a, b in zip(what, sig, first):
            if a != b:
                raise ValueError(
                    f"torchtpu.scan_layers: layer {i} differs from layer 0 in its {name}: {_short(a)} vs "
                    f"{_short(b)}; scan_layers needs layers of identical structure")
    return [n for n, *_ in first[2]], [n for n, *_ in first[3]]


def _short(value):
    text = value.__name__ if isinstance(value, type) else repr(value)
    return text if len(text) < 300 else text[:300] + "..."


class _Plan:
    """What the traced bodies need to know about the layers (not a tensor: autograd skips it)."""

    def __init__(self, template, param_names, buffer_names, length, extra, tensor_at):
        self.template = template
        self.param_names = param_names
        self.buffer_names = buffer_names
        self.length = length
        self.extra = extra
        self.tensor_at = tensor_at

    def call(self, h, params, buffers, extra_tensors):
        state = dict(zip(self.param_names, params))
        state.update(zip(self.buffer_names, buffers))
        extra = list(self.extra)
        for i, t in zip(self.tensor_at, extra_tensors):
            extra[i] = t
        out = functional_call(self.template, state, (h, *extra))
        if not isinstance(out, torch.Tensor) or out.shape != h.shape or out.dtype != h.dtype:
            raise ValueError(
                "torchtpu.scan_layers: each layer must return one tensor of its input's shape and dtype "
                f"({tuple(h.shape)}, {h.dtype}); got {_describe(out)}")
        return out


def _describe(value):
    if isinstance(value, torch.Tensor):
        return f"a tensor {tuple(value.shape)}, {value.dtype}"
    return f"a {type(value).__name__}"


def _placeholders(tensors, device, rows=False):
    return [_C.scan_body_input(list(t.shape[1:] if rows else t.shape), t.dtype, device) for t in tensors]


def _trace(build):
    """Traces build() (which makes placeholders and returns the body's outputs) into a body."""
    _C.scan_body_begin()
    try:
        outputs = build()
    except BaseException:
        _C.scan_body_abort()
        raise
    return _C.scan_body_end(outputs)


class _ScanLayers(torch.autograd.Function):
    @staticmethod
    def forward(ctx, plan, x, *inputs):
        n_extra, n_params = len(plan.tensor_at), len(plan.param_names)
        extra = inputs[:n_extra]
        flat = inputs[n_extra:n_extra + n_params * plan.length]
        stacked_buffers = list(inputs[n_extra + n_params * plan.length:])
        stacked = [torch.stack(flat[p::n_params]) for p in range(n_params)]
        device = x.device.index

        def forward_body():
            h, = _placeholders([x], device)
            params = _placeholders(stacked, device, rows=True)
            buffers = _placeholders(stacked_buffers, device, rows=True)
            consts = _placeholders(extra, device)
            # The layer's input is a y row: the backward loop recomputes from it.
            return [plan.call(h, params, buffers, consts), h]

        body = _trace(forward_body)
        out, inputs_per_layer = _C.scan(body, [x], stacked + stacked_buffers, list(extra), plan.length, False)
        ctx.plan = plan
        ctx.save_for_backward(inputs_per_layer, *extra, *stacked, *stacked_buffers)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        plan = ctx.plan
        n_extra, n_params = len(plan.tensor_at), len(plan.param_names)
        saved = ctx.saved_tensors
        inputs_per_layer, extra = saved[0], saved[1:1 + n_extra]
        stacked = saved[1 + n_extra:1 + n_extra + n_params]
        stacked_buffers = saved[1 + n_extra + n_params:]
        # Gradients are summed over layers for extra tensors that need them (carried).
        grad_extra_at = [k for k in range(n_extra) if ctx.needs_input_grad[2 + k] and extra[k].is_floating_point()]
        grad_param_at = [p for p in range(n_params) if stacked[p].is_floating_point()]
        device = grad_out.device.index

        def backward_body():
            g, = _placeholders([grad_out], device)
            sums = _placeholders([extra[k] for k in grad_extra_at], device)
            params = _placeholders(stacked, device, rows=True)
            buffers = _placeholders(stacked_buffers, device, rows=True)
            h, = _placeholders([inputs_per_layer], device, rows=True)
            consts = _placeholders(extra, device)
            with torch.enable_grad():
                h.requires_grad_()
                wrt = [h] + [params[p].requires_grad_() for p in grad_param_at]
                wrt += [consts[k].requires_grad_() for k in grad_extra_at]
                out = plan.call(h, params, buffers, consts)
                grads = torch.autograd.grad(out, wrt, g, allow_unused=True)
            grads = [torch.zeros_like(w) if gr is None else gr for w, gr in zip(wrt, grads)]
            grad_h, grad_params = grads[0], grads[1:1 + len(grad_param_at)]
            grad_consts = grads[1 + len(grad_param_at):]
            return [grad_h] + [s + gc for s, gc in zip(sums, grad_consts)] + list(grad_params)

        body = _trace(backward_body)
        zeros = [torch.zeros_like(extra[k]) for k in grad_extra_at]
        outs = _C.scan(body, [grad_out.contiguous()] + zeros, list(stacked) + list(stacked_buffers) + [inputs_per_layer],
                       list(extra), plan.length, True)
        grad_x = outs[0]
        grad_extra = [None] * n_extra
        for k, g in zip(grad_extra_at, outs[1:1 + len(grad_extra_at)]):
            grad_extra[k] = g
        grad_stacked = [None] * n_params
        for p, g in zip(grad_param_at, outs[1 + len(grad_extra_at):]):
            grad_stacked[p] = g.unbind(0)
        grad_flat = [None if grad_stacked[p] is None else grad_stacked[p][layer]
                     for layer in range(plan.length) for p in range(n_params)]
        return (None, grad_x, *grad_extra, *grad_flat, *([None] * len(stacked_buffers)))
