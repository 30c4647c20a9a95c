"""What PJRT knows about a device (its kind, its allocator's numbers), for torch.tpu.

Stopgap: the project's rule is that only csrc/runtime talks to jaxlib; these two reads belong
in the Runtime interface (device_kind, memory_stats) and move there when csrc/ is free.
They read the same client the runtime uses (xla_bridge.get_backend(platform)).
"""
import os

from torchtpu import _C


def _pjrt_device(index: int):
    from jax._src import xla_bridge

    return xla_bridge.get_backend(_C.platform()).local_devices()[index]


def device_kind(index: int) -> str:
    """"TPU v5 lite", "NVIDIA H200", or "cpu"."""
    return str(_pjrt_device(index).device_kind)


def allocator_stats(index: int) -> dict:
    """PJRT's allocator numbers (bytes_in_use, bytes_limit, pool_bytes, ...); {} where the
    platform keeps none (the CPU client allocates each buffer from the host heap)."""
    stats = _pjrt_device(index).memory_stats()
    return dict(stats) if stats else {}


def host_memory() -> tuple[int, int]:
    """(available, total) bytes of host memory: the device memory of the CPU platform."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    available = None
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    available = int(line.split()[1]) * 1024
                    break
    except OSError:
        pass
    if available is None:
        available = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
    return available, total
