"""Checks a release wheel (`make wheel`) as auditwheel would, and what is particular to torchtpu.

Usage: python tools/check_wheel.py WHEEL [TORCH_DIR ...]

- The platform tag is a manylinux tag this pip accepts (auditwheel chose it from the symbol
  versions the libraries need).
- It carries the common library once and one glue per supported torch minor for its Python,
  each beside the torch_version it was compiled against; the metadata requires that range.
- Every shared library needs only the system's libraries of the manylinux policy, torch's
  (the glue) and the common library; its RUNPATH points only inside the installation.
- The common library's code is not copied into the glues (no strong symbol in both).
- Given the torch package folders the glues were built against, each glue's undefined
  symbols are defined by its torch, the common library, Python or the system libraries: a
  glue that needs a symbol its torch minor lacks fails here, not on a user's import.
"""
import importlib.util
import os
import re
import subprocess
import sys
import tempfile
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# What the manylinux policies let a wheel take from the system (auditwheel's whitelist, less
# the X11/GL libraries torchtpu has no use for).
SYSTEM_LIBRARIES = {"libc.so.6", "libm.so.6", "libdl.so.2", "libpthread.so.0", "librt.so.1",
                    "libgcc_s.so.1", "libstdc++.so.6", "ld-linux-x86-64.so.2"}
TORCH_LIBRARIES = {"libtorch.so", "libtorch_cpu.so", "libtorch_python.so", "libc10.so"}
CORE = "torchtpu/_native/libtorchtpu_core.so"


def load_versions():
    spec = importlib.util.spec_from_file_location("_versions", os.path.join(ROOT, "torchtpu", "_versions.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run(*command) -> str:
    return subprocess.run(command, capture_output=True, text=True, check=True).stdout


def dynamic_section(path: str) -> tuple[list[str], list[str]]:
    """(NEEDED libraries, RUNPATH/RPATH entries) of an ELF file."""
    text = run("readelf", "-d", "-W", path)
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", text)
    paths = [p for m in re.findall(r"\((?:RUNPATH|RPATH)\)\s+Library (?:run)?path: \[([^\]]*)\]", text)
             for p in m.split(":")]
    return needed, paths


def symbols(path: str, defined: bool) -> dict[str, str]:
    """{name: nm type} of the dynamic symbols an ELF file defines (or leaves undefined)."""
    flag = "--defined-only" if defined else "--undefined-only"
    found = {}
    for line in run("nm", "-D", flag, path).splitlines():
        parts = line.split()
        if len(parts) >= 2:
            found[parts[-1].split("@")[0]] = parts[-2]
    return found


def check(wheel: str, torch_dirs: list[str]) -> list[str]:
    versions = load_versions()
    errors = []
    name = os.path.basename(wheel)
    match = re.fullmatch(r"torchtpu-[^-]+-(cp\d+)-(cp\d+)-(.+)\.whl", name)
    if match is None:
        return [f"{name}: not a torchtpu wheel name with a CPython tag"]
    python_tag, platforms = match.group(1), match.group(3).split(".")
    if not all(p.startswith("manylinux_") for p in platforms):
        errors.append(f"{name}: platform tag {match.group(3)} is not a manylinux tag")
    from packaging import tags

    accepted = {str(t) for t in tags.sys_tags()}
    if not any(f"{python_tag}-{python_tag}-{p}" in accepted for p in platforms) and \
            f"cp{sys.version_info.major}{sys.version_info.minor}" == python_tag:
        errors.append(f"{name}: this pip would not install it (tag not among this interpreter's)")

    with tempfile.TemporaryDirectory() as unpacked:
        with zipfile.ZipFile(wheel) as archive:
            archive.extractall(unpacked)
            names = archive.namelist()
        suffix = f".cpython-{python_tag[2:]}-x86_64-linux-gnu.so"
        glues = {}
        for entry in names:
            m = re.fullmatch(rf"torchtpu/_native/torch_(\d+)_(\d+)/_C{re.escape(suffix)}", entry)
            if m:
                glues[int(m.group(1)), int(m.group(2))] = entry
        if sorted(glues) != sorted(versions.SUPPORTED_TORCH):
            errors.append(f"glues for torch {sorted(glues)}, expected one per supported minor {versions.SUPPORTED_TORCH}")
        libraries = [n for n in names if n.endswith(".so") or ".so." in n]
        if CORE not in libraries or set(libraries) != {CORE, *glues.values()}:
            errors.append(f"shared libraries {sorted(libraries)}: expected the common library and the glues only")
        metadata = next(n for n in names if n.endswith(".dist-info/METADATA"))
        with open(os.path.join(unpacked, metadata)) as f:
            requires = re.findall(r"^Requires-Dist: (torch\S*)", f.read(), re.M)
        from packaging.requirements import Requirement
        from packaging.specifiers import SpecifierSet

        wanted = SpecifierSet(versions.torch_requirement(versions.SUPPORTED_TORCH))
        if [Requirement(r).specifier for r in requires] != [wanted]:
            errors.append(f"metadata requires {requires}, expected torch{wanted}")

        core_path = os.path.join(unpacked, CORE)
        core_defined = symbols(core_path, defined=True) if CORE in names else {}
        core_strong = {s for s, kind in core_defined.items() if kind in "TDBR"}
        for entry in libraries:
            path = os.path.join(unpacked, entry)
            needed, paths = dynamic_section(path)
            allowed = SYSTEM_LIBRARIES if entry == CORE else SYSTEM_LIBRARIES | TORCH_LIBRARIES | {"libtorchtpu_core.so"}
            if set(needed) - allowed:
                errors.append(f"{entry} needs {sorted(set(needed) - allowed)}, which the wheel does not declare")
            if any(not p.startswith("$ORIGIN") for p in paths):
                errors.append(f"{entry} has RUNPATH {paths}: only $ORIGIN-relative paths belong in a wheel")
            if entry != CORE:
                copied = {s for s, kind in symbols(path, defined=True).items() if kind in "TDBR"} & core_strong
                if copied:
                    errors.append(f"{entry} defines {len(copied)} symbols of the common library, e.g. {sorted(copied)[:3]}")

        for torch_dir in torch_dirs:
            with open(os.path.join(torch_dir, "version.py")) as f:
                release = versions.release(re.search(r"__version__\s*=\s*'([^']+)'", f.read()).group(1))
            if release not in glues:
                continue
            provided = set(core_defined)
            for library in TORCH_LIBRARIES:
                provided |= set(symbols(os.path.join(torch_dir, "lib", library), defined=True))
            missing = [s for s, kind in symbols(os.path.join(unpacked, glues[release]), defined=False).items()
                       if s not in provided and kind != "w" and not s.startswith(("Py", "_Py"))
                       and not _system_symbol(s)]
            if missing:
                errors.append(f"the glue for torch {release[0]}.{release[1]} needs {len(missing)} symbols that "
                              f"torch does not define, e.g. {missing[:5]}")
    return errors


_SYSTEM = None


def _system_symbol(symbol: str) -> bool:
    """Defined by one of the system libraries a manylinux wheel may use (found by ldconfig)."""
    global _SYSTEM
    if _SYSTEM is None:
        _SYSTEM = set()
        found = re.findall(r"^\s*(\S+) \(([^)]*)\) => (\S+)$", run("ldconfig", "-p"), re.M)
        for name, kind, path in found:
            if name in SYSTEM_LIBRARIES and "x86-64" in kind:
                _SYSTEM |= set(symbols(os.path.realpath(path), defined=True))
    return symbol in _SYSTEM


def main() -> None:
    if len(sys.argv) < 2:
        sys.exit("usage: python tools/check_wheel.py WHEEL [TORCH_DIR ...]")
    errors = check(sys.argv[1], sys.argv[2:])
    for error in errors:
        print(f"check_wheel: {error}", file=sys.stderr)
    if errors:
        sys.exit(1)
    print(f"check_wheel: {os.path.basename(sys.argv[1])} OK")


if __name__ == "__main__":
    main()
