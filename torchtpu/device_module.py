"""torch.tpu: the device module PyTorch looks up for the "tpu" device."""
import torch

from torchtpu import _C


def is_available() -> bool:
    return _C.initialized() and _C.device_count() > 0


def is_initialized() -> bool:
    return _C.initialized()


def _lazy_init() -> None:
    pass


def _is_in_bad_fork() -> bool:
    return False


def device_count() -> int:
    return _C.device_count()


def current_device() -> int:
    return _C.current_device()


def _index(device) -> int:
    if device is None:
        return _C.current_device()
    if isinstance(device, int):
        return device
    device = torch.device(device)
    if device.type != "tpu":
        raise ValueError(f"expected a tpu device, got {device}")
    return _C.current_device() if device.index is None else device.index


def set_device(device) -> None:
    _C.set_device(_index(device))


class device:
    """Context manager that makes the given tpu device current."""

    def __init__(self, device):
        self.index = _index(device)
        self.previous = None

    def __enter__(self):
        self.previous = _C.current_device()
        _C.set_device(self.index)

    def __exit__(self, *exc):
        _C.set_device(self.previous)
        return False


def synchronize(device=None) -> None:
    """Runs all pending work and waits until the device has finished it."""
    _C.sync(True)


def manual_seed(seed: int) -> None:
    _C.manual_seed(_C.current_device(), int(seed) & 0xFFFFFFFFFFFFFFFF)


def manual_seed_all(seed: int) -> None:
    for index in range(_C.device_count()):
        _C.manual_seed(index, int(seed) & 0xFFFFFFFFFFFFFFFF)


def seed() -> None:
    _C.default_generator(_C.current_device()).seed()


def seed_all() -> None:
    for index in range(_C.device_count()):
        _C.default_generator(index).seed()


def initial_seed() -> int:
    return _C.initial_seed(_C.current_device())


def get_rng_state(device=None) -> torch.Tensor:
    return _C.default_generator(_index(device)).get_state()


def set_rng_state(state: torch.Tensor, device=None) -> None:
    _C.default_generator(_index(device)).set_state(state)


def memory_allocated(device=None) -> int:
    """Bytes held by live tpu tensors on the device."""
    return _C.memory_allocated(_index(device))


def max_memory_allocated(device=None) -> int:
    return _C.max_memory_allocated(_index(device))


def reset_peak_memory_stats(device=None) -> None:
    _C.reset_peak_memory(_index(device))


def get_amp_supported_dtype():
    return [torch.bfloat16, torch.float16]


def _is_autocast_enabled() -> bool:
    return torch.is_autocast_enabled("tpu")
