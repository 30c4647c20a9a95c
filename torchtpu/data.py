"""Input pipeline: DeviceLoader keeps the next batches already on the tpu device.

    loader = torch.utils.data.DataLoader(dataset, batch_size=64, num_workers=2)
    for images, labels in torchtpu.data.DeviceLoader(loader, prefetch=2):
        ...                                   # images, labels are tpu tensors

A background thread draws batches from the loader and uploads them while the training step
runs; the step then finds its inputs on the device. The thread only uploads (host to device
copies through the runtime, under the GIL as every jaxlib call is); it never records ops
into the pending graph nor takes the engine's lock for long, so it cannot block a flush.
"""
import collections.abc
import queue
import threading

import torch

__all__ = ["DeviceLoader", "to_device"]

_END = object()


def to_device(batch, device):
    """Moves every tensor in a (nested) batch to `device`: tensors, dicts, lists, tuples and
    named tuples; anything else is passed through."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, collections.abc.Mapping):
        moved = {key: to_device(value, device) for key, value in batch.items()}
        try:
            return type(batch)(moved)
        except TypeError:
            return moved
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):
        return type(batch)(*(to_device(value, device) for value in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_device(value, device) for value in batch)
    return batch


class _Failure:
    def __init__(self, error):
        self.error = error


class DeviceLoader:
    """Iterates `loader` and yields its batches on `device` (default: the current tpu),
    with `prefetch` batches uploaded ahead by a background thread (0: upload each batch
    when it is asked for, in the caller's thread)."""

    def __init__(self, loader, device=None, prefetch: int = 2):
        if not isinstance(prefetch, int) or prefetch < 0:
            raise ValueError(f"prefetch must be a non-negative int, got {prefetch!r}")
        self.loader = loader
        self.device = torch.device("tpu", torch.tpu.current_device()) if device is None else torch.device(device)
        if self.device.type != "tpu":
            raise ValueError(f"DeviceLoader moves batches to a tpu device, got {self.device}")
        if self.device.index is None:
            self.device = torch.device("tpu", torch.tpu.current_device())
        self.prefetch = prefetch

    def __len__(self):
        return len(self.loader)

    def __iter__(self):
        if self.prefetch == 0:
            for batch in self.loader:
                yield to_device(batch, self.device)
            return
        ready = queue.Queue(maxsize=self.prefetch)
        stop = threading.Event()
        worker = threading.Thread(target=self._produce, args=(ready, stop), name="torchtpu-DeviceLoader",
                                  daemon=True)
        worker.start()
        try:
            while True:
                item = ready.get()
                if item is _END:
                    return
                if isinstance(item, _Failure):
                    raise item.error
                yield item
        finally:
            # The consumer stopped (end, error or break): let the thread see it and finish.
            stop.set()
            while worker.is_alive():
                try:
                    ready.get(timeout=0.05)
                except queue.Empty:
                    pass
            worker.join()

    def _produce(self, ready, stop):
        def put(item):
            while not stop.is_set():
                try:
                    ready.put(item, timeout=0.05)
                    return True
                except queue.Full:
                    pass
            return False

        try:
            for batch in self.loader:
                if stop.is_set() or not put(to_device(batch, self.device)):
                    return
        except BaseException as error:  # handed to the consumer, raised in its thread
            put(_Failure(error))
            return
        put(_END)
