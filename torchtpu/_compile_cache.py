"""Warm starts under torch.compile: AOTAutograd's results for the tpu backend, on disk.

A process that compiles a model again (same Dynamo graph, input types, torch, torchtpu)
skips AOTAutograd - the make_fx trace, functionalization, the partitioner - by loading what
a previous process produced. This is PyTorch's own AOTAutogradCache in its bundled form
(the form Inductor and aot_eager use for precompile): the cache key (Dynamo's graph, the
inputs' metadata, torch's version and configs) and the entry (the forward and backward aten
graphs, the runtime metadata that replays mutations, aliasing, RNG and requires_grad, the
runtime wrappers) are PyTorch's. torchtpu supplies:

- `compiler.TpuOutputCode`: the compiled form of one aot graph that PyTorch can pickle - the aten
  graph itself, which torchtpu captures into one executable on its first call (compiler.py);
  the executable comes from the executable cache, so a warm process compiles nothing.
- The storage: entries live in torchtpu's private cache folder (TORCHTPU_CACHE_DIR, next
  to the executables, through the same C++ DiskCache: 0700 folder, 0600 entries, the full
  key recorded in each entry, a damaged or foreign entry ignored with one warning), never
  in Inductor's shared /tmp folder. The key adds torchtpu's part: its version and build,
  the decomposition table (which ops keep their aten form) and the platform.

Guards stay Dynamo's: Dynamo still traces the frame and installs its guards; only the
backend's work behind it is cached. Graphs with symbolic sizes (bucketed) are not cached.
`scope()` turns this on around one backend call (torchtpu/_patches.py routes PyTorch's
storage here while it is active); counters() reports hits, misses and stores.
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import pickle
import threading
import warnings

import torch
from torchtpu import _C

ENTRY_KIND = "aot"  # file extension of these entries in the cache folder

_active = threading.local()
# compile_graphs_traced: aot graphs (forward, backward, inference) that AOTAutograd traced and
# handed to the tpu backend; a warm start that hits the cache traces none.
_counts = {"compile_graphs_traced": 0, "compile_cache_hits": 0, "compile_cache_misses": 0,
           "compile_cache_stores": 0}


def counters() -> dict:
    return dict(_counts)


def count_traced() -> None:
    _counts["compile_graphs_traced"] += 1


def reset() -> None:
    for name in _counts:
        _counts[name] = 0


def enabled() -> bool:
    """Whether a backend call may use the cache: a disk cache folder is set and PyTorch's
    caches are not switched off (torch.compiler.config.force_disable_caches)."""
    return bool(_C.cache_dir()) and not torch.compiler.config.force_disable_caches


def active() -> bool:
    """Whether this thread is inside a tpu backend call that caches (scope())."""
    return getattr(_active, "on", False)


@contextlib.contextmanager
def scope():
    """Around one tpu backend call: AOTAutograd looks up and stores its result here.

    The backward graph is compiled with the forward (not lazily at the first backward), so
    the whole entry is stored before this call returns, from this thread."""
    from torch._functorch import config as functorch_config

    if not enabled():
        # The backend's compilers are serializable, which alone makes AOTAutograd consult
        # its cache; without a folder that must not be Inductor's.
        with functorch_config.patch(enable_autograd_cache=False):
            yield
        return
    with functorch_config.patch(enable_autograd_cache=True, bundled_autograd_cache=True,
                                enable_remote_autograd_cache=False, force_non_lazy_backward_lowering=True):
        previous = active()
        _active.on = True
        try:
            yield
        finally:
            _active.on = previous


# ---------------------------------------------------------------------------------------
# The key's torchtpu part and the storage (called from the patched AOTAutogradCache).


def _torchtpu_identity() -> str:
    # What shapes the aot graphs besides what PyTorch's key holds: torchtpu's code (version,
    # and the compiled core's file: a rebuild can change meta kernels and lowerings) and the
    # decomposition table, which follows the set of lowered ops.
    global _identity
    if _identity is None:
        import torchtpu
        from torchtpu import compiler

        so = _C.__file__
        st = os.stat(so)
        decomposed = sorted(str(op) for op in compiler.decompositions())
        digest = hashlib.sha256("\n".join(decomposed).encode()).hexdigest()[:32]
        _identity = (f"torchtpu {torchtpu.__version__} core {os.path.basename(so)} {st.st_size} {st.st_mtime_ns}\n"
                     f"decompositions {len(decomposed)} {digest}\n"
                     f"platform {torchtpu.platform()}\n")
    return _identity


_identity: str | None = None


def cache_key(gm: torch.fx.GraphModule, example_inputs, aot_config, fx_config, *details) -> str:
    """AOTAutogradCache's key for a tpu backend call: everything PyTorch's own key holds for
    AOTAutograd (Dynamo's graph with its constants, the inputs' metadata, the AOT config,
    grad and autocast state, deterministic algorithms, functorch's config, activation
    checkpointing hashes), then torch's version and torchtpu's part - but not the Inductor
    part (Inductor's config, custom passes, its source hash), whose computation imports all
    of Inductor's code generators and costs a warm process more than AOTAutograd itself.
    `details`: what else this torch's AOTAutogradCacheDetails takes (2.14+: act_input_paths).
    Raises BypassAOTAutogradCache for graphs PyTorch deems uncacheable."""
    from torch._functorch._aot_autograd import autograd_cache

    with autograd_cache.sanitize_gm_for_cache(gm):
        autograd_cache.check_cacheable(gm)
        hashed = _details_class()(gm, example_inputs, aot_config, fx_config, *details)
        return "tpu" + autograd_cache.AOTAutogradCachePickler(gm).get_hash(hashed)


def _details_class():
    # Defined at first use (its base lives in torch._functorch's heavy cache module) and
    # kept as a module global: the key's pickler names the class by reference.
    global TpuCacheDetails
    if "TpuCacheDetails" not in globals():
        from torch._functorch._aot_autograd.autograd_cache import AOTAutogradCacheDetails

        class TpuCacheDetails(AOTAutogradCacheDetails):
            def _init_fx_graph_hash_details(self, gm, example_inputs, fx_config):
                self.gm = gm
                self.example_inputs = list(example_inputs)
                self.default_dtype = torch.get_default_dtype()
                self.torch_version = (torch.__version__, torch.version.git_version)
                self.torchtpu = _torchtpu_identity()

        TpuCacheDetails.__qualname__ = "TpuCacheDetails"
        globals()["TpuCacheDetails"] = TpuCacheDetails
    return TpuCacheDetails


def full_key(torch_key: str) -> str:
    return f"aotautograd {torch_key}\n{_torchtpu_identity()}"


def load_candidates(torch_key: str):
    """The stored entry for PyTorch's key, unpickled, as (entry, bytes, True) the way
    AOTAutogradCache.iterate_over_candidates yields local candidates; nothing on a miss.
    An entry that does not unpickle (written by another torch) is removed with a warning."""
    key = full_key(torch_key)
    content = _C.cache_load(ENTRY_KIND, key)
    if content is None:
        _counts["compile_cache_misses"] += 1
        return
    try:
        entry = pickle.loads(content)
    except Exception as e:  # noqa: BLE001 - any failure to rebuild is a miss, never an error
        warnings.warn(f"torchtpu: ignoring a torch.compile cache entry that does not load ({type(e).__name__}: "
                      f"{e}); the graph will be traced again", stacklevel=2)
        _C.cache_remove(ENTRY_KIND, key)
        _counts["compile_cache_misses"] += 1
        return
    _counts["compile_cache_hits"] += 1
    yield entry, content, True


def store(torch_key: str, content: bytes) -> None:
    if _C.cache_store(ENTRY_KIND, full_key(torch_key), content):  # False: no usable folder
        _counts["compile_cache_stores"] += 1
