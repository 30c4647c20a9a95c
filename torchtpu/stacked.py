"""StackedLayers: identical layers whose parameters are stored stacked (one tensor per name).

The module holds ONE Parameter per layer-parameter name, with a leading depth dimension, and
runs the layers as scan_layers' loop directly on those tensors: no per-step stack or unbind,
and an optimizer sees as many parameters as one layer has, so a whole training step
(forward, backward, optimizer) has a number of ops that does not grow with depth.
"""
from __future__ import annotations

import copy

import torch
from torch import nn
from torch.func import functional_call

from torchtpu.scan import check_input, check_structure, scan_stacked

__all__ = ["StackedLayers"]

_WHO = "torchtpu.StackedLayers"


class StackedLayers(nn.Module):
    """A stack of identical layers with stacked parameters: ``StackedLayers(layers)`` from an
    ``nn.ModuleList`` (or any sequence) of modules of one structure, or
    ``StackedLayers(factory, depth)`` from a function that makes one layer.

    ``forward(x, *extra)`` computes ``for layer in layers: x = layer(x, *extra)``; on the tpu
    device as one loop (``stablehlo.while``, forward and backward, see ``scan_layers``), off
    tpu and under torch.compile as a plain loop over rows of the stacked tensors.

    The layers' values are copied: parameter ``name`` of layer ``i`` is row ``i`` of
    ``self.layer.<name>`` (shape ``(depth, *shape)``); buffers likewise. ``self.layer`` is the
    layers' structure (a copy of layer 0 holding the stacked tensors); do not call it
    directly. ``state_dict`` keys are ``layer.<name>``; ``load_state_dict`` also accepts the
    per-layer layout of an ``nn.ModuleList`` (``0.<name>`` ... ``depth-1.<name>``), and
    ``unstack()`` returns an ``nn.ModuleList`` of separate copies (to export a plain model).

    A parameter shared between layers cannot be stored stacked (ValueError). Note for
    optimizer groups keyed on ``p.ndim``: a stacked parameter has one more dimension than a
    layer's (a layer norm's weight is 2-D here).
    """

    def __init__(self, layers, depth: int | None = None):
        super().__init__()
        if depth is not None:
            if not callable(layers) or isinstance(layers, nn.Module):
                raise TypeError(f"{_WHO}(factory, depth): factory must be a function that returns a layer, "
                                f"got {type(layers).__name__}")
            if not isinstance(depth, int) or depth < 1:
                raise ValueError(f"{_WHO}: depth must be a positive int, got {depth!r}")
            layers = [layers() for _ in range(depth)]
        one_module = isinstance(layers, nn.Module) and not isinstance(layers, (nn.ModuleList, nn.Sequential))
        if one_module or not hasattr(layers, "__iter__"):
            raise TypeError(f"{_WHO} takes a sequence of layers (an nn.ModuleList, say) or (factory, depth); "
                            f"got {type(layers).__name__}")
        layers = list(layers)
        if not layers:
            raise ValueError(f"{_WHO}: needs at least one layer")
        self._param_names, self._buffer_names = check_structure(layers, _WHO)
        _check_not_shared(layers)
        self.depth = len(layers)
        # The template is a copy of layer 0 whose tensors are the stacked ones (the deepcopy
        # memo puts each stacked tensor where layer 0's own was, ties within a layer kept).
        memo = {}
        for name, p in layers[0].named_parameters():
            rows = [dict(layer.named_parameters())[name] for layer in layers]
            memo[id(p)] = nn.Parameter(torch.stack([r.detach() for r in rows]), requires_grad=p.requires_grad)
        for name, b in layers[0].named_buffers():
            memo[id(b)] = torch.stack([dict(layer.named_buffers())[name] for layer in layers])
        self.layer = copy.deepcopy(layers[0], memo)

    def extra_repr(self) -> str:
        return f"depth={self.depth}"

    def __len__(self) -> int:
        return self.depth

    def _stacked(self):
        params, buffers = dict(self.layer.named_parameters()), dict(self.layer.named_buffers())
        return [params[n] for n in self._param_names], [buffers[n] for n in self._buffer_names]

    def forward(self, x: torch.Tensor, *extra):
        check_input(x, _WHO)
        stacked, stacked_buffers = self._stacked()
        if torch.compiler.is_compiling() or x.device.type != "tpu":
            return self._loop(x, extra, stacked, stacked_buffers)
        return scan_stacked(self.layer, self._param_names, self._buffer_names, self.depth, x, extra, stacked,
                            stacked_buffers, who=_WHO)

    def _loop(self, x, extra, stacked, stacked_buffers):
        """The plain loop: layer i is the template called on row i of every stacked tensor."""
        names = self._param_names + self._buffer_names
        rows = [t.unbind(0) for t in stacked + stacked_buffers]  # one backward (a stack), not one per row
        for i in range(self.depth):
            state = {n: r[i] for n, r in zip(names, rows)}
            x = functional_call(self.layer, state, (x, *extra))
        return x

    def unstack(self) -> nn.ModuleList:
        """The layers as an ``nn.ModuleList`` of separate modules (copies of the rows, on the
        same device; parameters keep ``requires_grad``), e.g. to save a per-layer model."""
        stacked, stacked_buffers = self._stacked()
        layers = []
        for i in range(self.depth):
            memo = {id(p): nn.Parameter(p.detach()[i].clone(), requires_grad=p.requires_grad) for p in stacked}
            memo.update({id(b): b[i].clone() for b in stacked_buffers})
            layers.append(copy.deepcopy(self.layer, memo))
        return nn.ModuleList(layers)

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        # A per-layer checkpoint (ModuleList keys "<i>.<name>") is stacked into "layer.<name>"
        # when every layer's row is there; anything else is left for the usual key checks.
        for name in self.layer.state_dict(keep_vars=True):
            rows = [f"{prefix}{i}.{name}" for i in range(self.depth)]
            if f"{prefix}layer.{name}" not in state_dict and all(r in state_dict for r in rows):
                state_dict[f"{prefix}layer.{name}"] = torch.stack([state_dict.pop(r) for r in rows])
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)


def _check_not_shared(layers):
    owner = {}
    for i, layer in enumerate(layers):
        for name, t in [*layer.named_parameters(), *layer.named_buffers()]:
            j = owner.setdefault(id(t), i)
            if j != i:
                raise ValueError(f"{_WHO}: layer {i} shares its {name!r} with layer {j}; stacked layers hold one "
                                 "copy per layer, so layers may not share parameters or buffers")
