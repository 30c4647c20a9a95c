"""Writes the glue's compiler and linker flags for one torch and this Python; prints its folder.

Usage: python tools/build_flags.py BUILD_DIR [TORCH_DIR]

TORCH_DIR is a torch package folder (an unpacked torch wheel, as `make wheel` uses); without
it, the torch this Python would import. The glue (csrc/device, distributed, python and
jaxlib_runtime.cpp) is built per torch release and Python in BUILD_DIR/glue/<torch>-<python>/,
so the development torch, the wheel's torches and another Python's build keep their own
objects. This script prints that folder and writes its config.mk.

The Makefile runs this before every build, so it must be cheap when nothing changed: it reads
torch's files without importing torch (importing takes seconds, and an unpacked wheel cannot
be imported) and rewrites config.mk only when the fingerprint of torch and Python differs.
The flags reach torch through the link BUILD_DIR/torch/<torch release>, never by its absolute
path: a wheel build (pip's temporary build environment), a source checkout's build and a build
from the sdist then run the same compile commands, so ccache serves them all from the same
entries. The link names no Python: a glue source that includes no Python header (csrc/device)
preprocesses to the same text for every Python, so ccache's preprocessor mode serves the
second Python's glue for a torch release from the first's objects.
"""
import hashlib
import importlib.util
import os
import re
import sys
import sysconfig


def fail(message: str) -> None:
    sys.exit(f"torchtpu build: {message}")


def find_torch_dir() -> str:
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        fail(f"{sys.executable} has no torch; install torch first (pip install -c constraints.txt torch)")
    return os.path.realpath(spec.submodule_search_locations[0])


def torch_version(torch_dir: str) -> str:
    with open(os.path.join(torch_dir, "version.py")) as f:
        match = re.search(r"""^__version__\s*=\s*['"]([^'"]+)['"]""", f.read(), re.M)
    if match is None:
        fail(f"cannot read the torch version in {torch_dir}/version.py")
    return match.group(1)


def uses_cxx11_abi(torch_dir: str) -> bool:
    """libc10 exports std::__cxx11 strings exactly when torch was built with the C++11 ABI."""
    with open(os.path.join(torch_dir, "lib", "libc10.so"), "rb") as f:
        return b"_ZNSt7__cxx11" in f.read()


def fingerprint(torch_dir: str) -> str:
    """Changes when anything the flags depend on changes: torch's build, Python, this script."""
    digest = hashlib.sha256()
    with open(os.path.join(torch_dir, "version.py"), "rb") as f:
        digest.update(f.read())
    with open(__file__, "rb") as f:
        digest.update(f.read())
    digest.update(sys.version.encode())
    digest.update(sysconfig.get_paths()["include"].encode())
    return digest.hexdigest()[:16]


def point_link(link: str, target: str) -> None:
    """Makes `link` a symlink to `target`, replacing it atomically when it points elsewhere."""
    if os.path.islink(link) and os.readlink(link) == target:
        return
    temporary = f"{link}.{os.getpid()}"
    os.symlink(target, temporary)
    os.replace(temporary, link)


def flags(torch_dir: str, torch_link: str, version: str) -> dict:
    if not uses_cxx11_abi(torch_dir):
        # The common library is compiled once with the C++11 ABI (the Makefile's CORE_CXXFLAGS).
        fail(f"torch {version} ({torch_dir}) was built with the pre-C++11 ABI; torchtpu's common "
             "library uses the C++11 ABI, as every torch since 2.7 on PyPI does")
    major, minor = re.match(r"(\d+)\.(\d+)", version).groups()
    # What torch.utils.cpp_extension.include_paths() / library_paths() give for a CPU extension.
    includes = [f"{torch_link}/include", f"{torch_link}/include/torch/csrc/api/include",
                sysconfig.get_paths()["include"]]
    cxxflags = ["-std=c++20", "-fPIC", "-D_GLIBCXX_USE_CXX11_ABI=1",
                "-DTORCH_API_INCLUDE_EXTENSION_H", "-DTORCH_EXTENSION_NAME=_C"]
    cxxflags += [f"-isystem {p}" for p in includes]
    ldflags = [f"-L{torch_link}/lib", "-ltorch", "-ltorch_cpu", "-ltorch_python", "-lc10"]
    return {
        "TORCH_VERSION": version,
        "TORCH_CXXFLAGS": " ".join(cxxflags),
        "TORCH_LDFLAGS": " ".join(ldflags),
        "EXT_SUFFIX": sysconfig.get_config_var("EXT_SUFFIX"),
        # The glue's folder in the package (torchtpu/_native/torch_2_13): one per torch minor.
        "GLUE_FOLDER": f"torch_{major}_{minor}",
    }


def main() -> None:
    if len(sys.argv) not in (2, 3):
        fail("usage: python tools/build_flags.py BUILD_DIR [TORCH_DIR]")
    torch_dir = os.path.realpath(sys.argv[2]) if len(sys.argv) == 3 and sys.argv[2] else find_torch_dir()
    if not os.path.isfile(os.path.join(torch_dir, "version.py")):
        fail(f"{torch_dir} is not a torch package folder (no version.py)")
    version = torch_version(torch_dir)
    glue_dir = os.path.join(sys.argv[1], "glue", f"{version}-{sys.implementation.cache_tag}")
    os.makedirs(glue_dir, exist_ok=True)
    # One link per torch release, shared by every Python's glue (see above); the unpacked
    # wheel and an installed torch of the same release have the same headers.
    torch_link = os.path.join(sys.argv[1], "torch", version)
    os.makedirs(os.path.dirname(torch_link), exist_ok=True)
    point_link(torch_link, torch_dir)
    out = os.path.join(glue_dir, "config.mk")
    stamp = f"# generated by tools/build_flags.py, fingerprint {fingerprint(torch_dir)}\n"
    try:
        with open(out) as f:
            current = f.readline() == stamp
    except OSError:
        current = False
    if not current:
        text = stamp + "".join(f"{key} := {value}\n" for key, value in flags(torch_dir, torch_link, version).items())
        with open(f"{out}.tmp", "w") as f:
            f.write(text)
        os.replace(f"{out}.tmp", out)
    print(glue_dir)


if __name__ == "__main__":
    main()
