"""Build hook for pip (PEP 517 through setuptools): compiles torchtpu._C with the Makefile.

The compile rules live in the Makefile only (`make extension`: incremental, ccache when
present, sources found by glob); this file hands it the staging folder of the wheel or of
the editable install, and pins the torch minor release that _C was compiled against.
"""
import importlib.metadata
import importlib.util
import os
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))


def load_versions():
    """torchtpu/_versions.py without importing the package (that would import torch and _C)."""
    spec = importlib.util.spec_from_file_location("_versions", os.path.join(ROOT, "torchtpu", "_versions.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def torch_requirement() -> str:
    """_C only loads beside the torch minor release it was compiled against (C++ ABI)."""
    try:
        version = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        sys.exit("building torchtpu needs torch installed in the build environment "
                 "(pip installs it from pyproject.toml's build requirements; with "
                 "--no-build-isolation, install it first: pip install -c constraints.txt torch)")
    major, minor = version.split(".")[:2]
    return f"torch=={major}.{minor}.*"


class MakeExtension(build_ext):
    """Runs `make extension`, writing _C and _build_info.py into the wheel's staging folder."""

    def build_extension(self, ext):
        package_dir = os.path.dirname(os.path.abspath(self.get_ext_fullpath(ext.name)))
        jobs = os.environ.get("MAX_JOBS") or str(os.cpu_count() or 1)
        # Objects go to build/ (shared with `make build`) unless TORCHTPU_BUILD_DIR names a
        # folder of their own, as `make check-torch211` does for another torch release.
        build_dir = os.environ.get("TORCHTPU_BUILD_DIR") or "build"
        subprocess.run(["make", "--no-print-directory", "extension", f"PY={sys.executable}",
                        f"BUILD_DIR={build_dir}", f"PACKAGE_DIR={package_dir}", f"JOBS={jobs}"],
                       cwd=ROOT, check=True)

    def copy_extensions_to_source(self):
        # Editable installs: setuptools copies _C into the source package; _build_info.py
        # (read by the version guard) goes with it.
        super().copy_extensions_to_source()
        staged = os.path.join(self.build_lib, "torchtpu", "_build_info.py")
        shutil.copyfile(staged, os.path.join(ROOT, "torchtpu", "_build_info.py"))


versions = load_versions()
os.makedirs(os.path.join(ROOT, "build"), exist_ok=True)  # egg_base below must exist
jax = f"jax{versions.JAX_REQUIREMENT}"
setup(
    ext_modules=[Extension("torchtpu._C", sources=[])],
    cmdclass={"build_ext": MakeExtension},
    # Keeps torchtpu.egg-info out of the source root, where PYTHONPATH=<checkout> would
    # make pip and importlib.metadata take it for an installed torchtpu.
    options={"egg_info": {"egg_base": "build"}},
    install_requires=[torch_requirement(), jax, f"jaxlib{versions.JAX_REQUIREMENT}"],
    extras_require={extra: [f"jax[{jax_extra}]{versions.JAX_REQUIREMENT}"]
                    for extra, jax_extra in versions.JAX_EXTRAS.items()},
)
