"""Entry point for PyTorch's backend autoloading (`import torch` loads torchtpu).

Kept outside the torchtpu package so that a failure (no jax, a bad TORCHTPU_PLATFORM)
becomes a warning here instead of breaking `import torch`; `import torchtpu` raises it.
"""
import warnings


def load():
    try:
        import torchtpu  # noqa: F401
    except Exception as error:  # pragma: no cover - exercised through a subprocess test
        warnings.warn(f"torchtpu was not loaded: {error}", stacklevel=2)
