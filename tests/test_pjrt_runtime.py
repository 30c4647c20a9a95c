"""The PJRT C-API runtime (TORCHTPU_RUNTIME=pjrt, csrc/runtime/pjrt_runtime.cpp).

The runtime is chosen when torchtpu loads, so what runs on it runs in fresh processes: one
worker (tests/pjrt_checks.py) makes many checks per launch, broken plugins (built from
tests/pjrt_fake_plugin.c) show the start-up errors, and a subset of the suite runs under it so
that both runtimes stay tested. The option lists each platform's client gets are checked here
without a device."""
import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

import utils
from torchtpu import _C, _pjrt, _settings

HERE = pathlib.Path(__file__).resolve().parent
CPU_PLUGIN = _pjrt.candidates("cpu", "")[0][1]


def run_checks(cache_dir):
    result = subprocess.run([sys.executable, str(HERE / "pjrt_checks.py")], capture_output=True, text=True,
                            timeout=600, env={**os.environ, "TORCHTPU_RUNTIME": "pjrt",
                                              "TORCHTPU_CACHE_DIR": str(cache_dir), "TORCHTPU_MODE": "fused"})
    assert result.returncode == 0, result.stdout + result.stderr
    line = next(line for line in result.stdout.splitlines() if line.startswith("PJRT_CHECKS "))
    return json.loads(line[len("PJRT_CHECKS "):]), result.stderr


@pytest.fixture(scope="module")
def checks(tmp_path_factory):
    """The worker's findings: a first run with an empty disk cache, then a second one."""
    cache = tmp_path_factory.mktemp("pjrt_cache")
    first, first_stderr = run_checks(cache)
    second, _ = run_checks(cache)
    return first, second, first_stderr


def test_the_plugin_serves_the_process_and_says_where_it_came_from(checks):
    info = checks[0]["info"]
    assert info["runtime"] == "pjrt" and info["platform"] == "cpu"
    assert info["plugin"] == CPU_PLUGIN and os.path.isfile(info["plugin"])
    major, minor = (int(part) for part in info["pjrt_api_version"].split("."))
    assert major == 0 and minor >= 106, info
    assert info["takes_ffi_handlers"] == "yes"


def test_a_plain_model_trains_like_cpu_without_importing_jax(checks):
    first = checks[0]
    assert first["training_matches"]
    assert first["donated_buffers"] > 0  # the optimizer updates parameters in place
    assert first["jax_imported_by_a_model"] is False
    assert first["int64"] == [2**41, -6]
    assert first["bf16"] == [3.0, 4.5]


def test_launches_take_no_gil(checks):
    # 50 launches from a native thread while the calling thread holds the GIL throughout.
    assert checks[0]["launches_while_gil_held"] == 50


@pytest.mark.jaxlib_only("it checks the jaxlib runtime's own launch path (Python objects under the GIL)")
def test_the_jaxlib_runtime_needs_the_gil_to_launch():
    # The same check under jaxlib: nothing finishes while the GIL is held (so the check can fail).
    import torch

    assert _C.launches_while_gil_held(torch.ones(16, device="tpu"), 5, 1.0) == 0


def test_memory_numbers_and_the_disk_cache(checks):
    first, second, _ = checks
    assert first["memory_allocated"] >= 4 * 1024 * 1024
    assert first["device_stats"] == []  # the CPU plugin keeps no allocator statistics
    assert first["disk_cached_result"] == second["disk_cached_result"] == [3.5 * k - 1 for k in range(7)]
    assert first["disk_cache_hits"] == 0 and second["disk_cache_hits"] >= 1


def test_a_compile_error_carries_the_plugin_message(checks):
    error = checks[0]["compile_error"]
    assert error is not None and "torchtpu_no_such_target" in error, error


def test_jax_interop_is_zero_copy_both_ways(checks):
    first = checks[0]
    assert first["from_jax_to_jax_same_memory"] and first["from_jax_values"]
    assert first["to_jax_int64"] == ["int64", [2**40, 5]]
    assert first["to_jax_twice_same_array"]


def test_spmd_says_it_needs_the_jaxlib_runtime(checks):
    # torchtpu.spmd's Mesh refuses first; a mesh built past that check meets the runtime's refusal.
    assert checks[0]["spmd_mesh_error"].startswith("RuntimeError: torchtpu.spmd needs the jaxlib runtime "
                                                   "(TORCHTPU_RUNTIME=jaxlib"), checks[0]["spmd_mesh_error"]
    runtime_error = checks[0]["spmd_runtime_error"]
    assert runtime_error.startswith("RuntimeError: ") and \
        "torchtpu.spmd needs the jaxlib runtime (TORCHTPU_RUNTIME=jaxlib)" in runtime_error, runtime_error


def test_linalg_runs_through_jaxlibs_lapack_handlers(checks):
    # With a jaxlib newer than the plugin's own bound each raises the error that says so.
    expected = _pjrt.lapack_handlers_problem(CPU_PLUGIN) or True
    assert checks[0]["linalg"] == {"inv": expected, "eigvalsh": expected, "svdvals": expected, "det": expected}


def test_the_plugin_logs_no_info_lines(checks):
    assert "cpu_device_count set via create_options" not in checks[2]


# ---- bad plugins ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fake_plugins(tmp_path_factory):
    folder = tmp_path_factory.mktemp("fake_plugins")
    built = {}
    for variant in ("FAKE_NO_ENTRY", "FAKE_OLD_API", "FAKE_NO_CLIENT"):
        path = folder / f"{variant.lower()}.so"
        subprocess.run(["cc", "-shared", "-fPIC", f"-D{variant}", str(HERE / "pjrt_fake_plugin.c"), "-o", str(path)],
                       check=True, timeout=120)
        built[variant] = str(path)
    return built


def start_with(plugin):
    return utils.run_python("import torch, torchtpu; torch.ones(1, device='tpu')", timeout=300,
                            TORCHTPU_RUNTIME="pjrt", TORCHTPU_PJRT_PLUGIN=plugin, TORCHTPU_PLATFORM="cpu")


@pytest.mark.parametrize("variant, problem", [
    ("FAKE_NO_ENTRY", "is not a PJRT plugin: it exports no GetPjrtApi"),
    ("FAKE_OLD_API", "implements PJRT C API 0.50, and torchtpu needs 0.81 or newer"),
    ("FAKE_NO_CLIENT", "could not create a cpu client (options: cpu_device_count=1): fake plugin: no device here"),
])
def test_a_broken_plugin_is_a_clear_error_naming_it_and_the_fix(fake_plugins, variant, problem):
    result = start_with(fake_plugins[variant])
    assert result.returncode != 0
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("RuntimeError: torchtpu: the PJRT plugin " + fake_plugins[variant]), result.stderr
    assert problem in last and "Fix: set TORCHTPU_PJRT_PLUGIN to a PJRT plugin's shared library" in last, last
    assert _pjrt.CPU_FIX in last


def test_a_missing_plugin_file_is_a_setting_error(tmp_path):
    result = start_with(str(tmp_path / "no_such_plugin.so"))
    assert result.returncode != 0
    assert "ValueError: TORCHTPU_PJRT_PLUGIN=" in result.stderr and "no_such_plugin.so" in result.stderr
    assert "no such file" in result.stderr and _pjrt.CPU_FIX in result.stderr


def test_a_requested_platform_without_its_plugin_names_the_package():
    result = utils.run_python("import torch, torchtpu; torch.ones(1, device='tpu')", timeout=300,
                              TORCHTPU_RUNTIME="pjrt", TORCHTPU_PLATFORM="tpu")
    assert result.returncode != 0
    assert "platform 'tpu' was requested" in result.stderr and "pip install 'jax[tpu]'" in result.stderr


def test_without_jax_a_model_runs_and_jax_features_say_what_is_missing(tmp_path):
    blocker = tmp_path / "jax"
    blocker.mkdir()
    (blocker / "__init__.py").write_text("raise ImportError('No module named jax (test)')\n")
    result = utils.run_python("""
        import torch, torchtpu
        print((torch.ones(3, device="tpu") * 2).sum().item())
        try:
            torchtpu.to_jax(torch.ones(2, device="tpu"))
        except ImportError as error:
            print("ImportError:", error)
    """, timeout=300, TORCHTPU_RUNTIME="pjrt", PYTHONPATH=f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    assert result.returncode == 0, result.stderr
    value, error = result.stdout.splitlines()
    assert value == "6.0" and error.startswith("ImportError: No module named jax (test); torchtpu's JAX interop")
    assert "Fix: pip install 'jax[cpu]" in error


def test_the_runtime_setting_is_checked():
    with pytest.raises(ValueError, match="^TORCHTPU_RUNTIME='xla' is not valid; use one of jaxlib, pjrt"):
        _settings.read({"TORCHTPU_RUNTIME": "xla"})
    assert _settings.read({"TORCHTPU_RUNTIME": "PJRT"}).runtime == "pjrt"


# ---- which runtime, which plugin, which options (no device needed) ----------------------------


def test_cpu_multi_process_jobs_keep_jaxlib():
    cpu = _settings.read({"TORCHTPU_RUNTIME": "pjrt", "TORCHTPU_PLATFORM": "cpu"})
    assert _pjrt.choose_runtime(cpu, local_world_size=0) == "pjrt"
    assert _pjrt.choose_runtime(cpu, local_world_size=2) == "jaxlib"  # no gloo in the CPU plugins
    assert _pjrt.choose_runtime(_settings.read({"TORCHTPU_RUNTIME": "jaxlib"}), 0) == "jaxlib"


def test_plugins_are_found_by_platform():
    assert _pjrt.candidates("", "") == [("cpu", CPU_PLUGIN, _pjrt.CPU_FIX)]  # no cuda/tpu plugin here
    assert _pjrt.candidates("tpu", "") == [("tpu", "", "pip install 'jax[tpu]'")]
    assert _pjrt.candidates("cuda", "")[0][2] == "pip install 'jax[cuda12]'"
    own = _pjrt.candidates("", "/opt/plugin.so")
    assert own[0][:2] == ("cpu", "/opt/plugin.so")


def test_client_options_per_platform():
    def options(platform, cpu=1, local_rank=0, local_world=0, preallocate=False, fraction=0.0, node=0, nodes=1):
        return _C.pjrt_client_options(platform, cpu, local_rank, local_world, preallocate, fraction, node, nodes)

    assert options("cpu", cpu=4) == ["cpu_device_count=4"]
    # jax and torchtpu share a GPU: no preallocation unless asked, a fraction when given.
    assert options("cuda") == ["preallocate=false"]
    assert options("cuda", preallocate=True, fraction=0.5) == ["preallocate=true", "memory_fraction=0.5"]
    # torchrun on a node with 4 GPUs, rank 2 of a 8-process job: one visible device, NCCL ids
    # exchanged through the key-value store between the job's nodes.
    assert options("cuda", local_rank=2, local_world=4, node=6, nodes=8) == [
        "preallocate=false", "visible_devices=[2]", "node_id=6", "num_nodes=8"]
    assert options("tpu", local_rank=1, local_world=4) == []


def test_gpu_memory_settings_follow_jaxs_variables():
    assert _pjrt.gpu_memory_settings({}) == (False, 0.0)
    assert _pjrt.gpu_memory_settings({"XLA_PYTHON_CLIENT_PREALLOCATE": "true",
                                      "XLA_PYTHON_CLIENT_MEM_FRACTION": ".3"}) == (True, 0.3)
    with pytest.raises(ValueError, match="XLA_PYTHON_CLIENT_MEM_FRACTION='1.5' is not valid"):
        _pjrt.gpu_memory_settings({"XLA_PYTHON_CLIENT_MEM_FRACTION": "1.5"})


def test_compile_options_proto_reads_back_as_xlas():
    from jax._src.lib import xla_client

    for ids, excess in (([0], False), ([3, 1, 2], True)):
        options = xla_client.CompileOptions.ParseFromString(_C.pjrt_compile_options(ids, excess))
        build = options.executable_build_options
        assert build.num_replicas == len(ids) and build.num_partitions == 1
        assert build.device_assignment.replica_count() == len(ids)
        assert build.device_assignment.computation_count() == 1
        assert str(build.device_assignment).endswith("Computation0{" + " ".join(map(str, ids)) + "}}")
        assert sorted(options.env_option_overrides) == [("xla_allow_excess_precision", excess),
                                                        ("xla_cpu_enable_fast_min_max", False),
                                                        ("xla_gpu_enable_fast_min_max", False)]
    # Modules with float16/bfloat16 values on CPU: YNNPACK's fusions off (runtime.h ynn_fusions_off).
    options = xla_client.CompileOptions.ParseFromString(_C.pjrt_compile_options([0], False, no_ynn_fusions=True))
    assert ("xla_cpu_experimental_ynn_fusion_type", "") in options.env_option_overrides


# ---- a subset of the suite under pjrt (the default is jaxlib) ------------------------------

# Chosen to cover what differs between the runtimes: buffers and transfers (smoke), NaN and inf
# handling that depends on XLA's options (special values, cumulative ops; float16/bfloat16
# rounding, which needs YNNPACK's fusions off: runtime.h ynn_fusions_off), JAX interop and the
# LAPACK custom calls (linalg), donation and the optimizer (training).
SUBSET = [
    "tests/test_smoke.py",
    "tests/ops/test_cumulative.py::test_logcumsumexp",
    "tests/ops/test_elementwise.py::test_binary_special_values",
    "tests/ops/test_elementwise.py::test_products_feeding_adds_and_reductions_round_as_eager",
    "tests/test_jax_interop.py",
    "tests/test_spmd.py",  # jaxlib-only: excluded with its reason, its fixtures never start
]
# The LAPACK custom calls, where the plugin takes this jaxlib's handlers (with a newer jaxlib,
# test_linalg_runs_through_jaxlibs_lapack_handlers checks the error instead).
if not _pjrt.lapack_handlers_problem(CPU_PLUGIN):
    SUBSET += ["tests/ops/test_linalg.py::test_solve_inv_det_slogdet", "tests/ops/test_linalg.py::test_eigh_and_svd"]


def test_a_subset_of_the_suite_passes_under_pjrt():
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", *SUBSET],
                            cwd=HERE.parent, capture_output=True, text=True, timeout=1500,
                            env={**os.environ, "TORCHTPU_RUNTIME": "pjrt"})
    summary = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else ""
    assert result.returncode == 0 and " passed" in summary and "failed" not in summary, \
        result.stdout[-4000:] + result.stderr[-2000:]
    # The only exclusions are the jaxlib-only tests (conftest.py's jaxlib_only marker), each with its reason.
    skips = [line for line in result.stdout.splitlines() if line.startswith("SKIPPED")]
    assert skips and all("jaxlib runtime only: single-process SPMD compiles one partitioned executable" in line
                         for line in skips), skips


def test_the_report_names_the_runtime_the_plugin_and_its_origin():
    result = subprocess.run([sys.executable, "-m", "torchtpu"], capture_output=True, text=True, timeout=300,
                            env={**os.environ, "TORCHTPU_RUNTIME": "pjrt"})
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert "runtime   pjrt  (TORCHTPU_RUNTIME=jaxlib|pjrt)" in lines
    assert f"plugin    {CPU_PLUGIN}" in lines
    origin = next(line for line in lines if "PJRT C API" in line)
    assert re.search(r"PJRT C API 0\.\d+, from lammps-jax-pjrt-cpu 0\.11\.2 \(stablehlo_current_version ", origin), origin
