"""All local devices from one process: tensors sharded over a mesh, XLA's SPMD partitioner.

A sharded tensor is an ordinary tpu tensor whose value is one global array laid out over the
devices of a mesh; every op on it records into the same graph as any tpu op, and a flush of
sharded values compiles ONE partitioned executable in which XLA inserts the collectives.

    mesh = torchtpu.spmd.Mesh((4, 2), ("data", "model"))
    x = torchtpu.spmd.shard(x, mesh, ("data", None))   # rows over "data", copies over "model"
    torchtpu.spmd.fully_shard(model, mesh)             # parameters FSDP-style, the batch data-parallel

A sharded tensor reports the mesh's first device (tpu:0 for the default mesh) and its global
shape; printing it or `.cpu()` gives the global value. An op mixing a sharded tensor with an
unsharded one on that device replicates the unsharded one onto the mesh (as XLA does); tensors
of two meshes over different devices in one op raise ValueError.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Sequence

import torch

from torchtpu import _C

__all__ = ["Mesh", "Sharding", "shard", "sharding", "shards", "mesh_devices", "fully_shard"]


class Mesh:
    """A logical arrangement of local tpu devices: `shape` with one name per axis.

    `devices` lists the tpu indices in row-major mesh order (default: 0 .. size-1).
    """

    def __init__(self, shape: Sequence[int] | int, axis_names: Sequence[str] | str, devices: Iterable[int] | None = None):
        if _C.pjrt_selected():  # its executables run on one device each: no SPMD partitioner behind them
            raise RuntimeError("torchtpu.spmd needs the jaxlib runtime (TORCHTPU_RUNTIME=jaxlib, the default); the "
                               "pjrt runtime (TORCHTPU_RUNTIME=pjrt) runs each executable on one device")
        shape = (shape,) if isinstance(shape, int) else tuple(int(s) for s in shape)
        axis_names = (axis_names,) if isinstance(axis_names, str) else tuple(axis_names)
        if len(shape) != len(axis_names):
            raise ValueError(f"torchtpu.spmd.Mesh: shape {shape} has {len(shape)} axes but {len(axis_names)} "
                             f"names {axis_names} were given")
        if len(set(axis_names)) != len(axis_names) or not all(isinstance(n, str) and n for n in axis_names):
            raise ValueError(f"torchtpu.spmd.Mesh: axis names {axis_names} must be distinct non-empty strings")
        if any(s < 1 for s in shape):
            raise ValueError(f"torchtpu.spmd.Mesh: shape {shape} has an axis smaller than 1")
        size = math.prod(shape)
        available = torch.tpu.device_count()
        if devices is None:
            if size > available:
                raise ValueError(
                    f"torchtpu.spmd.Mesh{shape} {axis_names} needs {size} devices but torchtpu sees {available} "
                    f"on platform {_C.platform()}" + (f"; on the CPU platform set TORCHTPU_NUM_DEVICES={size} "
                                                      "before importing torch" if _C.platform() == "cpu" else ""))
            devices = range(size)
        devices = [int(d) for d in devices]
        if len(devices) != size:
            raise ValueError(f"torchtpu.spmd.Mesh{shape}: {len(devices)} devices given for {size} mesh positions")
        if len(set(devices)) != size:
            raise ValueError(f"torchtpu.spmd.Mesh{shape}: devices {devices} repeat a device")
        for d in devices:
            if not 0 <= d < available:
                raise ValueError(f"torchtpu.spmd.Mesh{shape}: there is no tpu:{d} (torchtpu sees {available} devices)")
        self.shape = shape
        self.axis_names = axis_names
        self.devices = devices
        self._c = _C._Mesh(devices, list(shape), list(axis_names))

    @property
    def size(self) -> int:
        return len(self.devices)

    def axis_size(self, name: str) -> int:
        return self.shape[self._axis(name)]

    def _axis(self, name: str) -> int:
        if name not in self.axis_names:
            raise ValueError(f"torchtpu.spmd: {self!r} has no axis {name!r} (its axes: {self.axis_names})")
        return self.axis_names.index(name)

    def __repr__(self) -> str:
        return self._c.describe()

    def __eq__(self, other) -> bool:
        return isinstance(other, Mesh) and (self.shape, self.axis_names, self.devices) == (
            other.shape, other.axis_names, other.devices)

    def __hash__(self) -> int:
        return hash((self.shape, self.axis_names, tuple(self.devices)))


@dataclass(frozen=True)
class Sharding:
    """How a tensor's value is laid out, as XLA holds it: dimension d cut into tiles[d] pieces,
    each held by `replicas` devices; `tile_assignment` the mesh position of each (tile..., copy)
    in row-major order; `hlo` XLA's text of it."""
    devices: tuple
    tiles: tuple
    replicas: int
    tile_assignment: tuple
    hlo: str


def _describe(tensor: torch.Tensor, name: str | None) -> str:
    what = f"tensor '{name}'" if name else "tensor"
    return f"{what} of shape {list(tensor.shape)} ({str(tensor.dtype).replace('torch.', '')})"


def _layout(mesh: Mesh, spec: Sequence, shape: Sequence[int], what: str):
    """tiles, replicas and tile assignment of a PartitionSpec-like `spec` (one entry per
    dimension: None, an axis name or a tuple of axis names; missing trailing entries are None)."""
    spec = tuple(spec)
    if len(spec) > len(shape):
        raise ValueError(f"torchtpu.spmd.shard: spec {spec} has {len(spec)} entries for the {len(shape)} "
                         f"dimensions of the {what}")
    spec = spec + (None,) * (len(shape) - len(spec))
    used: list[int] = []
    tiles = []
    for dim, entry in enumerate(spec):
        names = () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)
        pieces = 1
        for name in names:
            axis = mesh._axis(name)
            if axis in used:
                raise ValueError(f"torchtpu.spmd.shard: spec {spec} uses mesh axis {name!r} twice")
            used.append(axis)
            pieces *= mesh.shape[axis]
        if shape[dim] % pieces:
            raise ValueError(f"torchtpu.spmd.shard: dimension {dim} of the {what} has size {shape[dim]}, which "
                             f"{mesh!r} cannot cut into {pieces} equal pieces (spec {spec}); choose a spec "
                             f"whose axes divide it, or None to keep the dimension whole")
        tiles.append(pieces)
    rest = [a for a in range(len(mesh.shape)) if a not in used]
    positions = torch.arange(mesh.size).reshape(mesh.shape).permute(*used, *rest)
    replicas = math.prod(mesh.shape[a] for a in rest)
    return tiles, replicas, positions.flatten().tolist()


class _Shard(torch.autograd.Function):
    """shard() of a tensor autograd tracks: the gradient flows back unchanged (its layout is
    XLA's choice, as for any intermediate)."""

    @staticmethod
    def forward(ctx, tensor, mesh_c, tiles, replicas, assignment):
        return _C.spmd_shard(tensor, mesh_c, tiles, replicas, assignment)

    @staticmethod
    def backward(ctx, grad):
        return grad, None, None, None, None


def shard(tensor: torch.Tensor, mesh: Mesh, spec: Sequence = (), *, name: str | None = None) -> torch.Tensor:
    """`tensor`'s contents laid out over `mesh`: spec entry d names the mesh axis (or tuple of
    axes) dimension d is cut along, None keeps it whole; axes no entry names hold copies.
    `shard(t, mesh)` replicates. Returns a new tensor (on the mesh's first device, with t's
    global shape); a CPU tensor is uploaded shard by shard. Of a leaf, the result is a leaf
    that requires grad as t does; of an intermediate, it is differentiable (a sharding
    constraint on an activation). `name` only names the tensor in errors."""
    if not isinstance(mesh, Mesh):
        raise TypeError(f"torchtpu.spmd.shard expects a torchtpu.spmd.Mesh, got {type(mesh).__name__}")
    tiles, replicas, assignment = _layout(mesh, spec, tensor.shape, _describe(tensor, name))
    if tensor.requires_grad and not tensor.is_leaf:
        return _Shard.apply(tensor, mesh._c, tiles, replicas, assignment)
    with torch.no_grad():
        out = _C.spmd_shard(tensor, mesh._c, tiles, replicas, assignment)
    return out.requires_grad_(tensor.requires_grad)


def sharding(tensor: torch.Tensor) -> Sharding | None:
    """The layout XLA gave `tensor` (computing it), or None for a tensor of one device."""
    d = _C.spmd_sharding(tensor)
    if d is None:
        return None
    return Sharding(tuple(d["devices"]), tuple(d["tiles"]), d["replicas"], tuple(d["tile_assignment"]), d["hlo"])


def shards(tensor: torch.Tensor) -> list[torch.Tensor]:
    """Each device's piece of `tensor`, as a tpu tensor on that device, in mesh order (the
    tensor itself when it lives on one device)."""
    return _C.spmd_shards(tensor)


def mesh_devices(tensor: torch.Tensor) -> list[int] | None:
    """The devices of the mesh `tensor` lives on, without computing anything; None for one device."""
    return _C.spmd_mesh_devices(tensor) if tensor.device.type == "tpu" else None


def _fsdp_spec(param: torch.Tensor, pieces: int, axes: tuple) -> tuple:
    """Cut the first dimension that divides into `pieces`; keep small or indivisible ones whole."""
    for dim, size in enumerate(param.shape):
        if size % pieces == 0:
            return (None,) * dim + (axes,)
    return ()


def _replace(tensor: torch.Tensor, sharded: torch.Tensor) -> None:
    """Gives `tensor` (a parameter or buffer, which modules and optimizers hold by identity)
    the sharded contents. A CPU model is uploaded shard by shard, never whole to one device."""
    if tensor.device.type == "tpu":
        tensor.data = sharded
    else:  # .data cannot change a CPU tensor into a tpu one; swapping keeps the Python object
        replacement = torch.nn.Parameter(sharded, tensor.requires_grad) if isinstance(tensor, torch.nn.Parameter) \
            else sharded
        torch.utils.swap_tensors(tensor, replacement)


def fully_shard(model: torch.nn.Module, mesh: Mesh, axes: Sequence[str] | None = None) -> torch.nn.Module:
    """Shards `model` FSDP-style over `mesh` and its batch data-parallel; returns the model.

    Each parameter is cut along its first dimension that divides by the product of `axes`
    (default: every mesh axis) and stays whole (replicated) if none does; buffers are
    replicated. The model may be on CPU (each device then receives only its shards) or on the
    mesh's first device. Parameters keep their identity, so optimizers made before still work.
    A forward pre-hook cuts every tpu tensor argument along dim 0 (the batch) the same way;
    XLA then gathers parameters and reduces gradients inside the step's one executable.
    """
    axes = tuple(mesh.axis_names if axes is None else ((axes,) if isinstance(axes, str) else axes))
    pieces = math.prod(mesh.axis_size(a) for a in axes)
    with torch.no_grad():
        for name, param in model.named_parameters():
            _replace(param, shard(param.detach(), mesh, _fsdp_spec(param, pieces, axes), name=name))
        for name, buffer in model.named_buffers():
            _replace(buffer, shard(buffer, mesh, (), name=name))

    def shard_batch(value):
        if (isinstance(value, torch.Tensor) and value.device.type == "tpu" and value.dim() > 0
                and value.shape[0] % pieces == 0 and mesh_devices(value) is None):
            return shard(value, mesh, (axes,))
        return value

    @torch.compiler.disable  # runs before a compiled forward, as the eager step would
    def pre_hook(module, args, kwargs):
        return tuple(shard_batch(a) for a in args), {k: shard_batch(v) for k, v in kwargs.items()}

    model.register_forward_pre_hook(pre_hook, with_kwargs=True)
    return model
