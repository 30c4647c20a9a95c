"""Hugging Face generate() on tpu (issue 27): tiny GPT-2, Llama and Qwen2 from configs (random
init, no downloads), token ids for prompts. Greedy tokens equal CPU's; sampling is seeded,
reproducible and follows CPU's processed distribution; nothing runs on CPU; compiles do not
grow with the number of new tokens (fused buckets, a static cache's compiled forward)."""
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import copy  # noqa: E402
import warnings  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

import torchtpu  # noqa: E402
from torchtpu import _C, metrics  # noqa: E402

transformers = pytest.importorskip("transformers")

VOCAB, EOS, PAD = 96, 3, 0
PROMPT = 6
# 6 + 20 tokens: the dynamic cache's length crosses the buckets 8, 16 and 32.
NEW = 20


def _config(family):
    common = dict(vocab_size=VOCAB, eos_token_id=EOS, bos_token_id=1, pad_token_id=PAD)
    if family == "gpt2":
        # No pad token in the config: GPT-2's forward then skips transformers' check of the
        # ids for padding (`pad_token_id in input_ids[:, [-1, 0]]`), a host read per token,
        # as on CUDA. generate() gets pad_token_id itself.
        common["pad_token_id"] = None
        return transformers.GPT2LMHeadModel(transformers.GPT2Config(n_positions=64, n_embd=32, n_layer=2, n_head=2,
                                                                    **common))
    sizes = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, max_position_embeddings=64, **common)
    if family == "llama":
        return transformers.LlamaForCausalLM(transformers.LlamaConfig(**sizes))
    return transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**sizes))


_models = {}


def models(family):
    """(CPU model, tpu model) of a family, built once per module (seeded random weights)."""
    if family not in _models:
        torch.manual_seed(0)
        cpu = _config(family).eval()
        _models[family] = (cpu, copy.deepcopy(cpu).to("tpu"))
    return _models[family]


def prompt(batch=2):
    return torch.randint(4, VOCAB, (batch, PROMPT), generator=torch.Generator().manual_seed(1))


class StepCounters(transformers.LogitsProcessor):
    """Notes the counters once per generated token (logits processors run eagerly each step,
    after the forward and before the step's flush)."""

    def __init__(self):
        self.steps = []

    def __call__(self, input_ids, scores):
        c = metrics.counters()
        self.steps.append((c["graphs_compiled"], c["downloads"]))
        return scores


def generate(model, ids, counters=None, **kwargs):
    kwargs = {"max_new_tokens": NEW, "do_sample": False, "pad_token_id": PAD, **kwargs}
    if "min_new_tokens" not in kwargs:
        kwargs["min_new_tokens"] = kwargs["max_new_tokens"]  # EOS masked (isin): every run has full length
    processors = transformers.LogitsProcessorList([counters] if counters else [])
    return model.generate(ids, attention_mask=torch.ones_like(ids), logits_processor=processors, **kwargs)


def per_step(counters):
    """Compiles and downloads between consecutive tokens (index k: while making token k + 1)."""
    c = metrics.counters()
    marks = counters.steps + [(c["graphs_compiled"], c["downloads"])]
    return [(b[0] - a[0], b[1] - a[1]) for a, b in zip(marks, marks[1:])]


@pytest.fixture
def fresh():
    """Fused mode and zeroed counters. Executables compiled by earlier tests stay cached:
    the compile counts below are upper bounds, which hits only lower."""
    metrics.reset()
    with torchtpu.mode("fused"), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # transformers' notes on generation flags
        yield
    torchtpu.sync(wait=True)


# Llama's static cache: test_static_cache_forward_is_compiled_once_and_donates_its_cache.
@pytest.mark.parametrize("family, cache", [("gpt2", "dynamic"), ("gpt2", "static"), ("llama", "dynamic"),
                                           ("qwen2", "static")])
def test_greedy_tokens_equal_cpu_with_compiles_that_do_not_grow(fresh, family, cache):
    cpu, tpu = models(family)
    ids = prompt()
    kw = {"cache_implementation": "static"} if cache == "static" else {}
    expected = generate(cpu, ids, **kw)
    counters = StepCounters()
    out = generate(tpu, ids.to("tpu"), counters, **kw)
    assert out.device.type == "tpu" and torch.equal(out.cpu(), expected)
    assert metrics.counters()["fallback_ops"] == {}
    steps = per_step(counters)
    assert len(steps) == NEW
    # One host read per token: the stopping check's flag (unfinished.max() == 0), copied
    # without blocking and read one step late (transformers' DeferredStopCheck). A step whose
    # graph moves to a new bucket also pads its inputs on the host: the first padded step and,
    # for a dynamic cache, each doubling (2 such steps here; 3 allowed). The last step also
    # reads the output.
    assert all(downloads >= 1 for _, downloads in steps[2:]), steps
    assert sum(downloads > 1 for _, downloads in steps[:-1]) <= 3, steps
    later = [compiles for compiles, _ in steps[3:-1]]
    if cache == "static":
        # Tokens 1-3 compile the prefill, the compiled forward and the bookkeeping graphs
        # (exact, then padded to the bucket of max_length); after that nothing, whatever
        # max_new_tokens is, the last step included: the max-length criterion's flag
        # (torch.full(size, is_done)) is lifted into the graph's scalars, so its flip to True
        # runs the same executable (it compiled a graph of its own before).
        assert sum(later) + steps[-1][0] == 0, steps
    else:
        # One compile each time the sequence crosses a bucket (8 -> 16 -> 32: 2 measured,
        # plus the first padded step inside the window); 4 allowed.
        assert sum(later) + steps[-1][0] <= 4, steps


@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_an_early_stop_at_eos_equals_cpu_with_the_stop_check_deferred(fresh, cache, monkeypatch):
    # transformers' DeferredStopCheck (enabled for tpu by torchtpu.integrations.transformers)
    # reads each step's "all finished?" flag one step late, through a non-blocking copy to
    # pinned memory, computes one step too many and undoes it: the result must still be CPU's.
    cpu, tpu = models("gpt2")
    ids = prompt()
    kw = {"cache_implementation": "static"} if cache == "static" else {}
    full = generate(cpu, ids, **kw)
    # Each row's token at an early step is an end of sequence: CPU stops well before NEW.
    eos = sorted({int(full[0, PROMPT + 3]), int(full[1, PROMPT + 6])})
    expected = generate(cpu, ids, min_new_tokens=0, eos_token_id=eos, **kw)
    assert expected.shape[1] < PROMPT + NEW
    deferred = transformers.generation.utils.DeferredStopCheck
    calls = []
    check = deferred.__call__
    monkeypatch.setattr(deferred, "__call__", lambda self, *a: calls.append(1) or check(self, *a))
    out = generate(tpu, ids.to("tpu"), min_new_tokens=0, eos_token_id=eos, **kw)
    assert torch.equal(out.cpu(), expected)
    assert len(calls) >= expected.shape[1] - PROMPT - 1  # the deferred check ran every step
    assert metrics.counters()["fallback_ops"] == {}


def test_strict_mode_tokens_equal_cpu(fresh):
    # Strict mode runs each op at its exact sizes (no buckets): right, not fast.
    cpu, tpu = models("gpt2")
    ids = prompt()
    with torchtpu.mode("strict"):
        out = generate(tpu, ids.to("tpu"), max_new_tokens=3)
    assert torch.equal(out.cpu(), generate(cpu, ids, max_new_tokens=3))
    assert metrics.counters()["fallback_ops"] == {}


def test_static_cache_forward_is_compiled_once_and_donates_its_cache(fresh):
    # transformers compiles the forward of a static-cache generation with
    # torch.compile(backend="tpu") on tpu; each decode step replays the captured executable,
    # whose cache updates (index_copy_) reuse the cache buffers.
    cpu, tpu = models("llama")
    ids = prompt()
    expected = generate(cpu, ids, cache_implementation="static")
    before = _C.capture_stats()
    out = generate(tpu, ids.to("tpu"), cache_implementation="static")
    assert torch.equal(out.cpu(), expected)
    after = _C.capture_stats()
    c = metrics.counters()
    assert c["compile_graphs_traced"] <= 1  # the decode step's graph, traced once (or by an earlier test)
    assert after["replays"] - before["replays"] >= NEW - 2  # decode steps after the capturing one
    # 2 layers x (keys, values) per decode step, each donated (measured 4 per step plus the
    # bookkeeping graphs' own).
    assert c["donated_buffers"] >= 4 * (NEW - 2)


def test_inductor_compile_config_uses_the_tpu_backend(fresh):
    cpu, tpu = models("gpt2")
    ids = prompt()
    config = transformers.CompileConfig()  # Inductor, transformers' default for CUDA
    assert config.backend == "inductor"
    with pytest.warns(UserWarning, match="compiled with torch.compile\\(backend=\"tpu\"\\)"):
        out = generate(tpu, ids.to("tpu"), max_new_tokens=4, cache_implementation="static", compile_config=config)
    assert torch.equal(out.cpu(), generate(cpu, ids, max_new_tokens=4, cache_implementation="static"))


SAMPLING = dict(do_sample=True, temperature=0.7, top_k=20, top_p=0.9, repetition_penalty=1.3)


def processed_probs(model, ids):
    """CPU's next-token distribution after the same processors generate() applies."""
    warpers = transformers.LogitsProcessorList([
        transformers.RepetitionPenaltyLogitsProcessor(1.3), transformers.TemperatureLogitsWarper(0.7),
        transformers.TopKLogitsWarper(20), transformers.TopPLogitsWarper(0.9)])
    with torch.no_grad():
        scores = warpers(ids, model(ids).logits[:, -1].float())
    return scores.softmax(-1)


@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_sampling_is_seeded_and_keeps_to_cpus_processors(fresh, cache):
    cpu, tpu = models("llama")
    kw = dict(SAMPLING, cache_implementation="static") if cache == "static" else dict(SAMPLING)
    ids = prompt().to("tpu")
    torch.manual_seed(7)
    a = generate(tpu, ids, max_new_tokens=8, **kw).cpu()
    torch.manual_seed(7)
    b = generate(tpu, ids, max_new_tokens=8, **kw).cpu()
    assert torch.equal(a, b), "the same seed must give the same tokens"
    assert metrics.counters()["fallback_ops"] == {}
    # Every sampled token is one CPU's processors allow (top-k, top-p, penalty) after its prefix.
    for t in range(PROMPT, a.shape[1]):
        probs = processed_probs(cpu, a[:, :t])
        assert (probs.gather(1, a[:, t:t + 1]) > 0).all(), t


def test_sampled_tokens_follow_cpus_distribution(fresh):
    # The first token's frequencies over 512 rows of one prompt: within 4 standard deviations
    # of CPU's processed probabilities (sampling noise; a wrong temperature or cut-off is far
    # outside).
    cpu, tpu = models("llama")
    rows = prompt(batch=1).expand(512, PROMPT)
    torch.manual_seed(8)
    first = generate(tpu, rows.to("tpu"), max_new_tokens=1, **SAMPLING)[:, PROMPT].cpu()
    assert metrics.counters()["fallback_ops"] == {}
    expected = processed_probs(cpu, rows[:1])[0].double()
    got = torch.bincount(first, minlength=VOCAB).double() / 512
    bound = 4 * (expected * (1 - expected) / 512).sqrt() + 1 / 512
    assert ((got - expected).abs() <= bound).all(), (got, expected)


def test_unknown_transformers_version_fails_loudly(monkeypatch):
    from transformers.generation import utils as generation_utils

    from torchtpu.integrations import UnsupportedVersionError
    from torchtpu.integrations import transformers as adapter

    import sys

    # The module the adapter imports now (transformers may have put another object in
    # sys.modules since this file imported it).
    monkeypatch.setattr(sys.modules["transformers"], "__version__", "9.0.0")
    with pytest.raises(UnsupportedVersionError, match=r"transformers >=5\.0,<6\.0 .*found transformers 9\.0\.0"):
        adapter.install(generation_utils)


def test_compiled_in_place_update_donates_and_keeps_what_others_hold(fresh):
    # A compiled step that writes a cache in place: the cache's buffer is reused when the
    # cache tensor alone holds it; a clone taken before a call keeps its contents (that call
    # runs without donation).
    def step(cache, x, pos):
        cache.index_copy_(2, pos, x)
        return cache.sum(-1)

    compiled = torch.compile(step, backend="tpu", dynamic=False)
    cache, cache_t = torch.zeros(2, 2, 8, 4), torch.zeros(2, 2, 8, 4, device="tpu")
    clones = {}
    for t in range(6):
        x = torch.full((2, 2, 1, 4), float(t + 1))
        if t == 4:
            clones[t] = (cache.clone(), cache_t.clone())
        before = metrics.counters()["donated_buffers"]
        out = compiled(cache_t, x.to("tpu"), torch.tensor([t], device="tpu"))
        donated = metrics.counters()["donated_buffers"] - before
        expected = step(cache, x, torch.tensor([t]))
        assert torch.equal(out.cpu(), expected) and torch.equal(cache_t.cpu(), cache)
        assert donated == (0 if t == 4 else 1), (t, donated)
    cpu_clone, tpu_clone = clones[4]
    assert torch.equal(tpu_clone.cpu(), cpu_clone)
