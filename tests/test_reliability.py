"""Never a silent wrong answer, never lost state, never a hang: the private disk cache,
checked indexing, argument checks, transactional flushes and out-of-memory errors. CPU is
the oracle for error types and messages."""
import contextlib
import os
import stat
import warnings

import pytest
import torch

import torchtpu
from utils import run_python

_C = torchtpu._C


# ---- the private, verified disk cache ---------------------------------------------------


@contextlib.contextmanager
def cache_dir(path):
    """Compiles into the disk cache at `path` (a cold memory cache), then restores the test
    session's cache."""
    previous = _C.cache_dir()
    _C.set_cache_dir(str(path))
    _C.clear_memory_cache()
    try:
        yield
    finally:
        _C.set_cache_dir(previous)
        _C.clear_memory_cache()


def run_graph(offset, n=7, reduce="sum"):
    # Sizes used by no other test, so the graph is new to every cache.
    x = torch.arange(n * 3, dtype=torch.float32).reshape(n, 3)
    return getattr(x.to("tpu") + offset, reduce)(0).cpu(), getattr(x + offset, reduce)(0)


def cache_warnings(caught, text):
    return [w for w in caught if text in str(w.message)]


def test_cache_folder_and_entries_are_private_whatever_the_umask(tmp_path):
    folder = tmp_path / "parent" / "cache"
    old = os.umask(0)
    try:
        with cache_dir(folder):
            got, want = run_graph(1.5)
    finally:
        os.umask(old)
    assert torch.equal(got, want)
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    entries = list(folder.iterdir())
    assert entries and all(stat.S_IMODE(e.stat().st_mode) == 0o600 for e in entries)


def test_cache_refuses_a_folder_others_can_write_with_one_warning(tmp_path):
    folder = tmp_path / "shared"
    folder.mkdir()
    folder.chmod(0o777)
    with cache_dir(folder), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for offset in (2.5, 3.5):  # two graphs: still one warning
            got, want = run_graph(offset, n=9)
            assert torch.equal(got, want)
    refused = cache_warnings(caught, "not using the compilation cache")
    assert len(refused) == 1 and "other users can write to it (mode 0777)" in str(refused[0].message)
    assert list(folder.iterdir()) == []


def test_cache_refuses_a_folder_owned_by_another_user(tmp_path):
    if os.geteuid() == 0:
        folder = tmp_path / "theirs"
        folder.mkdir(mode=0o700)
        os.chown(folder, 65534, 65534)
    else:
        folder = "/usr"  # owned by root, not by this user
    with cache_dir(folder), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got, want = run_graph(4.5, n=10)
    assert torch.equal(got, want)
    refused = cache_warnings(caught, "not using the compilation cache")
    assert len(refused) == 1 and "owned by another user" in str(refused[0].message)
    if folder != "/usr":
        assert not os.listdir(folder)


def test_an_entry_copied_over_another_graphs_entry_is_recompiled(tmp_path):
    # The case: graph A's valid entry under graph B's file name made B return A's
    # results. Each entry records its full key, so B now recompiles.
    with cache_dir(tmp_path / "a"):
        run_graph(100.0, n=11, reduce="amax")
    with cache_dir(tmp_path / "b"):
        run_graph(-100.0, n=11)
    (entry_a,) = (tmp_path / "a").iterdir()
    (entry_b,) = (tmp_path / "b").iterdir()
    entry_b.write_bytes(entry_a.read_bytes())
    before = torchtpu.metrics.counters()
    with cache_dir(tmp_path / "b"), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got, want = run_graph(-100.0, n=11)
    after = torchtpu.metrics.counters()
    assert torch.equal(got, want)
    assert after["cache_hits_disk"] == before["cache_hits_disk"]
    assert after["graphs_compiled"] == before["graphs_compiled"] + 1
    assert len(cache_warnings(caught, "holds another graph's executable")) == 1
    # The recompiled executable replaced the foreign entry: the next process hits it.
    with cache_dir(tmp_path / "b"):
        before = torchtpu.metrics.counters()["cache_hits_disk"]
        got, want = run_graph(-100.0, n=11)
        assert torch.equal(got, want)
        assert torchtpu.metrics.counters()["cache_hits_disk"] == before + 1


def test_a_failed_cache_write_warns_once(tmp_path):
    # A file size limit makes every entry write fail part-way, as a full disk does (and
    # unlike a read-only folder, it also stops a root user).
    script = f"""
        import resource, signal, warnings, torch, torchtpu
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (64, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
        x = torch.arange(6.).to("tpu")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            a, b = (x * 3).cpu(), (x - 3).sum().cpu()
        print(a.tolist(), b.item())
        print([str(w.message) for w in caught if "cannot write the compilation cache" in str(w.message)])
    """
    result = run_python(script, TORCHTPU_CACHE_DIR=str(tmp_path / "cache"))
    assert result.returncode == 0, result.stderr
    values, messages = result.stdout.strip().splitlines()[-2:]
    assert values == "[0.0, 3.0, 6.0, 9.0, 12.0, 15.0] -3.0"
    messages = eval(messages)
    assert len(messages) == 1 and "File too large" in messages[0]  # names the OS error
    assert not [p for p in (tmp_path / "cache").iterdir() if ".tmp." in p.name]
