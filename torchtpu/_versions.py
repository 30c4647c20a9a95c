"""Version guard and loader: picks the compiled glue for the installed torch, or says what to fix.

torchtpu's C++ is two parts (docs/ARCHITECTURE.md, "Build and packaging"): a common library
(engine, lowerings, runtime; no torch, no Python) and a glue extension per torch minor release
(the device layer and the Python module), since torch's C++ ABI changes between minors. They
live in torchtpu/_native/: libtorchtpu_core.so and torch_<major>_<minor>/_C<suffix>, each glue
beside a torch_version file naming the exact release it was compiled against. A wheel carries
one glue per supported minor; a source build carries the one for the torch it was built with.

Loading a glue beside the wrong torch fails with an undefined-symbol error that tells the user
nothing; check_versions() turns every such case into an ImportError that names the versions
and the pip command that fixes it, and load_core() loads the matching glue as torchtpu._C.
This module reads versions from package metadata and imports nothing heavy. setup.py reads
the ranges and extras from this file too (one place for them).
"""
import importlib.machinery
import importlib.metadata
import os
import re
import sys

# torch minor releases torchtpu supports; `make wheel` builds a glue for each (against the
# release named here: any release of a minor has the same C++ ABI). A new minor: docs/ARCHITECTURE.md.
TORCH_RELEASES = ("2.11.0", "2.12.1", "2.13.0", "2.14.1", "2.15.0")
# jax/jaxlib releases the runtime supports (DESIGN.md): 0.10 (pinned for development) to 0.12;
# 0.11 and later need Python 3.12.
JAX_OLDEST = (0, 10)
JAX_NEWEST = (0, 12)
JAX_REQUIREMENT = ">=0.10,<0.13"
# torchtpu's extras -> jax's extra that brings the matching jaxlib and PJRT plugin.
JAX_EXTRAS = {"cpu": "cpu", "cuda": "cuda12", "cuda12": "cuda12", "cuda13": "cuda13", "tpu": "tpu"}
# The installed plugin tells which extra a fix command should name.
_PLUGIN_EXTRAS = (("jax-cuda13-plugin", "cuda13"), ("jax-cuda12-plugin", "cuda12"), ("libtpu", "tpu"))

NATIVE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_native")


def release(version: str) -> tuple[int, int]:
    """(major, minor) of a version string such as '2.13.0+cpu' or '0.10.2'."""
    match = re.match(r"(\d+)\.(\d+)", version)
    if match is None:
        raise ImportError(f"cannot read the version {version!r}")
    return int(match.group(1)), int(match.group(2))


SUPPORTED_TORCH = tuple(release(v) for v in TORCH_RELEASES)


def torch_requirement(minors) -> str:
    """The pip specifier for a set of consecutive torch minors: '==2.13.*' or '>=2.11,<2.16'."""
    minors = sorted(minors)
    (major, oldest), (_, newest) = minors[0], minors[-1]
    if len(minors) == 1:
        return f"=={major}.{oldest}.*"
    if minors != [(major, m) for m in range(oldest, newest + 1)]:
        raise ValueError(f"torch minors {minors} are not consecutive releases of one major")
    return f">={major}.{oldest},<{major}.{newest + 1}"


def _minors_text(minors) -> str:
    minors = sorted(minors)
    names = [f"{a}.{b}" for a, b in minors]
    return names[0] if len(names) == 1 else f"{names[0]} to {names[-1]}"


def installed(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def glue_folder(torch_version: str) -> str:
    return "torch_%d_%d" % release(torch_version)


def built_glues(native_dir: str = NATIVE_DIR) -> dict[tuple[int, int], str]:
    """{(major, minor): the torch release its glue was compiled against} for this Python."""
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    found = {}
    try:
        entries = sorted(os.listdir(native_dir))
    except OSError:
        return found
    for entry in entries:
        match = re.fullmatch(r"torch_(\d+)_(\d+)", entry)
        folder = os.path.join(native_dir, entry)
        if match is None or not os.path.isfile(os.path.join(folder, f"_C{suffix}")):
            continue
        try:
            with open(os.path.join(folder, "torch_version")) as f:
                version = f.read().strip()
        except OSError:
            version = f"{match.group(1)}.{match.group(2)}"
        found[int(match.group(1)), int(match.group(2))] = version
    return found


def glue_path(torch_version: str, native_dir: str = NATIVE_DIR) -> str:
    """The glue extension for this torch and this Python (check_versions() says if it exists)."""
    return os.path.join(native_dir, glue_folder(torch_version), f"_C{importlib.machinery.EXTENSION_SUFFIXES[0]}")


def jax_install_command() -> str:
    extra = next((extra for plugin, extra in _PLUGIN_EXTRAS if installed(plugin)), "cpu")
    return f"pip install 'jax[{extra}]{JAX_REQUIREMENT}'"


def torch_problem(torch_version: str, glues: dict) -> str | None:
    """Why this install cannot run beside torch_version (with the fix), or None."""
    if not glues:
        return ("torchtpu's compiled core is not built (no torchtpu/_native/torch_*/_C"
                f"{importlib.machinery.EXTENSION_SUFFIXES[0]}). In a source checkout run `make build`; "
                "otherwise reinstall it: pip install --force-reinstall <torchtpu wheel or source folder>")
    minor = release(torch_version)
    if minor in glues:
        return None
    fix = f"pip install 'torch{torch_requirement(glues)}'"
    carried = ", ".join(glues[m] for m in sorted(glues))
    if minor not in SUPPORTED_TORCH:
        return (f"torchtpu supports torch {_minors_text(SUPPORTED_TORCH)} "
                f"(torch{torch_requirement(SUPPORTED_TORCH)}), but torch {torch_version} is installed. "
                f"Fix: {fix}"
                + ("" if set(glues) == set(SUPPORTED_TORCH) else f"  (this build carries torch {carried} only)"))
    return (f"this torchtpu was compiled against torch {carried}, but torch {torch_version} is installed "
            f"(torch's C++ ABI changes between minor releases). Fix: {fix}  (or rebuild torchtpu "
            "against this torch: `make build` in a source checkout, or pip install --no-build-isolation <source>)")


def problems(torch_version: str, glues: dict, jax: str | None, jaxlib: str | None,
             jax_required: bool = True) -> list[str]:
    """What keeps this install from loading, each with its fix; empty when all is well. Without
    `jax_required` (the PJRT runtime) a missing jax is no problem, one outside the range is."""
    found = [p for p in [torch_problem(torch_version, glues)] if p]
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
    found = problems(torch.__version__, built_glues(), installed("jax"), installed("jaxlib"), jax_required)
    import torchtpu_autoload

    claimed = torchtpu_autoload.device_claimed_elsewhere()
    if claimed is not None:  # torch_tpu (or another backend) owns PrivateUse1: never register twice
        found.append(torchtpu_autoload.claim_message(claimed))
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


def load_core(torch_version: str):
    """Loads the glue for this torch as torchtpu._C (check_versions() has found it)."""
    if "torchtpu._C" in sys.modules:
        return sys.modules["torchtpu._C"]
    path = glue_path(torch_version)
    # The module keeps its name torchtpu._C wherever its file lies (PyInit__C is found by it).
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "torchtpu._C", path, loader=importlib.machinery.ExtensionFileLoader("torchtpu._C", path))
    module = importlib.util.module_from_spec(spec)
    sys.modules["torchtpu._C"] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules["torchtpu._C"]
        raise
    setattr(sys.modules["torchtpu"], "_C", module)
    return module
