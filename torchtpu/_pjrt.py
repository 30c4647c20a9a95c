"""The PJRT runtime's Python side (TORCHTPU_RUNTIME=pjrt, csrc/runtime/pjrt_runtime.cpp):
which plugin serves which platform, which runtime a process gets, and the custom-call
handlers (jaxlib's LAPACK kernels) the CPU plugin needs for the linear algebra JAX lowers.

Plugins are found by their installed packages' files, without importing anything:
    cpu   lammps-jax-pjrt-cpu   XLA's CPU plugin, built from jaxlib 0.11.2's XLA (PJRT API 0.115)
    cuda  jax-cuda13-pjrt / jax-cuda12-pjrt   jax's CUDA plugins
    tpu   libtpu
Why that CPU plugin: docs/ARCHITECTURE.md, "Runtimes".
"""
from __future__ import annotations

import importlib.util
import os
import threading

# platform -> [(importable package holding the plugin, its file, pip command that installs it)]
PLUGINS = {
    "tpu": [("libtpu", "libtpu.so", "pip install 'jax[tpu]'")],
    "cuda": [("jax_plugins.xla_cuda13", "xla_cuda_plugin.so", "pip install 'jax[cuda13]'"),
             ("jax_plugins.xla_cuda12", "xla_cuda_plugin.so", "pip install 'jax[cuda12]'")],
    "cpu": [("lammps_jax_pjrt_cpu", "pjrt_c_api_cpu_plugin.so", "pip install 'lammps-jax-pjrt-cpu==0.11.2'")],
}
CPU_FIX = PLUGINS["cpu"][0][2]
PLATFORM_ORDER = ("tpu", "cuda", "cpu")


def plugin_file(package: str, name: str) -> str | None:
    """The plugin file inside an installed package, or None; imports nothing (the package's
    parent, a namespace package such as jax_plugins, is only located)."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    for folder in (spec.submodule_search_locations or []) if spec else []:
        path = os.path.join(folder, name)
        if os.path.isfile(path):
            return path
    return None


def distribution_of(path: str) -> str:
    """'<distribution> <version>' of the installed package that holds the plugin file."""
    import importlib.metadata

    for platform_plugins in PLUGINS.values():
        for package, file, _ in platform_plugins:
            if plugin_file(package, file) == path:
                top = package.split(".")[0]
                for name in importlib.metadata.packages_distributions().get(top, []):
                    files = importlib.metadata.distribution(name).files or []
                    if any(str(f).endswith(package.replace(".", "/") + "/" + file) for f in files):
                        return f"{name} {importlib.metadata.version(name)}"
    return "an unknown package"


def candidates(platform: str, plugin_override: str) -> list[tuple[str, str, str]]:
    """(platform, plugin path, fix command) to try in order. A requested platform gets one
    entry even when its plugin is missing, so that starting names the fix."""
    if plugin_override:
        fix = ("set TORCHTPU_PJRT_PLUGIN to a PJRT plugin's shared library, or unset it to use the "
               f"installed plugin ({(PLUGINS.get(platform or 'cpu') or PLUGINS['cpu'])[0][2]})")
        return [(platform or "cpu", plugin_override, fix)]
    found = []
    for name in ([platform] if platform else PLATFORM_ORDER):
        for package, file, fix in PLUGINS[name]:
            path = plugin_file(package, file)
            if path:
                found.append((name, path, fix))
                break
        else:
            if platform:  # requested and missing: starting raises, saying what to install
                found.append((name, "", PLUGINS[name][-1][2]))
    return found


def choose_runtime(settings, local_world_size: int) -> str:
    """The runtime this process uses. Multi-process jobs on CPU keep jaxlib: the CPU plugins
    have no cross-process (gloo) collectives."""
    if settings.runtime != "pjrt" or local_world_size == 0:
        return settings.runtime
    platforms = [p for p, _, _ in candidates(settings.platform, settings.pjrt_plugin)]
    return "jaxlib" if not platforms or platforms[0] == "cpu" else "pjrt"


def gpu_memory_settings(environ=os.environ) -> tuple[bool, float]:
    """(preallocate, memory fraction) of the CUDA client, read from jax's own variables so one
    setting governs both clients in a process. Default: allocate on demand, so that JAX,
    PyTorch and torchtpu can share the GPU."""
    preallocate = environ.get("XLA_PYTHON_CLIENT_PREALLOCATE", "false").strip().lower() in ("1", "true")
    raw = environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION", "").strip()
    try:
        fraction = float(raw) if raw else 0.0
    except ValueError:
        fraction = -1.0
    if raw and not 0.0 < fraction <= 1.0:
        raise ValueError(f"XLA_PYTHON_CLIENT_MEM_FRACTION={raw!r} is not valid; use a number in (0, 1]")
    return preallocate, fraction


def configure(C, settings, local_rank: int, local_world_size: int) -> str:
    """Installs the runtime's starter in the core; returns the runtime's name."""
    chosen = choose_runtime(settings, local_world_size)
    if chosen == "jaxlib":
        C.configure(settings.platform, settings.num_devices, local_rank, local_world_size)
    else:
        # The plugins log INFO lines to stderr (absl, before any log setup: "cpu_device_count set
        # via create_options"); warnings and errors still show. A user's own value wins.
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
        # jax is only asked to lower (jax_op, linalg, Pallas: any platform lowers from its CPU
        # backend) and to share CPU memory here; a jax TPU client would take the chips from
        # torchtpu's, a CUDA one GPU memory. A user's own JAX_PLATFORMS wins.
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
        preallocate, fraction = gpu_memory_settings()
        C.configure_pjrt(candidates(settings.platform, settings.pjrt_plugin), settings.num_devices, local_rank,
                         local_world_size, preallocate, fraction)
    return chosen


_registered = False
_lock = threading.Lock()


def _version_tuple(version: str) -> tuple[int, ...]:
    """(0, 12, 0, 1) of '0.12.0.1': the numeric release parts, compared as numbers."""
    parts = []
    for part in version.split("+")[0].split("."):
        if not part.isdigit():
            break
        parts.append(int(part))
    return tuple(parts)


def handlers_bound(requires: list[str]) -> str | None:
    """The newest jax a plugin distribution takes ('0.11.2' of 'jax<=0.11.2'), or None."""
    for requirement in requires:
        name, _, rest = requirement.partition("<=")
        if name.strip().lower() == "jax" and rest:
            return rest.split(";")[0].split(",")[0].strip()
    return None


def lapack_handlers_problem(plugin_path: str, jaxlib_version: str | None = None,
                            requires: list[str] | None = None) -> str | None:
    """Why the plugin cannot take this jaxlib's LAPACK handlers (with the fix), or None.

    lammps-jax-pjrt-cpu is XLA's CPU plugin built from one jaxlib's XLA and declares that jax
    as its newest (jax<=0.11.2). jaxlib 0.12's handlers register with it without an error, yet
    its compiler then finds none ("No FFI handler registered for lapack_dgetrf_ffi"), so a
    jaxlib newer than the plugin's bound is refused here, before linear algebra compiles."""
    import importlib.metadata

    if requires is None:
        distribution = distribution_of(plugin_path).split(" ")[0] if plugin_path else ""
        try:
            requires = importlib.metadata.requires(distribution) or [] if distribution else []
        except importlib.metadata.PackageNotFoundError:
            requires = []
    bound = handlers_bound(requires)
    if jaxlib_version is None:
        try:
            jaxlib_version = importlib.metadata.version("jaxlib")
        except importlib.metadata.PackageNotFoundError:
            return None
    if bound is None or _version_tuple(jaxlib_version) <= _version_tuple(bound):
        return None
    return (f"torchtpu: the PJRT plugin {plugin_path} takes the LAPACK handlers of jaxlib {bound} or older "
            f"(its metadata: jax<={bound}), but jaxlib {jaxlib_version} is installed, so linear algebra "
            f"cannot run under TORCHTPU_RUNTIME=pjrt. Fix: pip install 'jax[cpu]<={bound}' "
            "'jaxlib<=" + bound + "', or use the jaxlib runtime (unset TORCHTPU_RUNTIME)")


def register_custom_calls(module_text: str) -> None:
    """Before the core compiles a module JAX lowered: jaxlib's LAPACK handlers (the custom
    calls of jax.lax.linalg on CPU) are registered with the CPU plugin, once per process.
    jaxlib's client has them already; the plugin needs them given."""
    global _registered
    if _registered or "custom_call" not in module_text:
        return
    from torchtpu import _C

    if _C.runtime_info().get("runtime") != "pjrt" or _C.platform() != "cpu":
        return
    with _lock:
        if _registered:
            return
        problem = lapack_handlers_problem(_C.runtime_info().get("plugin", ""))
        if problem:
            raise RuntimeError(problem)
        from jaxlib.cpu import _lapack

        _lapack.initialize()
        handlers = {name: capsule for name, capsule in _lapack.registrations().items() if name.endswith("_ffi")}
        _C.register_ffi_handlers(handlers, "Host")
        _registered = True
