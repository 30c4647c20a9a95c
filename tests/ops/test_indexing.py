"""Indexing ops: advanced indexing and index_put, index_select, gather/scatter and their
reductions, index_add, masked ops, embedding, one_hot, sort/topk; data-dependent ops
(nonzero, masked_select, x[mask]) are in test_data_dependent.py."""
import pytest
import torch
import torch.nn.functional as F

import torchtpu
from utils import check, check_error

torch.manual_seed(0)
X = torch.randn(4, 5, requires_grad=True)
X3 = torch.randn(3, 4, 5, requires_grad=True)
XI = torch.randint(-9, 9, (4, 5))
XB = torch.rand(4, 5) > 0.5
I = torch.tensor([0, -2, 1])
I32 = torch.tensor([[1, 0], [3, -1]], dtype=torch.int32)
IDX = torch.tensor([[0, 2, 1], [3, 0, 4], [1, 1, 0], [2, 3, 3]])
UNIQ = torch.tensor([[0, 2], [3, 0], [1, 4], [2, 3]])  # no duplicates per row
M = torch.tensor([True, False, True, True])


def flat(out):
    if isinstance(out, (list, tuple)):
        return tuple(t for o in out for t in flat(o))
    return (out,)


def group(*fns):
    return lambda t: tuple(o for fn in fns for o in flat(fn(t)))


def on(x, t):
    """t on x's device: index arguments of gather/scatter/index_select must be (as on CUDA);
    advanced indexing (x[I]) takes CPU indices."""
    return t.to(x.device)


def put(x, key, value, accumulate=False):
    x = x.clone()
    if accumulate:
        x[key] += value
    else:
        x[key] = value
    return x


CASES = {
    "index": (group(lambda x: x[I], lambda x: x[I, I], lambda x: x[:, I32], lambda x: x[I32[:, :1], I32],
                    lambda x: x[[0, 3]], lambda x: x[torch.tensor(2)]), X),
    "index_3d": (group(lambda x: x[I, :, I], lambda x: x[:, I, :2], lambda x: x[..., I32],
                       lambda x: x[I[:, None], 1:, I32[0]], lambda x: x[:0][:, I]), X3),
    "index_int_bool": (group(lambda x: x[I], lambda x: x[:, I32]), XI),
    "index_bool_dtype": (group(lambda x: x[I, 1:]), XB),
    "index_put": (group(lambda x: put(x, (I,), x[:3] * 2), lambda x: put(x, (slice(None), I), 1.5),
                        lambda x: x.index_put((I32[0], I32[1]), torch.tensor(9.0)),
                        lambda x: put(x, (torch.tensor([0, 0, 1]),), x[:3], accumulate=True),
                        lambda x: x.index_put((I[:, None], I[:2]), x[:3, :2], accumulate=True)), X),
    "index_put_3d": (group(lambda x: put(x, (I, slice(None), I), x[0, :, :3].t()),
                           lambda x: put(x, (slice(None), I32), 0.0)), X3),
    "mask_put": (group(lambda x: put(x, M[:3], 3.0), lambda x: put(x, x.detach() > 0, x.detach().sum()),
                       lambda x: put(x, (slice(None), M), x[:, :3].detach() * 2),
                       lambda x: x.index_put((M[:3],), on(x, torch.ones(5)), accumulate=True)), X3),
    "index_select": (group(lambda x: x.index_select(1, on(x, I % 5)),
                           lambda x: x.index_select(-2, on(x, I32.flatten() % 4)),
                           lambda x: x.index_select(0, on(x, torch.tensor(2))),
                           lambda x: x.index_select(0, on(x, torch.tensor([], dtype=torch.long)))), X),
    "gather": (group(lambda x: x.gather(1, on(x, IDX)), lambda x: x.gather(-2, on(x, IDX[:3, :2] % 4)),
                     lambda x: x.gather(0, on(x, 3 - IDX[:2] % 4)), lambda x: x.gather(1, on(x, IDX[:, :0]))), X),
    "gather_int": (group(lambda x: x.gather(1, on(x, IDX)), lambda x: x.sort(1)), XI),
    "scatter": (group(lambda x: on(x, torch.zeros(4, 6)).scatter(1, on(x, UNIQ), x[:, :2]),
                      lambda x: x.scatter(1, on(x, UNIQ), -2.0),
                      lambda x: x.scatter(0, on(x, UNIQ % 4), x[:, 2:4] * 3),
                      lambda x: on(x, torch.zeros(4, 6)).scatter_add(1, on(x, IDX), x[:, :3]),
                      lambda x: x.scatter_add(-1, on(x, IDX), x[:, 1:4])), X),
    "scatter_reduce": (group(*[
        (lambda r, s: lambda x: x.scatter_reduce(1, on(x, IDX), x[:, :3] * 2, r, include_self=s))(r, s)
        for r in ("sum", "mean") for s in (True, False)]), X),
    # amax/amin/prod backward uses bitwise_and, which has no lowering yet: forward only.
    "scatter_reduce_minmax": (group(*[
        (lambda r, s: lambda x: x.scatter_reduce(1, on(x, IDX), x[:, :3] * 2, r, include_self=s))(r, s)
        for r in ("amax", "amin", "prod") for s in (True, False)]), X.detach()),
    "scatter_int": (group(lambda x: x.scatter(1, on(x, UNIQ), 7),
                          lambda x: x.scatter_reduce(1, on(x, IDX), x * 3, "mean"),
                          lambda x: x.scatter_reduce(1, on(x, IDX), x, "amax", include_self=False),
                          lambda x: x.scatter(1, on(x, IDX), x, reduce="multiply"),
                          lambda x: x.scatter(1, on(x, IDX), 2, reduce="add")), XI),
    "index_add": (group(lambda x: on(x, torch.zeros(4, 6)).index_add(1, on(x, I % 6), x[:, :3], alpha=2),
                        lambda x: x.index_add(0, on(x, torch.tensor([1, 1, 3])), x[:3]),
                        lambda x: x.index_add(-1, on(x, torch.tensor([4])), x[:, 4:] * 2)), X),
    "masked": (group(lambda x: x.masked_fill(x > 0, 1.0),
                     lambda x: x.masked_fill(on(x, M[:, None]), torch.tensor(2.0)),
                     lambda x: x.masked_fill(on(x, torch.tensor(True)), -1.0),
                     lambda x: x.masked_scatter(x > 0, x * 3), lambda x: x.masked_scatter(on(x, M[:, None]), -x)), X),
    "masked_int": (group(lambda x: x.masked_fill(x > 0, 5), lambda x: x.masked_scatter(x < 0, x * 10)), XI),
    "embedding": (group(lambda w: F.embedding(on(w, I32 % 4), w), lambda w: F.embedding(on(w, I32 % 4), w, padding_idx=1),
                        lambda w: F.embedding(on(w, torch.tensor([1, 1, 2, 1])), w, scale_grad_by_freq=True),
                        lambda w: F.embedding(on(w, torch.tensor(3)), w)), X),
    "sort": (group(lambda x: x.sort(1), lambda x: x.sort(0, descending=True), lambda x: x.argsort(-1),
                   lambda x: torch.msort(x), lambda x: x.topk(2), lambda x: x.topk(3, dim=0, largest=False),
                   lambda x: x.topk(2, sorted=True)), X),
    "sort_ties_nan": (group(lambda x: x.sort(stable=True), lambda x: x.sort(stable=True, descending=True),
                            lambda x: x.argsort(stable=True)),
                      torch.tensor([3.0, float("nan"), 1.0, 3.0, 1.0, float("nan"), -2.0], requires_grad=True)),
    "sort_int_bool": (group(lambda x: x.sort(stable=True), lambda x: (x > 0).sort(stable=True),
                            lambda x: x[:5].topk(3, largest=False)), torch.tensor([3, -1, 2, 4, 0, 2, -1])),
    "topk_k0": (group(lambda x: x.topk(0), lambda x: x.topk(0, dim=0, largest=False), lambda x: x[0, 0].topk(0)), X),
    "one_hot": (group(lambda i: F.one_hot(i, 6), lambda i: F.one_hot(i[:0], 3)), torch.tensor([[0, 5], [2, 1]])),
}


@pytest.mark.parametrize("name", list(CASES))
def test_indexing(mode, name):
    fn, x = CASES[name]
    check(fn, x, grad=x.requires_grad)


def test_index_zero_dim(mode):
    s = torch.tensor(1.5, requires_grad=True)
    check(group(lambda s: s.index_select(0, on(s, torch.tensor([0]))), lambda s: s.gather(0, on(s, torch.tensor(0))),
                lambda s: s.sort()), s, grad=True)


F32_INDEX = torch.tensor([0.0, 2.0])
# Index dtypes CPU's kernels refuse where the meta kernels pass them: index_put computed with
# float, int8 and int16 indices ("tensors used as indices must be long, int, byte or bool
# tensors" on CPU), x[uint8_mask] = 1.0 (CPU's masked_fill_ takes bool masks only),
# index_add with a float index and masked_scatter with a uint8 mask. The getters, gather,
# scatter, index_select and take were right already (their meta kernels or lowerings check).
INDEX_DTYPE_ERRORS = {
    **{f"index_put-{dt}": (lambda x, i: x.index_put((i,), torch.tensor(7.0, device=x.device)), F32_INDEX.to(dt))
       for dt in (torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int8, torch.int16)},
    "setitem-float": (lambda x, i: put(x, i, 7.0), F32_INDEX),
    "setitem-tensor-float": (lambda x, i: put(x, i, x[:2] * 2), F32_INDEX),
    "index_put_-accumulate-float": (lambda x, i: x.clone().index_put_((i,), x[:2], accumulate=True), F32_INDEX),
    "setitem-int-and-float": (lambda x, i: put(x, (torch.tensor([0, 1], device=x.device), i), 7.0), F32_INDEX),
    "setitem-mask-and-float": (lambda x, i: put(x, (M.to(x.device), i), 7.0), torch.tensor([0.0, 2.0, 1.0])),
    "setitem-uint8-mask-scalar": (lambda x, m: put(x, m, 7.0), M.to(torch.uint8)),
    "unsafe_index_put-float": (lambda x, i: torch.ops.aten._unsafe_index_put(x, [i], torch.tensor(7.0, device=x.device)),
                               F32_INDEX),
    "unsafe_index-bool": (lambda x, m: torch.ops.aten._unsafe_index(x, [m]), M),
    "unsafe_index-uint8": (lambda x, m: torch.ops.aten._unsafe_index(x, [m]), M.to(torch.uint8)),
    "index-float": (lambda x, i: x[i], F32_INDEX),
    "index-mask-and-float": (lambda x, i: x[M.to(x.device), i], torch.tensor([0.0, 2.0, 1.0])),
    "index_add-float": (lambda x, i: x.index_add(0, i, x[:2]), F32_INDEX),
    "index_add-int16": (lambda x, i: x.index_add(0, i, x[:2]), F32_INDEX.to(torch.int16)),
    "index_select-float": (lambda x, i: x.index_select(0, i), F32_INDEX),
    "gather-float": (lambda x, i: x.gather(0, i[None].expand(2, 5)), F32_INDEX),
    "scatter-float": (lambda x, i: x.scatter(0, i[None].expand(2, 5), 1.0), F32_INDEX),
    "scatter_add-float": (lambda x, i: x.scatter_add(0, i[None].expand(2, 5), x[:2]), F32_INDEX),
    "masked_scatter-uint8": (lambda x, m: x.masked_scatter(m[:, None], x * 2), M.to(torch.uint8)),
    "embedding_dense_backward-int16": (lambda x, i: torch.ops.aten.embedding_dense_backward(x[:2], i, 4, -1, False),
                                       F32_INDEX.to(torch.int16)),
}


@pytest.mark.filterwarnings("ignore:.*uint8.*deprecated")
@pytest.mark.parametrize("name", list(INDEX_DTYPE_ERRORS))
def test_refused_index_dtype_raises_cpu_error(mode, name):
    fn, index = INDEX_DTYPE_ERRORS[name]
    check_error(fn, X.detach(), index)


@pytest.mark.filterwarnings("ignore:.*uint8.*deprecated")
def test_accepted_index_dtypes_like_cpu(mode):
    # int32 indices and bool masks stay on tpu.
    x = X.detach()
    check(group(lambda x: put(x, I.int(), 7.0), lambda x: put(x, (I32[0], I32[1]), x[0, :2]),
                lambda x: put(x, M, 7.0), lambda x: x.index_add(0, on(x, I32[0]), x[:2]),
                lambda x: torch.ops.aten._unsafe_index(x, [I32[0].to(x.device)])), x)
    # A uint8 mask with a row value computes on CPU: CPU's kernel decides every uint8 index
    # to index_put (a fallback), since it refuses one with a 0-d value.
    check(group(lambda x: put(x, M.to(torch.uint8), x[0]), lambda x: put(x, (M.to(torch.uint8), I), 7.0)), x,
          no_fallback=False)
