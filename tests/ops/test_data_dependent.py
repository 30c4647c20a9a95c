"""Ops whose result shape depends on the data: nonzero/argwhere, masked_select, x[mask] and
boolean-mask assignment, the unique family, count_nonzero and nonzero_static. They run on
the device: a count is read back (8 bytes), the result is computed on the device and, in
fused mode, stays in the pending graph."""
import pytest
import torch

import torchtpu
from utils import check

torch.manual_seed(0)
X = torch.randn(4, 5)
X[X.abs() < 0.4] = 0.0
X.requires_grad_(True)
M = torch.tensor([True, False, True, True])
SPECIAL = torch.tensor([3.0, 1.0, 2.0, 1.0, 3.5, float("nan"), float("nan"), -0.0, 0.0, float("inf"), -float("inf"),
                        1.0])
ROWS = torch.tensor([[1, 2, 0], [0, 1, 0], [1, 2, 0], [0, 0, 5], [0, 1, 0]])


def put(x, key, value, accumulate=False):
    x = x.clone()
    if accumulate:
        x[key] += value
    else:
        x[key] = value
    return x


CASES = {
    "nonzero": (lambda x: (x.nonzero(), torch.argwhere(x), x.nonzero(as_tuple=True), x[0].nonzero(),
                           x[:0].nonzero(), x.sum().nonzero(), (x * 0).nonzero()), X.detach()),
    "nonzero_int_bool": (lambda x: (x.nonzero(), (x > 0).nonzero(), torch.argwhere(x[1])), torch.tensor([[0, 3, -1], [2, 0, 0]])),
    "count_nonzero": (lambda x: (torch.count_nonzero(x), torch.count_nonzero(x, 1), torch.count_nonzero(x, (0, 1)),
                                 torch.count_nonzero(x.sum())), X.detach()),
    "nonzero_static": (lambda x: (torch.nonzero_static(x, size=4), torch.nonzero_static(x, size=30, fill_value=-7),
                                  torch.nonzero_static(x[:0], size=2)), X.detach()),
    "masked_select": (lambda x: (x.masked_select(x > 0), x.masked_select(M[:, None].to(x.device)), x[0].masked_select(x > 0),
                                 x.masked_select(x > 100)), X),
    "mask_index": (lambda x: (x[x > 0], x[M], x[:, M[:3].repeat(2)[:5]], x[M, 1:], x[M, torch.tensor([0, 2, 4])],
                              x[x.detach() > 100]), X),
    "mask_index_3d": (lambda x: (x[x > 0.5], x[M[:3], ..., 1], x[:, x[0, :, 0] > 0]), torch.randn(3, 4, 2, requires_grad=True)),
    "mask_put": (lambda x: (put(x, (M, torch.tensor([0, 2, 4])), 5.0), put(x, (torch.tensor([[1], [3]]), M[:3].repeat(2)[:5]), -1.0),
                            put(x, x > 0, 0.0), put(x, (M & False, torch.tensor([1])), 2.0),
                            put(x, (M, torch.tensor([1, 1, 1])), x[:3, 0] * 2, accumulate=True)), X),
    "unique": (lambda x: (torch.unique(x), torch.unique(x, return_inverse=True, return_counts=True),
                          torch.unique(x, sorted=False, return_inverse=True), torch.unique(x[:0], return_counts=True),
                          torch.unique(x[2]), torch.unique(x.reshape(3, 4), return_inverse=True)), SPECIAL),
    "unique_int_bool": (lambda x: (torch.unique(x, return_inverse=True, return_counts=True),
                                   torch.unique(x > 0, return_counts=True)), ROWS),
    "unique_consecutive": (lambda x: (torch.unique_consecutive(x), torch.unique_consecutive(x, return_inverse=True,
                                                                                            return_counts=True)),
                           torch.tensor([1.0, 1.0, 2.0, 2.0, 2.0, float("nan"), float("nan"), 1.0, -0.0, 0.0])),
    "unique_dim": (lambda x: (torch.unique(x, dim=0, return_inverse=True, return_counts=True),
                              torch.unique(x, dim=1, return_inverse=True, return_counts=True),
                              torch.unique(x, dim=-1), torch.unique_consecutive(x, dim=0, return_counts=True),
                              torch.unique_consecutive(x.t(), dim=1, return_inverse=True),
                              torch.unique(x[:0], dim=0, return_counts=True)), ROWS),
    "unique_dim_float": (lambda x: torch.unique(x, dim=0, return_inverse=True, return_counts=True),
                         torch.tensor([[1.5, float("nan")], [0.0, 1.0], [1.5, float("nan")], [-0.0, 1.0]])),
}


@pytest.mark.parametrize("name", list(CASES))
def test_data_dependent(mode, name):
    fn, x = CASES[name]
    check(fn, x, grad=x.requires_grad)


@pytest.mark.modes("fused")
def test_count_is_read_once_and_result_stays_on_device(mode):
    x = torch.randn(64, 32, device="tpu")
    y = x * 2
    torchtpu.sync(wait=True)
    before = torchtpu.metrics.counters()
    out = y[y > 0] + 1  # masked count, read back; then the selection and the add stay pending
    after = torchtpu.metrics.counters()
    assert after["bytes_to_host"] - before["bytes_to_host"] == 8  # one int64 count
    assert torchtpu._C.pending_ops() >= 2
    assert after["fallback_ops"] == before["fallback_ops"]  # nothing ran on CPU here
    expected = (y.cpu()[y.cpu() > 0] + 1)
    torch.testing.assert_close(out.cpu(), expected)


@pytest.mark.modes("fused")
def test_same_count_compiles_once(mode):
    x = torch.tensor([0.0, 1.0, 0.0, 2.0], device="tpu")
    x.nonzero().cpu()
    compiled = torchtpu.metrics.counters()["graphs_compiled"]
    for _ in range(3):
        x.nonzero().cpu()
    assert torchtpu.metrics.counters()["graphs_compiled"] == compiled


def test_errors_match_cpu(mode):
    x = torch.zeros(4, 5, device="tpu")
    with pytest.raises(IndexError, match=r"The shape of the mask \[3\] at index 0 does not match the shape of the "
                                         r"indexed tensor \[4, 5\] at index 0"):
        x[torch.ones(3, dtype=torch.bool, device="tpu")]
    with pytest.raises(RuntimeError, match="masked_select: expected BoolTensor for mask"):
        x.masked_select(torch.ones(4, 5, dtype=torch.uint8, device="tpu"))
    with pytest.raises(RuntimeError, match=r"The size of tensor a \(5\) must match the size of tensor b \(4\)"):
        x.masked_select(torch.ones(4, dtype=torch.bool, device="tpu"))
    with pytest.raises(RuntimeError, match="0 sized dimensions, and they aren't selected"):
        torch.unique(torch.zeros(2, 0, device="tpu"), dim=0)
    with pytest.raises(IndexError, match="Dimension out of range"):
        torch.unique(x, dim=2)
