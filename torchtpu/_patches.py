"""Small adaptations of PyTorch's Python layer for the tpu device: printing, saving and
loading, and the end of optimizer steps as a flush point."""
import functools

import torch

from torchtpu import _C


def _is_tpu(tensor) -> bool:
    return isinstance(tensor, torch.Tensor) and tensor.device.type == "tpu"


def _patch_printing():
    import torch._tensor_str as tensor_str

    original = tensor_str._tensor_str

    @functools.wraps(original)
    def _tensor_str(self, indent):
        # Formatting runs many small ops; do them on a host copy (one transfer).
        if _is_tpu(self):
            self = self.cpu()
        return original(self, indent)

    tensor_str._tensor_str = _tensor_str

    original_str = tensor_str._str

    @functools.wraps(original_str)
    def _str(self, *, tensor_contents=None):
        # A tpu tensor is a functional wrapper inside; print it as the plain device tensor
        # it is to the user (PyTorch would print "_to_functional_tensor(...)").
        if not _is_tpu(self):
            return original_str(self, tensor_contents=tensor_contents)
        is_functional = torch._is_functional_tensor
        torch._is_functional_tensor = lambda t: False if _is_tpu(t) else is_functional(t)
        try:
            return original_str(self, tensor_contents=tensor_contents)
        finally:
            torch._is_functional_tensor = is_functional

    tensor_str._str = _str


def _patch_serialization():
    # torch.save of a tpu tensor goes through a CPU copy, as for XLA tensors.
    original_has_storage = torch._C._has_storage

    def _has_storage(tensor):
        if _is_tpu(tensor):
            return False
        return original_has_storage(tensor)

    torch._C._has_storage = _has_storage

    original_load = torch.load

    @functools.wraps(original_load)
    def load(f, map_location=None, *args, **kwargs):
        target = _tpu_target(map_location)
        if target is None:
            return original_load(f, map_location, *args, **kwargs)
        return _move(original_load(f, "cpu", *args, **kwargs), target)

    torch.load = load


def _tpu_target(map_location):
    if isinstance(map_location, (str, torch.device)):
        device = torch.device(map_location)
        if device.type == "tpu":
            return device
    return None


def _move(obj, device):
    if isinstance(obj, torch.nn.Parameter):
        return torch.nn.Parameter(obj.to(device), requires_grad=obj.requires_grad)
    if isinstance(obj, torch.Tensor):
        return obj.to(device)
    if isinstance(obj, dict):
        moved = {k: _move(v, device) for k, v in obj.items()}
        if type(obj) is not dict:
            try:
                return type(obj)(moved)
            except TypeError:
                return moved
        return moved
    if isinstance(obj, list):
        return [_move(v, device) for v in obj]
    if isinstance(obj, tuple) and not hasattr(obj, "_fields"):
        return tuple(_move(v, device) for v in obj)
    return obj


def _patch_optimizers():
    # The end of an optimizer step is where a training step's graph ends: run it now, without
    # waiting for it, so the next step is traced while this one computes.
    def flush_after_step(optimizer, args, kwargs):
        if _C.get_mode() != "fused":
            return
        for group in optimizer.param_groups:
            for param in group["params"]:
                if param.device.type == "tpu":
                    _C.sync(False)
                    return

    # fused=True: PyTorch accepts it for tpu, but its fused kernels (_fused_adam_, ...) are
    # CUDA kernels with no functional form. On tpu the foreach path is the fused one: in
    # fused mode the whole step becomes one XLA executable. Same math, same results.
    def fused_means_foreach(optimizer, args, kwargs):
        for group in optimizer.param_groups:
            if group.get("fused") and any(p.device.type == "tpu" for p in group["params"]):
                group["fused"] = False
                group["foreach"] = True

    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

    register_optimizer_step_pre_hook(fused_means_foreach)
    register_optimizer_step_post_hook(flush_after_step)


def _patch_module_apply():
    # module.to("tpu") builds new Parameters (a tpu tensor cannot take over a CPU tensor's
    # storage in place), which would untie weights shared between modules (tied embeddings).
    # Re-tie them after the move, as CUDA users get for free.
    import threading

    original = torch.nn.Module._apply
    state = threading.local()

    @functools.wraps(original)
    def _apply(self, fn, recurse=True):
        if getattr(state, "active", False):
            return original(self, fn, recurse)
        holders = {}
        for module in self.modules():
            for name, param in module._parameters.items():
                if param is not None:
                    holders.setdefault(id(param), []).append((module, name))
        state.active = True
        try:
            result = original(self, fn, recurse)
        finally:
            state.active = False
        for places in holders.values():
            if len(places) > 1:
                first_module, first_name = places[0]
                shared = first_module._parameters[first_name]
                for module, name in places[1:]:
                    module._parameters[name] = shared
        return result

    torch.nn.Module._apply = _apply


def _patch_inference_mode():
    # PyTorch's C++ functionalization (which tpu tensors go through, as XLA's do) cannot take
    # a view of a normal tensor under inference mode: the view's wrapper is created as an
    # inference tensor and autograd's view tracking then fails with "Cannot set
    # version_counter for inference tensor" (any Linear does a view: weight.t()). Once tpu
    # tensors are in use, torch.inference_mode() runs as torch.no_grad(): same results, no
    # autograd graph; tensors made inside are normal tensors. CPU-only processes are untouched.
    import warnings

    cls = torch.autograd.grad_mode.inference_mode
    original_enter, original_exit = cls.__enter__, cls.__exit__
    state = {"tpu_used": False, "warned": False}

    def tpu_in_use() -> bool:
        if not state["tpu_used"]:
            c = _C.counters()
            state["tpu_used"] = bool(c["ops_traced"] or c["bytes_to_device"] or _C.pending_ops())
        return state["tpu_used"]

    def __enter__(self):
        if self.mode and tpu_in_use():
            if not state["warned"]:
                state["warned"] = True
                warnings.warn("torchtpu: torch.inference_mode() runs as torch.no_grad() once tpu tensors are in "
                              "use (PyTorch's functionalization cannot view normal tensors under inference mode); "
                              "results are the same", stacklevel=2)
            self._torchtpu_no_grad = torch.no_grad()
            return self._torchtpu_no_grad.__enter__()
        self._torchtpu_no_grad = None
        return original_enter(self)

    def __exit__(self, exc_type, exc_value, traceback):
        no_grad = getattr(self, "_torchtpu_no_grad", None)
        if no_grad is not None:
            self._torchtpu_no_grad = None
            return no_grad.__exit__(exc_type, exc_value, traceback)
        return original_exit(self, exc_type, exc_value, traceback)

    cls.__enter__, cls.__exit__ = __enter__, __exit__


_installed = False


def install():
    global _installed
    if _installed:
        return
    _installed = True
    _patch_printing()
    _patch_serialization()
    _patch_optimizers()
    _patch_module_apply()
    _patch_inference_mode()
