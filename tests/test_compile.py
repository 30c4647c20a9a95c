"""torch.compile(model, backend="tpu"): compiled vs CPU results, compile counts, graph
breaks, replay of captured executables, the disk cache across processes, fallbacks."""
import copy
import os
import subprocess
import sys
import tempfile
import textwrap

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import torchtpu
from torchtpu import _C, compiler
from utils import assert_close

# The folder holding the torchtpu under test: the source tree, or site-packages when the tests
# run against an installed torchtpu (`make check-torch-range`), whose source tree has no glue.
IMPORT_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(torchtpu.__file__)))


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    import torch._dynamo

    torch._dynamo.reset()
    yield
    torch._dynamo.reset()
    torchtpu.sync(wait=True)


def counters():
    return torchtpu.metrics.counters()


def fallbacks_since(before):
    after = counters()["fallback_ops"]
    return {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}


class MLP(nn.Module):
    def __init__(self, i=8, h=16, o=4):
        super().__init__()
        self.fc1 = nn.Linear(i, h)
        self.fc2 = nn.Linear(h, o)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


class Block(nn.Module):
    """A GPT-style block: pre-norm causal self-attention and an MLP."""

    def __init__(self, d=16, heads=2):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 4 * d)
        self.fc2 = nn.Linear(4 * d, d)

    def forward(self, x):
        B, T, C = x.shape
        h = self.heads
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, h, C // h).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / (C // h) ** 0.5)
        mask = torch.tril(torch.ones(T, T, device=x.device, dtype=torch.bool))
        att = att.masked_fill(~mask, float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        x = x + self.proj(y)
        return x + self.fc2(F.gelu(self.fc(self.ln2(x))))


def mse(a, b):
    d = a - b
    return (d * d).mean()


def train(model, opt_cls, data, compiled, device, **opt_kwargs):
    model = copy.deepcopy(model).to(device)
    opt = opt_cls(model.parameters(), **opt_kwargs)
    fwd = torch.compile(model, backend="tpu") if compiled else model
    losses = []
    for x, y in data:
        loss = mse(fwd(x.to(device)), y.to(device))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.detach().to("cpu"))
    return torch.stack(losses), [p.detach().to("cpu") for p in model.parameters()]


def test_backend_is_registered_by_name():
    from torch._dynamo.backends.registry import lookup_backend

    assert lookup_backend("tpu") is compiler.tpu_backend


def test_mlp_inference_matches_cpu_and_replays():
    torch.manual_seed(0)
    model = MLP()
    x = torch.randn(5, 8)
    expected = model(x)
    tpu_model = copy.deepcopy(model).to("tpu")
    compiled = torch.compile(tpu_model, backend="tpu")
    before = dict(counters()["fallback_ops"])
    with torch.no_grad():
        xt = x.to("tpu")
        first = compiled(xt)
        assert_close(first, expected.detach(), rtol=1e-5, atol=1e-5)
        stats = _C.capture_stats()
        traced = counters()["ops_traced"]
        for _ in range(3):
            again = compiled(xt)
        # Later calls run the captured executable: no aten op is traced again.
        assert counters()["ops_traced"] == traced
        assert _C.capture_stats()["replays"] == stats["replays"] + 3
    assert_close(again, expected.detach(), rtol=1e-5, atol=1e-5)
    assert not fallbacks_since(before)


@pytest.mark.parametrize("opt_cls,kwargs", [(torch.optim.SGD, {"lr": 0.1}), (torch.optim.AdamW, {"lr": 0.01})])
def test_mlp_training_matches_cpu(opt_cls, kwargs):
    torch.manual_seed(0)
    model = MLP()
    data = [(torch.randn(6, 8), torch.randn(6, 4)) for _ in range(4)]
    cpu_losses, cpu_params = train(model, opt_cls, data, compiled=False, device="cpu", **kwargs)
    stats = _C.capture_stats()
    tpu_losses, tpu_params = train(model, opt_cls, data, compiled=True, device="tpu", **kwargs)
    # Tolerance: float32, different reduction order in XLA; 4 steps.
    torch.testing.assert_close(tpu_losses, cpu_losses, rtol=1e-5, atol=1e-5)
    for a, b in zip(tpu_params, cpu_params):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    # Forward and backward were each captured once, then replayed for the other 3 steps.
    now = _C.capture_stats()
    assert now["captures"] - stats["captures"] == 2
    assert now["replays"] - stats["replays"] == 6


def test_gradients_match_cpu():
    torch.manual_seed(1)
    model = MLP(6, 10, 3)
    x = torch.randn(4, 6)
    model(x).pow(2).sum().backward()
    tpu_model = copy.deepcopy(model).to("tpu")
    tpu_model.zero_grad()
    out = torch.compile(tpu_model, backend="tpu")(x.to("tpu"))
    (out * out).sum().backward()
    for p, q in zip(model.parameters(), tpu_model.parameters()):
        assert_close(q.grad, p.grad, rtol=1e-5, atol=1e-5)


def test_transformer_block_fullgraph_training_adamw():
    torch.manual_seed(0)
    model = Block()
    data = [(torch.randn(2, 8, 16), torch.randn(2, 8, 16)) for _ in range(3)]
    # eps=1e-3: the k bias has a mathematically zero gradient (softmax ignores it); with a
    # tiny eps Adam turns its rounding noise (~1e-9) into +-lr steps on either device.
    cpu_losses, cpu_params = train(model, torch.optim.AdamW, data, compiled=False, device="cpu", lr=1e-2, eps=1e-3)
    tpu_model = copy.deepcopy(model).to("tpu")
    opt = torch.optim.AdamW(tpu_model.parameters(), lr=1e-2, eps=1e-3)
    fwd = torch.compile(tpu_model, backend="tpu", fullgraph=True)
    losses = []
    for x, y in data:
        loss = mse(fwd(x.to("tpu")), y.to("tpu"))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.detach().cpu())
    # Ops without a tpu lowering yet (layer_norm, gelu, amax, ...) run on CPU inside the
    # compiled graph; results must match regardless (measured within 1e-2 of this tolerance).
    torch.testing.assert_close(torch.stack(losses), cpu_losses, rtol=1e-5, atol=1e-5)
    for a, b in zip(tpu_model.parameters(), cpu_params):
        torch.testing.assert_close(a.detach().cpu(), b, rtol=1e-5, atol=1e-5)


def test_small_cnn_fullgraph():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(64, 5))
    x = torch.randn(2, 3, 8, 8)
    expected = model(x)
    expected.sum().backward()
    tpu_model = copy.deepcopy(model).to("tpu")
    tpu_model.zero_grad()
    out = torch.compile(tpu_model, backend="tpu", fullgraph=True)(x.to("tpu"))
    assert_close(out, expected.detach(), rtol=1e-5, atol=1e-5)
    out.sum().backward()
    for p, q in zip(model.parameters(), tpu_model.parameters()):
        assert_close(q.grad, p.grad, rtol=1e-5, atol=1e-5)


def test_three_shapes_compile_exactly_once_each(monkeypatch):
    # Sizes used by no other test, so neither cache has these graphs yet. Exact shapes (no
    # buckets): see test_dynamic_lengths_compile_once_per_bucket_and_match_eager for those.
    monkeypatch.setenv("TORCHTPU_BUCKETS", "off")
    torch.manual_seed(0)
    cpu_model = nn.Sequential(nn.Linear(13, 7), nn.ReLU(), nn.Linear(7, 3))
    compiled = torch.compile(copy.deepcopy(cpu_model).to("tpu"), backend="tpu")
    deltas, results = [], []
    with torch.no_grad():
        for n in (2, 3, 5, 2, 3, 5, 3):
            x = torch.randn(n, 13)
            xt = x.to("tpu")
            torchtpu.sync()
            before = counters()["graphs_compiled"]
            out = compiled(xt)
            torchtpu.sync(wait=True)
            deltas.append(counters()["graphs_compiled"] - before)
            results.append((out, cpu_model(x)))
    # One executable per new input shape (Dynamo's second shape makes a dynamic graph;
    # each concrete shape is still its own XLA executable), none for shapes seen before.
    assert deltas == [1, 1, 1, 0, 0, 0, 0]
    for out, expected in results:
        assert_close(out, expected, rtol=1e-5, atol=1e-5)


def test_graph_break_runs_eagerly_between_compiled_regions(capsys):
    def f(x):
        y = (x * 2).relu()
        print("eager in the middle")
        s = y.sum().item()  # a graph break: Dynamo cannot capture .item()
        return y * s + 1

    x = torch.randn(6)
    graphs = compiler.fx_graphs_compiled
    out = torch.compile(f, backend="tpu")(x.to("tpu"))
    assert_close(out, f(x), rtol=1e-5, atol=1e-5)
    assert capsys.readouterr().out.count("eager in the middle") == 2
    # At least one compiled graph on each side of the break (this Dynamo splits at the print
    # and at .item(): [x*2 relu], [y.sum()], [y*s+1]).
    assert compiler.fx_graphs_compiled - graphs >= 2


def test_fullgraph_rejects_graph_break():
    def f(x):
        y = x + 1
        torch._dynamo.graph_break()
        return y * 2

    with pytest.raises(Exception, match="graph_break|[Gg]raph break"):
        torch.compile(f, backend="tpu", fullgraph=True)(torch.randn(3).to("tpu"))


def test_item_inside_fullgraph_is_correct():
    # Dynamo keeps .item() in the graph here; reading the scalar flushes in the middle, so
    # the graph is not captured as one executable and keeps running through the interpreter.
    def f(x):
        return x * x.sum().item()

    x = torch.randn(3)
    compiled = torch.compile(f, backend="tpu", fullgraph=True)
    for scale in (1.0, 2.0):
        assert_close(compiled((x * scale).to("tpu")), f(x * scale), rtol=1e-5, atol=1e-5)


def test_input_mutation_and_replay():
    def f(x, y):
        x.add_(1.0)
        return x * y

    x, y = torch.randn(4), torch.randn(4)
    xt, yt = x.to("tpu"), y.to("tpu")
    compiled = torch.compile(f, backend="tpu")
    for _ in range(3):
        out = compiled(xt, yt)
        expected = f(x, y)
        assert_close(out, expected, rtol=1e-6, atol=1e-6)
        assert_close(xt, x, rtol=1e-6, atol=1e-6)


def test_python_scalar_arguments():
    def f(x, alpha):
        return x * alpha + 1

    x = torch.randn(5)
    compiled = torch.compile(f, backend="tpu")
    for alpha in (0.5, 2.0, -3.0, 2.0):
        assert_close(compiled(x.to("tpu"), alpha), f(x, alpha), rtol=1e-6, atol=1e-6)


def test_strict_mode_runs_graph_eagerly():
    x = torch.randn(3, 3)
    compiled = torch.compile(lambda a: (a @ a).relu() + 1, backend="tpu")
    with torchtpu.mode("strict"):
        assert_close(compiled(x.to("tpu")), (x @ x).relu() + 1, rtol=1e-5, atol=1e-5)


def test_op_without_lowering_falls_back_or_raises():
    def f(x):
        return torch.igamma(x * 2 + 1, x + 1) + 1  # igamma has no tpu lowering yet

    x = torch.rand(4)
    before = dict(counters()["fallback_ops"])
    out = torch.compile(f, backend="tpu")(x.to("tpu"))
    assert_close(out, f(x), rtol=1e-5, atol=1e-5)
    assert any("igamma" in op for op in fallbacks_since(before))
    torch._dynamo.reset()
    _C.set_fallback_policy("error")
    try:
        with pytest.raises(NotImplementedError, match="igamma"):
            torch.compile(f, backend="tpu")(x.to("tpu"))
    finally:
        _C.set_fallback_policy(os.environ.get("TORCHTPU_FALLBACK", "warn"))


_SECOND_PROCESS = textwrap.dedent(
    """
    import sys, torch, torchtpu
    assert "torch._dynamo" not in sys.modules, "importing torchtpu imported dynamo"
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(11, 9), torch.nn.ReLU(), torch.nn.Linear(9, 2)).to("tpu")
    x = torch.randn(3, 11).to("tpu")
    compiled = torch.compile(model, backend="tpu")
    torchtpu.sync(wait=True)
    before = torchtpu.metrics.counters()
    out = compiled(x)
    out.sum().backward()
    torchtpu.sync(wait=True)
    after = torchtpu.metrics.counters()
    print("COMPILED", after["graphs_compiled"] - before["graphs_compiled"],
          "DISK", after["cache_hits_disk"] - before["cache_hits_disk"])
    """
)


def test_disk_cache_second_process_compiles_nothing():
    with tempfile.TemporaryDirectory(prefix="torchtpu-compile-cache-") as cache:
        env = dict(os.environ, TORCHTPU_CACHE_DIR=cache, PYTHONPATH=IMPORT_ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
        runs = []
        for _ in range(2):
            proc = subprocess.run([sys.executable, "-c", _SECOND_PROCESS], env=env, capture_output=True, text=True,
                                  timeout=300)
            assert proc.returncode == 0, proc.stderr[-3000:]
            line = [l for l in proc.stdout.splitlines() if l.startswith("COMPILED")][-1].split()
            runs.append((int(line[1]), int(line[3])))
    (compiled_first, _), (compiled_second, disk_second) = runs
    assert compiled_first >= 2  # forward and backward (plus eager graphs around them)
    assert compiled_second == 0
    assert disk_second == compiled_first


def test_compiled_and_eager_share_the_memory_cache():
    x = torch.randn(9, 9).to("tpu")
    torchtpu.sync(wait=True)
    before = counters()
    compiled = torch.compile(lambda a: (a @ a).relu(), backend="tpu")
    y = compiled(x)
    torchtpu.sync(wait=True)
    middle = counters()
    z = (x @ x).relu()  # the same graph, traced eagerly
    torchtpu.sync(wait=True)
    after = counters()
    assert middle["graphs_compiled"] - before["graphs_compiled"] == 1
    assert after["graphs_compiled"] == middle["graphs_compiled"]
    assert after["cache_hits_memory"] - middle["cache_hits_memory"] == 1
    assert_close(y, z.cpu(), rtol=0, atol=0)


def test_interpreter_path_without_replay(monkeypatch):
    monkeypatch.setenv("TORCHTPU_COMPILE_REPLAY", "0")
    torch.manual_seed(0)
    model = MLP(5, 6, 2)
    x = torch.randn(3, 5)
    compiled = torch.compile(copy.deepcopy(model).to("tpu"), backend="tpu")
    stats = _C.capture_stats()
    with torch.no_grad():
        for _ in range(2):
            assert_close(compiled(x.to("tpu")), model(x).detach(), rtol=1e-5, atol=1e-5)
    assert _C.capture_stats() == stats


def test_training_three_shapes_compile_counts(monkeypatch):
    monkeypatch.setenv("TORCHTPU_BUCKETS", "off")  # exact shapes; buckets are tested below
    # Forward and backward: one executable each per new batch size, none for sizes seen
    # before. (Eager work between them, e.g. AOTAutograd detaching saved views on a
    # capturing call and the gradient seed, is flushed outside the measured windows.)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(17, 5), nn.ReLU(), nn.Linear(5, 1)).to("tpu")
    compiled = torch.compile(model, backend="tpu")
    fwd, bwd, total = [], [], []
    for n in (4, 6, 10) * 4:
        x = torch.randn(n, 17).to("tpu")
        torchtpu.sync()
        start = counters()["graphs_compiled"]
        out = compiled(x)
        fwd.append(counters()["graphs_compiled"] - start)
        grad_seed = torch.ones_like(out)
        torchtpu.sync()
        before = counters()["graphs_compiled"]
        out.backward(grad_seed)
        bwd.append(counters()["graphs_compiled"] - before)
        torchtpu.sync(wait=True)
        total.append(counters()["graphs_compiled"] - start)
        model.zero_grad(set_to_none=True)
    assert fwd == [1, 1, 1] + [0] * 9
    assert bwd == [1, 1, 1] + [0] * 9
    # The small eager graphs around the calls (gradient seed, detaches) differ once between
    # a capturing call and a replaying one (Dynamo's second shape switches to a dynamic
    # graph, so size 4 is captured twice); in the last round nothing compiles.
    assert total[9:] == [0, 0, 0]


def test_reset_mid_training_matches_eager():
    # A graph captured after the optimizer has updated the weights, on a first (capturing)
    # forward: the saved transposes of the weights are functional views of the parameters
    # and the backward reads them through their storage's base. Replays must read the
    # current weights, not the ones of the capturing step.
    torch.manual_seed(0)
    model = Block()
    data = [(torch.randn(2, 8, 16), torch.randn(2, 8, 16)) for _ in range(2)]

    def run(reset_at):
        tpu_model = copy.deepcopy(model).to("tpu")
        opt = torch.optim.AdamW(tpu_model.parameters(), lr=1e-2, eps=1e-3)
        fwd = torch.compile(tpu_model, backend="tpu") if reset_at is not None else tpu_model
        losses = []
        for step in range(8):
            if step == reset_at:
                torch._dynamo.reset()
            x, y = data[step % 2]
            loss = mse(fwd(x.to("tpu")), y.to("tpu"))
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.detach().cpu())
        return torch.stack(losses)

    eager = run(None)
    stats = _C.capture_stats()
    compiled = run(3)
    replays = _C.capture_stats()["replays"] - stats["replays"]
    assert replays >= 8  # the steps after each capture replay (forward and backward)
    torch.testing.assert_close(compiled, eager, rtol=1e-5, atol=1e-6)


class SeqClassifier(nn.Module):
    """Variable-length sequences: embedding, non-causal attention (softmax over padded keys),
    layer norm, mean and max pooling over the sequence, and the loss inside the module."""

    def __init__(self, vocab=50, d=16):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.qkv = nn.Linear(d, 3 * d)
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(2 * d, 3)

    def forward(self, ids, target):
        x = self.emb(ids)
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        att = (q @ k.transpose(1, 2) / 4.0).softmax(-1)
        h = self.ln(x + att @ v)
        pooled = torch.cat([h.mean(1), h.amax(1)], dim=-1)
        logits = self.head(pooled)
        return logits, F.cross_entropy(logits, target)


def _train_variable_lengths(device, compiled, lengths, **compile_kwargs):
    torch.manual_seed(0)
    model = SeqClassifier().to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    fwd = torch.compile(model, backend="tpu", **compile_kwargs) if compiled else model
    losses, logits = [], []
    for i, n in enumerate(lengths):
        g = torch.Generator().manual_seed(i)
        ids, target = torch.randint(0, 50, (3, n), generator=g), torch.randint(0, 3, (3,), generator=g)
        out, loss = fwd(ids.to(device), target.to(device))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.detach().to("cpu"))
        logits.append(out.detach().to("cpu"))
    return torch.stack(losses), logits, [p.detach().to("cpu") for p in model.parameters()]


def _bucketed_graphs():
    return [g for g in compiler._compiled_graphs if isinstance(g, compiler._BucketedGraph)]


def test_dynamic_lengths_compile_once_per_bucket_and_match_eager(monkeypatch):
    monkeypatch.setenv("TORCHTPU_BUCKETS", "pow2")
    lengths = [5, 7, 12, 3, 16, 9, 4, 13]  # buckets 8, 8, 16, 4, 16, 16, 4, 16
    cpu_losses, cpu_logits, cpu_params = _train_variable_lengths("cpu", False, lengths)
    older = set(_bucketed_graphs())
    before = counters()["graphs_compiled"]
    losses, logits, params = _train_variable_lengths("tpu", True, lengths, dynamic=True)
    first_pass = counters()["graphs_compiled"] - before
    torch.testing.assert_close(losses, cpu_losses, rtol=1e-5, atol=1e-6)
    for a, b in zip(logits, cpu_logits):
        assert a.shape == b.shape
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    for a, b in zip(params, cpu_params):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    graphs = [g for g in _bucketed_graphs() if g not in older]
    assert {g.name for g in graphs} == {"forward", "backward"}
    for g in graphs:
        # One captured executable per bucket (4, 8, 16) and batch 3 -> 4; nothing exact.
        assert sorted(g.variants) in ([(4, 4), (4, 8), (4, 16)], [(4, 4), (8, 4), (16, 4)])
        assert all(v is not None for v in g.variants.values()) and g.stats["captured"] == 0
        assert all(v[0].stats["captured"] == 1 for v in g.variants.values())  # one executable each
    assert not compiler.bucket_fallbacks
    # The same lengths again: every graph is in a cache, nothing compiles.
    before = counters()["graphs_compiled"]
    _train_variable_lengths("tpu", True, lengths, dynamic=True)
    assert counters()["graphs_compiled"] - before == 0
    # Per bucket a forward and a backward, plus the optimizer step and the gradient seed.
    assert first_pass <= 3 * 2 + 2


def test_dynamic_lengths_without_buckets_compile_per_length(monkeypatch):
    monkeypatch.setenv("TORCHTPU_BUCKETS", "off")
    lengths = [5, 7, 6]
    cpu_losses, _, _ = _train_variable_lengths("cpu", False, lengths)
    before = counters()["graphs_compiled"]
    losses, _, _ = _train_variable_lengths("tpu", True, lengths, dynamic=True)
    torch.testing.assert_close(losses, cpu_losses, rtol=1e-5, atol=1e-6)
    assert counters()["graphs_compiled"] - before >= 2 * len(lengths)


def test_bucketing_falls_back_for_ops_it_cannot_mask(monkeypatch):
    monkeypatch.setenv("TORCHTPU_BUCKETS", "pow2")

    def f(x):
        return torch.sort(x, dim=1).values[:, :2] * 2 + x.var(1, keepdim=True)

    compiled = torch.compile(f, backend="tpu", dynamic=True)
    for n in (5, 6, 3):
        x = torch.randn(2, n)
        assert_close(compiled(x.to("tpu")), f(x), rtol=1e-5, atol=1e-5)
    assert compiler.bucket_fallbacks
    assert "exact sizes" in torchtpu.metrics.report()


def test_mark_dynamic_inference_pads_to_buckets_and_slices_outputs(monkeypatch):
    monkeypatch.setenv("TORCHTPU_BUCKETS", "8,32")
    torch.manual_seed(0)
    model = SeqClassifier()
    compiled = torch.compile(copy.deepcopy(model).to("tpu"), backend="tpu")
    older = set(_bucketed_graphs())
    with torch.no_grad():
        for n in (5, 9, 31, 2, 40):  # buckets 8, 32, 32, 8, and 40 (above the largest: exact)
            ids, target = torch.randint(0, 50, (2, n)), torch.randint(0, 3, (2,))
            ids_t = ids.to("tpu")
            torch._dynamo.mark_dynamic(ids_t, 1)
            logits, loss = compiled(ids_t, target.to("tpu"))
            ref_logits, ref_loss = model(ids, target)
            assert_close(logits, ref_logits, rtol=1e-5, atol=1e-6)
            assert_close(loss, ref_loss, rtol=1e-5, atol=1e-6)
    (graph,) = [g for g in _bucketed_graphs() if g not in older]
    assert graph.name == "inference"
    assert sorted(graph.variants) == [(8,), (32,)]
    assert graph.stats["captured"] == 1  # n=40: the exact graph


def test_bucketing_never_uses_a_padded_size_as_a_value(monkeypatch):
    monkeypatch.setenv("TORCHTPU_BUCKETS", "pow2")

    def f(x):
        n = x.shape[1]
        return x * torch.arange(n, 2 * n, device=x.device) + x.sum(1, keepdim=True) / n

    compiled = torch.compile(f, backend="tpu", dynamic=True)
    for n in (5, 6, 3, 7):
        x = torch.randn(2, n)
        assert_close(compiled(x.to("tpu")), f(x), rtol=1e-5, atol=1e-5)


class NanoGPT(nn.Module):
    """nanoGPT's shape in small: token and position embeddings, pre-norm blocks of causal
    self-attention (scaled_dot_product_attention) and a GELU MLP, a tied head."""

    def __init__(self, vocab=64, block=16, width=32, heads=4, layers=2):
        super().__init__()
        self.heads = heads
        self.wte, self.wpe = nn.Embedding(vocab, width), nn.Embedding(block, width)
        self.blocks = nn.ModuleList(nn.ModuleDict(dict(
            ln_1=nn.LayerNorm(width), attn=nn.Linear(width, 3 * width), proj=nn.Linear(width, width),
            ln_2=nn.LayerNorm(width), fc=nn.Linear(width, 4 * width), out=nn.Linear(4 * width, width)))
            for _ in range(layers))
        self.ln_f = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)
        self.head.weight = self.wte.weight

    def forward(self, idx, targets):
        b, t = idx.shape
        x = self.wte(idx) + self.wpe(torch.arange(t, device=idx.device))
        for blk in self.blocks:
            q, k, v = blk.attn(blk.ln_1(x)).split(x.shape[-1], dim=2)
            q, k, v = (z.view(b, t, self.heads, -1).transpose(1, 2) for z in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, -1)
            x = x + blk.proj(y)
            x = x + blk.out(F.gelu(blk.fc(blk.ln_2(x))))
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


@pytest.mark.parametrize("backend_args", [{}, {"backend": "inductor"}], ids=["default", "inductor-by-name"])
def test_compile_with_inductor_on_tpu_trains_with_the_tpu_backend(backend_args):
    # torch.compile(model) as nanoGPT's train.py writes it: Inductor would generate Pallas code
    # for Google's torch_tpu (or crash); the graphs go to torchtpu's backend, said once.
    torch.manual_seed(0)
    cpu = NanoGPT()
    tpu = copy.deepcopy(cpu).to("tpu")
    compiled = torch.compile(tpu, **backend_args)
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randint(0, 64, (4, 16), generator=g), torch.randint(0, 64, (4, 16), generator=g))
               for _ in range(3)]
    opt_cpu, opt_tpu = torch.optim.AdamW(cpu.parameters(), lr=1e-2), torch.optim.AdamW(tpu.parameters(), lr=1e-2)
    def tpu_graphs():  # compiled by the tpu backend, or loaded from its cache
        c = counters()
        return c.get("compile_graphs_traced", 0) + c.get("compile_cache_hits", 0)

    graphs = tpu_graphs()
    losses = []
    import warnings
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for x, y in batches:
            for model, opt, device in ((cpu, opt_cpu, "cpu"), (compiled, opt_tpu, "tpu")):
                opt.zero_grad()
                loss = model(x.to(device), y.to(device))
                loss.backward()
                opt.step()
                losses.append(loss.item())
    assert tpu_graphs() > graphs  # the tpu backend compiled them
    routed = [w for w in caught if "torch.compile with Inductor" in str(w.message)]
    assert len(routed) <= 1  # once per process (an earlier test may have said it already)
    assert_close(torch.tensor(losses[1::2]), torch.tensor(losses[0::2]), rtol=1e-4, atol=1e-5)
    assert_close(compiled.head.weight, cpu.head.weight, rtol=1e-3, atol=1e-4)


def test_inductor_still_compiles_cpu_graphs():
    model = nn.Linear(4, 3)
    x = torch.randn(2, 4)
    before = counters()
    assert_close(torch.compile(model)(x), model(x))
    after = counters()
    for key in ("compile_graphs_traced", "compile_cache_hits"):  # Inductor's, not torchtpu's
        assert after.get(key, 0) == before.get(key, 0)
