"""Adapters that let libraries built for CUDA use tpu unchanged, one module per library.

Each adapter applies when its library is imported (or at once, if it already was), so
importing torch stays as cheap as before. An adapter that has to patch a library checks the
library's version first and refuses an unchecked one with an error naming the versions it
knows (TORCHTPU_INTEGRATIONS=off turns every library adapter off). Each change to a
library's code is a guarded, restorable entry of torchtpu/_patches.py's registry
(`python -m torchtpu patches` lists them). Fixes of torch's own code paths live in the
device layer (csrc/device) and torchtpu/_patches.py.
"""
import importlib
import importlib.abc
import os
import re
import sys
import threading

# module whose import triggers the adapter -> adapter module (its install(module) runs then)
_ADAPTERS = {
    "safetensors.torch": "torchtpu.integrations.safetensors",
    "huggingface_hub.serialization._torch": "torchtpu.integrations.huggingface_hub",
    "accelerate.state": "torchtpu.integrations.accelerate",
    "lightning.pytorch.trainer.connectors.accelerator_connector": "torchtpu.integrations.lightning",
    "pytorch_lightning.trainer.connectors.accelerator_connector": "torchtpu.integrations.lightning",
    "transformers.generation.utils": "torchtpu.integrations.transformers",
    "transformers.modeling_utils": "torchtpu.integrations.transformers",
}

_SETTING = "TORCHTPU_INTEGRATIONS"
_applied: set = set()
_lock = threading.RLock()


class UnsupportedVersionError(RuntimeError):
    """A library's version is outside the range an adapter was checked with."""


def check_version(library: str, version: str, supported: tuple, tested: str) -> None:
    """Raises UnsupportedVersionError unless supported[0] <= version < supported[1]."""
    low, high = supported
    if not _release(low) <= _release(version) < _release(high):
        raise UnsupportedVersionError(
            f"torchtpu's {library} adapter patches {library} internals and was checked with {library} "
            f">={low},<{high} (tested {tested}); found {library} {version}. Install a checked version "
            f"(pip install '{library}>={low},<{high}') or set {_SETTING}=off to run {library} without "
            f"torchtpu's adapters (it will then not place work on tpu by itself)."
        )


def _release(version: str) -> tuple:
    """(major, minor, patch) of a version string ("1.15.0", "2.6.6.post1" -> (2, 6, 6))."""
    numbers = [int(part) for part in re.findall(r"\d+", version.split("+")[0])[:3]]
    return tuple(numbers + [0] * (3 - len(numbers)))


def adapters_enabled() -> bool:
    """Reads TORCHTPU_INTEGRATIONS; torchtpu checks it first thing at start-up."""
    value = os.environ.get(_SETTING, "on").strip().lower() or "on"
    if value not in ("on", "off"):
        raise ValueError(f"{_SETTING}={value!r} is not valid; use 'on' (the default) or 'off'")
    return value == "on"


def _apply(name: str, module) -> None:
    with _lock:
        if name in _applied:
            return
        _applied.add(name)
        try:
            importlib.import_module(_ADAPTERS[name]).install(module)
        except BaseException:
            _applied.discard(name)  # the import fails; trying again must fail the same way
            raise


class _AdapterLoader(importlib.abc.Loader):
    """Runs the real loader, then the adapter for the module it loaded."""

    def __init__(self, name, loader):
        self._name, self._loader = name, loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        # The library sees its own loader, as without the adapter.
        module.__loader__ = module.__spec__.loader = self._loader
        self._loader.exec_module(module)
        _apply(self._name, module)

    def __getattr__(self, attribute):
        return getattr(self._loader, attribute)


class _AdapterFinder(importlib.abc.MetaPathFinder):
    """Finds the modules adapters wait for through the other finders and wraps their loader."""

    def find_spec(self, name, path, target=None):
        if name not in _ADAPTERS or name in _applied:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _AdapterLoader(name, spec.loader)
                return spec
        return None


_finder = _AdapterFinder()


def install() -> None:
    """Applies every library adapter when its library loads."""
    if not adapters_enabled():
        return
    if _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)
    for name in _ADAPTERS:
        if name in sys.modules:
            _apply(name, sys.modules[name])
