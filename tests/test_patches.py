"""torchtpu's changes to other projects' code (torchtpu/_patches.py): the registry is the table
in docs/ARCHITECTURE.md, each patch changes exactly what it declares and can be undone, each
guard rejects a torch (or library) that changed what it relies on (simulated here, per
patch), and each works on this torch (behaviour below, or the test named in
COVERED_ELSEWHERE). Also: torch.compile finds the "tpu" backend through the
torch_dynamo_backends entry point alone."""
import copy
import importlib
import importlib.metadata
import inspect
import pathlib
import re
import threading

import pytest
import torch

import torchtpu.compiler  # noqa: F401 - installs the patch that waits for it ("compile cache")
from torchtpu import _C, _patches
from utils import run_python

ROOT = pathlib.Path(__file__).resolve().parent.parent

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
    "fsdp2 free unsharded parameters": "tests/test_distributed.py::test_fsdp2_dtensor_tensor_parallel_checkpoints",
    "process group default backend": "tests/test_distributed.py::test_ddp_matches_single_process_training",
    "accelerate default device":
        "tests/test_huggingface.py::test_accelerator_places_model_batches_and_optimizer_state_on_tpu",
    "safetensors shared tensors": "tests/test_interop.py::test_safetensors_shared_tpu_tensors_like_cpu",
    "safetensors load_file": "tests/test_interop.py::test_safetensors_save_and_load_tpu_tensors",
    "huggingface_hub shared tensors": "tests/test_huggingface.py::test_save_model_and_from_pretrained_round_trip",
    "lightning accelerator connector": "tests/test_lightning.py::test_trainer_on_tpu_matches_cpu",
    "pytorch_lightning accelerator connector":
        "tests/test_lightning.py::test_standalone_pytorch_lightning_gets_the_same_adapter",
    "transformers decode loop": "tests/test_generate.py::test_greedy_tokens_equal_cpu_with_compiles_that_do_not_grow",
    "transformers compile config":
        "tests/test_generate.py::test_inductor_compile_config_uses_the_tpu_backend",
    "transformers deferred stop check":
        "tests/test_generate.py::test_an_early_stop_at_eos_equals_cpu_with_the_stop_check_deferred",
}


def _adapter_args(name):
    """The arguments an integration's patch is installed with (the library module it patches)."""
    modules = {"accelerate default device": "accelerate.state",
               "safetensors shared tensors": "safetensors.torch", "safetensors load_file": "safetensors.torch",
               "huggingface_hub shared tensors": "huggingface_hub.serialization._torch",
               "lightning accelerator connector": "lightning.pytorch.trainer.connectors.accelerator_connector",
               "pytorch_lightning accelerator connector":
                   "pytorch_lightning.trainer.connectors.accelerator_connector",
               "transformers decode loop": "transformers.generation.utils",
               "transformers compile config": "transformers.modeling_utils",
               "transformers deferred stop check": "transformers.generation.utils"}
    if name not in modules:
        return ()
    module = importlib.import_module(modules[name])
    if "lightning" in name:
        root = modules[name].split(".trainer.")[0]
        return module, importlib.import_module(f"{root}.accelerators").Accelerator, root
    return (module,)


# ---------------------------------------------------------------------------------------
# The registry.


def _documented_table():
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    start = text.index("<!-- patches table")
    rows = []
    for line in text[start:].splitlines()[1:]:
        if not line.startswith("|"):
            break
        rows.append(tuple(cell.strip() for cell in line.strip("|").split(" | ")))
    return rows[2:]  # past the header and its rule


def test_the_registry_is_the_table_in_the_architecture_doc():
    expected = [entry.row() for entry in _patches.entries()]
    documented = _documented_table()
    missing = [row for row in expected if row not in documented]
    stale = [row for row in documented if row not in expected]
    assert not missing and not stale, (
        f"docs/ARCHITECTURE.md's table of changes differs from the registry: not documented {missing}, "
        f"documented but not so {stale}; `python -m torchtpu patches` prints the table")
    assert documented == expected


def _python_patch_names():
    _patches.entries()  # imports the modules that register patches
    return list(_patches.PATCHES)


@pytest.mark.parametrize("name", _python_patch_names())
def test_each_python_patch_changes_exactly_its_targets_and_passes_its_guard(monkeypatch, name):
    # The patch's guard runs against the real torch (or library); its changes are recorded
    # instead of made.
    entry = _patches.PATCHES[name]
    args = _adapter_args(name)  # imports the library first: its adapters apply as usual
    changed = []
    monkeypatch.setattr(_patches, "_replace", lambda owner, attribute, new: changed.append(
        _patches._path(owner, attribute)))
    monkeypatch.setattr(_patches, "_library", lambda namespace: _RecordingLibrary(namespace, changed))
    entry.install(*args)
    assert tuple(changed) == entry.targets_here()


class _RecordingLibrary:
    def __init__(self, namespace, changed):
        self.namespace, self.changed = namespace, changed

    def impl(self, name, fn, key):
        self.changed.append(f"{self.namespace}::{name}")


def test_every_kernel_entry_is_in_place_and_lists_its_ops():
    kernels = _C.kernel_overrides()
    assert [k["name"] for k in kernels] == [e.name for e in _patches.kernel_entries()]
    for k in kernels:
        assert k["active"] and k["ops"], k["name"]
        for op in k["ops"]:
            assert torch._C._dispatch_has_kernel_for_dispatch_key(op, k["key"]), (k["name"], op)
            assert "kernel_overrides.cpp" in torch._C._dispatch_dump(op), (k["name"], op)


@pytest.mark.parametrize("name", _python_patch_names())
def test_each_python_patch_can_be_undone_and_installed_again(name):
    entry = _patches.PATCHES[name]
    was_installed = _patches.installed(name)
    args = _adapter_args(name)
    _patches.apply(name, *args)
    try:
        originals = {target: _plain(_patches._originals[key]) for target, key in _target_keys(entry).items()}
        assert all(_is_patched(value) for value in _current(entry).values()), name
        _patches.restore(name)
        assert not _patches.installed(name)
        for target, value in _current(entry).items():
            assert value is originals.get(target, False), f"{name}: {target} is not its own after restore"
        _patches.apply(name, *args)
        assert _patches.installed(name) and all(_is_patched(value) for value in _current(entry).values())
    finally:
        if not was_installed:
            _patches.restore(name)


def _target_keys(entry):
    """target -> its (owner, attribute) key of _patches._originals (attribute targets only)."""
    return {_patches._path(owner, attribute): (owner, attribute) for owner, attribute in _patches._originals
            if _patches._path(owner, attribute) in entry.targets_here()}


def _plain(value):
    """A function as set on its owner, whatever wraps it there (static/class method, property)."""
    if isinstance(value, (staticmethod, classmethod)) or hasattr(value, "__self__") and isinstance(
            value.__self__, type):
        return value.__func__
    return value.fget if isinstance(value, property) else value


def _current(entry):
    """target -> what is there now: the attribute's function, or (kernel targets) False when
    the op has no Functionalize kernel."""
    values = {}
    for target in entry.targets_here():
        if "::" in target:
            values[target] = torch._C._dispatch_has_kernel_for_dispatch_key(target, "Functionalize")
            continue
        owner, attribute = _owner_of(target)
        values[target] = _plain(inspect.getattr_static(owner, attribute))
    return values


def _owner_of(target):
    parts = target.split(".")
    for split in range(len(parts) - 1, 0, -1):
        try:
            owner = importlib.import_module(".".join(parts[:split]))
        except ImportError:
            continue
        for part in parts[split:-1]:
            owner = getattr(owner, part)
        return owner, parts[-1]
    raise LookupError(target)


def _is_patched(value):
    return value is True or hasattr(value, "__wrapped__")


def test_a_kernel_guard_names_the_override_and_what_changed():
    cases = [("aten::no_such_op", "Meta", True, "does not exist"),
             ("aten::sin", "Functionalize", True, "has no Functionalize kernel of PyTorch's to replace"),
             ("aten::add_.Tensor", "Meta", False, "has a Meta kernel of PyTorch's already")]
    for op, key, replaces, complaint in cases:
        with pytest.raises(RuntimeError) as error:
            _C.check_kernel_override("an override", op, key, replaces)
        message = str(error.value)
        assert f"torchtpu kernel override 'an override': {op} {complaint}" in message, message
        assert "in torch 2." in message and "requirements.txt" in message


def test_a_torch_whose_kernels_changed_fails_the_import_and_keeps_none_of_torchtpus():
    # A torch that has a Functionalize kernel for record_stream where torchtpu adds one.
    result = run_python("""
        import torch
        library = torch.library.Library("aten", "IMPL")
        library.impl("record_stream", lambda self, stream: None, "Functionalize")
        try:
            import torchtpu
        except Exception as error:
            print("ERROR", type(error).__name__, error)
        print("TO_COPY", "kernel_overrides.cpp" in torch._C._dispatch_dump("aten::_to_copy"))
    """, timeout=300, TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    assert result.returncode == 0, result.stderr[-3000:]
    assert ("ERROR ImportError torchtpu kernel override 'functionalize record_stream': aten::record_stream has a "
            "Functionalize kernel of PyTorch's already") in result.stdout, result.stdout
    assert "TO_COPY False" in result.stdout  # the entry registered before it is gone too


def test_the_command_lists_every_entry_and_a_kernel_entry_can_be_undone():
    result = run_python("""
        import runpy, sys, torch
        sys.argv = ["torchtpu", "patches"]
        try:
            runpy.run_module("torchtpu", run_name="__main__")  # python -m torchtpu patches
        except SystemExit as exit:
            print("EXIT", exit.code)
        from torchtpu import _patches
        def meta_line():
            return [l for l in torch._C._dispatch_dump("aten::add_.Tensor").splitlines() if l.startswith("Meta:")][0]
        print("BEFORE", "kernel_overrides.cpp" in meta_line(), _patches.installed("meta add_ sub_"))
        _patches.restore("meta add_ sub_")
        print("AFTER", "kernel_overrides.cpp" in meta_line(), "_meta_registrations.py" in meta_line(),
              _patches.installed("meta add_ sub_"))
        x = torch.ones(3, device="tpu")
        x.add_(torch.ones(3, device="tpu"), alpha=2)  # PyTorch's own meta kernel checks it now
        print("VALUE", x.cpu().tolist())
    """, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    for entry in _patches.entries():
        assert f"| {entry.name} | {entry.kind} | {entry.when} |" in result.stdout
    assert "| functional check | torch attribute | import | `torch._is_functional_tensor` | installed |" \
        in result.stdout
    assert "| compile cache | torch attribute | torch.compile |" in result.stdout
    assert "EXIT 0" in result.stdout
    assert "BEFORE True True" in result.stdout
    assert "AFTER False True False" in result.stdout
    assert "VALUE [3.0, 3.0, 3.0]" in result.stdout


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
    from torch.distributed import distributed_c10d
    from torch.distributed.fsdp._fully_shard._fsdp_param import FSDPParam
    import torch._tensor_str as tensor_str
    import accelerate.state
    import huggingface_hub.serialization._torch as hub_torch
    import lightning.pytorch.trainer.connectors.accelerator_connector as lightning_connector
    import safetensors.torch
    import transformers.generation.utils as generation_utils
    import transformers.modeling_utils as modeling_utils

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
        ("fsdp2 storage identity", torch.UntypedStorage, "data_ptr", None, "does not exist"),
        ("fsdp2 free unsharded parameters", FSDPParam, "free_unsharded_param", _broken, "takes"),
        ("process group default backend", distributed_c10d, "_new_process_group_helper", _other_signature, "takes"),
        ("accelerate default device", accelerate.state.PartialState, "default_device", _broken, "not a property"),
        ("safetensors shared tensors", safetensors.torch, "_end_ptr", None, "does not exist"),
        ("safetensors load_file", safetensors.torch, "load_file", _other_signature, "takes"),
        ("huggingface_hub shared tensors", hub_torch, "storage_ptr", _other_signature, "takes"),
        ("lightning accelerator connector", lightning_connector._AcceleratorConnector, "_choose_strategy", None,
         "does not exist"),
        ("transformers decode loop", generation_utils.GenerationMixin, "_sample", _other_signature, "takes"),
        ("transformers compile config", modeling_utils.PreTrainedModel, "get_compiled_call", None, "does not exist"),
        ("transformers deferred stop check", generation_utils.DeferredStopCheck, "__init__", _broken,
         "takes"),
    ]


@pytest.mark.parametrize("index", range(29))
def test_a_changed_torch_internal_fails_its_patch_loudly(monkeypatch, index):
    cases = _changed_torch()
    assert len(cases) == 29
    name, owner, attribute, changed, complaint = cases[index]
    if (owner, attribute) in _patches._originals:  # patched already: the guard checks the project's own
        monkeypatch.setitem(_patches._originals, (owner, attribute), changed)
    else:
        monkeypatch.setattr(owner, attribute, changed)
    entry = _patches.PATCHES[name]
    before = _patched_now()
    with pytest.raises(_patches.PatchError) as error:
        entry.install(*_adapter_args(name))
    message = str(error.value)
    assert f"torchtpu patch '{name}'" in message and f".{attribute} " in message and complaint in message
    library = importlib.import_module(entry.library)
    assert f"{entry.library} {library.__version__}" in message and entry.source in message
    assert _patched_now() == before  # a failed guard changes nothing


def _patched_now():
    return {(owner, attribute): getattr(owner, attribute) for owner, attribute in _patches._originals}


def test_every_patch_has_a_guard_test_or_guards_nothing_it_reads():
    guarded = {case[0] for case in _changed_torch()}
    assert set(_patches.PATCHES) - guarded == {"pytorch_lightning accelerator connector", "fsdp2 copy-out kernels"}


def test_fsdp2_copy_out_kernels_guard_against_a_torch_that_has_its_own(monkeypatch):
    real = torch._C._dispatch_has_kernel_for_dispatch_key
    monkeypatch.setattr(torch._C, "_dispatch_has_kernel_for_dispatch_key",
                        lambda op, key: op == "fsdp::chunk_cat" or real(op, key))
    with pytest.raises(_patches.PatchError, match="torchtpu patch 'fsdp2 copy-out kernels': fsdp::chunk_cat has a "
                                                  "Functionalize kernel of PyTorch's already in torch 2"):
        _patches.apply("fsdp2 copy-out kernels")
    assert not _patches.installed("fsdp2 copy-out kernels")


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
