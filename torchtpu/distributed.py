"""torch.distributed on tpu: the "tpu" process-group backend.

    # torchrun --nproc_per_node=N train.py       (one process per device)
    dist.init_process_group()                   # picks "tpu" for tpu tensors
    model = DDP(model.to("tpu"))

Each process drives one device, tpu:LOCAL_RANK. Creating the first tpu process group joins
jax's distributed runtime (the coordinator's port is chosen by rank 0 and shared through
the c10d store), so the runtime's client sees every process's device; collectives are
StableHLO collectives over those devices (csrc/distributed, csrc/lowering/collective.cpp),
carried by gloo on CPU, NCCL on GPU and the ICI on TPU.
"""
import atexit
import datetime
import functools
import os
import socket

import torch
import torch.distributed as dist

from torchtpu import _C, _patches

_COORDINATOR_KEY = "torchtpu/coordinator"
_ARRIVED_KEY = "torchtpu/arrived"
# jax's own default: a process that has sent no heartbeat for this long is declared dead.
_HEARTBEAT_TIMEOUT_S = 100


def _seconds(timeout) -> float:
    if isinstance(timeout, datetime.timedelta):
        return timeout.total_seconds()
    return float(timeout)


def _coordinator_host() -> str:
    # MASTER_ADDR is rank 0's host as every rank reaches it (torchrun sets it).
    return os.environ.get("MASTER_ADDR") or socket.gethostname()


def _free_port(host: str) -> int:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def _joined() -> bool:
    return _C.distributed_joined() or _C.pjrt_distributed_joined()


def _join_job(store, rank: int, world_size: int, timeout_s: float) -> None:
    """Joins jax's distributed runtime (once per process, from the world group); under the
    PJRT runtime (cuda/tpu) the plugin's client exchanges its ids through the job's store."""
    if world_size == 1 or _joined():
        return
    if _C.pjrt_selected():
        if not _C.join_distributed_pjrt(store, rank, world_size):
            raise RuntimeError(
                "torchtpu: tpu tensors were used before torch.distributed.init_process_group(), so this process's "
                "tpu runtime cannot join the job any more. Call init_process_group() before creating tpu tensors "
                "or models (under torchrun, each process then drives tpu:LOCAL_RANK).")
        atexit.register(_run_pending_collectives)
        return
    store.set(f"{_ARRIVED_KEY}/{rank}", "1")
    if rank == 0:
        host = _coordinator_host()
        store.set(_COORDINATOR_KEY, f"{host}:{_free_port(host)}")
    try:
        address = store.get(_COORDINATOR_KEY).decode()
    except RuntimeError as error:  # the store's timeout: rank 0 never got here
        raise RuntimeError(f"torchtpu: rank 0 did not reach init_process_group() within {timeout_s:.0f} s "
                           f"(rank {rank} waited for it): {error}") from None
    init_timeout = max(1, int(timeout_s))
    heartbeat = max(1, min(init_timeout, _HEARTBEAT_TIMEOUT_S))
    try:
        joined = _C.join_distributed(address, world_size, rank, init_timeout, heartbeat)
    except RuntimeError as error:
        absent = _absent_ranks(store, world_size)
        if absent:
            raise RuntimeError(f"torchtpu: rank(s) {', '.join(map(str, absent))} did not reach "
                               f"init_process_group() within {timeout_s:.0f} s. {error}") from None
        raise
    if joined:
        atexit.register(_run_pending_collectives)
    if not joined:
        raise RuntimeError(
            "torchtpu: tpu tensors were used before torch.distributed.init_process_group(), so this process's "
            "tpu runtime cannot join the job any more. Call init_process_group() before creating tpu tensors "
            "or models (under torchrun, each process then drives tpu:LOCAL_RANK).")


def _run_pending_collectives() -> None:
    """At exit: collectives this rank issued but never needed the results of still run (the
    other ranks wait for them), for scripts that end without destroy_process_group(); and
    their Works leave c10d's registry (else PyTorch warns of unwaited collective calls)."""
    try:
        _C.sync(True)
    except RuntimeError:
        pass  # a peer is gone: the ranks that still wait report it
    _C.release_collective_works()


def _absent_ranks(store, world_size: int) -> list:
    """Ranks that never reached init_process_group(); none when the store is gone too (rank 0,
    which serves it, may have given up first): the join's own error then says what to check."""
    try:
        return [r for r in range(world_size) if not store.check([f"{_ARRIVED_KEY}/{r}"])]
    except RuntimeError:
        return []


def _create_backend(options, backend_options=None):
    """Backend creator for torch.distributed (extended API): one per process group."""
    ranks = list(options.global_ranks_in_group)
    size = options.group_size
    timeout_s = _seconds(options.timeout)
    if not ranks:  # the default (world) group
        ranks = list(range(size))
        _join_job(options.store, options.group_rank, size, timeout_s)
    elif size > 1 and not _joined():
        raise RuntimeError(
            "torchtpu: the first process group using the tpu backend must span every rank; create the default "
            "group with it (init_process_group() or backend=\"cpu:gloo,tpu:tpu\") before subgroups")
    _support_fsdp2()
    return _C.create_backend(options.store, options.group_rank, size, ranks, timeout_s)


@functools.cache
def _support_fsdp2() -> None:
    """What FSDP2 (fully_shard) asks of a device beyond collectives, for tpu tensors, whose
    storages are functionalization's (no host address). Installed with the first tpu group."""
    for name in ("fsdp2 storage identity", "fsdp2 free unsharded parameters", "fsdp2 copy-out kernels"):
        _patches.apply(name)


@_patches.patch("fsdp2 storage identity", when="tpu process group", targets=("torch.storage.UntypedStorage.data_ptr",))
def _patch_storage_identity():
    # FSDP2 compares storages by data_ptr() to see whether a parameter still lives in its
    # padded shard. A tpu storage has no address; its identity stands in (0 when empty, as
    # for an empty CPU storage), so tensors sharing a storage compare equal, as on CUDA.
    data_ptr = _patches.checked("fsdp2 storage identity", torch.UntypedStorage, "data_ptr")

    @functools.wraps(data_ptr)
    def tpu_data_ptr(self):
        if self.device.type == "tpu":
            return self._cdata if self.nbytes() else 0
        return data_ptr(self)

    _patches._replace(torch.UntypedStorage, "data_ptr", tpu_data_ptr)


@_patches.patch("fsdp2 free unsharded parameters", when="tpu process group",
                targets=("torch.distributed.fsdp._fully_shard._fsdp_param.FSDPParam.free_unsharded_param",))
def _patch_free_unsharded():
    # Resharding frees the unsharded parameters' storages (free_storage: resize_(0), which
    # frees a tpu storage's device data, csrc/device/storage.cpp). The unsharded parameter
    # FSDP2 keeps between uses is a view of that storage that holds its own computed copy
    # (functionalization's view_copy) until its next use; that copy is dropped too, so nothing
    # holds unsharded data between the all-gathers.
    from torch.distributed.fsdp._fully_shard._fsdp_param import FSDPParam

    # It must still free storages; torch 2.15 reads all_gather_outputs through
    # free_all_gather_outputs(), which the wrapper's own read of the attribute does not need.
    free_unsharded = _patches.checked("fsdp2 free unsharded parameters", FSDPParam, "free_unsharded_param",
                                      params=["self"], reads=["free_storage"])

    @functools.wraps(free_unsharded)
    def free_unsharded_param(self):
        free_unsharded(self)
        param = getattr(self, "_unsharded_param", None)
        for tensor in (getattr(param, "_local_tensor", param), *self.all_gather_outputs):
            if tensor is not None:
                _C.release_freed_alias(tensor)

    _patches._replace(FSDPParam, "free_unsharded_param", free_unsharded_param)


_FSDP_COPY_OUT_OPS = ("fsdp::split_with_sizes_copy", "fsdp::chunk_cat")
# torch 2.15 moved the reduce-scatter copy-in to this op (a group's gradients may mix dtypes).
_FSDP_MIXED_COPY_IN = "fsdp::chunk_cat_mixed_dtype"


@_patches.patch("fsdp2 copy-out kernels", when="tpu process group", kind="Functionalize kernel, added",
                targets=(*_FSDP_COPY_OUT_OPS, f"{_FSDP_MIXED_COPY_IN} from torch 2.15"))
def _patch_fsdp_copy_out():
    # FSDP2's copy-out ops write into their `out` tensors; tpu tensors are functionalized, so
    # these ops get what functionalization needs: the same work in ATen ops, which it handles.
    from torch.distributed.fsdp._fully_shard import _fsdp_collectives  # noqa: F401  (defines the ops)

    mixed = hasattr(torch.ops.fsdp, _FSDP_MIXED_COPY_IN.split("::")[1])
    if mixed != (torch.__version__ >= "2.15"):
        raise _patches.PatchError(f"torchtpu patch 'fsdp2 copy-out kernels': {_FSDP_MIXED_COPY_IN} "
                                  f"{'exists' if mixed else 'does not exist'} in torch {torch.__version__}; "
                                  "update this patch (torchtpu/distributed.py)")
    for op in _FSDP_COPY_OUT_OPS + ((_FSDP_MIXED_COPY_IN,) if mixed else ()):
        namespace, name = op.split("::")
        if not hasattr(getattr(torch.ops, namespace), name):
            raise _patches.PatchError(f"torchtpu patch 'fsdp2 copy-out kernels': {op} does not exist in torch "
                                      f"{torch.__version__}; update this patch (torchtpu/distributed.py)")
        if torch._C._dispatch_has_kernel_for_dispatch_key(op, "Functionalize"):
            raise _patches.PatchError(f"torchtpu patch 'fsdp2 copy-out kernels': {op} has a Functionalize kernel "
                                      f"of PyTorch's already in torch {torch.__version__}; update this patch "
                                      "(torchtpu/distributed.py)")
    library = _patches._library("fsdp")
    library.impl("split_with_sizes_copy", _split_with_sizes_copy, "Functionalize")
    library.impl("chunk_cat", _chunk_cat, "Functionalize")
    if mixed:
        library.impl("chunk_cat_mixed_dtype", _chunk_cat_mixed_dtype, "Functionalize")


def _split_with_sizes_copy(all_gather_output, all_gather_input_split_sizes, dim=0, *, out):
    torch.split_with_sizes_copy(all_gather_output, all_gather_input_split_sizes, dim=dim, out=out)


def _chunk_cat(tensors, dim, num_chunks, *, out):
    torch._chunk_cat(tensors, dim, num_chunks, out=out)


def _chunk_cat_mixed_dtype(tensors, dim, num_chunks, *, out):
    # Each gradient cast to the reduce-scatter input's dtype first, as PyTorch's own kernel
    # does for mixes it has no fused copy for.
    torch._chunk_cat([t.to(out.dtype) for t in tensors], dim, num_chunks, out=out)


def _has_tpu_backend(group) -> bool:
    try:
        return group._get_backend(torch.device("tpu")).name() == "tpu"
    except (RuntimeError, AttributeError):
        return False


@_patches.patch("process group default backend",
                targets=("torch.distributed.distributed_c10d._new_process_group_helper",))
def _patch_default_backend():
    # PyTorch makes a group's default backend gloo when init_process_group() picks a
    # third-party device's backend (only NCCL is recognised), and leaves it unset for
    # "cpu:gloo,tpu:tpu"; DDP then fails looking for it ("Could not find backend type 1").
    # A group with the tpu backend gets it as its default, as a CUDA group gets NCCL.
    if not dist.is_available():
        return
    from torch.distributed import distributed_c10d as c10d

    name = "process group default backend"
    original = _patches.checked(name, c10d, "_new_process_group_helper", params=["group_size", "group_rank"])
    _patches.checked(name, dist.ProcessGroup, "_set_default_backend")
    if not hasattr(dist.ProcessGroup.BackendType, "CUSTOM"):
        raise _patches.PatchError(f"torchtpu patch '{name}': torch.distributed.ProcessGroup.BackendType has no "
                                  f"CUSTOM in torch {torch.__version__}; update this patch (torchtpu/distributed.py)")

    @functools.wraps(original)
    def _new_process_group_helper(*args, **kwargs):
        group, store = original(*args, **kwargs)
        if isinstance(group, dist.ProcessGroup) and _has_tpu_backend(group):
            group._set_default_backend(dist.ProcessGroup.BackendType.CUSTOM)
        return group, store

    _patches._replace(c10d, "_new_process_group_helper", _new_process_group_helper)


def install() -> None:
    """Registers the "tpu" backend, the default for tpu tensors (init_process_group())."""
    if not dist.is_available() or "tpu" in dist.Backend.backend_list:
        return
    # transformers names the "tpu" device's backend "tpu_dist" (torch_tpu's name) when it starts
    # torch.distributed itself (from_pretrained with a tp_plan or distributed_config): the same
    # backend under that name. Registered first, so that "tpu" stays the device's default.
    if "tpu_dist" not in dist.Backend.backend_list:
        dist.Backend.register_backend("tpu_dist", _create_backend, extended_api=True, devices=["tpu"])
    dist.Backend.register_backend("tpu", _create_backend, extended_api=True, devices=["tpu"])
    _patches.apply("process group default backend")  # installed with the other patches already
    # Each collective first checks that every rank issued the same one (a mismatch would
    # otherwise corrupt memory or hang in the transport). Must be the same on every rank.
    _C.set_collective_checks(os.environ.get("TORCHTPU_COLLECTIVE_CHECKS", "1").strip() not in ("0", "false", "off"))
