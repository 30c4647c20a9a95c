"""Kernels PyTorch's own code paths need for tpu tensors, registered from Python.

Stopgap: both belong in the device layer (csrc/device) and move there when it is free.
- lift_fresh: torch.tensor(data, device="tpu") builds the tensor with functionalization
  switched off and then "lifts" it; the default lift_fresh returns it unwrapped, so the
  result was a raw tpu tensor that in-place ops with ordinary tpu tensors rejected
  ("mutating a non-functional tensor with a functional tensor is not allowed";
  transformers' Trainer accumulates its loss exactly so).
- record_stream: functionalization rejects ops with alias annotations, and tpu has no kernel
  for it; tpu buffers need no stream bookkeeping (XLA orders a device's work), so it is a
  no-op on tpu (DDP's side-stream input copies call it); other functional tensors pass it to
  their own kernel unwrapped.

(module.to keeping Parameter objects is the "module.to" patch in torchtpu/_patches.py.)
"""
import torch

_library = None


def _lift_fresh(tensor):
    if torch._is_functional_tensor(tensor):
        return tensor
    return torch._to_functional_tensor(tensor)


def _record_stream(tensor, stream):
    if tensor.device.type == "tpu":
        return  # a tpu buffer is freed only after the work that uses it: nothing to record
    inner = torch._from_functional_tensor(tensor)
    with torch._C._ExcludeDispatchKeyGuard(torch._C.DispatchKeySet(torch._C.DispatchKey.Functionalize)):
        inner.record_stream(stream)


def install() -> None:
    global _library
    if _library is not None:
        return
    _library = torch.library.Library("aten", "IMPL")
    _library.impl("lift_fresh", _lift_fresh, "PrivateUse1")
    _library.impl("record_stream", _record_stream, "Functionalize")
