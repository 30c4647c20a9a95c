"""take, put, index_fill, index_copy and index_reduce against CPU: negative indices, 0-d
inputs, every reduction with and without self, integer dtypes, gradients."""
import pytest
import torch

from utils import check, check_error

torch.manual_seed(0)
X = torch.randn(4, 5, requires_grad=True)
I = torch.tensor([0, -2, 3])  # negative indices: take, put and index_fill only (as on CPU)
J = torch.tensor([0, 2, 3])
DUP = torch.tensor([1, 1, 3])


def test_take_put(mode):
    check(lambda x: (torch.take(x, torch.tensor([[0, -1], [7, 3]], device=x.device)), torch.take(x, torch.tensor(4, device=x.device)),
                     x.put(torch.tensor([0, -1, 6], device=x.device), torch.tensor([9.0, 8.0, 7.0], device=x.device)),
                     x.put(torch.tensor([2, 2, 5], device=x.device), x[0, :3] * 2, accumulate=True)), X, grad=True)
    check(lambda i: (i.put(torch.tensor([1, 3], device=i.device), torch.tensor([-5, 5], device=i.device), accumulate=True), torch.take(i, torch.tensor([5], device=i.device))),
          torch.arange(6).reshape(2, 3))


def test_index_fill_copy(mode):
    check(lambda x: (x.index_fill(0, I.to(x.device), -1.5), x.index_fill(1, torch.tensor([4, 0], device=x.device), torch.tensor(2.0, device=x.device)),
                     x.index_fill(1, torch.tensor([], dtype=torch.long, device=x.device), 3.0),
                     x.index_copy(0, torch.tensor([2, 0], device=x.device), x[:2] * 3), x.index_copy(-1, torch.tensor([1, 4], device=x.device), x[:, :2] + 1)),
          X, grad=True)
    check(lambda s: (s.index_fill(0, torch.tensor([0], device=s.device), 4.0), s.index_copy(0, torch.tensor([0], device=s.device), torch.tensor(2.5, device=s.device))),
          torch.tensor(1.0))
    check(lambda b: b.index_fill(1, torch.tensor([0, 2], device=b.device), True), torch.zeros(2, 3, dtype=torch.bool))


@pytest.mark.parametrize("reduce", ["prod", "mean", "amax", "amin"])
def test_index_reduce(mode, reduce):
    source = torch.randn(3, 5, requires_grad=True)
    for include_self in (True, False):
        check(lambda x, s: (x.index_reduce(0, DUP.to(x.device), s, reduce, include_self=include_self),
                            x.index_reduce(0, J.to(x.device), s, reduce, include_self=include_self),
                            x.index_reduce(1, torch.tensor([0, 4, 0], device=x.device), s.t()[:4], reduce,
                                           include_self=include_self)), X, source, grad=True)
    check(lambda i: i.index_reduce(0, torch.tensor([0, 0, 2], device=i.device), torch.tensor([2, 3, -4], device=i.device), reduce),
          torch.full((3,), 7))


F32_INDEX = torch.tensor([0.0, 2.0])
# CPU's kernels take int64 indices only (index_add and index_reduce take int32 too); the meta
# kernels do not check, and the lowerings computed float, int32, bool and uint8 indices
# (index_fill read bool and uint8 ones as positions 0 and 1).
INDEX_DTYPE_ERRORS = {
    **{f"index_copy-{dt}": (lambda x, i: x.index_copy(0, i, x[:2] * 3), F32_INDEX.to(dt))
       for dt in (torch.float32, torch.float16, torch.int32, torch.int16)},
    **{f"index_fill-{dt}": (lambda x, i: x.index_fill(0, i, 1.5), F32_INDEX.to(dt))
       for dt in (torch.float32, torch.int32, torch.uint8, torch.bool)},
    "index_fill_tensor-float": (lambda x, i: x.index_fill(1, i, torch.tensor(2.0, device=x.device)), F32_INDEX),
    "index_fill_-float": (lambda x, i: x.clone().index_fill_(0, i, 1.5), F32_INDEX),
    **{f"index_reduce-{dt}": (lambda x, i: x.index_reduce(0, i, x[:2], "prod"), F32_INDEX.to(dt))
       for dt in (torch.float32, torch.bfloat16, torch.int8, torch.uint8, torch.bool)},
    **{f"put-{dt}": (lambda x, i: x.put(i, torch.tensor([9.0, 8.0], device=x.device)), F32_INDEX.to(dt))
       for dt in (torch.float32, torch.float64, torch.int32, torch.uint8)},
    "put-accumulate-float": (lambda x, i: x.put(i, torch.tensor([9.0, 8.0], device=x.device), accumulate=True),
                             F32_INDEX),
    "put_-float": (lambda x, i: x.clone().put_(i, torch.tensor([9.0, 8.0], device=x.device)), F32_INDEX),
    "take-float": (lambda x, i: torch.take(x, i), F32_INDEX),
}


@pytest.mark.parametrize("name", list(INDEX_DTYPE_ERRORS))
def test_refused_index_dtype_raises_cpu_error(mode, name):
    fn, index = INDEX_DTYPE_ERRORS[name]
    check_error(fn, X.detach(), index)


def test_int32_index_stays_on_tpu(mode):
    # index_reduce takes int32 indices on CPU, as index_add does (test_indexing.py).
    check(lambda x: x.index_reduce(0, J.int().to(x.device), x[:3] * 2, "amax"), X.detach())


def test_index_copy_into_a_static_cache_in_place(mode):
    # A static KV cache's update: index_copy_ of one step's keys at a position held in a
    # tensor (cache_position), in place, step after step.
    cache, steps = torch.zeros(2, 3, 6, 4), torch.randn(5, 2, 3, 1, 4)
    cache_t = cache.to("tpu")
    for t in range(5):
        pos = torch.tensor([t])
        cache.index_copy_(2, pos, steps[t])
        cache_t.index_copy_(2, pos.to("tpu"), steps[t].to("tpu"))
    assert torch.equal(cache_t.cpu(), cache)
