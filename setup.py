"""Build hook for pip (PEP 517 through setuptools): compiles torchtpu's C++ with the Makefile.

The compile rules live in the Makefile only (`make extension`: incremental, ccache when
present, sources found by glob); this file hands it the staging folder of the wheel or of the
editable install and the torch to compile the glue against. One glue extension per torch:
by default the build environment's torch (the wheel then requires that minor release);
`make wheel` sets TORCHTPU_TORCH_DIRS to unpacked torch wheels, one per supported minor, and
the wheel requires that range.
"""
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


versions = load_versions()


def torch_dirs() -> list[str]:
    """The torch package folders to compile a glue against (found without importing torch)."""
    listed = os.environ.get("TORCHTPU_TORCH_DIRS")
    if listed:
        return [d for d in listed.split(os.pathsep) if d]
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("building torchtpu needs torch installed in the build environment "
                 "(pip installs it from pyproject.toml's build requirements; with "
                 "--no-build-isolation, install it first: pip install -c constraints.txt torch)")
    return [os.path.realpath(spec.submodule_search_locations[0])]


def torch_version(torch_dir: str) -> str:
    namespace = {}
    with open(os.path.join(torch_dir, "version.py")) as f:
        exec(f.read(), namespace)
    return namespace["__version__"]


# One extension per torch: the glue module torchtpu._native.torch_<major>_<minor>._C.
GLUES = {f"torchtpu._native.{versions.glue_folder(torch_version(d))}._C": d for d in torch_dirs()}
if len(GLUES) != len(torch_dirs()):
    sys.exit(f"building torchtpu: two torch folders of the same minor release in {torch_dirs()}")


class MakeExtension(build_ext):
    """Runs `make extension` per glue, writing the common library and the glue into the wheel's
    staging folder (or, for an editable install, into the source tree's torchtpu/_native)."""

    def run(self):
        # setuptools keeps its staging folder (build/lib.*) between builds: glues an earlier
        # build left there (another torch's, `make wheel`'s) must not ride along in this wheel.
        if not self.editable_mode:
            shutil.rmtree(os.path.join(os.path.abspath(self.build_lib), "torchtpu", "_native"), ignore_errors=True)
        super().run()

    def build_extension(self, ext):
        if self.editable_mode:
            package_dir = os.path.join(ROOT, "torchtpu")
        else:  # .../torchtpu/_native/torch_2_13/_C<suffix> -> .../torchtpu
            package_dir = os.path.dirname(os.path.dirname(os.path.dirname(
                os.path.abspath(self.get_ext_fullpath(ext.name)))))
        jobs = os.environ.get("MAX_JOBS") or str(os.cpu_count() or 1)
        subprocess.run(["make", "--no-print-directory", "extension", f"PY={sys.executable}",
                        f"PACKAGE_DIR={package_dir}", f"TORCH_DIR={GLUES[ext.name]}", f"JOBS={jobs}"],
                       cwd=ROOT, check=True)

    def copy_extensions_to_source(self):
        pass  # editable installs: build_extension wrote into the source tree already


os.makedirs(os.path.join(ROOT, "build"), exist_ok=True)  # egg_base below must exist
jax = f"jax{versions.JAX_REQUIREMENT}"
setup(
    ext_modules=[Extension(name, sources=[]) for name in GLUES],
    cmdclass={"build_ext": MakeExtension},
    # Keeps torchtpu.egg-info out of the source root, where PYTHONPATH=<checkout> would
    # make pip and importlib.metadata take it for an installed torchtpu.
    options={"egg_info": {"egg_base": "build"}},
    # The torch minors the glues were compiled against (torch's C++ ABI changes between minors).
    install_requires=[f"torch{versions.torch_requirement(versions.release(torch_version(d)) for d in GLUES.values())}",
                      jax, f"jaxlib{versions.JAX_REQUIREMENT}"],
    extras_require={extra: [f"jax[{jax_extra}]{versions.JAX_REQUIREMENT}"]
                    for extra, jax_extra in versions.JAX_EXTRAS.items()},
)
