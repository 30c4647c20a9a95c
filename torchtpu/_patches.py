"""Every change torchtpu makes to other projects' code, in one registry, each entry guarded.

An entry (`Patch`) is one change: a Python attribute of torch or of a library replaced
(registered with @patch, here or in the module it belongs to), or torchtpu's kernels at a
dispatch key every device goes through (Functionalize, Meta, ADInplaceOrView: registered by
torchtpu._C, csrc/device/kernel_overrides.h). Before a patch changes anything it checks that
its target is there and looks as this code expects (its parameters; the names its code reads
that the patch relies on); on a release where it does not, PatchError names the patch and
the version instead of misbehaving silently. Every entry can be removed again (`restore`).

`python -m torchtpu patches` prints the table (`entries()`); docs/ARCHITECTURE.md ("Changes to
other projects' code") holds the same table, and tests/test_patches.py keeps them equal and
covers each patch's behaviour and its guard.

An entry is installed `when`:
    import                  torchtpu loads (install())
    torch.compile           torchtpu.compiler loads (install_lazy): torch._functorch's cache
                            module is too heavy to import with torchtpu
    tpu process group       the first tpu process group is created (torchtpu/distributed.py)
    import of <module>      the library's module loads (torchtpu/integrations/)
The end of an optimizer step uses PyTorch's public optimizer hooks (no patch, no guard).
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib
import inspect
import os
import threading
from typing import Callable

import torch

from torchtpu import _C


class PatchError(RuntimeError):
    """A patched torch internal (or library internal) is missing or not what torchtpu expects."""


@dataclasses.dataclass(frozen=True)
class Patch:
    """One change torchtpu makes to another project's code."""

    name: str
    kind: str                  # "<library> attribute", or "<DispatchKey> kernel, <relation>" (kernel_overrides.h)
    when: str                  # see the module's docstring
    targets: tuple[str, ...]   # what it changes: "torch.load", "aten::add_.Tensor", or a rule
    install: Callable | None = None  # None for the C++ kernels (torchtpu._C installs them)
    library: str = "torch"
    source: str = ""           # the file that makes the change

    def targets_here(self) -> tuple[str, ...]:
        """The targets the running torch has: "fsdp::op from torch 2.15" names fsdp::op from
        that release on (a target a newer torch added; the table keeps the note)."""
        found = []
        for target in self.targets:
            name, _, since = target.partition(" from torch ")
            if not since or torch.__version__ >= since:
                found.append(name)
        return tuple(found)

    def row(self) -> tuple[str, str, str, str]:
        """The entry as a row of the table in docs/ARCHITECTURE.md."""
        return (self.name, self.kind, self.when, ", ".join(t if " " in t else f"`{t}`" for t in self.targets))


PATCHES: dict[str, Patch] = {}  # the Python patches, in registration order
_originals: dict[tuple[object, str], object] = {}  # (owner, attribute) -> its own value before any patch
_inherited: set[tuple[object, str]] = set()  # of those, attributes the owner inherited from a base class
_installed: dict[str, list] = {}  # patch name -> what it changed: (owner, attribute) keys, or Libraries
_installing: list[str] = []  # the patch whose install function runs now (install(), apply())
_install_lock = threading.RLock()
# Modules that register patches besides this one (imported by entries()).
_REGISTERING_MODULES = ("torchtpu.distributed", "torchtpu.integrations.accelerate",
                        "torchtpu.integrations.safetensors", "torchtpu.integrations.huggingface_hub",
                        "torchtpu.integrations.lightning", "torchtpu.integrations.transformers")


def patch(name: str, targets: tuple[str, ...], when: str = "import", library: str = "torch",
          kind: str | None = None):
    """Registers an install function as the patch `name` (it changes exactly `targets`)."""

    def register(fn):
        if name in PATCHES:
            raise ValueError(f"torchtpu patch {name!r} is registered twice")
        PATCHES[name] = Patch(name, kind or f"{library} attribute", when, tuple(targets), fn, library,
                              _relative(inspect.getsourcefile(fn)))
        return fn

    return register


def _relative(path: str | None) -> str:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return os.path.relpath(path, root) if path else ""


def kernel_entries() -> list[Patch]:
    """torchtpu._C's kernels at dispatch keys every device goes through, as entries."""
    entries = []
    for info in _C.kernel_overrides():
        kind = f"{info['key']} kernel, {info['relation']}"
        targets = (info["rule"],) if info["rule"] else tuple(info["ops"])
        entries.append(Patch(info["name"], kind, "import", targets, None, "torch", "csrc/device/kernel_overrides.h"))
    return entries


def entries() -> list[Patch]:
    """Every change to other projects' code: the Python patches, then torchtpu._C's kernels."""
    for module in _REGISTERING_MODULES:
        importlib.import_module(module)
    return list(PATCHES.values()) + kernel_entries()


def table(with_state: bool = False) -> str:
    """The registry as the markdown table docs/ARCHITECTURE.md holds (`python -m torchtpu
    patches` adds a column saying whether each change is in place now)."""
    header = ["change", "kind", "when", "targets"] + (["now"] if with_state else [])
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for entry in entries():
        cells = list(entry.row()) + (["installed" if installed(entry.name) else "not installed"] if with_state else [])
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> int:
    """`python -m torchtpu patches`."""
    print("torchtpu's changes to other projects' code (torchtpu/_patches.py; docs/ARCHITECTURE.md explains them):")
    print()
    print(table(with_state=True))
    return 0


def installed(name: str) -> bool:
    """Whether the entry's change is in place now."""
    if name in PATCHES:
        return name in _installed
    return any(info["name"] == name and info["active"] for info in _C.kernel_overrides())


def checked(patch_name: str, owner, attribute: str, params=None, reads=(), is_property=False):
    """The patched project's own owner.attribute, after checking that it exists (a property
    when is_property), that its parameters start with `params` (names) and that its code
    reads each name in `reads`; else PatchError naming the patch and the project's version."""
    where = _path(owner, attribute)
    target = _originals.get((owner, attribute), getattr(owner, attribute, None))

    def fail(what):
        entry = PATCHES.get(patch_name)
        library = entry.library if entry else "torch"
        if library == "torch":
            return PatchError(f"torchtpu patch '{patch_name}': {where} {what} in torch {torch.__version__}; "
                              "install the torch release torchtpu pins (requirements.txt), or update this "
                              f"patch ({entry.source if entry else 'torchtpu/_patches.py'})")
        version = getattr(importlib.import_module(library), "__version__", "?")
        return PatchError(f"torchtpu patch '{patch_name}': {where} {what} in {library} {version}; install the "
                          f"{library} release torchtpu was checked with (requirements.txt), or update this patch "
                          f"({entry.source})")

    if target is None:
        raise fail("does not exist")
    if is_property:
        if not isinstance(target, property):
            raise fail(f"is a {type(target).__name__}, not a property")
        function = target.fget
    elif not callable(target):
        raise fail(f"is a {type(target).__name__}, not a function")
    else:
        function = target
    if params is not None:
        actual = list(inspect.signature(function).parameters)
        if actual[:len(params)] != list(params):
            raise fail(f"takes ({', '.join(actual)}), not ({', '.join(params)}, ...)")
    code = getattr(inspect.unwrap(function), "__code__", None)
    for name in reads:
        if code is None or name not in code.co_names:
            raise fail(f"no longer reads {name}")
    return target


def _path(owner, attribute: str) -> str:
    """owner.attribute by its full name: "torch.load", "torch.nn.modules.module.Module._apply"."""
    if inspect.ismodule(owner):
        return f"{owner.__name__}.{attribute}"
    return f"{owner.__module__}.{owner.__qualname__}.{attribute}"


def _replace(owner, attribute: str, replacement) -> None:
    """Sets owner.attribute for the patch being installed (restore() puts the original back)."""
    key = (owner, attribute)
    if key not in _originals:
        _originals[key] = getattr(owner, attribute)
        if not inspect.ismodule(owner) and attribute not in vars(owner):
            _inherited.add(key)  # restore() deletes it again, so that the base class's shows
    _installed[_installing[-1]].append(key)
    setattr(owner, attribute, _like(owner, attribute, replacement))


def _library(namespace: str) -> torch.library.Library:
    """A torch.library.Library for the patch being installed (restore() destroys it)."""
    library = torch.library.Library(namespace, "IMPL")
    _installed[_installing[-1]].append(library)
    return library


def apply(name: str, *args) -> None:
    """Installs one patch (PATCHES[name].install(*args)), once; a failed guard changes nothing."""
    with _install_lock:
        if name in _installed:
            return
        _installed[name] = []
        _installing.append(name)
        try:
            PATCHES[name].install(*args)
        except BaseException:
            restore(name)
            raise
        finally:
            _installing.pop()


def restore(name: str) -> None:
    """Undoes one entry: the patched attributes get their own values back (a C++ kernel entry
    is removed from the dispatcher). An entry not installed is left as it is."""
    with _install_lock:
        if name not in PATCHES:
            if not _C.restore_kernel_override(name):
                raise KeyError(f"torchtpu has no patch named {name!r}")
            return
        for change in reversed(_installed.pop(name, [])):
            if isinstance(change, tuple):
                owner, attribute = change
                if change in _inherited:
                    delattr(owner, attribute)
                    _inherited.discard(change)
                    del _originals[change]
                elif change in _originals:
                    setattr(owner, attribute, _like(owner, attribute, _originals.pop(change)))
            else:
                change._destroy()


def _restore() -> None:
    """Undoes every Python patch (a failed import of torchtpu leaves torch as it was)."""
    for name in reversed(list(_installed)):
        restore(name)


def _like(owner, attribute: str, function):
    # A static method or class method of a class stays one (getattr unwraps or binds it;
    # setattr must not). A bound class method (torch's own, from getattr) goes back unbound.
    kind = inspect.getattr_static(owner, attribute, None)
    if isinstance(kind, staticmethod):
        return staticmethod(function)
    if isinstance(kind, classmethod):
        return classmethod(getattr(function, "__func__", function))
    return function


def _is_tpu(tensor) -> bool:
    return isinstance(tensor, torch.Tensor) and tensor.device.type == "tpu"


# ---------------------------------------------------------------------------------------
# A tpu tensor is a FunctionalTensorWrapper inside; where PyTorch's Python asks
# torch._is_functional_tensor to decide how to show or describe a tensor, it must see the
# plain device tensor the user has. The answer changes only inside `described_as_plain`,
# on the calling thread (other threads keep torch's answer).

_plain = threading.local()


@patch("functional check", targets=("torch._is_functional_tensor",))
def _patch_functional_check():
    original = checked("functional check", torch, "_is_functional_tensor")

    @functools.wraps(original)
    def _is_functional_tensor(tensor):
        plain = getattr(_plain, "predicate", None)
        if plain is not None and plain(tensor):
            return False
        return original(tensor)

    _replace(torch, "_is_functional_tensor", _is_functional_tensor)


@contextlib.contextmanager
def described_as_plain(predicate: Callable[[torch.Tensor], bool]):
    """On this thread, torch._is_functional_tensor(t) is False where predicate(t) holds."""
    previous = getattr(_plain, "predicate", None)
    _plain.predicate = predicate
    try:
        yield
    finally:
        _plain.predicate = previous


# ---------------------------------------------------------------------------------------
# Printing.


@patch("printing", targets=("torch._tensor_str._tensor_str", "torch._tensor_str._str"))
def _patch_printing():
    import torch._tensor_str as tensor_str

    original = checked("printing", tensor_str, "_tensor_str", params=("self", "indent"))
    original_str = checked("printing", tensor_str, "_str", params=("self", "tensor_contents"))
    checked("printing", tensor_str, "_str_intern", reads=("_is_functional_tensor",))

    @functools.wraps(original)
    def _tensor_str(self, indent):
        # Formatting runs many small ops; do them on a host copy (one transfer).
        if _is_tpu(self):
            self = self.cpu()
        return original(self, indent)

    @functools.wraps(original_str)
    def _str(self, *, tensor_contents=None):
        # Print a tpu tensor as the device tensor it is to the user; PyTorch would print the
        # functional wrapper ("_to_functional_tensor(...)").
        if not _is_tpu(self):
            return original_str(self, tensor_contents=tensor_contents)
        with described_as_plain(_is_tpu):
            return original_str(self, tensor_contents=tensor_contents)

    _replace(tensor_str, "_tensor_str", _tensor_str)
    _replace(tensor_str, "_str", _str)


# ---------------------------------------------------------------------------------------
# Saving and loading.


@patch("saving", targets=("torch._C._has_storage",))
def _patch_saving():
    # torch.save (and deepcopy) of a tpu tensor go through a CPU copy, as for XLA tensors:
    # PyTorch takes that path for a PrivateUse1 tensor without storage.
    original = checked("saving", torch._C, "_has_storage")
    checked("saving", torch.Tensor, "_reduce_ex_internal", reads=("_has_storage", "_get_privateuse1_backend_name"))

    @functools.wraps(original)
    def _has_storage(tensor):
        if _is_tpu(tensor):
            return False
        return original(tensor)

    _replace(torch._C, "_has_storage", _has_storage)


@patch("loading", targets=("torch.load",))
def _patch_loading():
    # torch.load(..., map_location="tpu") loads on CPU and moves the result.
    original = checked("loading", torch, "load", params=("f", "map_location"))

    @functools.wraps(original)
    def load(f, map_location=None, *args, **kwargs):
        target = _tpu_target(map_location)
        if target is None:
            return original(f, map_location, *args, **kwargs)
        return _move(original(f, "cpu", *args, **kwargs), target)

    _replace(torch, "load", load)


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


# ---------------------------------------------------------------------------------------
# module.to("tpu").


@patch("module.to", targets=("torch.nn.modules.module.Module._apply",))
def _patch_module_apply():
    # module.to("tpu") must keep each Parameter object, as on CUDA: an optimizer built before
    # the move (accelerate's prepare(model, optimizer), or plain user code) holds them. A tpu
    # tensor cannot take over a CPU tensor's storage in place (param.data = ...), so for
    # conversions that touch tpu, PyTorch's own swap path (torch.__future__.
    # set_swap_module_params_on_conversion) swaps the moved tensor into the existing
    # Parameter. The flag is process-global; it is on only for the duration of the call, and
    # swapping is also correct for any CPU module another thread converts meanwhile.
    # A parameter that cannot be swapped (something holds a weak reference to it, e.g. a
    # compiled graph) gets a new Parameter object; weights shared between modules (tied
    # embeddings) are then re-tied after the move.
    original = checked("module.to", torch.nn.Module, "_apply", params=("self", "fn", "recurse"),
                       reads=("_parameters", "_buffers"))
    future = torch.__future__
    for name in ("get_swap_module_params_on_conversion", "set_swap_module_params_on_conversion"):
        checked("module.to", future, name)
    state = threading.local()

    def plain_apply_retied(module_, fn, recurse):
        holders = {}
        for module in module_.modules():
            for name, param in module._parameters.items():
                if param is not None:
                    holders.setdefault(id(param), []).append((module, name))
        result = original(module_, fn, recurse)
        for places in holders.values():
            if len(places) > 1:
                first_module, first_name = places[0]
                shared = first_module._parameters[first_name]
                for module, name in places[1:]:
                    module._parameters[name] = shared
        return result

    @functools.wraps(original)
    def _apply(self, fn, recurse=True):
        if getattr(state, "active", False) or future.get_swap_module_params_on_conversion() \
                or not _touches_tpu(self, fn):
            return original(self, fn, recurse)
        state.active = True
        lazy = _take_uninitialized(self, fn, recurse)
        try:
            future.set_swap_module_params_on_conversion(True)
            try:
                return original(self, fn, recurse)
            except RuntimeError as error:
                if "Couldn't swap" not in str(error):
                    raise
            finally:
                future.set_swap_module_params_on_conversion(False)
            return plain_apply_retied(self, fn, recurse)
        finally:
            for table, name, tensor in lazy:
                table[name] = tensor
            state.active = False

    _replace(torch.nn.Module, "_apply", _apply)


def _take_uninitialized(module, fn, recurse):
    # Lazy modules' UninitializedParameter / UninitializedBuffer hold no data: PyTorch keeps
    # them through .to() by setting .data, which a tpu tensor cannot take over from a CPU one,
    # and a swap or a new Parameter loses the class (the module then fails with a 0-element
    # weight). Each is taken out before the conversion and replaced by a new uninitialized
    # one on the converted device and dtype, which materializes there at the first forward.
    from torch.nn.parameter import UninitializedBuffer, UninitializedParameter
    replaced = []
    for owner in (module.modules() if recurse else [module]):
        for table in (owner._parameters, owner._buffers):
            for name, tensor in list(table.items()):
                if not isinstance(tensor, (UninitializedParameter, UninitializedBuffer)):
                    continue
                probe = fn(torch.empty(0, dtype=tensor.dtype, device=tensor.device))
                kind = type(tensor)
                replaced.append((table, name, kind(requires_grad=tensor.requires_grad, device=probe.device,
                                                   dtype=probe.dtype)))
                del table[name]
    return replaced


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


# ---------------------------------------------------------------------------------------
# torch.inference_mode().


@patch("inference mode", targets=("torch.autograd.grad_mode.inference_mode.__enter__",
                                  "torch.autograd.grad_mode.inference_mode.__exit__"))
def _patch_inference_mode():
    # PyTorch's C++ functionalization (which tpu tensors go through, as XLA's do) cannot take
    # a view of a normal tensor under inference mode: the view's wrapper is created as an
    # inference tensor and autograd's view tracking then fails with "Cannot set
    # version_counter for inference tensor" (any Linear does a view: weight.t()). Once tpu
    # tensors are in use, torch.inference_mode() runs as torch.no_grad(): same results, no
    # autograd graph; tensors made inside are normal tensors. CPU-only processes are untouched.
    import warnings

    cls = torch.autograd.grad_mode.inference_mode
    checked("inference mode", cls, "__init__", params=("self", "mode"), reads=("mode",))
    original_enter = checked("inference mode", cls, "__enter__", params=("self",))
    original_exit = checked("inference mode", cls, "__exit__", params=("self", "exc_type", "exc_value", "traceback"))
    state = {"tpu_used": False, "warned": False}

    def tpu_in_use() -> bool:
        if not state["tpu_used"]:
            c = _C.counters()
            state["tpu_used"] = bool(c["ops_traced"] or c["bytes_to_device"] or _C.pending_ops())
        return state["tpu_used"]

    @functools.wraps(original_enter)
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

    @functools.wraps(original_exit)
    def __exit__(self, exc_type, exc_value, traceback):
        no_grad = getattr(self, "_torchtpu_no_grad", None)
        if no_grad is not None:
            self._torchtpu_no_grad = None
            return no_grad.__exit__(exc_type, exc_value, traceback)
        return original_exit(self, exc_type, exc_value, traceback)

    _replace(cls, "__enter__", __enter__)
    _replace(cls, "__exit__", __exit__)


# ---------------------------------------------------------------------------------------
# Fakeification (torch.compile).


@patch("fakeification", targets=("torch._subclasses.meta_utils.MetaTensorDescriber.describe_tensor",))
def _patch_fakeification():
    # Dynamo turns inputs into FakeTensors through MetaTensorDescriber, which unwraps
    # functional tensors unless their device is xla or lazy; that gives functional-wrapped
    # fakes Dynamo cannot use (parameters fail its leaf check). A tpu tensor takes the
    # xla/lazy path: it is described as the plain dense tensor it is to the user, and
    # becomes an ordinary FakeTensor on device "tpu".
    import dataclasses

    from torch._subclasses import meta_utils

    describer = meta_utils.MetaTensorDescriber
    original = checked("fakeification", describer, "describe_tensor", params=("self", "t", "recurse", "trace"),
                       reads=("_is_functional_tensor",))
    if "is_functional" not in {f.name for f in dataclasses.fields(meta_utils.MetaTensorDesc)}:
        raise PatchError(f"torchtpu patch 'fakeification': torch._subclasses.meta_utils.MetaTensorDesc has no "
                         f"is_functional field in torch {torch.__version__}")

    @functools.wraps(original)
    def describe_tensor(self, t, *, recurse=True, trace=False):
        if t.device.type != "tpu" or not torch._is_functional_tensor(t):
            return original(self, t, recurse=recurse, trace=trace)
        with described_as_plain(lambda x: x is t):
            desc = original(self, t, recurse=recurse, trace=trace)
        return dataclasses.replace(desc, is_functional=False)

    _replace(describer, "describe_tensor", describe_tensor)


# ---------------------------------------------------------------------------------------
# Storage resize: FSDP2 frees its unsharded parameters with untyped_storage().resize_(0) and
# re-allocates them with resize_(nbytes) before the all-gather writes them.


@patch("storage resize", targets=("torch.storage.UntypedStorage.resize_",))
def _patch_storage_resize():
    # torch's resize_ refuses a storage without a host address and non-zero size ("invalid
    # python storage"), which every tpu storage is; torchtpu._C frees or re-allocates its
    # device data instead (csrc/device/storage.cpp).
    original = checked("storage resize", torch.UntypedStorage, "resize_")

    @functools.wraps(original)
    def resize_(self, size):
        if self.device.type != "tpu":
            return original(self, size)
        if not isinstance(size, int) or isinstance(size, bool):  # torch's own check and wording
            raise RuntimeError(f"resize_ expects an int, but got {type(size).__name__}")
        _C.resize_storage(self, size)
        return self

    _replace(torch.UntypedStorage, "resize_", resize_)


# ---------------------------------------------------------------------------------------
# Optimizer steps as transactions.


@patch("optimizer step", targets=("torch.optim.optimizer.Optimizer.profile_hook_step",))
def _patch_optimizer_step():
    # A step that raises - an op inside it, or the flush of its graph at its end - is undone:
    # parameters and optimizer state get back what they held before it, so no step is ever
    # half applied and the next one starts from a consistent state. PyTorch wraps each
    # optimizer class's step with Optimizer.profile_hook_step (hooks, profiling) when its
    # first instance is made; the transaction goes around that wrapper.
    from torch.optim import Optimizer

    original = checked("optimizer step", Optimizer, "profile_hook_step", params=("func",))
    checked("optimizer step", Optimizer, "_patch_step_function", reads=("profile_hook_step",))

    @functools.wraps(original)
    def profile_hook_step(func):
        hooked = original(func)

        @functools.wraps(hooked)
        def step(*args, **kwargs):
            snapshot = _StepSnapshot.take(args[0])
            _steps.depth = getattr(_steps, "depth", 0) + 1
            try:
                return hooked(*args, **kwargs)
            except BaseException as error:
                if snapshot is not None:
                    lost = snapshot.restore()
                    if lost:
                        error.add_note(f"torchtpu: {lost} tensors of this optimizer step keep its update: work "
                                       "inside the step was run before it failed (a read on the host, or "
                                       "TORCHTPU_MAX_PENDING_OPS reached), and their previous values are gone.")
                raise
            finally:
                _steps.depth -= 1

        return step

    _replace(Optimizer, "profile_hook_step", profile_hook_step)


# How many optimizer steps this thread is inside (a subclass's step calling its base's): only
# the outermost runs the step's graph, so a failure after an inner step can still undo it.
_steps = threading.local()


class _StepSnapshot:
    """What an optimizer step may change: its tpu parameters' and state tensors' values
    (kept by torchtpu._C, without copies), its CPU state tensors (copied: step counters are
    tiny) and the keys of its state."""

    __slots__ = ("optimizer", "values", "host", "host_copies", "state")

    @classmethod
    def take(cls, optimizer):
        params = [p for group in optimizer.param_groups for p in group["params"]]
        if not any(_is_tpu(p) for p in params):
            return None
        from torch.utils._python_dispatch import is_traceable_wrapper_subclass

        if any(is_traceable_wrapper_subclass(p) for p in params):
            # DTensor parameters (FSDP2, tensor parallel) keep their data in wrapped local
            # tensors that FSDP2 re-points between steps: such steps are not undone.
            return None
        snapshot = cls()
        snapshot.optimizer = optimizer
        tensors, host, state = [], [], {}
        for p in params:
            if _is_tpu(p):
                tensors.append(p)
            entries = optimizer.state.get(p)
            state[p] = None if entries is None else dict(entries)
            for value in (entries or {}).values():
                if _is_tpu(value):
                    tensors.append(value)
                elif isinstance(value, torch.Tensor):
                    host.append(value)
        snapshot.values = _C.take_snapshot(tensors)
        snapshot.host = host
        snapshot.host_copies = torch._foreach_mul(host, 1) if host else []
        snapshot.state = state
        return snapshot

    def restore(self) -> int:
        """Puts the values back; returns how many tpu tensors could not get theirs back."""
        lost = _C.restore_snapshot(self.values)
        if self.host:
            with torch.no_grad():
                torch._foreach_copy_(self.host, self.host_copies)
        state = self.optimizer.state
        for p, entries in self.state.items():
            if entries is None:
                state.pop(p, None)
            else:
                state[p].clear()
                state[p].update(entries)
        return lost


# ---------------------------------------------------------------------------------------
# Optimizer steps (public hooks, not patches).


def _register_optimizer_hooks():
    # The end of an optimizer step is where a training step's graph ends: run it now, without
    # waiting for it, so the next step is traced while this one computes.
    def flush_after_step(optimizer, args, kwargs):
        if _C.get_mode() != "fused" or getattr(_steps, "depth", 0) > 1:
            return
        for group in optimizer.param_groups:
            for param in group["params"]:
                if param.device.type == "tpu":
                    _C.sync(False, "optimizer_step")
                    return

    from torch.optim.optimizer import register_optimizer_step_post_hook

    register_optimizer_step_post_hook(flush_after_step)


# ---------------------------------------------------------------------------------------
# torch.compile's AOTAutograd cache in torchtpu's private folder.


@patch("compile cache", when="torch.compile", targets=(
    "torch._functorch._aot_autograd.autograd_cache.autograd_cache_key",
    "torch._functorch._aot_autograd.autograd_cache.AOTAutogradCache.iterate_over_candidates",
    "torch._functorch._aot_autograd.autograd_cache.AOTAutogradCache._write_to_local_cache"))
def _patch_compile_cache():
    # The tpu backend caches AOTAutograd's results with PyTorch's own AOTAutogradCache
    # (torchtpu/_compile_cache.py), but its local entries must live in torchtpu's private,
    # keyed cache folder, not in Inductor's shared /tmp one: while a tpu backend call caches
    # (on its thread), the cache reads and writes them there; any other call is untouched.
    from torch._functorch._aot_autograd import autograd_cache
    from torch._functorch._aot_autograd.autograd_cache import AOTAutogradCache

    from torchtpu import _compile_cache

    # torch 2.11 builds the fx config in try_load and passes it: (gm, example_inputs, config,
    # fx_config); 2.12 and later pass (mod, example_inputs, config, compiler_config_extra), and
    # 2.14 and later add act_input_paths, which AOTAutogradCacheDetails takes as well.
    own_key = getattr(autograd_cache, "autograd_cache_key", None)
    takes_fx_config = own_key is not None and "fx_config" in inspect.signature(own_key).parameters
    key = checked("compile cache", autograd_cache, "autograd_cache_key",
                  params=("gm", "example_inputs", "config", "fx_config") if takes_fx_config else
                  ("mod", "example_inputs", "config", "compiler_config_extra"))
    checked("compile cache", AOTAutogradCache, "try_load",
            reads=("autograd_cache_key",) if takes_fx_config else ("autograd_cache_key", "create_fx_config"))
    # 2.13 and later compute Inductor's part of the key in _init_fx_graph_hash_details, which
    # _compile_cache's details class leaves out; 2.11 and 2.12 compute it in __init__ (their keys
    # then cost an Inductor import, and stay correct).
    if hasattr(autograd_cache.AOTAutogradCacheDetails, "_init_fx_graph_hash_details"):
        checked("compile cache", autograd_cache.AOTAutogradCacheDetails, "__init__",
                reads=("_init_fx_graph_hash_details",))
    candidates = checked("compile cache", AOTAutogradCache, "iterate_over_candidates",
                         params=("local", "remote_cache", "key"))
    write = checked("compile cache", AOTAutogradCache, "_write_to_local_cache", params=("key", "content"))
    checked("compile cache", AOTAutogradCache, "find_guarded_entry", reads=("iterate_over_candidates",))
    checked("compile cache", AOTAutogradCache, "save", reads=("_write_to_local_cache",))

    @functools.wraps(key)
    def autograd_cache_key(mod, example_inputs, config, extra=None, *details):
        # Without Inductor's part, whose computation imports all of Inductor (see cache_key).
        if not _compile_cache.active():
            return key(mod, example_inputs, config, extra, *details)
        gm = mod.gm if isinstance(mod, torch._dynamo.utils.GmWrapper) else mod
        fx_config = extra if takes_fx_config else autograd_cache.create_fx_config(extra)
        return _compile_cache.cache_key(gm, example_inputs, config, fx_config, *details), []

    @functools.wraps(candidates)
    def iterate_over_candidates(cls, local, remote_cache, key):
        if _compile_cache.active():
            return _compile_cache.load_candidates(key)
        return candidates(local, remote_cache, key)

    @functools.wraps(write)
    def _write_to_local_cache(key, content):
        if _compile_cache.active():
            return _compile_cache.store(key, content)
        return write(key, content)

    _replace(autograd_cache, "autograd_cache_key", autograd_cache_key)
    _replace(AOTAutogradCache, "iterate_over_candidates", iterate_over_candidates)
    _replace(AOTAutogradCache, "_write_to_local_cache", _write_to_local_cache)


# ---------------------------------------------------------------------------------------
# torch.compile(model) with Inductor (the default backend) on tpu tensors.


@patch("inductor on tpu", targets=("torch._TorchCompileInductorWrapper.__call__",))
def _patch_inductor_on_tpu():
    # Inductor generates code for CPU and CUDA; PyTorch 2.13's takes device "tpu" for Google's
    # torch_tpu (torch.utils._pallas.has_torch_tpu() only checks that torch.tpu exists) and
    # emits Pallas code for a package that is not installed, or crashes. torch.compile builds
    # this wrapper for backend "inductor", by default or by name: a graph whose inputs are on
    # tpu goes to torchtpu's backend instead (said once), so torch.compile(model) works
    # unchanged; graphs on other devices still go to Inductor.
    import warnings
    wrapper = checked("inductor on tpu", torch, "_TorchCompileInductorWrapper")
    original = checked("inductor on tpu", wrapper, "__call__", params=("self", "model_", "inputs_"),
                       reads=("compile_fx",))
    warned = []

    @functools.wraps(original)
    def __call__(self, model_, inputs_, **kwargs):
        if not any(_is_tpu(t) for t in inputs_):
            return original(self, model_, inputs_, **kwargs)
        if not warned:
            warned.append(True)
            warnings.warn("torchtpu: torch.compile with Inductor (the default backend) on tpu tensors compiles "
                          "with torchtpu's backend instead (Inductor generates code for CPU and CUDA only); "
                          "pass backend=\"tpu\" to say so. Inductor's mode and options do not apply.")
        from torchtpu.compiler import tpu_backend
        return tpu_backend(model_, inputs_)

    _replace(wrapper, "__call__", __call__)


def install():
    """Applies every patch installed when torchtpu loads (when="import"), and registers the
    optimizer hooks, once. A failed guard raises PatchError and leaves torch as it was."""
    with _install_lock:
        if getattr(install, "done", False):
            return
        try:
            for module in _REGISTERING_MODULES:
                importlib.import_module(module)
            for name, entry in list(PATCHES.items()):
                if entry.when == "import":
                    apply(name)
        except PatchError:
            _restore()
            raise
        _register_optimizer_hooks()
        install.done = True


def install_lazy(name: str) -> None:
    """Applies one patch that waits for its first use (when != "import"), once."""
    apply(name)
