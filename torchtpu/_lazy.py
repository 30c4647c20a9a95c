"""Modules imported at their first use: `import torchtpu` and a plain model under the PJRT
runtime need no jax; JAX interop, the JAX-lowered linear algebra and Pallas import it when
they first run."""
import importlib
import types


class LazyModule(types.ModuleType):
    """Stands for the module `name`, which is imported at the first attribute read."""

    def __getattr__(self, attribute):
        return getattr(importlib.import_module(self.__name__), attribute)


def module(name: str) -> types.ModuleType:
    return LazyModule(name)
