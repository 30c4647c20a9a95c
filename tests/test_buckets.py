"""Shape buckets (torchtpu/_buckets.py) alone, on CPU: bucket choice, padding specs through
views and broadcasts, host padding, the rule table, and graphs rewritten per bucket run on
padded CPU tensors against the same function at the real sizes (no tpu, no Dynamo)."""
import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx
from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext

from torchtpu import _buckets
from torchtpu._buckets import NoBucket, _broadcast, _plain, _regroup

aten = torch.ops.aten


# ---------------------------------------------------------------------------------------
# Bucket choice.


@pytest.mark.parametrize("setting, expected", [
    ("pow2", "pow2"), ("", None), ("off", None), (" OFF ", None), ("0", None),
    ("256,64,128", [64, 128, 256]), ("8,8,32", [8, 32])])
def test_policy_reads_torchtpu_buckets(monkeypatch, setting, expected):
    monkeypatch.setenv("TORCHTPU_BUCKETS", setting)
    assert _buckets.policy() == expected


def test_policy_default_is_pow2(monkeypatch):
    monkeypatch.delenv("TORCHTPU_BUCKETS", raising=False)
    assert _buckets.policy() == "pow2"


@pytest.mark.parametrize("setting", ["64,abc", "0,8", "-4"])
def test_bad_policy_is_a_value_error_naming_the_variable(monkeypatch, setting):
    monkeypatch.setenv("TORCHTPU_BUCKETS", setting)
    with pytest.raises(ValueError, match="TORCHTPU_BUCKETS"):
        _buckets.policy()


@pytest.mark.parametrize("n, pol, bucket", [
    (1, "pow2", 1), (2, "pow2", 2), (5, "pow2", 8), (8, "pow2", 8), (9, "pow2", 16), (1000, "pow2", 1024),
    (5, [64, 128], 64), (64, [64, 128], 64), (65, [64, 128], 128), (129, [64, 128], 129), (7, None, 7)])
def test_bucket_of(n, pol, bucket):
    assert _buckets.bucket_of(n, pol) == bucket


# ---------------------------------------------------------------------------------------
# Padding specs: per dimension its (size, symbol or None) factors.

T = ((8, "s0"),)  # a dimension padded to 8


def test_view_merging_a_padded_dimension_keeps_its_factors():
    spec = (_plain(2), T, _plain(4))
    merged = _regroup(spec, (16, 4))  # view(B*T, C)
    assert merged == (((2, None), (8, "s0")), _plain(4))
    assert _regroup(merged, (2, 8, 4)) == spec  # and back


def test_view_splitting_a_plain_dimension_next_to_a_padded_one():
    assert _regroup((T, _plain(6)), (8, 2, 3)) == (T, _plain(2), _plain(3))
    assert _regroup((T, _plain(1), _plain(4)), (8, 4)) == (T, _plain(4))  # size-1 dims vanish


def test_view_splitting_a_padded_dimension_cannot_bucket():
    with pytest.raises(NoBucket, match="splits a padded dimension"):
        _regroup((T, _plain(4)), (4, 8))
    with pytest.raises(NoBucket, match="number of elements"):
        _regroup((T, _plain(4)), (8, 8))


def test_broadcast_takes_the_padded_dimension():
    assert _broadcast([(T, _plain(4)), (_plain(1), _plain(4))], (8, 4)) == (T, _plain(4))
    assert _broadcast([(_plain(4),), (_plain(2), T, _plain(4)), None], (2, 8, 4)) == (_plain(2), T, _plain(4))


def test_broadcast_of_differently_padded_dimensions_cannot_bucket():
    with pytest.raises(NoBucket, match="differently padded"):
        _broadcast([(T,), (((8, "s1"),),)], (8,))


def test_pad_and_unpad_through_a_merged_dimension():
    spec = (((2, None), (8, "s0")), _plain(3))  # (B*T, C) with T real 5, bucket 8
    real = torch.arange(2 * 5 * 3.).reshape(10, 3)
    padded = _buckets.pad(real, spec, {"s0": 5})
    assert padded.shape == (16, 3)
    blocks = padded.reshape(2, 8, 3)
    assert torch.equal(blocks[:, :5], real.reshape(2, 5, 3)) and not blocks[:, 5:].any()
    assert torch.equal(_buckets.unpad(padded, spec, {"s0": 5}), real)
    assert _buckets.pad(padded, spec, {"s0": 5}) is padded  # already at the bucket's sizes


def test_carries_sizes():
    t = torch.zeros(2)
    assert not _buckets.carries_sizes([t, 3])
    setattr(t, _buckets._REAL_ATTR, {"s0": 1})
    assert _buckets.carries_sizes([3, t])


# ---------------------------------------------------------------------------------------
# The rule table.


def test_every_rule_names_an_aten_op_of_this_torch():
    assert len(_buckets._RULES) > 50
    for name in _buckets._RULES:
        op = _buckets._op_from_name(name)
        assert op.name() == name


def test_a_rule_for_an_unknown_op_fails_at_registration():
    with pytest.raises(ValueError, match="no aten op 'aten::no_such_op'"):
        _buckets.rule("aten::no_such_op")(lambda rw, n, v: None)
    with pytest.raises(ValueError, match="two bucket rules for aten::mm"):
        _buckets.rule("aten::mm")(lambda rw, n, v: None)


def test_rule_lookup():
    assert _buckets.rule_for(aten.view.default) is _buckets._view
    assert _buckets.rule_for(aten.sum.dim_IntList) is _buckets._sum
    assert _buckets.rule_for(aten.clone.default) is _buckets._same  # tagged pointwise, named first
    assert _buckets.rule_for(aten.sin.default) is _buckets._elementwise  # by PyTorch's pointwise tag
    assert _buckets.rule_for(aten.sort.default) is None


# ---------------------------------------------------------------------------------------
# Rewritten graphs, run on CPU: each padded run equals the function at the real sizes.


def trace(f, tensors, dynamic):
    """f traced to aten ops with symbolic sizes at the dims `dynamic` lists per tensor."""
    mode = FakeTensorMode(shape_env=ShapeEnv())
    fakes = []
    for t, dims in zip(tensors, dynamic):
        sizes = [DimDynamic.DYNAMIC if i in dims else DimDynamic.STATIC for i in range(t.dim())]
        fakes.append(mode.from_tensor(t, symbolic_context=StatelessSymbolicContext(dynamic_sizes=sizes)))
    def returns_a_tuple(*args):  # as AOTAutograd's graphs do
        out = f(*args)
        return tuple(out) if isinstance(out, (list, tuple)) else (out,)

    return make_fx(returns_a_tuple, tracing_mode="symbolic")(*fakes)


def run_padded(f, tensors, dynamic, pol="pow2"):
    """f's graph rewritten for the bucket of the tensors' sizes, run on padded tensors."""
    graph = _buckets.DynamicGraph(trace(f, tensors, dynamic))
    sizes = graph.sizes(tensors, pol)
    padded = graph.rewrite(sizes)
    args = padded.prepare(tensors, sizes)
    for a, t, dims in zip(args, tensors, dynamic):
        # Each padded dimension at its symbol's bucket: the next one up from T, or from T + k
        # when the graph grows it by k (a cat).
        assert all(a.shape[d] >= t.shape[d] and a.shape[d] in sizes.bucket.values() for d in dims)
    for sym in graph.symbols:
        assert sizes.bucket[sym] == _buckets.bucket_of(sizes.real[sym] + graph.headroom[sym], pol)
    return padded.finish(padded.gm(*args), sizes), padded


def check_padded(f, tensors, dynamic, **kwargs):
    out, padded = run_padded(f, tensors, dynamic, **kwargs)
    expected = f(*tensors)
    expected = list(expected) if isinstance(expected, (list, tuple)) else [expected]
    assert len(out) == len(expected)
    for a, e in zip(out, expected):
        torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-6)
    return padded


def seeded(*shapes):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(s, generator=g) for s in shapes]


def test_reductions_over_a_padded_dimension_see_their_identity():
    (x,) = seeded((3, 5, 4))
    x = x - 2  # all negative: a zero in the padding would win amax
    check_padded(lambda x: (x.sum(1), x.mean(1), x.amax(1), x.amin(1), torch.logsumexp(x, 1),
                            x.max(1).values, x.argmax(1), x.prod(1), torch.amax(x), x.sum(dim=[]),
                            torch.amax(x, dim=[])), [x], [{1}])


def test_softmax_over_a_padded_dimension_gives_the_padding_nothing():
    (x,) = seeded((2, 5, 3))
    check_padded(lambda x: (x.softmax(1), x.log_softmax(1), x.softmax(-1)), [x], [{1}])


def test_elementwise_ops_keep_the_padding_zero():
    (x,) = seeded((2, 5))
    padded = check_padded(lambda x: ((x.exp() + 1).sum(1), torch.cos(x).amax(1)), [x], [{1}])
    assert padded.gm.code.count("aten.where") >= 2  # exp(0) + 1 and cos(0) re-zeroed


def test_linear_through_a_merged_batch_and_length():
    x, w, b = seeded((3, 5, 4), (4, 6), (6,))
    check_padded(lambda x, w, b: torch.addmm(b, x.reshape(-1, 4), w).view(3, -1, 6).mean(1),
                 [x, w, b], [{1}, set(), set()])


def test_attention_scores_over_padded_keys():
    q, k = seeded((2, 5, 4), (2, 5, 4))
    check_padded(lambda q, k: torch.bmm(q, k.transpose(1, 2)).softmax(-1).sum(1), [q, k], [{1}, {1}])


def test_embedding_and_cross_entropy_ignore_padded_tokens():
    g = torch.Generator().manual_seed(0)
    ids, target = torch.randint(0, 7, (2, 5), generator=g), torch.randint(0, 7, (2, 5), generator=g)
    (table,) = seeded((7, 3))
    check_padded(lambda ids, target, table: F.cross_entropy(F.embedding(ids, table).reshape(-1, 3) @ table.t(),
                                                            target.reshape(-1)),
                 [ids, target, table], [{1}, {1}, set()])


def test_layer_norm_over_a_plain_dimension():
    x, w, b = seeded((2, 5, 4), (4,), (4,))
    check_padded(lambda x, w, b: F.layer_norm(x, (4,), w, b).sum(1), [x, w, b], [{1}, set(), set()])


def test_unbind_and_split_of_a_plain_dimension():
    (x,) = seeded((3, 5, 4))
    check_padded(lambda x: [t.sum(1) for t in x.unbind(2)] + [t.amax(1) for t in x.split(2, 0)], [x], [{1}])


def test_outputs_are_sliced_to_the_real_sizes():
    (x,) = seeded((2, 5))
    out, _ = run_padded(lambda x: x * 2, [x], [{1}])
    assert out[0].shape == (2, 5)
    out, _ = run_padded(lambda x: x * 2, [x], [{1}], pol=[16, 64])
    assert out[0].shape == (2, 5)


def test_slices_along_a_padded_dimension_read_at_the_real_sizes():
    # From the end (a moving position), from the front, dropping the last (a length T - 1).
    (x,) = seeded((2, 5, 3))
    check_padded(lambda x: (x[:, -1:], x[:, -2:], x[:, 1:3], x[:, 1:], x[:, :-1], x[:, :-1].sum(1), x[:, 1:].amax(1)),
                 [x], [{1}])


def test_a_cat_along_a_padded_dimension_grows_in_its_bucket():
    # A decode step: the cache of T tokens and the token row grow by one (T + 1); the bucket
    # holds T + 1 (headroom), and attention over the T + 1 keys sees only real ones.
    x, new, q = seeded((2, 8, 4), (2, 1, 4), (2, 1, 4))
    ids = torch.arange(16).view(2, 8)
    f = lambda x, new, q, ids: (torch.cat([x, new], 1), torch.cat([ids, ids[:, -1:] + 1], 1),  # noqa: E731
                                torch.cat([new, new, x], 1).sum(1),
                                torch.bmm(q, torch.cat([x, new], 1).transpose(1, 2)).softmax(-1))
    out, padded = run_padded(f, [x, new, q, ids], [{1}, set(), set(), {1}])
    assert sorted(padded.source.headroom.values()) == [1, 2]  # ids grow by one, x by two
    assert padded.input_specs["arg0_1"][1][0][0] == 16  # 8 + 2 tokens: the next bucket
    for a, e in zip(out, f(x, new, q, ids)):
        torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-6)


def test_pad_moves_a_value_kept_padded_to_a_larger_bucket():
    real = torch.arange(10.0).view(2, 5)
    held = _buckets.pad(real, ((((2, None),),) + ((((8, "s0"),),))), {"s0": 5})
    spec16 = (((2, None),), ((16, "s0+1"),))
    grown = _buckets.pad(held, spec16, {"s0": 4}, current=(((2, None),), ((8, "s0+1"),)))
    assert grown.shape == (2, 16) and torch.equal(grown[:, :5], real) and not grown[:, 5:].any()
    assert torch.equal(_buckets.unpad(grown, spec16, {"s0": 4}), real)


@pytest.mark.parametrize("f, reason", [
    (lambda x: torch.sort(x, 1).values, "sort"),
    (lambda x: x.var(1), "var"),
    (lambda x: x[:, ::2], "strided slice"),
    (lambda x: torch.cat([x, x], 1), "several padded pieces"),
    (lambda x: x.cumsum(1), "cumsum on a padded tensor"),
    (lambda x: x.view(-1, 2), "a view"),
])
def test_ops_the_rules_cannot_mask_turn_bucketing_off(f, reason):
    (x,) = seeded((2, 5))
    graph = _buckets.DynamicGraph(trace(f, [x], [{1}]))
    with pytest.raises(NoBucket, match=reason):
        graph.rewrite(graph.sizes([x], "pow2"))


def test_sizes_of_a_call():
    (x,) = seeded((2, 5))
    graph = _buckets.DynamicGraph(trace(lambda x: x.sum(1), [x], [{1}]))
    (sym,) = graph.symbols
    sizes = graph.sizes([x], "pow2")
    assert (sizes.real, sizes.bucket, sizes.key) == ({sym: 5}, {sym: 8}, (8,))
    assert graph.sizes([x], None) is None  # bucketing off
    assert graph.sizes([x], [2, 4]) is None  # above the largest bucket: exact
