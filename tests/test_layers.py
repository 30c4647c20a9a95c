"""The layers of csrc/ reach one way (docs/ARCHITECTURE.md): device -> engine -> lowering ->
stablehlo -> ir -> base, with runtime beside ir on base. This scans every #include line:
a folder may include only itself and the folders below it, and the folders under the
device layer include no torch or Python header, so the engine and the lowerings build
and run without torch (tests/cpp)."""
import pathlib
import re

import pytest

CSRC = pathlib.Path(__file__).resolve().parent.parent / "csrc"

# Each folder of csrc/ and the project folders its files may include.
BELOW = {
    "base": set(),
    "ir": {"base"},
    "runtime": {"base"},
    "stablehlo": {"ir", "base"},
    "lowering": {"stablehlo", "ir", "base"},
    "engine": {"lowering", "stablehlo", "ir", "runtime", "base"},
    "device": {"engine", "lowering", "stablehlo", "ir", "runtime", "base"},
    # torch.distributed's "tpu" c10d backend: records collectives on device tensors.
    "distributed": {"device", "engine", "lowering", "stablehlo", "ir", "runtime", "base"},
    "python": {"distributed", "device", "engine", "lowering", "stablehlo", "ir", "runtime", "base"},
}
# Folders that speak torch and Python (the PyTorch device, its c10d backend, the extension module).
TORCH_FOLDERS = {"device", "distributed", "python"}
# Files outside those folders allowed to use Python: the one file that calls jaxlib (through
# pybind11) and reads DLPack tensors (the DLPack header ships inside torch as ATen/dlpack.h).
TORCH_FILES = {
    "runtime/jaxlib_runtime.cpp": ("pybind11/", "ATen/dlpack.h"),
}
TORCH_OR_PYTHON = re.compile(r"^(ATen|c10|torch|caffe2|pybind11|Python\.h|frameobject\.h|numpy)\b")
INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]')


def includes():
    """(file relative to csrc, line number, kind '<' or '"', header) for every #include."""
    for path in sorted(CSRC.rglob("*")):
        if path.suffix not in (".h", ".cpp"):
            continue
        rel = path.relative_to(CSRC).as_posix()
        for number, line in enumerate(path.read_text().splitlines(), 1):
            m = INCLUDE.match(line)
            if m:
                yield rel, number, m.group(1), m.group(2)


def violations():
    found = []
    for rel, number, kind, header in includes():
        folder = rel.split("/")[0]
        where = f"csrc/{rel}:{number}: #include {header}"
        if folder not in BELOW:
            found.append(f"{where}: csrc/{folder}/ has no place in the layer table of tests/test_layers.py")
            continue
        if kind == '"':
            target = header.split("/")[0]
            if target not in BELOW:
                found.append(f"{where}: not a csrc/ folder")
            elif target != folder and target not in BELOW[folder]:
                found.append(f"{where}: {folder}/ may not include {target}/ (it is not below it)")
        elif TORCH_OR_PYTHON.match(header) and folder not in TORCH_FOLDERS:
            if not header.startswith(TORCH_FILES.get(rel, ())):
                found.append(f"{where}: {folder}/ must build without torch and Python headers")
    return found


def test_layers_include_only_what_is_below_them():
    assert violations() == []


def test_the_scan_sees_every_folder_and_catches_an_upward_include(tmp_path, monkeypatch):
    # The scan is only worth something if it reads the real tree and flags a violation.
    seen = {rel.split("/")[0] for rel, _, _, _ in includes()}
    assert seen == set(BELOW), seen
    fake = tmp_path / "csrc"
    (fake / "ir").mkdir(parents=True)
    (fake / "ir" / "bad.h").write_text('#include "lowering/registry.h"\n#include <ATen/Tensor.h>\n')
    monkeypatch.setattr(__import__(__name__), "CSRC", fake)
    found = violations()
    assert len(found) == 2 and "may not include lowering/" in found[0] and "without torch" in found[1], found


def test_build_splits_sources_into_common_library_and_glue(tmp_path):
    # tools/sources.mk: a source in a torch-facing folder or including torch/Python itself is
    # glue (built per torch minor); every other one is the common library (built once), so a
    # new torch-free file lands there with no build change.
    import subprocess

    makefile = tmp_path / "print.mk"
    makefile.write_text("include tools/sources.mk\nprint:\n\t@echo $(GLUE_SOURCES)\n\t@echo $(CORE_SOURCES)\n")
    done = subprocess.run(["make", "-s", "-f", str(makefile), "print"], cwd=CSRC.parent, capture_output=True,
                          text=True, timeout=60, check=True)
    glue, core = (set(line.split()) for line in done.stdout.splitlines())
    sources = {p.relative_to(CSRC).as_posix() for p in CSRC.rglob("*.cpp")}
    torch_including = {rel for rel, _, kind, header in includes() if kind == "<" and TORCH_OR_PYTHON.match(header)}
    expected = {rel for rel in sources if rel.split("/")[0] in TORCH_FOLDERS or rel in torch_including}
    assert glue == {f"csrc/{rel}" for rel in expected}
    assert core == {f"csrc/{rel}" for rel in sources - expected}
    assert "csrc/runtime/jaxlib_runtime.cpp" in glue and "csrc/runtime/runtime.cpp" in core
    # The PJRT runtime is torch- and Python-free (built once); its Python bindings are glue.
    assert {"csrc/runtime/pjrt_runtime.cpp", "csrc/runtime/pjrt_plugin.cpp", "csrc/runtime/pjrt_options.cpp"} <= core
    assert "csrc/python/pjrt.cpp" in glue


def sources():
    """(path relative to csrc, text) for every .h and .cpp file."""
    for path in sorted(CSRC.rglob("*")):
        if path.suffix in (".h", ".cpp"):
            yield path.relative_to(CSRC).as_posix(), path.read_text()


def test_every_file_opens_with_its_role():
    # STYLE.md: a file starts with one line on its role; the engine's split by job is read
    # from these lines and from docs/ARCHITECTURE.md's layout.
    assert [rel for rel, text in sources() if not text.startswith("// ")] == []


def test_every_engine_file_is_in_the_architecture_layout():
    # docs/ARCHITECTURE.md lists csrc/engine/ one file per job: a new file gets its line there.
    layout = (CSRC.parent / "docs" / "ARCHITECTURE.md").read_text()
    engine = {rel.split("/")[1].split(".")[0] for rel, _ in sources() if rel.startswith("engine/")}
    assert {name for name in engine if not re.search(rf"\b{name}(\.h)?(\.cpp|/\.cpp)", layout)} == set()


# An op named by text ("stablehlo.add") or a dimension-number attribute spelt by hand.
SPELT_OP = re.compile(r'"(stablehlo|chlo)\.[a-z_]+"|#stablehlo\.(gather|scatter|dot|conv)<')


def test_only_the_stablehlo_folder_spells_ops():
    # Typed emission: lowerings and the engine name ops by Hlo enumerator and dimension numbers
    # by struct (stablehlo/builder.h), so a misspelt op is a compile error, not an XLA parse
    # error for a whole module. Only csrc/stablehlo/ holds the mnemonic table and the printers.
    spelt = [f"csrc/{rel}:{number}" for rel, text in sources() if rel.split("/")[0] in ("lowering", "engine")
             for number, line in enumerate(text.splitlines(), 1) if SPELT_OP.search(line)]
    assert spelt == []
    builder = (CSRC / "stablehlo" / "builder.cpp").read_text()
    assert SPELT_OP.search(builder) and SPELT_OP.search('V s = ctx.emit("stablehlo.add", {a, b}, t);')
