"""Counters of what torchtpu did: ops traced, graphs compiled, cache hits, transfers, fallbacks."""
from torchtpu import _C, _compile_cache


def counters() -> dict:
    """A snapshot of the counters (see report() for a readable form); compile_graphs_traced and
    compile_cache_{hits,misses,stores} count torch.compile's AOTAutograd work and its cache."""
    c = _C.counters()
    c.update(_compile_cache.counters())
    return c


def recompilations() -> list:
    """(python line, reason) for each graph compiled again at a line that compiled before."""
    return _C.recompilations()


def buckets() -> list:
    """Fused graphs seen at more than one size (issue 16): per structure, the Python line that
    started it, its op count, how many flushes ran padded and to which buckets (one size per
    symbol), how many graphs it compiled at exact sizes and why the latest one was not padded."""
    return _C.bucket_summaries()


def reset() -> None:
    _C.reset_metrics()
    _compile_cache.reset()


def report() -> str:
    c = counters()
    lines = ["torchtpu metrics"]
    for key in ("ops_traced", "graphs_compiled", "cache_hits_memory", "cache_hits_disk", "execute_count",
                "recompilations", "donated_buffers", "compile_graphs_traced", "compile_cache_hits"):
        lines.append(f"  {key:<18} {c[key]}")
    lines.append(f"  {'compile_seconds':<18} {c['compile_seconds']:.3f}")
    lines.append(f"  {'bytes_to_device':<18} {c['bytes_to_device']}")
    lines.append(f"  {'bytes_to_host':<18} {c['bytes_to_host']} in {c['downloads']} downloads")
    if c["fallback_ops"]:
        lines.append("  ops run on CPU (no tpu lowering yet):")
        for op, count in sorted(c["fallback_ops"].items(), key=lambda kv: -kv[1]):
            lines.append(f"    {op:<40} {count}")
    else:
        lines.append("  ops run on CPU: none")
    import sys

    compiler = sys.modules.get("torchtpu.compiler")
    if compiler is not None and compiler.bucket_fallbacks:
        lines.append("  torch.compile graphs run at exact sizes instead of a padded bucket:")
        for reason in compiler.bucket_fallbacks[-20:]:
            lines.append(f"    {reason}")
    seen = buckets()
    if seen:
        lines.append("  fused graphs seen at several sizes (TORCHTPU_BUCKETS):")
        for b in seen:
            parts = []
            if b["padded_runs"]:
                sizes = ", ".join(str(k[0]) if len(k) == 1 else str(tuple(k)) for k in b["buckets"])
                parts.append(f"{b['padded_runs']} runs padded to buckets {sizes}")
            if b["exact_graphs"]:
                parts.append(f"{b['exact_graphs']} graphs at exact sizes (the latest: {b['exact_reason']})")
            lines.append(f"    {b['origin'] or '<no Python line>'} ({b['ops']} ops): " + "; ".join(parts))
    recompiled = recompilations()
    if recompiled:
        lines.append("  recompilations (where the new graph started, and what changed):")
        for origin, reason in recompiled:
            lines.append(f"    {origin}: {reason}")
    return "\n".join(lines)
