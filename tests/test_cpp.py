"""Runs the C++ test of the layers below the device (tests/cpp/engine_test.cpp): the
engine and the lowerings built without torch or Python, against a fake runtime. The build
is incremental (ccache), about a minute of CPU from scratch."""
import pathlib
import subprocess

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_engine_and_lowerings_build_and_run_without_torch():
    result = subprocess.run(["make", "--no-print-directory", "-f", "tests/cpp/build.mk", "run"], cwd=ROOT,
                            capture_output=True, text=True, timeout=1200)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert " 0 failed" in result.stdout and "checks" in result.stdout, output
