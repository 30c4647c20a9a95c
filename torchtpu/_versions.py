"""Version guard: torch and jax/jaxlib must match this build before torchtpu._C is loaded.

_C is C++ compiled against one torch minor release (its C++ ABI changes between minors) and
calls jaxlib's client, whose API torchtpu supports only for a range of releases. Loading _C
beside the wrong torch fails with an undefined-symbol error that tells the user nothing; this
module turns every such case into an ImportError that names both versions and the pip
command that fixes it. It reads versions from package metadata and imports nothing heavy.
setup.py reads JAX_REQUIREMENT and JAX_EXTRAS from this file too (one place for the range).
"""
import importlib.metadata
import os
import re

# jax/jaxlib releases the runtime supports (DESIGN.md): 0.10 (pinned for development) to 0.12.
JAX_OLDEST = (0, 10)
JAX_NEWEST = (0, 12)
JAX_REQUIREMENT = ">=0.10,<0.13"
# torchtpu's extras -> jax's extra that brings the matching jaxlib and PJRT plugin.
JAX_EXTRAS = {"cpu": "cpu", "cuda": "cuda12", "cuda12": "cuda12", "cuda13": "cuda13", "tpu": "tpu"}
# The installed plugin tells which extra a fix command should name.
_PLUGIN_EXTRAS = (("jax-cuda13-plugin", "cuda13"), ("jax-cuda12-plugin", "cuda12"), ("libtpu", "tpu"))


def release(version: str) -> tuple[int, int]:
    """(major, minor) of a version string such as '2.13.0+cpu' or '0.10.2'."""
    match = re.match(r"(\d+)\.(\d+)", version)
    if match is None:
        raise ImportError(f"cannot read the version {version!r}")
    return int(match.group(1)), int(match.group(2))


def installed(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def built_torch_version() -> str | None:
    """The torch that _C was compiled against, as recorded by the build (_build_info.py)."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_build_info.py")
    try:
        with open(path) as f:
            match = re.search(r'TORCH_VERSION = "([^"]+)"', f.read())
    except OSError:
        return None
    return match.group(1) if match else None


def jax_install_command() -> str:
    extra = next((extra for plugin, extra in _PLUGIN_EXTRAS if installed(plugin)), "cpu")
    return f"pip install 'jax[{extra}]{JAX_REQUIREMENT}'"


def problems(torch_version: str, built: str | None, jax: str | None, jaxlib: str | None,
             jax_required: bool = True) -> list[str]:
    """What keeps this build from loading, each with its fix; empty when all is well. Without
    `jax_required` (the PJRT runtime) a missing jax is no problem, one outside the range is."""
    found = []
    if built is None:
        found.append(
            "torchtpu's compiled core is not built (torchtpu/_build_info.py is missing). In a "
            "source checkout run `make build`; otherwise reinstall it: pip install --force-reinstall "
            "<torchtpu wheel or source folder>")
    elif release(torch_version) != release(built):
        major, minor = release(built)
        found.append(
            f"this torchtpu was compiled against torch {built}, but torch {torch_version} "
            f"is installed (torch's C++ ABI changes between minor releases). Fix: "
            f"pip install 'torch=={major}.{minor}.*'  (or rebuild torchtpu against this torch: "
            f"`make build` in a source checkout, or pip install --no-build-isolation <source>)")
    for name, version in (("jax", jax), ("jaxlib", jaxlib)):
        if version is None:
            if not jax_required:
                continue
            found.append(f"torchtpu needs {name}{JAX_REQUIREMENT}, which is not installed. "
                         f"Fix: {jax_install_command()}")
        elif not JAX_OLDEST <= release(version) <= JAX_NEWEST:
            found.append(
                f"torchtpu supports {name}{JAX_REQUIREMENT}, but {name} {version} is "
                f"installed. Fix: {jax_install_command()}")
    return found


def check_versions() -> None:
    """Raises ImportError, before anything loads _C, when this environment cannot run it."""
    import torch

    # TORCHTPU_RUNTIME=pjrt runs models without jax; JAX interop and linalg import it at first use.
    jax_required = os.environ.get("TORCHTPU_RUNTIME", "").strip().lower() != "pjrt"
    found = problems(torch.__version__, built_torch_version(), installed("jax"), installed("jaxlib"), jax_required)
    if not found and jax_required:
        try:  # installed is not importable: a broken install, or a folder named jax in the way
            import jax  # noqa: F401
            import jaxlib  # noqa: F401
        except ImportError as error:
            found.append(f"torchtpu needs jax and jaxlib, and importing them failed ({error}). "
                         f"Fix: {jax_install_command()}")
    if found:
        from torchtpu._report import exit_if_reporting

        exit_if_reporting(found)
        raise ImportError("\n".join(found))
