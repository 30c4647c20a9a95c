"""torchtpu's patches of PyTorch internals (torchtpu/_patches.py): each one's guard rejects a
torch that changed what it relies on (simulated here, per patch), and each one works on this
torch (behaviour below, or the test named in COVERED_ELSEWHERE). Also: torch.compile finds
the "tpu" backend through the torch_dynamo_backends entry point alone."""
import copy
import importlib.metadata
import threading

import pytest
import torch

import torchtpu.compiler  # noqa: F401 - installs the patch that waits for it ("compile cache")
from torchtpu import _patches
from utils import run_python

# Patches whose behaviour another test file shows.
COVERED_ELSEWHERE = {
    "printing": "tests/test_device.py::test_print_shows_device_and_values",
    "loading": "tests/test_device.py::test_save_and_load",
    "module.to": "tests/test_device.py::test_model_to_keeps_tied_weights",
    "inference mode": "tests/test_device.py::test_inference_mode_runs_models_like_no_grad",
    "optimizer step": "tests/test_reliability.py::test_a_failed_optimizer_step_is_undone",
    "storage resize": "tests/test_storage_resize.py::test_free_and_reallocate_like_cpu",
    "compile cache": "tests/test_compile_cache.py::test_a_warm_process_skips_aot_autograd_and_trains_the_same",
    "inductor on tpu": "tests/test_compile.py::test_compile_with_inductor_on_tpu_trains_with_the_tpu_backend",
}


def _patched_now():
    return {(owner, attribute): getattr(owner, attribute) for owner, attribute in _patches._originals}


def test_every_torch_internal_is_patched_in_one_place():
    assert list(_patches.PATCHES) == ["functional check", "printing", "saving", "loading", "module.to",
                                      "inference mode", "fakeification", "storage resize", "optimizer step",
                                      "compile cache", "inductor on tpu"]
    assert _patches.LAZY == {"compile cache"}
    from torch._functorch._aot_autograd import autograd_cache
    from torch._subclasses import meta_utils
    import torch._tensor_str as tensor_str

    inference_mode = torch.autograd.grad_mode.inference_mode
    cache = autograd_cache.AOTAutogradCache
    assert set(_patches._originals) == {  # fourteen torch internals (two methods of two classes)
        (torch, "_is_functional_tensor"), (tensor_str, "_tensor_str"), (tensor_str, "_str"),
        (torch._C, "_has_storage"), (torch, "load"), (torch.nn.Module, "_apply"),
        (inference_mode, "__enter__"), (inference_mode, "__exit__"),
        (meta_utils.MetaTensorDescriber, "describe_tensor"), (torch.UntypedStorage, "resize_"),
        (torch.optim.Optimizer, "profile_hook_step"),
        (autograd_cache, "autograd_cache_key"), (cache, "iterate_over_candidates"), (cache, "_write_to_local_cache"),
        (torch._TorchCompileInductorWrapper, "__call__")}
    for (owner, attribute), original in _patches._originals.items():
        assert getattr(owner, attribute).__wrapped__ == original  # == : a class method is bound anew


def test_every_patch_passes_its_guard_on_this_torch(monkeypatch):
    # Each patch's checks run again against torch's own functions; its replacements are
    # recorded instead of made.
    replaced = []
    monkeypatch.setattr(_patches, "_replace", lambda owner, attribute, new: replaced.append((owner, attribute)))
    for name, install in _patches.PATCHES.items():
        count = len(replaced)
        install()
        assert len(replaced) > count, f"patch {name!r} replaced nothing"
    assert sorted(map(repr, replaced)) == sorted(map(repr, _patches._originals))


# ---------------------------------------------------------------------------------------
# Guards: a torch release that changed a target fails loudly, naming the patch and version.


def _broken(*args, **kwargs):  # reads nothing the patches rely on
    return None


def _other_signature(self, something_else):
    return None


def _calls_no_inductor(self, model_, inputs_):
    return None


def _changed_torch():
    from torch._functorch._aot_autograd import autograd_cache
    from torch._subclasses import meta_utils
    import torch._tensor_str as tensor_str

    inference_mode = torch.autograd.grad_mode.inference_mode
    return [  # patch, owner, attribute, what a changed torch has there, the complaint
        ("functional check", torch, "_is_functional_tensor", None, "does not exist"),
        ("printing", tensor_str, "_str", _other_signature, "takes"),
        ("printing", tensor_str, "_str_intern", _broken, "no longer reads _is_functional_tensor"),
        ("saving", torch._C, "_has_storage", None, "does not exist"),
        ("saving", torch.Tensor, "_reduce_ex_internal", _broken, "no longer reads _has_storage"),
        ("loading", torch, "load", _other_signature, "takes"),
        ("module.to", torch.nn.Module, "_apply", _other_signature, "takes"),
        ("inference mode", inference_mode, "__exit__", _other_signature, "takes"),
        ("inference mode", inference_mode, "__init__", _other_signature, "takes"),
        ("fakeification", meta_utils.MetaTensorDescriber, "describe_tensor", _broken, "takes"),
        ("storage resize", torch.UntypedStorage, "resize_", None, "does not exist"),
        ("optimizer step", torch.optim.Optimizer, "profile_hook_step", _other_signature, "takes"),
        ("optimizer step", torch.optim.Optimizer, "_patch_step_function", _broken,
         "no longer reads profile_hook_step"),
        ("compile cache", autograd_cache, "autograd_cache_key", _other_signature, "takes"),
        ("compile cache", autograd_cache.AOTAutogradCache, "save", _broken, "no longer reads _write_to_local_cache"),
        ("compile cache", autograd_cache.AOTAutogradCacheDetails, "__init__", _broken,
         "no longer reads _init_fx_graph_hash_details"),
        ("inductor on tpu", torch._TorchCompileInductorWrapper, "__call__", _other_signature, "takes"),
        ("inductor on tpu", torch._TorchCompileInductorWrapper, "__call__", _calls_no_inductor,
         "no longer reads compile_fx"),
    ]


@pytest.mark.parametrize("index", range(len(_changed_torch())))
def test_a_changed_torch_internal_fails_its_patch_loudly(monkeypatch, index):
    name, owner, attribute, changed, complaint = _changed_torch()[index]
    if (owner, attribute) in _patches._originals:  # patched already: the guard checks torch's own
        monkeypatch.setitem(_patches._originals, (owner, attribute), changed)
    else:
        monkeypatch.setattr(owner, attribute, changed)
    before = _patched_now()
    with pytest.raises(_patches.PatchError) as error:
        _patches.PATCHES[name]()
    message = str(error.value)
    assert f"torchtpu patch '{name}'" in message and f".{attribute} " in message and complaint in message
    assert f"torch {torch.__version__}" in message
    assert _patched_now() == before  # a failed guard changes nothing


# ---------------------------------------------------------------------------------------
# Behaviour of patches not shown elsewhere.


def test_printing_does_not_change_what_other_threads_see():
    t = torch.ones(2, device="tpu")
    assert torch._is_functional_tensor(t)  # a tpu tensor is a functional wrapper inside
    inside, seen_elsewhere = threading.Event(), []
    done = threading.Event()

    def other_thread():
        inside.wait(10)
        seen_elsewhere.append(torch._is_functional_tensor(t))
        done.set()

    thread = threading.Thread(target=other_thread)
    thread.start()
    with _patches.described_as_plain(lambda x: x is t):
        assert not torch._is_functional_tensor(t)
        inside.set()
        done.wait(10)
    thread.join()
    assert seen_elsewhere == [True]
    assert torch._is_functional_tensor(t)


def test_printing_from_several_threads_at_once():
    tensors = [torch.full((2,), float(i), device="tpu") for i in range(4)]
    checks, texts, stop = [], [], threading.Event()

    def print_loop(t):
        for _ in range(20):
            texts.append(repr(t))

    def check_loop():
        while not stop.is_set():
            checks.append(torch._is_functional_tensor(tensors[0]))

    checker = threading.Thread(target=check_loop)
    checker.start()
    printers = [threading.Thread(target=print_loop, args=(t,)) for t in tensors]
    for p in printers:
        p.start()
    for p in printers:
        p.join()
    stop.set()
    checker.join()
    assert checks and all(checks)
    assert len(texts) == 80 and all("device='tpu:0'" in s and "functional" not in s for s in texts)


def test_deepcopy_and_save_go_through_a_host_copy(tmp_path):
    t = torch.arange(4.0, device="tpu") * 3
    assert not torch._C._has_storage(t) and torch._C._has_storage(t.cpu())
    copied = copy.deepcopy(t)
    assert copied.device.type == "tpu" and torch.equal(copied.cpu(), t.cpu())
    torch.save(t, tmp_path / "t.pt")
    assert torch.equal(torch.load(tmp_path / "t.pt", map_location="cpu"), t.cpu())


def test_fakeification_gives_plain_fake_tensors_on_tpu():
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    t = torch.randn(3, 4).to("tpu")
    fake = FakeTensorMode().from_tensor(t)
    assert isinstance(fake, FakeTensor) and fake.device.type == "tpu" and fake.shape == (3, 4)
    assert not torch._is_functional_tensor(fake)
    assert torch._is_functional_tensor(t)  # the real tensor is untouched


def test_covered_elsewhere_names_real_tests():
    import pathlib

    root = pathlib.Path(__file__).parent.parent
    for name, where in COVERED_ELSEWHERE.items():
        assert name in _patches.PATCHES
        path, test = where.split("::")
        assert f"def {test}(" in (root / path).read_text()


# ---------------------------------------------------------------------------------------
# torch.compile(backend="tpu") through the entry point (no import hook of torchtpu's).


def test_the_entry_point_names_the_backend():
    (entry,) = [e for e in importlib.metadata.entry_points(group="torch_dynamo_backends") if e.name == "tpu"]
    assert entry.value == "torchtpu.compiler:tpu_backend"


COMPILE_IN_A_FRESH_PROCESS = """
import sys, torch
{before}
f = torch.compile(lambda a: (a * 2).sin().sum(), backend="tpu")
assert "torchtpu" in sys.modules  # the backend's lookup loaded it, if nothing did before
x = torch.arange(6.0, device="tpu")
print("RESULT", round(f(x).item(), 4), round((x.cpu() * 2).sin().sum().item(), 4))
print("FINDERS", [type(f).__name__ for f in sys.meta_path if "torchtpu" in type(f).__module__])
from torchtpu import integrations
print("WATCHED", sorted(name for name in integrations._ADAPTERS if name.startswith("torch")))
"""


@pytest.mark.parametrize("before, env", [
    ("import torchtpu", {}),
    ("assert 'torchtpu' not in sys.modules", {"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}),
], ids=["import-torchtpu-first", "torchtpu-not-imported"])
def test_compile_finds_the_backend_by_name_in_a_fresh_process(before, env):
    result = run_python(COMPILE_IN_A_FRESH_PROCESS.format(before=before), timeout=300, **env)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = dict(line.split(" ", 1) for line in result.stdout.splitlines() if " " in line)
    got, expected = lines["RESULT"].split()
    assert got == expected
    # The only torchtpu finder left is the integrations' post-import hook for third-party
    # libraries (accelerate, lightning, ...); nothing watches Dynamo's modules any more.
    assert lines["FINDERS"] in ("[]", "['_AdapterFinder']")
    assert lines["WATCHED"] == "[]"


def test_a_torch_torchtpu_cannot_patch_fails_its_import_and_stays_as_it_was():
    result = run_python("""
        import torch
        from torch._subclasses import meta_utils
        meta_utils.MetaTensorDescriber.describe_tensor = lambda self, t: None  # a changed torch
        import torch._tensor_str
        before = (torch._tensor_str._str, torch._is_functional_tensor, torch.load)
        try:
            import torchtpu
        except Exception as error:
            print("ERROR", type(error).__name__, error)
        print("UNCHANGED", before == (torch._tensor_str._str, torch._is_functional_tensor, torch.load),
              torch._C._get_privateuse1_backend_name())
    """, timeout=300, TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "ERROR PatchError torchtpu patch 'fakeification'" in result.stdout
    assert f"in torch {torch.__version__}" in result.stdout
    assert "UNCHANGED True privateuseone" in result.stdout
