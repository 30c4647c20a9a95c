"""Packaging: the wheel carries the common library and the glue for its torch and works from
a fresh venv; its metadata pins the torch minor release and the jax range; the loader picks
the glue for the installed torch; a torch or jaxlib it cannot run beside is an ImportError
with the fix, raised before _C loads; `python -m torchtpu` reports.

The wheel is built once per source state (`pip wheel .`, pip's isolated build, as a user
runs it) and kept under build/packaging/wheels/<hash of the sources>. The venv is created
fresh and the wheel installed into it with its dependencies (torch and jax pinned by
constraints.txt, from the local wheel store); it is kept under build/packaging/venvs/<hash
of the constraints and the wheel's requirements>, and a later session with a new wheel
replaces only torchtpu in it, through the same `pip install` (so the requirements are
resolved again). The steps print their seconds (pytest -s shows them).
"""
import hashlib
import importlib.machinery
import os
import re
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
import torch

from torchtpu import _versions

ROOT = Path(__file__).resolve().parents[1]
# Where the torchtpu under test lives (the source tree, or site-packages in `make check-torch-range`).
IMPORT_ROOT = str(Path(_versions.__file__).resolve().parents[1])
CACHE = ROOT / "build" / "packaging"
BUILD_INPUTS = ("csrc", "torchtpu", "torchtpu_autoload.py", "setup.py", "pyproject.toml", "Makefile",
                "MANIFEST.in", "tools/build_flags.py")
GENERATED = ("torch_version", ".so", ".pyc", ".tmp")


def digest(paths) -> str:
    sha = hashlib.sha256()
    for path in paths:
        sha.update(str(path.relative_to(ROOT)).encode())
        sha.update(path.read_bytes())
    return sha.hexdigest()[:16]


def source_files():
    for name in BUILD_INPUTS:
        path = ROOT / name
        candidates = sorted(path.rglob("*")) if path.is_dir() else [path]
        yield from (p for p in candidates if p.is_file() and not p.name.endswith(GENERATED))


def keep_only(folder: Path, name: str) -> Path:
    """folder/name, after removing the folder's other entries (each venv is about 1.3 GB)."""
    folder.mkdir(parents=True, exist_ok=True)
    for entry in folder.iterdir():
        if entry.name != name:
            shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()
    return folder / name


def run(command, seconds, **kwargs):
    start = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, timeout=seconds, **kwargs)
    assert done.returncode == 0, f"{command} failed:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    print(f"\n  [{time.monotonic() - start:.0f} s] {' '.join(map(str, command))[:120]}")
    return done


def clean_env(**extra):
    """The environment of a user outside the source tree: no PYTHONPATH, a private cache."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "TORCHTPU_", "TORCH_DEVICE"))}
    env.update(extra)
    return env


@pytest.fixture(scope="session")
def wheel() -> Path:
    out = keep_only(CACHE / "wheels", digest(source_files()))
    if not list(out.glob("torchtpu-*.whl")):
        staging = out.with_name(out.name + ".tmp")
        shutil.rmtree(staging, ignore_errors=True)
        run([sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "-w", str(staging)], 1800)
        staging.rename(out)
    (found,) = out.glob("torchtpu-*.whl")
    return found


def wheel_metadata(wheel: Path) -> str:
    with zipfile.ZipFile(wheel) as archive:
        return archive.read("torchtpu-0.1.0.dist-info/METADATA").decode()


@pytest.fixture(scope="session")
def venv(wheel, tmp_path_factory) -> Path:
    requires = [line for line in wheel_metadata(wheel).splitlines() if line.startswith("Requires-Dist")]
    key = digest([ROOT / "constraints.txt"]) + hashlib.sha256("\n".join(requires).encode()).hexdigest()[:8]
    path = keep_only(CACHE / "venvs", key)
    python = path / "bin" / "python"
    if not python.exists():
        shutil.rmtree(path, ignore_errors=True)
        run([sys.executable, "-m", "venv", str(path)], 300)
    installed = path / "installed-wheel"
    if not installed.exists() or installed.read_text() != wheel.parent.name:
        elsewhere = dict(cwd=tmp_path_factory.mktemp("install"), env=clean_env())
        run([python, "-m", "pip", "uninstall", "-q", "-y", "torchtpu"], 300, **elsewhere)
        # --no-compile: byte-compiling torch's thousands of files doubles the install time;
        # Python compiles what it imports anyway.
        run([python, "-m", "pip", "install", "-q", "--no-compile", f"{wheel}[cpu]",
             "-c", str(ROOT / "constraints.txt")], 1200, **elsewhere)
        installed.write_text(wheel.parent.name)
    return python


def test_wheel_carries_compiled_core_and_pins(wheel):
    # The build environment's torch is the one pyproject.toml pins: the wheel carries the common
    # library and that minor's glue, and requires that minor.
    pinned = re.search(r'"torch==(\d+)\.(\d+)\.\d+"', (ROOT / "pyproject.toml").read_text()).groups()
    glue = f"torchtpu/_native/torch_{pinned[0]}_{pinned[1]}"
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        built_against = archive.read(f"{glue}/torch_version").decode().strip()
    assert "torchtpu/_native/libtorchtpu_core.so" in names
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]  # pip wheel ran with this Python
    assert {n for n in names if n.endswith(".so")} == {"torchtpu/_native/libtorchtpu_core.so", f"{glue}/_C{suffix}"}
    modules = {str(p.relative_to(ROOT)) for p in (ROOT / "torchtpu").rglob("*.py")}
    assert modules <= set(names), f"not in the wheel: {modules - set(names)}"
    assert "torchtpu_autoload.py" in names
    assert re.search(r"-cp\d+-cp\d+-linux_\w+\.whl$", wheel.name), "a compiled wheel is platform-specific"
    assert built_against.startswith(f"{pinned[0]}.{pinned[1]}.")
    metadata = wheel_metadata(wheel)
    requires = {line.split(": ", 1)[1] for line in metadata.splitlines() if line.startswith("Requires-Dist")}
    assert f"torch=={pinned[0]}.{pinned[1]}.*" in requires
    assert {"jax<0.13,>=0.10", "jaxlib<0.13,>=0.10"} <= requires
    for extra, jax_extra in {"cpu": "cpu", "cuda": "cuda12", "cuda12": "cuda12", "cuda13": "cuda13",
                             "tpu": "tpu"}.items():
        assert f"Provides-Extra: {extra}" in metadata
        assert f'jax[{jax_extra}]<0.13,>=0.10; extra == "{extra}"' in requires


SMOKE = """
import copy, os, sys
import torch                                   # autoloads torchtpu (torch.backends entry point)
assert "torchtpu" in sys.modules, "import torch did not load torchtpu"
import torchtpu
assert torchtpu.__file__.startswith(sys.prefix), torchtpu.__file__   # the venv's site-packages

torch.manual_seed(0)
a, b = torch.randn(8, 16), torch.randn(16, 4)
torch.testing.assert_close((a.to("tpu") @ b.to("tpu")).cpu(), a @ b)

model = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
device_model = copy.deepcopy(model).to("tpu")
for m, x in ((model, a), (device_model, a.to("tpu"))):
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    m(x).square().mean().backward()
    opt.step()
for ref, got in zip(model.parameters(), device_model.parameters()):
    torch.testing.assert_close(got.cpu(), ref, rtol=1e-5, atol=1e-6)
print("smoke ok", torchtpu.platform())
"""


def test_wheel_in_fresh_venv(wheel, venv, tmp_path):
    env = clean_env(TORCHTPU_CACHE_DIR=str(tmp_path / "cache"))
    smoke = run([venv, "-c", SMOKE], 600, cwd=tmp_path, env=env)
    assert "smoke ok cpu" in smoke.stdout

    report = run([venv, "-m", "torchtpu"], 300, cwd=tmp_path, env=env).stdout
    assert "status    OK" in report
    assert "autoload  active" in report
    # The wheel's glue (pip wheel built it against pyproject.toml's torch, whatever torch runs
    # these tests) is the one loaded beside the venv's torch (constraints.txt's).
    with zipfile.ZipFile(wheel) as archive:
        built_against = next(archive.read(n).decode().strip() for n in archive.namelist() if n.endswith("/torch_version"))
    minor = ".".join(built_against.split(".")[:2])
    assert f"  glue      built for torch {built_against}; one for the installed torch {minor}" in report
    assert re.search(r"devices   1: tpu:0 cpu", report)
    assert re.search(r"cache     .*cache \(\d+ entries", report)


def test_version_guard_messages():
    # A source build carries the glue of the torch it was built with.
    built = {(2, 13): "2.13.0+cpu"}
    torch_problem, = _versions.problems("2.12.1", built, "0.10.2", "0.10.2")
    assert "compiled against torch 2.13.0+cpu, but torch 2.12.1 is installed" in torch_problem
    assert "pip install 'torch==2.13.*'" in torch_problem and "make build" in torch_problem
    outside, = _versions.problems("2.10.2", built, "0.10.2", "0.10.2")
    assert outside.startswith("torchtpu supports torch 2.11 to 2.15 (torch>=2.11,<2.16), but torch 2.10.2 is installed")
    assert "Fix: pip install 'torch==2.13.*'  (this build carries torch 2.13.0+cpu only)" in outside

    # The release wheel carries one glue per supported minor: only a torch outside the range fails.
    wheel = {minor: f"{minor[0]}.{minor[1]}.0" for minor in _versions.SUPPORTED_TORCH}
    for torch_version in ("2.11.0", "2.12.1+cu128", "2.13.0+cpu", "2.14.1", "2.15.0"):
        assert _versions.problems(torch_version, wheel, "0.12.0.1", "0.12.0.1") == []
    newer, = _versions.problems("2.16.0", wheel, "0.12.0.1", "0.12.0.1")
    assert newer == ("torchtpu supports torch 2.11 to 2.15 (torch>=2.11,<2.16), but torch 2.16.0 is installed. "
                     "Fix: pip install 'torch>=2.11,<2.16'")

    jaxlib_problem, = _versions.problems("2.13.0", built, "0.10.2", "0.9.1")
    assert "jaxlib>=0.10,<0.13, but jaxlib 0.9.1 is installed" in jaxlib_problem
    assert "pip install 'jax[cpu]>=0.10,<0.13'" in jaxlib_problem
    newer_jax = _versions.problems("2.13.0", built, "0.13.0", "0.13.0")
    assert len(newer_jax) == 2 and "but jax 0.13.0 is installed" in newer_jax[0]

    missing = _versions.problems("2.13.1", built, None, None)
    assert len(missing) == 2 and all("not installed" in p for p in missing)
    assert _versions.problems("2.13.1", built, "0.12.0", "0.12.0") == []
    assert "not built" in _versions.problems("2.13.0", {}, "0.10.2", "0.10.2")[0]


def test_torch_requirement_of_the_glues():
    assert _versions.torch_requirement([(2, 13)]) == "==2.13.*"
    assert _versions.torch_requirement(_versions.SUPPORTED_TORCH) == ">=2.11,<2.16"
    with pytest.raises(ValueError, match="not consecutive"):
        _versions.torch_requirement([(2, 11), (2, 13)])


def test_loader_chooses_the_glue_for_the_torch_version(tmp_path):
    # A wheel's layout: a glue per minor, each with the release it was compiled against; a glue
    # for another Python, or a folder without one, is not counted.
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    for (major, minor), release in {(2, 11): "2.11.0", (2, 12): "2.12.1"}.items():
        folder = tmp_path / f"torch_{major}_{minor}"
        folder.mkdir()
        (folder / f"_C{suffix}").write_bytes(b"")
        (folder / "torch_version").write_text(release + "\n")
    (tmp_path / "torch_2_13").mkdir()
    (tmp_path / "torch_2_13" / "_C.cpython-399-x86_64-linux-gnu.so").write_bytes(b"")
    (tmp_path / "torch_2_14").mkdir()
    glues = _versions.built_glues(str(tmp_path))
    assert glues == {(2, 11): "2.11.0", (2, 12): "2.12.1"}
    assert _versions.glue_path("2.12.0+cu130", str(tmp_path)) == str(tmp_path / "torch_2_12" / f"_C{suffix}")
    assert _versions.glue_path("2.15.0", str(tmp_path)) == str(tmp_path / "torch_2_15" / f"_C{suffix}")
    assert _versions.torch_problem("2.12.0", glues) is None
    assert "compiled against torch 2.11.0, 2.12.1, but torch 2.13.0 is installed" in \
        _versions.torch_problem("2.13.0", glues)
    assert "Fix: pip install 'torch>=2.11,<2.13'" in _versions.torch_problem("2.13.0", glues)

    # This checkout's build: the glue of the torch running the tests, which is what loaded.
    import torchtpu

    assert _versions.release(torch.__version__) in _versions.built_glues()
    assert torchtpu._C.__file__ == _versions.glue_path(torch.__version__)
    assert torchtpu._C.__name__ == "torchtpu._C"


# Before torchtpu is imported, torch claims another minor release (autoload is off, or
# `import torch` would have loaded torchtpu already).
MOCK_TORCH_VERSION = "import torch; torch.__version__ = '2.99.0'\n"


def test_version_guard_raises_before_loading_core():
    code = MOCK_TORCH_VERSION + (
        "import sys\n"
        "try:\n    import torchtpu\nexcept ImportError as error:\n    print('ImportError:', error)\n"
        "assert 'torchtpu._C' not in sys.modules\n")
    env = dict(os.environ, TORCH_DEVICE_BACKEND_AUTOLOAD="0", PYTHONPATH=IMPORT_ROOT)
    out = run([sys.executable, "-c", code], 300, env=env, cwd=IMPORT_ROOT).stdout
    glues = _versions.built_glues()
    assert f"but torch 2.99.0 is installed. Fix: pip install 'torch{_versions.torch_requirement(glues)}'" in out


def test_report_exits_nonzero_with_the_fix(tmp_path):
    (tmp_path / "sitecustomize.py").write_text(MOCK_TORCH_VERSION)
    env = dict(os.environ, TORCH_DEVICE_BACKEND_AUTOLOAD="0", PYTHONPATH=f"{tmp_path}:{IMPORT_ROOT}")
    mismatch = subprocess.run([sys.executable, "-m", "torchtpu"], capture_output=True, text=True,
                              timeout=300, env=env, cwd=tmp_path)
    assert mismatch.returncode == 1, mismatch.stderr
    assert f"torch     {_versions.installed('torch')}" in mismatch.stdout  # as pip sees it
    fix = f"pip install 'torch{_versions.torch_requirement(_versions.built_glues())}'"
    assert "but torch 2.99.0 is installed" in mismatch.stdout and fix in mismatch.stdout
    assert "undefined symbol" not in mismatch.stdout + mismatch.stderr

    env = dict(os.environ, TORCHTPU_PLATFORM="gpu", PYTHONPATH=IMPORT_ROOT)
    bad = subprocess.run([sys.executable, "-m", "torchtpu"], capture_output=True, text=True,
                         timeout=300, env=env, cwd=tmp_path)
    assert bad.returncode == 1, bad.stderr
    assert "platform  not started" in bad.stdout
    assert "TORCHTPU_PLATFORM='gpu' is not a platform; valid platforms are cpu, cuda, tpu" in bad.stdout


def test_report_states_ranges_and_a_plugin_of_another_release(monkeypatch):
    from torchtpu import _report

    releases = {"torch": "2.16.0", "jax": "0.12.0.1", "jaxlib": "0.12.0.1", "jax-cuda12-plugin": "0.11.2"}
    monkeypatch.setattr(_versions, "installed", releases.get)
    problems = []
    text = _report.report(problems, runtime=[])
    assert "torch     2.16.0  (torchtpu supports torch >=2.11,<2.16: 2.11 to 2.15)" in text
    assert "jaxlib    0.12.0.1  (supported >=0.10,<0.13)" in text
    assert "plugin    jax-cuda12-plugin 0.11.2" in text
    assert problems == ["jax-cuda12-plugin 0.11.2 does not match jaxlib 0.12.0.1 (jax loads only its own "
                        "release's plugin). Fix: pip install 'jax[cuda12]==0.12.0.1'"]
    assert "1 problem(s):" in text and "status    OK" not in text


def test_a_jaxlib_newer_than_the_pjrt_plugins_bound_is_refused_for_lapack():
    from torchtpu import _pjrt

    # lammps-jax-pjrt-cpu 0.11.2 declares jax<=0.11.2; jaxlib 0.12's handlers register with it
    # but are never found (measured), so linear algebra under pjrt says why, before compiling.
    requires = ["jax<=0.11.2"]
    assert _pjrt.lapack_handlers_problem("/p/plugin.so", "0.10.2", requires) is None
    assert _pjrt.lapack_handlers_problem("/p/plugin.so", "0.11.2", requires) is None
    assert _pjrt.lapack_handlers_problem("/p/plugin.so", "0.12.0.1", requires) == (
        "torchtpu: the PJRT plugin /p/plugin.so takes the LAPACK handlers of jaxlib 0.11.2 or older (its "
        "metadata: jax<=0.11.2), but jaxlib 0.12.0.1 is installed, so linear algebra cannot run under "
        "TORCHTPU_RUNTIME=pjrt. Fix: pip install 'jax[cpu]<=0.11.2' 'jaxlib<=0.11.2', or use the jaxlib "
        "runtime (unset TORCHTPU_RUNTIME)")
    assert _pjrt.lapack_handlers_problem("/p/plugin.so", "0.12.0.1", ["numpy"]) is None  # no bound declared
    assert _pjrt.handlers_bound(["jax<=0.11.2; python_version >= '3.11'"]) == "0.11.2"
