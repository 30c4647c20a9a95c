"""kthvalue, median, nanmedian, mode, searchsorted, bucketize, histc and isin against CPU, with
NaN, ties, integer inputs and gradients."""
import pytest
import torch

from utils import check

torch.manual_seed(0)
X = torch.randn(4, 7, requires_grad=True)
NAN = torch.tensor([[3.0, 1.0, 4.0, 2.0, 0.5, 6.0, 5.0],
                    [float("nan"), 1.0, float("nan"), 2.0, 0.0, 5.0, 4.0],
                    [float("nan")] * 7])


def flat(*results):
    return tuple(t for r in results for t in (r if isinstance(r, tuple) else (r,)))


def test_kth_median(mode):
    check(lambda x: flat(tuple(torch.kthvalue(x, 3, 1)), tuple(torch.kthvalue(x, 1, 0, keepdim=True)),
                         tuple(torch.median(x, 1)), tuple(torch.median(x, 0, keepdim=True)), torch.median(x),
                         tuple(torch.nanmedian(x, 1)), torch.nanmedian(x)), X, grad=True)
    # The index CPU gives among NaNs (all-NaN nanmedian, kthvalue landing on a NaN) is
    # arbitrary (its quickselect's): only those values are compared.
    check(lambda x: flat(tuple(torch.median(x, 1)), tuple(torch.nanmedian(x[:2], 1)), torch.median(x[:2]),
                         torch.nanmedian(x[:2]), torch.nanmedian(x[2]), torch.nanmedian(x, 1).values,
                         torch.kthvalue(x[:2], 6, 1).values), NAN)
    check(lambda i: flat(tuple(torch.kthvalue(i, 2, 0)), tuple(torch.median(i, 0)), torch.median(i)),
          torch.tensor([5, -2, 9, 0, 3]))
    check(lambda s: flat(tuple(torch.median(s, 0)), tuple(torch.kthvalue(s, 1, 0))), torch.tensor(1.5))


def test_mode(mode):
    # Ties: the smallest of the most frequent values, at its last occurrence.
    rows = torch.tensor([[2.0, 2.0, 1.0, 1.0, 3.0], [5.0, 5.0, 1.0, 1.0, 5.0], [4.0, 3.0, 2.0, 1.0, 0.0]])
    check(lambda x: flat(tuple(torch.mode(x, 1)), tuple(torch.mode(x, 0, keepdim=True))), rows)
    check(lambda i: tuple(torch.mode(i, -1)), torch.randint(0, 4, (5, 9)))
    check(lambda x: tuple(torch.mode(x, 1)), X, grad=True)


def test_searchsorted_bucketize(mode):
    boundaries = torch.tensor([-1.0, 0.0, 0.0, 1.5, 3.0])
    values = torch.tensor([[-2.0, -1.0, 0.0, 0.7], [1.5, 2.9, 3.0, 4.0]])
    check(lambda b, v: (torch.searchsorted(b, v), torch.searchsorted(b, v, right=True),
                        torch.searchsorted(b, v, side="right", out_int32=True), torch.bucketize(v, b),
                        torch.bucketize(v, b, right=True), torch.searchsorted(b, 0.0), torch.bucketize(1.5, b)),
          boundaries, values)
    rows = torch.sort(torch.randn(2, 6), dim=1).values
    check(lambda b, v: (torch.searchsorted(b, v), torch.searchsorted(b, v, right=True)), rows, torch.randn(2, 3))
    shuffled = torch.tensor([3.0, -1.0, 1.5, 0.0])
    check(lambda b, v: torch.searchsorted(b, v, sorter=torch.argsort(b)), shuffled, values)
    check(lambda b, v: torch.searchsorted(b, v), torch.tensor([1, 3, 5, 7]), torch.tensor([0, 3, 6, 9]))


def test_searchsorted_nan_and_ties_follow_cpus_binary_search(mode):
    # NaN fails every comparison, so CPU's binary search is not a count of smaller boundaries:
    # with a NaN boundary (sorted last) 1.0 lands at 2 of [-1, 0, 2, nan], not 3.
    nan, inf = float("nan"), float("inf")
    boundaries = torch.tensor([-1.0, 0.0, 0.0, 2.0, nan])
    values = torch.tensor([[nan, 1.0, inf, -inf, 0.0], [2.0, 3.0, -1.0, nan, -0.0]])
    unsorted = torch.tensor([2.0, nan, -1.0, 0.0, 3.0])
    rows = torch.tensor([[0.0, 1.0, 1.0, nan, nan], [nan, nan, nan, nan, nan]])
    for right in (False, True):
        check(lambda b, v: (torch.searchsorted(b, v, right=right), torch.bucketize(v, b, right=right),
                            torch.searchsorted(b, nan, right=right), torch.searchsorted(b[:4], v, right=right)),
              boundaries, values)
        check(lambda b, v: torch.searchsorted(b, v, right=right, sorter=torch.argsort(b, stable=True)), unsorted, values)
        check(lambda b, v: torch.searchsorted(b, v, side="right" if right else "left"), rows, values)


def test_histc(mode):
    x = torch.tensor([0.0, 0.1, 0.5, 0.99, 1.0, 1.5, -0.5, float("nan"), 0.25])
    check(lambda x: (torch.histc(x, 4, 0, 1), torch.histc(x[:7], 5), torch.histc(x, 3, -1, 2),
                     torch.histc(torch.ones(3, device=x.device), 4), torch.histc(x[:0], 3, 0, 1)), x)
    check(lambda x: torch.histc(x, 10), torch.randn(100))


def test_histc_range_from_data_must_be_finite(mode):
    # min == max takes the range from the data: CPU raises when that holds inf or NaN.
    for data in ([1.0, float("inf")], [float("-inf"), 0.0, 2.0], [0.5, float("nan")], [float("nan")]):
        with pytest.raises(RuntimeError, match="torch.histc: range of"):
            torch.histc(torch.tensor(data), 4)
        with pytest.raises(RuntimeError, match=r"torch.histc: range of \[min, max\] is not finite"):
            torch.histc(torch.tensor(data, device="tpu"), 4).cpu()
    check(lambda x: torch.histc(x, 4, -1, 1), torch.tensor([float("inf"), float("nan"), 0.5, -1.0]))


def test_isin(mode):
    ids = torch.randint(0, 50, (3, 9))
    eos = torch.tensor([7, 11, 49])
    check(lambda a, b: (torch.isin(a, b), torch.isin(a, b, invert=True), torch.isin(a[:, -1:], b)), ids, eos)
    # Promotion: an integer tensor against float test elements (and a float number), NaN in nothing.
    check(lambda a, b: (torch.isin(a, b), torch.isin(a, 2.0), torch.isin(a, 2.5), torch.isin(3, a)),
          torch.tensor([1, 2, 3], dtype=torch.uint8), torch.tensor([2.0, 3.5]))
    check(lambda a, b: torch.isin(a, b), torch.tensor([1.0, float("nan"), 3.0]), torch.tensor([3.0, float("nan")]))
    check(lambda a, b: torch.isin(a, b), torch.randint(0, 10, (4,)), torch.empty(0, dtype=torch.int64))
    # Many pairs: the sorted search instead of comparing every pair.
    check(lambda a, b: (torch.isin(a, b), torch.isin(a, b, invert=True)),
          torch.randint(0, 4000, (1500,)), torch.randint(0, 4000, (1000,)))


def test_isin_refuses_bool_as_cpu(mode):
    for a, b in [(torch.tensor([True]), torch.tensor([1])), (torch.tensor([1]), torch.tensor([True]))]:
        with pytest.raises(RuntimeError, match=r"Unsupported input type encountered for isin\(\): Bool"):
            torch.isin(a.to("tpu"), b.to("tpu"))
