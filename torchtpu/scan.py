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
    host raise ValueError. ``torchtpu.StackedLayers`` stores the parameters stacked instead, so
    that the optimizer's step does not grow with depth either.
    """
    layers = list(layers)
    param_names, buffer_names = check_structure(layers, "torchtpu.scan_layers")
    check_input(x, "torchtpu.scan_layers")
    if not layers:
        return x
    if torch.compiler.is_compiling() or x.device.type != "tpu":
        return _unrolled(layers, x, extra)
    # Stacked here, under autograd: the stack's backward unbinds the loop's stacked grads.
    stacked = [torch.stack(ps) for ps in zip(*(_named(l.named_parameters(), param_names) for l in layers))]
    stacked_buffers = [torch.stack(bs) for bs in zip(*(_named(l.named_buffers(), buffer_names) for l in layers))]
    return scan_stacked(layers[0], param_names, buffer_names, len(layers), x, extra, stacked, stacked_buffers)


def scan_stacked(template, param_names, buffer_names, length, x, extra, stacked, stacked_buffers,
                 who="torchtpu.scan_layers"):
    """The loop on tpu over parameters and buffers already stacked (one row per layer), run
    through ``template``'s structure; gradients land on the stacked tensors."""
    for t in [*stacked, *stacked_buffers, *(e for e in extra if isinstance(e, torch.Tensor))]:
        if t.device != x.device:
            raise RuntimeError("Expected all tensors to be on the same device, but found at least two devices, "
                               f"{x.device} and {t.device}!")
    tensor_at = [i for i, e in enumerate(extra) if isinstance(e, torch.Tensor)]
    plan = _Plan(template, param_names, buffer_names, length, extra, tensor_at, who)
    return _ScanLayers.apply(plan, x, *[extra[i] for i in tensor_at], *stacked, *stacked_buffers)


def check_input(x, who):
    """TypeError unless x is a floating-point tensor (the loop carries it and its gradient)."""
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        what = f"a tensor of dtype {x.dtype}" if isinstance(x, torch.Tensor) else f"a {type(x).__name__}"
        raise TypeError(f"{who}: x must be a floating-point tensor, got {what}")


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


def check_structure(layers, who):
    """(parameter names, buffer names) shared by all layers; ValueError when they differ."""
    for i, layer in enumerate(layers):
        if not isinstance(layer, torch.nn.Module):
            raise TypeError(f"{who}: layer {i} is a {type(layer).__name__}, not an nn.Module")
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
                    f"{who}: layer {i} differs from layer 0 in its {name}: {_short(a)} vs "
                    f"{_short(b)}; {who.split('.')[-1]} needs layers of identical structure")
    return [n for n, *_ in first[2]], [n for n, *_ in first[3]]


def _short(value):
    text = value.__name__ if isinstance(value, type) else repr(value)
    return text if len(text) < 300 else text[:300] + "..."


class _Plan:
    """What the traced bodies need to know about the layers (not a tensor: autograd skips it)."""

    def __init__(self, template, param_names, buffer_names, length, extra, tensor_at, who):
        self.template = template
        self.param_names = param_names
        self.buffer_names = buffer_names
        self.length = length
        self.extra = extra
        self.tensor_at = tensor_at
        self.who = who  # the public name that errors cite

    def call(self, h, params, buffers, extra_tensors):
        state = dict(zip(self.param_names, params))
        state.update(zip(self.buffer_names, buffers))
        extra = list(self.extra)
        for i, t in zip(self.tensor_at, extra_tensors):
            extra[i] = t
        out = functional_call(self.template, state, (h, *extra))
        if not isinstance(out, torch.Tensor) or out.shape != h.shape or out.dtype != h.dtype:
            raise ValueError(
                f"{self.who}: each layer must return one tensor of its input's shape and dtype "
                f"({tuple(h.shape)}, {h.dtype}); got {_describe(out)}")
        return out


    def probe(self, x, stacked, stacked_buffers, extra_tensors):
        """Runs layer 0 eagerly (outside any trace) after its trace failed, so that an error
        of the layer's own (a wrong input shape, which on tpu falls back to the host inside
        the trace) surfaces as the plain loop would raise it; returns if the layer runs."""
        with torch.no_grad():
            self.call(x, [p[0] for p in stacked], [b[0] for b in stacked_buffers], extra_tensors)


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
        stacked = list(inputs[n_extra:n_extra + n_params])
        stacked_buffers = list(inputs[n_extra + n_params:])
        device = x.device.index

        def forward_body():
            h, = _placeholders([x], device)
            params = _placeholders(stacked, device, rows=True)
            buffers = _placeholders(stacked_buffers, device, rows=True)
            consts = _placeholders(extra, device)
            # The layer's input is a y row: the backward loop recomputes from it.
            return [plan.call(h, params, buffers, consts), h]

        try:
            body = _trace(forward_body)
        except ValueError:
            plan.probe(x, stacked, stacked_buffers, extra)
            raise
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
            grad_stacked[p] = g
        return (None, grad_x, *grad_extra, *grad_stacked, *([None] * len(stacked_buffers)))
