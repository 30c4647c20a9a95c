"""torch.tpu: the device module PyTorch, torch.accelerator and libraries look up for "tpu".

It offers what code written for torch.cuda reaches for. Streams and events are logical: XLA
runs the work of one device in the order it was issued, so every stream of a device is one
queue; waiting between streams is always satisfied, and synchronizing waits for the device.
Only the names below are public (tests/test_device_module.py lists them).
"""
import torch as _torch

from torchtpu import _C

__all__ = [
    "Event", "Stream", "StreamContext", "current_device", "current_stream", "default_stream", "device",
    "device_count", "empty_cache", "get_amp_supported_dtype", "get_device_name", "get_device_properties",
    "get_rng_state", "get_rng_state_all", "initial_seed", "is_available", "is_bf16_supported",
    "is_initialized", "manual_seed", "manual_seed_all", "max_memory_allocated", "max_memory_reserved",
    "mem_get_info", "memory_allocated", "memory_reserved", "memory_stats", "reset_max_memory_allocated",
    "reset_peak_memory_stats", "seed", "seed_all", "set_device", "set_rng_state", "set_rng_state_all",
    "set_per_process_memory_fraction", "set_stream", "stream", "synchronize",
]

_PRIVATEUSE1 = 20  # c10::DeviceType::PrivateUse1, the type torch.Stream/torch.Event carry for "tpu"


def is_available() -> bool:
    try:
        return _C.device_count() > 0
    except RuntimeError:
        return False


def is_initialized() -> bool:
    return _C.initialized()


def _lazy_init() -> None:
    """PyTorch calls this before it creates a tensor on the device: the runtime started at
    import, so only a forked child (whose client lost its threads) has anything to say."""
    _C.check_not_forked()


def _is_in_bad_fork() -> bool:
    return _C.in_bad_fork()


def device_count() -> int:
    return _C.device_count()


def current_device() -> int:
    return _C.current_device()


def _index(device) -> int:
    if device is None:
        return _C.current_device()
    if isinstance(device, int):
        return device
    if isinstance(device, (Stream, Event)):
        return device.device_index
    device = _torch.device(device)
    if device.type != "tpu":
        raise ValueError(f"Expected a tpu device, but got: {device}")
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


# ---- random numbers ---------------------------------------------------------------------

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


def get_rng_state(device=None) -> _torch.Tensor:
    return _C.default_generator(_index(device)).get_state()


def set_rng_state(state: _torch.Tensor, device=None) -> None:
    _C.default_generator(_index(device)).set_state(state)


def get_rng_state_all() -> list:
    return [get_rng_state(index) for index in range(_C.device_count())]


def set_rng_state_all(states) -> None:
    for index, state in enumerate(states):
        set_rng_state(state, index)


# ---- memory -----------------------------------------------------------------------------
# "allocated" counts the bytes of live tpu buffers (torchtpu's own count). "reserved" is what
# the platform's allocator holds (PJRT's pool on GPU/TPU); the CPU platform keeps no pool, so
# there it equals allocated. torch.accelerator's memory functions read the same numbers.

def memory_allocated(device=None) -> int:
    """Bytes held by live tpu tensors on the device."""
    return _C.memory_allocated(_index(device))


def max_memory_allocated(device=None) -> int:
    return _C.max_memory_allocated(_index(device))


def memory_reserved(device=None) -> int:
    """Bytes the device's allocator holds (at least memory_allocated)."""
    return _C.memory_stats(_index(device))["reserved_bytes.all.current"]


def max_memory_reserved(device=None) -> int:
    return _C.memory_stats(_index(device))["reserved_bytes.all.peak"]


def reset_peak_memory_stats(device=None) -> None:
    """Restarts max_memory_allocated from the current value (PJRT's own peaks cannot be reset)."""
    _C.reset_peak_memory(_index(device))


def reset_max_memory_allocated(device=None) -> None:
    reset_peak_memory_stats(device)


def memory_stats(device=None) -> dict:
    """torch.cuda.memory_stats' main keys, plus the platform allocator's own numbers."""
    return _C.memory_stats(_index(device))


def mem_get_info(device=None) -> tuple[int, int]:
    """(free, total) bytes of device memory: the host's memory on the CPU platform."""
    return _C.mem_get_info(_index(device))


def set_per_process_memory_fraction(fraction, device=None) -> None:
    """Caps the share of the device's memory (mem_get_info's total) torchtpu may fill: an op
    or graph that would go beyond it raises torch.OutOfMemoryError before it runs."""
    if not isinstance(fraction, float):
        raise TypeError("Invalid type for fraction argument, must be `float`")
    if fraction < 0 or fraction > 1:
        raise ValueError(f"Invalid fraction value: {fraction}. Allowed range: 0~1")
    _C.set_memory_fraction(_index(device), fraction)


def empty_cache() -> None:
    """Runs pending work and waits for it, so buffers that only pending work still held are
    freed. torchtpu keeps no pool of freed memory of its own: a buffer is released as soon as
    no tensor uses it."""
    _C.sync(True)


# ---- device facts -----------------------------------------------------------------------

class _DeviceProperties:
    __slots__ = ("name", "platform", "index", "total_memory")

    def __init__(self, name, platform, index, total_memory):
        self.name, self.platform, self.index, self.total_memory = name, platform, index, total_memory

    def __repr__(self):
        return (f"_TpuDeviceProperties(name='{self.name}', platform='{self.platform}', index={self.index}, "
                f"total_memory={self.total_memory // (1024 * 1024)}MB)")


def get_device_properties(device=None) -> _DeviceProperties:
    index = _index(device)
    _check_index(index)
    return _DeviceProperties(get_device_name(index), _C.platform(), index, mem_get_info(index)[1])


def get_device_name(device=None) -> str:
    """The device's kind as XLA names it ("TPU v5 lite", "NVIDIA H200", "cpu")."""
    index = _index(device)
    _check_index(index)
    return _C.device_kind(index)


def _check_index(index: int) -> None:
    if not 0 <= index < _C.device_count():
        raise AssertionError("Invalid device id")  # torch.cuda's type and wording


def is_bf16_supported(including_emulation: bool = True) -> bool:
    """bfloat16 runs on every XLA platform (natively on TPU)."""
    return is_available()


def get_amp_supported_dtype():
    return [_torch.bfloat16, _torch.float16]


def _is_autocast_enabled() -> bool:
    return _torch.is_autocast_enabled("tpu")


# ---- streams and events -----------------------------------------------------------------
# The device guard (csrc/device/registration.cpp) implements them, so torch.Stream,
# torch.Event and torch.accelerator see the same streams and current stream as torch.tpu.

class Stream(_torch.Stream):
    """A tpu stream: a name for the device's one ordered queue of work.

    wait_stream / wait_event are satisfied at once (work on a device runs in issue order);
    synchronize() and query() wait until the device has finished all work issued so far.
    """

    def __new__(cls, device=None, priority: int = 0, **kwargs):
        if "stream_id" in kwargs:  # rebuilt from (stream_id, device_index, device_type)
            return super().__new__(cls, priority=priority, **kwargs)
        index = _index(device)
        _check_index(index)
        return super().__new__(cls, device=_torch.device("tpu", index), priority=priority)

    def __init__(self, device=None, priority: int = 0, **kwargs):
        pass

    def record_event(self, event=None):
        event = Event() if event is None else event
        event.record(self)
        return event

    def __enter__(self):
        self._context = StreamContext(self)
        return self._context.__enter__()

    def __exit__(self, *exc):
        return self._context.__exit__(*exc)

    def __repr__(self):
        return f"<torch.tpu.Stream device=tpu:{self.device_index} stream_id={self.stream_id}>"


def _as_tpu_stream(stream) -> Stream:
    if isinstance(stream, Stream):
        return stream
    if stream.device_type != _PRIVATEUSE1:
        raise ValueError(f"Expected a tpu stream, but got: {stream}")
    return Stream(stream_id=stream.stream_id, device_index=stream.device_index, device_type=_PRIVATEUSE1)


def default_stream(device=None) -> Stream:
    index = _index(device)
    return Stream(stream_id=0, device_index=index, device_type=_PRIVATEUSE1)


def current_stream(device=None) -> Stream:
    return _as_tpu_stream(_torch.accelerator.current_stream(_index(device)))


def set_stream(stream) -> None:
    """Makes `stream` current on its device (for this thread)."""
    if stream is None:
        return
    _torch.accelerator.set_stream(_as_tpu_stream(stream))


class StreamContext:
    """Makes a stream current (and its device) for the block, then restores both."""

    def __init__(self, stream):
        self.stream = None if stream is None else _as_tpu_stream(stream)
        self.previous_stream = None
        self.previous_device = None

    def __enter__(self):
        if self.stream is None:
            return None
        self.previous_device = _C.current_device()
        self.previous_stream = current_stream(self.stream.device_index)
        _C.set_device(self.stream.device_index)
        set_stream(self.stream)
        return self.stream

    def __exit__(self, *exc):
        if self.stream is not None:
            set_stream(self.previous_stream)
            _C.set_device(self.previous_device)
        return False


def stream(stream) -> StreamContext:
    """with torch.tpu.stream(s): ... runs the block with s current (None: no change)."""
    return StreamContext(stream)


class Event(_torch.Event):
    """A point in a device's work. record() marks it (without flushing fused work);
    synchronize() and query() wait until the device finished everything issued before it;
    elapsed_time() needs enable_timing=True, whose record() waits for the device, so it
    measures the host time between two points the device had reached."""

    def __new__(cls, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False):
        if interprocess:
            raise ValueError("torchtpu: interprocess events are not supported on tpu")
        return super().__new__(cls, device=_torch.device("tpu", _C.current_device()), enable_timing=enable_timing,
                               blocking=blocking)

    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False):
        self.enable_timing = enable_timing

    @property
    def device_index(self) -> int:
        return self.device.index

    def elapsed_time(self, end_event) -> float:
        """Milliseconds between this event and end_event (RuntimeErrors as torch.cuda.Event's)."""
        if not (self.enable_timing and getattr(end_event, "enable_timing", False)):
            raise RuntimeError("Both events must be created with argument 'enable_timing=True'.")
        try:
            return _C.event_elapsed_time(self, end_event)
        except ValueError as error:
            raise RuntimeError(str(error)) from None

    def __repr__(self):
        return f"<torch.tpu.Event device=tpu:{self.device_index}>"
