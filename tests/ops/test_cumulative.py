"""cummax, cummin (values and indices, ties and NaN as on CPU) and logcumsumexp against CPU,
with gradients."""
import torch

from utils import HALF_PRECISION, check

TIES = torch.tensor([[1.0, 3.0, 3.0, -1.0, float("nan"), 2.0, float("nan"), 5.0],
                     [-float("inf"), -float("inf"), 0.0, 0.0, -0.0, 4.0, 4.0, float("inf")]], requires_grad=True)


def test_cummax_cummin(mode):
    check(lambda x: (torch.cummax(x, 1), torch.cummin(x, 1), torch.cummax(x, 0), torch.cummin(x, -2)), TIES)
    torch.manual_seed(0)
    x = torch.randn(3, 5, 4, requires_grad=True)
    check(lambda x: (*torch.cummax(x, 1), *torch.cummin(x, 2)), x, grad=True)
    check(lambda i: (torch.cummax(i, 0), torch.cummin(i, 0), torch.cummax(i > 0, 0)), torch.tensor([3, 1, 3, 5, -2, 5]))
    check(lambda s: (torch.cummax(s, 0), torch.cummin(s, 0)), torch.tensor(2.5))


def test_logcumsumexp(mode):
    torch.manual_seed(0)
    x = torch.randn(4, 6, requires_grad=True)
    check(lambda x: (torch.logcumsumexp(x, 1), torch.logcumsumexp(x * 30, 0)), x, grad=True)
    check(lambda x: torch.logcumsumexp(x, 1), TIES.detach())
    check(lambda x: torch.logcumsumexp(x, 0), torch.randn(5).to(torch.bfloat16), **HALF_PRECISION)  # measured equal
