"""Warm starts under torch.compile (torchtpu/_compile_cache.py): a process that finds what an
earlier one stored in TORCHTPU_CACHE_DIR skips AOTAutograd (and XLA compiles) and computes
exactly what the compiling process computed. Each test runs fresh processes on its own
cache folder. About 90 s on the shared 2-core machine under load (47 s of CPU): five
processes of a small training run, and one in-process test of the key (8 s)."""
import json
import pathlib
import shutil

import pytest
import torch

from utils import run_python

# One training run: a model with a buffer it mutates in forward (a running sum of its input),
# AdamW, three steps under torch.compile; and a compiled function with an input mutation,
# an output aliasing an input, dropout (RNG) and a no-grad output. Prints one JSON line:
# the tpu results, the CPU eager oracle's, and torchtpu's counters.
TRAIN = r"""
import json, torch, torchtpu

class Tally(torch.nn.Module):
    def __init__(self, n):
        super().__init__()
        self.register_buffer("running", torch.zeros(n))

    def forward(self, h):
        self.running.add_(h.detach().mean(0))
        return h

def build(device):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), Tally(16), torch.nn.GELU(),
                                torch.nn.Linear(16, 4)).to(device)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)

def train(device, compiled):
    model, opt = build(device)
    step_fn = torch.compile(model, backend="tpu") if compiled else model
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(6, 8, generator=g).to(device), torch.randn(6, 4, generator=g).to(device)
    losses = []
    for _ in range(3):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(step_fn(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert loss.requires_grad
    running = model[1].running.cpu().tolist()
    return losses, running, [p.detach().cpu().flatten()[:4].tolist() for p in model.parameters()]

def effects(a, b):
    b.mul_(2)                                             # an input mutation
    kept = torch.nn.functional.dropout(a, 0.5, training=True)  # RNG
    with torch.no_grad():
        plain = a.sum()
    return kept * b, a.t(), plain                         # a.t() aliases the input

losses, running, params = train("tpu", compiled=True)
cpu_losses, cpu_running, cpu_params = train("cpu", compiled=False)
torch.tpu.manual_seed(3)
a = torch.arange(12.0).reshape(3, 4).to("tpu").requires_grad_()
b = torch.full((3, 4), 1.5).to("tpu")
kept, view, plain = torch.compile(effects, backend="tpu")(a, b)
aliased = view._base is a
c = torchtpu.metrics.counters()
print("RESULT " + json.dumps(dict(
    losses=losses, running=running, params=params,
    cpu_losses=cpu_losses, cpu_running=cpu_running, cpu_params=cpu_params,
    b=b.cpu().tolist(), kept=kept.detach().cpu().tolist(), kept_grad=kept.requires_grad,
    plain_grad=plain.requires_grad, view_grad=view.requires_grad, aliased=aliased,
    counters={k: c[k] for k in ("compile_graphs_traced", "compile_cache_hits", "compile_cache_misses",
                                "compile_cache_stores", "graphs_compiled")})))
"""


def _run(cache: str, **env):
    p = run_python(TRAIN, TORCHTPU_CACHE_DIR=cache, **env)
    assert p.returncode == 0, p.stderr[-3000:]
    line = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT "):]), p.stderr


def _entries(cache: pathlib.Path):
    return sorted(cache.glob("*.aot"))


def _assert_same_results(a, b):
    # Bitwise: the warm process runs the same aten graphs through the same executables.
    for key in ("losses", "running", "params", "b", "kept", "aliased", "kept_grad", "plain_grad", "view_grad"):
        assert a[key] == b[key], key


def _assert_matches_cpu(r):
    # XLA:CPU and PyTorch's CPU kernels round differently; 3 steps of AdamW stay within 1e-5
    # here (measured max 4e-7 for losses).
    torch.testing.assert_close(r["losses"], r["cpu_losses"], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(r["running"], r["cpu_running"], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(r["params"], r["cpu_params"], rtol=1e-5, atol=1e-5)
    assert r["b"] == [[3.0] * 4] * 3  # the input mutation reached the caller's tensor
    assert r["aliased"] and r["kept_grad"] and r["view_grad"] and not r["plain_grad"]


@pytest.fixture(scope="module")
def filled(tmp_path_factory):
    """A cache folder a cold process filled, and that process's results."""
    cache = tmp_path_factory.mktemp("filled") / "cache"
    cold, _ = _run(str(cache))
    return cache, cold


def _copy(filled, tmp_path) -> pathlib.Path:
    cache = tmp_path / "cache"
    shutil.copytree(filled[0], cache)
    return cache


def test_a_warm_process_skips_aot_autograd_and_trains_the_same(filled, tmp_path):
    cold = filled[1]
    # Two Dynamo frames: the model (forward + backward graphs) and effects (forward +
    # backward: a requires grad). Each is one stored entry.
    assert cold["counters"]["compile_graphs_traced"] == 4
    assert cold["counters"]["compile_cache_hits"] == 0 and cold["counters"]["compile_cache_stores"] == 2
    assert len(_entries(filled[0])) == 2
    _assert_matches_cpu(cold)

    cache = _copy(filled, tmp_path)
    warm, _ = _run(str(cache))
    assert warm["counters"]["compile_graphs_traced"] == 0  # AOTAutograd traced nothing
    assert warm["counters"]["compile_cache_hits"] == 2 and warm["counters"]["compile_cache_misses"] == 0
    assert warm["counters"]["graphs_compiled"] == 0  # nor did XLA compile anything
    _assert_same_results(warm, cold)
    for path in _entries(filled[0]):
        assert path.stat().st_mode & 0o777 == 0o600
    assert filled[0].stat().st_mode & 0o777 == 0o700


def test_damaged_and_foreign_entries_are_ignored_with_one_warning(filled, tmp_path):
    cold, cache = filled[1], _copy(filled, tmp_path)
    first, second = _entries(cache)
    data = bytearray(first.read_bytes())
    data[len(data) // 2] ^= 0xFF  # damaged: its checksum no longer matches
    first.write_bytes(bytes(data))
    warm, stderr = _run(str(cache))
    assert stderr.count("ignoring damaged compilation cache entry") == 1, stderr[-2000:]
    assert warm["counters"]["compile_graphs_traced"] == 2 and warm["counters"]["compile_cache_hits"] == 1
    _assert_same_results(warm, cold)

    # Foreign: the two graphs' (valid) entries swapped, each under the other's name.
    first_data, second_data = first.read_bytes(), second.read_bytes()
    first.write_bytes(second_data)
    second.write_bytes(first_data)
    foreign, stderr = _run(str(cache))
    assert stderr.count("holds another graph's") == 2, stderr[-2000:]
    assert foreign["counters"]["compile_graphs_traced"] == 4 and foreign["counters"]["compile_cache_hits"] == 0
    _assert_same_results(foreign, cold)


def test_no_cache_folder_stores_nothing_anywhere(tmp_path):
    # TORCHTPU_CACHE_DIR="" turns the cache off; AOTAutograd must not fall back to
    # Inductor's own folder either.
    inductor = tmp_path / "inductor"
    r, _ = _run("", TORCHINDUCTOR_CACHE_DIR=str(inductor))
    # 3 graphs: without a cache AOTAutograd compiles a backward at its first use, and effects'
    # backward never runs.
    assert r["counters"]["compile_cache_stores"] == 0 and r["counters"]["compile_graphs_traced"] == 3
    assert not (inductor / "aotautograd").exists()
    _assert_matches_cpu(r)


def test_the_key_holds_torchtpus_identity_and_the_inputs_types(tmp_path, monkeypatch):
    # In this process: each torch._dynamo.reset() makes the next call a fresh compile.
    from torchtpu import _C, _compile_cache, metrics

    previous = _C.cache_dir()
    _C.set_cache_dir(str(tmp_path))
    try:
        def f(a):
            return (a * 3).tanh() + 1

        def compile_and_run(x):
            torch._dynamo.reset()
            before = metrics.counters()
            out = torch.compile(f, backend="tpu")(x.to("tpu")).cpu()
            torch.testing.assert_close(out, f(x))
            after = metrics.counters()
            return {k: after[k] - before[k] for k in ("compile_cache_hits", "compile_cache_stores")}

        x = torch.randn(4, 5, generator=torch.Generator().manual_seed(0))
        assert compile_and_run(x) == {"compile_cache_hits": 0, "compile_cache_stores": 1}
        assert compile_and_run(x) == {"compile_cache_hits": 1, "compile_cache_stores": 0}
        assert compile_and_run(x.double()) == {"compile_cache_hits": 0, "compile_cache_stores": 1}
        monkeypatch.setattr(_compile_cache, "_identity", "torchtpu (another build)\n")
        assert compile_and_run(x) == {"compile_cache_hits": 0, "compile_cache_stores": 1}
        assert len(_entries(tmp_path)) == 3
    finally:
        torch._dynamo.reset()
        _C.set_cache_dir(previous)


def test_a_refused_folder_stores_nothing(tmp_path):
    # A folder others can write is refused (as for executables): nothing stored, one warning.
    import warnings

    from torchtpu import _C, metrics

    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    previous = _C.cache_dir()
    _C.set_cache_dir(str(shared))
    try:
        torch._dynamo.reset()
        before = metrics.counters()["compile_cache_stores"]
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out = torch.compile(lambda a: a.exp() - 2, backend="tpu")(torch.ones(3).to("tpu")).cpu()
        torch.testing.assert_close(out, torch.ones(3).exp() - 2)
        assert metrics.counters()["compile_cache_stores"] == before
        assert list(shared.iterdir()) == []
        assert sum("not using the compilation cache" in str(w.message) for w in caught) == 1
    finally:
        torch._dynamo.reset()
        _C.set_cache_dir(previous)


def test_a_cached_graph_still_donates_its_in_place_updates(tmp_path):
    # A static KV cache's write (index_copy_) reuses the cache's buffer; a graph loaded from the
    # cache (no AOTAutograd metadata to read the updates from) must donate it as the compiling
    # call did (it copied instead: the result was right, the memory doubled).
    from torchtpu import _C, metrics

    def step(cache, x, pos):
        cache.index_copy_(2, pos, x)
        return cache.sum(-1)

    previous = _C.cache_dir()
    _C.set_cache_dir(str(tmp_path))
    try:
        def compile_and_run():
            torch._dynamo.reset()
            compiled = torch.compile(step, backend="tpu", dynamic=False)
            cache, cache_t = torch.zeros(2, 2, 8, 4), torch.zeros(2, 2, 8, 4, device="tpu")
            before = metrics.counters()
            for t in range(3):
                x = torch.full((2, 2, 1, 4), float(t + 1))
                out = compiled(cache_t, x.to("tpu"), torch.tensor([t], device="tpu"))
                assert torch.equal(out.cpu(), step(cache, x, torch.tensor([t])))
                assert torch.equal(cache_t.cpu(), cache)
            after = metrics.counters()
            return {k: after[k] - before[k] for k in ("compile_cache_hits", "donated_buffers")}

        assert compile_and_run() == {"compile_cache_hits": 0, "donated_buffers": 3}
        assert compile_and_run() == {"compile_cache_hits": 1, "donated_buffers": 3}
    finally:
        torch._dynamo.reset()
        _C.set_cache_dir(previous)
