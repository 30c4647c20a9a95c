"""Google's TorchTPU (`torch_tpu`) beside torchtpu: both name PrivateUse1 "tpu" and autoload
through torch's entry points. With a stand-in torch_tpu on sys.path (a module and a dist-info
with its entry point, registering the device the way torch_tpu does on a TPU host),
`import torch` still works, torchtpu says once that two packages claim the device and how to
pick one, and the device is registered by one package only, never half by each."""
import os
import subprocess
import sys
import textwrap

import pytest

import torchtpu

IMPORT_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(torchtpu.__file__)))

FAKE_LOADER = '''
"""Stands in for torch_tpu._loader: on a TPU host it renames PrivateUse1 and registers torch.tpu."""
import os
import types

import torch


def load():
    if os.environ.get("FAKE_TPU_HOST") != "1":
        return  # torch_tpu registers nothing on a machine without TPU chips
    torch.utils.rename_privateuse1_backend("tpu")
    module = types.ModuleType("torch.tpu")
    module.owner = "torch_tpu"
    module.is_available = lambda: True
    module.device_count = lambda: 1
    torch._register_device_module("tpu", module)
'''


@pytest.fixture(scope="module")
def fake_torch_tpu(tmp_path_factory):
    root = tmp_path_factory.mktemp("fake_torch_tpu")
    (root / "torch_tpu").mkdir()
    (root / "torch_tpu" / "__init__.py").write_text("")
    (root / "torch_tpu" / "_loader.py").write_text(FAKE_LOADER)
    info = root / "torch_tpu-0.2.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: torch-tpu\nVersion: 0.2.0\n")
    (info / "entry_points.txt").write_text("[torch.backends]\ntorch_tpu = torch_tpu._loader:load\n")
    return root


def run(code: str, root, **env) -> subprocess.CompletedProcess:
    """Runs Python code (or `-m module`) with the stand-in torch_tpu first on sys.path."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCHTPU_AUTOLOAD", "TORCH_DEVICE"))}
    full_env.update(env, PYTHONPATH=f"{root}{os.pathsep}{IMPORT_ROOT}", TORCHTPU_PLATFORM="cpu")
    args = code.split() if code.startswith("-m ") else ["-c", textwrap.dedent(code)]
    return subprocess.run([sys.executable, *args], capture_output=True, text=True,
                          timeout=300, env=full_env, cwd=root)


IMPORT_TORCH = """
    import sys, warnings
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        import torch
    claims = [str(w.message) for w in caught if "Two packages claim" in str(w.message)]
    print("CLAIMS", len(claims))
    for claim in claims:
        print("CLAIM", claim)
"""


def test_torch_tpu_registered_first_keeps_the_device(fake_torch_tpu):
    done = run(IMPORT_TORCH + """
    assert "torchtpu" not in sys.modules and "torchtpu._C" not in sys.modules
    assert torch._C._get_privateuse1_backend_name() == "tpu" and torch.tpu.owner == "torch_tpu"
    try:
        import torchtpu
    except ImportError as error:
        print("IMPORT_ERROR", error)
    assert "torchtpu._C" not in sys.modules and torch.tpu.owner == "torch_tpu"
    """, fake_torch_tpu, FAKE_TPU_HOST="1")
    assert done.returncode == 0, done.stderr
    assert "CLAIMS 1\n" in done.stdout, done.stdout
    claim = done.stdout.split("\nCLAIM ", 1)[1]
    assert 'Two packages claim the "tpu" device: torchtpu and torch_tpu' in claim
    assert f"torch_tpu ({fake_torch_tpu / 'torch_tpu'}) has registered it" in claim
    assert "set TORCHTPU_AUTOLOAD=0" in claim and "pip uninstall torch-tpu" in claim
    assert "IMPORT_ERROR Two packages claim" in done.stdout

    report = run("-m torchtpu", fake_torch_tpu, FAKE_TPU_HOST="1")
    assert report.returncode == 1, report.stderr
    assert "rival     torch_tpu 0.2.0 installed" in report.stdout
    assert "has registered it, so torchtpu is not loaded" in report.stdout


def test_torch_tpu_installed_without_chips_leaves_import_torchtpu_working(fake_torch_tpu):
    done = run(IMPORT_TORCH + """
    assert "torchtpu" not in sys.modules  # autoload steps aside whichever entry point runs first
    import torchtpu
    assert torch.tpu is torchtpu.device_module
    print("VALUE", (torch.ones(2, device="tpu") + 1).cpu().tolist())
    """, fake_torch_tpu)
    assert done.returncode == 0, done.stderr
    assert "CLAIMS 1\n" in done.stdout
    assert "is installed and registers it when it autoloads" in done.stdout
    assert "VALUE [2.0, 2.0]" in done.stdout


def test_autoload_switch_leaves_the_device_to_torch_tpu_silently(fake_torch_tpu):
    done = run(IMPORT_TORCH + """
    assert "torchtpu" not in sys.modules and torch.tpu.owner == "torch_tpu"
    """, fake_torch_tpu, FAKE_TPU_HOST="1", TORCHTPU_AUTOLOAD="0")
    assert done.returncode == 0, done.stderr
    assert "CLAIMS 0\n" in done.stdout
