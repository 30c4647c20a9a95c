"""`python -m torchtpu`: what is installed, which platform and devices, and what to fix.

The report must work when torchtpu itself cannot start (wrong torch, no jax, a bad
TORCHTPU_PLATFORM), so everything but the platform section reads package metadata and the
environment; `import torchtpu` calls exit_if_reporting() when it fails under this command.
"""
import importlib.metadata
import os
import platform as host
import sys

from torchtpu import _versions


def reporting() -> bool:
    """True while `python -m torchtpu` imports the package (sys.argv[0] is "-m" until then)."""
    argv = getattr(sys, "orig_argv", [])
    asked = any(a == "-mtorchtpu" or (a == "-m" and b == "torchtpu") for a, b in zip(argv, argv[1:] + [""]))
    return asked and sys.argv[:1] == ["-m"]


def exit_if_reporting(problems: list[str]) -> None:
    """Under `python -m torchtpu`, an import that failed prints the report and exits 1."""
    if reporting():
        print(report(problems, runtime=None))
        sys.exit(1)


def _version(distribution: str) -> str:
    return _versions.installed(distribution) or "not installed"


# PJRT plugins jax loads (installed by torchtpu's extras through jax's); each must be the
# release of the installed jaxlib.
_JAX_PLUGINS = ("jax-cuda12-plugin", "jax-cuda12-pjrt", "jax-cuda13-plugin", "jax-cuda13-pjrt", "libtpu")


def _glue_line() -> str:
    glues = _versions.built_glues()
    if not glues:
        return "  glue      none built for this Python (see the problems below)"
    torch_version = _versions.installed("torch")
    match = ""
    if torch_version:
        minor = ".".join(map(str, _versions.release(torch_version)))
        match = f"; {'one' if _versions.release(torch_version) in glues else 'none'} for the installed torch {minor}"
    return f"  glue      built for torch {', '.join(glues[m] for m in sorted(glues))}{match}"


def _torch_line() -> str:
    supported = _versions.SUPPORTED_TORCH
    return (f"torch     {_version('torch')}  (torchtpu supports torch "
            f"{_versions.torch_requirement(supported)}: {supported[0][0]}.{supported[0][1]} to "
            f"{supported[-1][0]}.{supported[-1][1]})")


def _plugin_lines(problems: list[str]) -> list[str]:
    """The installed PJRT plugins, each checked against jaxlib's release."""
    jaxlib = _versions.installed("jaxlib")
    lines = []
    for name in _JAX_PLUGINS:
        version = _versions.installed(name)
        if version is None:
            continue
        lines.append(f"plugin    {name} {version}")
        if name != "libtpu" and jaxlib and _versions.release(version) != _versions.release(jaxlib):
            extra = "cuda13" if "cuda13" in name else "cuda12"
            problems.append(f"{name} {version} does not match jaxlib {jaxlib} (jax loads only its own "
                            f"release's plugin). Fix: pip install 'jax[{extra}]=={jaxlib}'")
    return lines or ["plugin    none (jax's CPU client only; GPU/TPU: pip install 'torchtpu[cuda12]', "
                     "'[cuda13]' or '[tpu]')"]


def _python_line() -> str:
    note = "" if sys.version_info >= (3, 12) else "  (jax 0.11 and newer need Python 3.12+)"
    return f"Python    {host.python_version()}  ({sys.executable}){note}"


def _rival_lines(problems: list[str]) -> list[str]:
    """Google's torch_tpu claims the same device name: say so, and how to pick one."""
    import torchtpu_autoload

    if not torchtpu_autoload.rival_installed():
        return []
    version = _versions.installed(torchtpu_autoload.RIVAL_DISTRIBUTION) or "(version unknown)"
    if torchtpu_autoload.autoload_enabled() and not any(p.startswith("Two packages claim") for p in problems):
        problems.append(torchtpu_autoload.claim_message(None))
    return [f"rival     {torchtpu_autoload.RIVAL_MODULE} {version} installed: it also names its device \"tpu\""]


def _cache_line(directory: str) -> str:
    if not directory:
        return "disabled (TORCHTPU_CACHE_DIR is empty)"
    if not os.path.isdir(directory):
        return f"{directory} (not created yet)"
    files, size = 0, 0
    for root, _, names in os.walk(directory):
        for name in names:
            try:
                size += os.path.getsize(os.path.join(root, name))
                files += 1
            except OSError:
                pass
    return f"{directory} ({files} entries, {size / 2**20:.1f} MiB)"


def _autoload_line() -> str:
    import torchtpu_autoload

    if os.environ.get("TORCH_DEVICE_BACKEND_AUTOLOAD", "1") == "0":
        return "off (TORCH_DEVICE_BACKEND_AUTOLOAD=0): `import torchtpu` before using device='tpu'"
    if not torchtpu_autoload.autoload_enabled():
        return (f"off ({torchtpu_autoload.AUTOLOAD_VARIABLE}=0): `import torchtpu` before using "
                "device='tpu'")
    if torchtpu_autoload.rival_installed():
        return f"stepped aside: {torchtpu_autoload.RIVAL_MODULE} is installed (see the problems below)"
    points = importlib.metadata.entry_points(group="torch.backends")
    if any(point.value == "torchtpu_autoload:load" for point in points):
        return "active: `import torch` loads torchtpu"
    return ("inactive: torchtpu is not installed in this environment (no torch.backends entry "
            "point): `import torchtpu` before using device='tpu', or pip install it")


def _default_cache_dir() -> str:
    configured = os.environ.get("TORCHTPU_CACHE_DIR")
    return os.path.join(os.path.expanduser("~"), ".cache", "torchtpu") if configured is None else configured


def _setting(name: str, default: str) -> str:
    value = os.environ.get(name)
    return f"{value} ({name})" if value else f"{default} (default; set {name} to change)"


def _runtime_lines(problems: list[str]) -> list[str]:
    """Platform, devices and one computation on device 0: proves the whole path works."""
    import torch

    import torchtpu

    try:
        name = torchtpu.platform()
        count = torch.tpu.device_count()
        lines = [f"platform  {name}  (choose with TORCHTPU_PLATFORM=cpu|cuda|tpu)",
                 f"devices   {count}: " + ", ".join(f"tpu:{i} {torch.tpu.get_device_name(i)}" for i in range(count))]
        lines += _runtime_source(torchtpu._C.runtime_info())
        value = (torch.ones(2, device="tpu") + 1).cpu().tolist()
        if value != [2.0, 2.0]:
            problems.append(f"ones(2) + 1 on tpu:0 gave {value}, expected [2.0, 2.0]: please report this")
        lines.append(f"mode      {torchtpu.get_mode()}  (TORCHTPU_MODE or torchtpu.set_mode)")
        lines.append(f"cache     {_cache_line(torchtpu._C.cache_dir())}")
        return lines
    except Exception as error:  # a platform that does not start is the report's subject
        problems.append(f"the runtime did not start: {error}")
        return []


def _runtime_source(info: dict) -> list[str]:
    """Which runtime reaches XLA, and for the PJRT one the plugin, its API version and the
    package it came from."""
    choose = "(TORCHTPU_RUNTIME=jaxlib|pjrt)"
    if info.get("runtime") != "pjrt":
        return [f"runtime   jaxlib  {choose}: {info.get('version', '')}"]
    from torchtpu import _pjrt

    path = info.get("plugin", "")
    origin = "TORCHTPU_PJRT_PLUGIN" if os.environ.get("TORCHTPU_PJRT_PLUGIN") else _pjrt.distribution_of(path)
    details = ", ".join(f"{key} {info[key]}" for key in ("stablehlo_current_version", "xla_version") if key in info)
    return [f"runtime   pjrt  {choose}",
            f"plugin    {path}",
            f"          PJRT C API {info.get('pjrt_api_version', '?')}, from {origin}"
            + (f" ({details})" if details else "")]


def report(problems: list[str], runtime) -> str:
    """The whole report; `runtime` is a list of platform lines, or None when torchtpu failed.
    Problems found while writing it (a plugin of another release, a rival) join `problems`."""
    lines = [
        f"torchtpu  {getattr(sys.modules['torchtpu'], '__version__', '?')}  "
        f"({os.path.dirname(os.path.abspath(__file__))})",
        _glue_line(),
        _torch_line(),
        f"jax       {_version('jax')}  (supported {_versions.JAX_REQUIREMENT})",
        f"jaxlib    {_version('jaxlib')}  (supported {_versions.JAX_REQUIREMENT})",
        *_plugin_lines(problems),
        _python_line(),
        f"host      {host.system()} {host.machine()}",
        *_rival_lines(problems),
    ]
    if runtime is None:
        lines.append("platform  not started (see the problems below)")
        lines.append(f"mode      {_setting('TORCHTPU_MODE', 'fused')}")
        lines.append(f"cache     {_cache_line(_default_cache_dir())}")
    else:
        lines += runtime
    lines.append(f"fallback  {_setting('TORCHTPU_FALLBACK', 'warn')}")
    lines.append(f"autoload  {_autoload_line()}")
    if problems:
        lines.append(f"{len(problems)} problem(s):")
        lines += [f"  - {problem}" for problem in problems]
    else:
        lines.append("status    OK")
    return "\n".join(lines)


def main() -> int:
    problems: list[str] = []
    runtime = _runtime_lines(problems)
    print(report(problems, runtime))
    return 1 if problems else 0
