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

And one patch of torch.nn.Module._apply (move it into torchtpu/_patches.py with the weight
re-tying there): module.to("tpu") keeps each Parameter object, as on CUDA. A tpu tensor
cannot take over a CPU tensor's storage in place (param.data = ...), so PyTorch made new
Parameter objects, and an optimizer built before the move (accelerate's prepare(model,
optimizer), or plain user code) silently kept updating the old CPU ones. For conversions
that touch tpu, PyTorch's own swap path (torch.__future__.set_swap_module_params_on_
conversion) swaps the moved tensor into the existing Parameter instead.
"""
import functools
import threading

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


def _touches_tpu(module, fn) -> bool:
    for tensor in module.parameters():
        return tensor.device.type == "tpu" or _maps_to_tpu(fn)
    return any(b.device.type == "tpu" for b in module.buffers()) or _maps_to_tpu(fn)


def _maps_to_tpu(fn) -> bool:
    try:
        probe = fn(torch.empty(0))  # conversions are elementwise; an empty probe costs nothing
    except Exception:
        return False
    return isinstance(probe, torch.Tensor) and probe.device.type == "tpu"


def _patch_module_apply() -> None:
    original = torch.nn.Module._apply
    state = threading.local()

    @functools.wraps(original)
    def _apply(self, fn, recurse=True):
        if getattr(state, "active", False) or torch.__future__.get_swap_module_params_on_conversion() \
                or not _touches_tpu(self, fn):
            return original(self, fn, recurse)
        state.active = True
        torch.__future__.set_swap_module_params_on_conversion(True)
        try:
            return original(self, fn, recurse)
        except RuntimeError as error:
            if "Couldn't swap" not in str(error):
                raise
        finally:
            torch.__future__.set_swap_module_params_on_conversion(False)
            state.active = False
        # A parameter that cannot be swapped (something holds a weak reference to it, e.g. a
        # compiled graph) gets a new Parameter object, as before; those already moved stay.
        return original(self, fn, recurse)

    torch.nn.Module._apply = _apply


def install() -> None:
    global _library
    if _library is not None:
        return
    _library = torch.library.Library("aten", "IMPL")
    _library.impl("lift_fresh", _lift_fresh, "PrivateUse1")
    _library.impl("record_stream", _record_stream, "Functionalize")
    _patch_module_apply()
