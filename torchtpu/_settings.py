"""torchtpu's environment settings, read and checked when torchtpu loads, before anything
starts: a bad value is a ValueError that names the variable and the values it accepts.

    TORCHTPU_PLATFORM        tpu | cuda | cpu (default: the best one present)
    TORCHTPU_RUNTIME         jaxlib (default) | pjrt: how XLA is reached (docs/ARCHITECTURE.md)
    TORCHTPU_PJRT_PLUGIN     the PJRT plugin's .so for the pjrt runtime (default: the
                             installed plugin of the platform, torchtpu/_pjrt.py)
    TORCHTPU_MODE            fused (default) | strict | debug
    TORCHTPU_FALLBACK        warn (default) | error | silent
    TORCHTPU_NUM_DEVICES     devices of the cpu platform, a positive integer (default 1)
    TORCHTPU_MAX_PENDING_OPS ops a fused graph holds before it runs, a positive integer
    TORCHTPU_EXECUTABLE_CACHE_SIZE  compiled graphs kept in memory, a positive integer (default
                             1024; the least recently used is dropped, and found again in the
                             disk cache or recompiled when it comes back)
    TORCHTPU_BUCKETS         pow2 (default) | off | increasing sizes "64,128,256"
    TORCHTPU_CACHE_DIR       a directory (created if missing; default ~/.cache/torchtpu;
                             empty: no disk cache)
    TORCHTPU_DUMP_DIR        a directory for compiled modules' StableHLO (default: none)
    TORCHTPU_COMPILE_REPLAY  1 (default) | 0: torch.compile graphs replay captured executables
    TORCHTPU_EXPLAIN         ops whose route through the tpu kernels is printed (to stderr, once
                             per route): "all", or comma-separated names "aten::add" (every
                             overload), "aten::add.Tensor" (default: none)
"""
from __future__ import annotations

import dataclasses
import os
import re

PLATFORMS = ("cpu", "cuda", "tpu")
MODES = ("debug", "strict", "fused")
FALLBACKS = ("warn", "error", "silent")
RUNTIMES = ("jaxlib", "pjrt")
DEFAULT_RUNTIME = "jaxlib"


@dataclasses.dataclass(frozen=True)
class Settings:
    platform: str              # "" = the best platform present
    runtime: str               # "jaxlib" | "pjrt"
    pjrt_plugin: str           # "" = the installed plugin of the platform
    mode: str
    fallback: str
    num_devices: int
    max_pending_ops: int | None  # None = the engine's default
    executable_cache_size: int | None  # None = the engine's default
    cache_dir: str             # "" = no disk cache
    dump_dir: str              # "" = no dumps
    explain: tuple[str, ...] = ()  # ops TORCHTPU_EXPLAIN names ("all" for every op)


def read(environ=os.environ) -> Settings:
    """All settings, checked; raises ValueError for the first bad one."""
    bucket_policy(environ.get("TORCHTPU_BUCKETS", "pow2"))  # read again at each compile; checked now
    compile_replay(environ)  # read again by each compiled graph; checked now
    cache_dir = environ.get("TORCHTPU_CACHE_DIR")
    if cache_dir is None:
        cache_dir = os.path.join(os.path.expanduser("~"), ".cache", "torchtpu")
    return Settings(
        platform=_platform(environ.get("TORCHTPU_PLATFORM", "")),
        runtime=_choice(environ, "TORCHTPU_RUNTIME", RUNTIMES, DEFAULT_RUNTIME),
        pjrt_plugin=_plugin_file(environ.get("TORCHTPU_PJRT_PLUGIN", "")),
        mode=_choice(environ, "TORCHTPU_MODE", MODES, "fused"),
        fallback=_choice(environ, "TORCHTPU_FALLBACK", FALLBACKS, "warn"),
        num_devices=_positive(environ, "TORCHTPU_NUM_DEVICES") or 1,
        max_pending_ops=_positive(environ, "TORCHTPU_MAX_PENDING_OPS"),
        executable_cache_size=_positive(environ, "TORCHTPU_EXECUTABLE_CACHE_SIZE"),
        cache_dir=_directory("TORCHTPU_CACHE_DIR", cache_dir, "to an empty string for no disk cache"),
        dump_dir=_directory("TORCHTPU_DUMP_DIR", environ.get("TORCHTPU_DUMP_DIR", ""), "unset it for no dumps"),
        explain=explain_ops(environ.get("TORCHTPU_EXPLAIN", "")),
    )


def bucket_policy(spec: str):
    """TORCHTPU_BUCKETS as None (off), "pow2" or a sorted list of sizes."""
    spec = spec.strip().lower()
    if spec in ("off", "0", "none", ""):
        return None
    if spec == "pow2":
        return "pow2"
    try:
        sizes = sorted({int(s) for s in spec.split(",")})
    except ValueError:
        raise ValueError(f'TORCHTPU_BUCKETS={spec!r} is not valid: use "pow2", "off" or increasing sizes like '
                         '"64,128,256"') from None
    if not sizes or sizes[0] < 1:
        raise ValueError(f"TORCHTPU_BUCKETS={spec!r} is not valid: sizes must be positive")
    return sizes


_OP_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*::[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)?$")


def explain_ops(spec: str) -> tuple[str, ...]:
    """TORCHTPU_EXPLAIN as op names: ("all",), or names like "aten::add" / "aten::add.Tensor"
    (an aten op must exist in this torch; other namespaces register later, so only their
    spelling is checked)."""
    names = tuple(name.strip() for name in spec.split(",") if name.strip())
    if names == ("all",):
        return names
    for name in names:
        bad = None
        if not _OP_NAME.match(name):
            bad = 'is not an op name like "aten::add" or "aten::add.Tensor"'
        elif name.startswith("aten::") and not _aten_op_exists(name):
            bad = "is not an op of this torch"
        if bad:
            raise ValueError(f"TORCHTPU_EXPLAIN={spec!r} is not valid: {name!r} {bad}; use \"all\" or "
                             "comma-separated op names (aten::add for every overload, aten::add.Tensor for one)")
    return names


def _aten_op_exists(name: str) -> bool:
    import torch

    base, _, overload = name[len("aten::"):].partition(".")
    packet = getattr(torch.ops.aten, base, None)
    return packet is not None and (not overload or overload in packet.overloads())


def compile_replay(environ=os.environ) -> bool:
    """TORCHTPU_COMPILE_REPLAY as a bool."""
    return _choice(environ, "TORCHTPU_COMPILE_REPLAY", ("1", "0"), "1") == "1"


def _choice(environ, name: str, allowed: tuple, default: str) -> str:
    value = environ.get(name, "").strip().lower() or default
    if value not in allowed:
        raise ValueError(f"{name}={environ[name]!r} is not valid; use one of {', '.join(allowed)} "
                         f"(default {default})")
    return value


def _positive(environ, name: str) -> int | None:
    raw = environ.get(name, "").strip()
    if not raw:
        return None
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(f"{name}={raw!r} is not valid; use a positive integer")
    return value


def _platform(raw: str) -> str:
    value = raw.strip().lower()
    if value and value not in PLATFORMS:
        present = present_platforms()
        raise ValueError(f"TORCHTPU_PLATFORM={value!r} is not a platform; valid platforms are "
                         f"{', '.join(PLATFORMS)} (present here: {', '.join(present) or 'none'})")
    return value


def _plugin_file(path: str) -> str:
    """TORCHTPU_PJRT_PLUGIN: empty, or a file (whether it is a PJRT plugin is found when the
    runtime starts, which names the plugin and the fix)."""
    path = path.strip()
    if path and not os.path.isfile(os.path.expanduser(path)):
        from torchtpu._pjrt import CPU_FIX

        raise ValueError(f"TORCHTPU_PJRT_PLUGIN={path!r} is not valid: no such file; set it to a PJRT "
                         f"plugin's shared library, or unset it to use the installed plugin ({CPU_FIX})")
    return os.path.abspath(os.path.expanduser(path)) if path else ""


def _directory(name: str, path: str, alternative: str) -> str:
    """The path if it is a directory or can become one (its first existing ancestor is one)."""
    if not path:
        return path
    probe = os.path.abspath(os.path.expanduser(path))
    while not os.path.exists(probe):
        parent = os.path.dirname(probe)
        if parent == probe:
            break
        probe = parent
    if not os.path.isdir(probe):
        raise ValueError(f"{name}={path!r} is not valid: {probe} is not a directory; set it to a directory "
                         f"(created if missing) or {alternative}")
    return path


def present_platforms() -> list[str]:
    """The platforms jaxlib can start here (starts their clients: only for error messages)."""
    present = []
    try:
        from jax._src import xla_bridge

        for name in PLATFORMS:
            try:
                xla_bridge.get_backend(name)
                present.append(name)
            except Exception:
                pass
    except Exception:
        pass
    return present
