"""aminmax, nansum/nanmean, trace, renorm, vdot, cross, channel_shuffle, equal, logspace and
factory out= forms against CPU."""
import torch
import torch.nn.functional as F

import torchtpu
from utils import check

torch.manual_seed(0)
X = torch.randn(4, 5)
X[1, 2] = float("nan")
Y = torch.randn(4, 5, requires_grad=True)


def test_reductions(mode):
    check(lambda x: (torch.aminmax(x), torch.aminmax(x, dim=1), torch.aminmax(x, dim=0, keepdim=True),
                     torch.nansum(x), torch.nansum(x, 1), torch.nanmean(x, 0, keepdim=True)), X)
    check(lambda y: (torch.aminmax(y, dim=1)[1], torch.nansum(y * 2, 0), torch.trace(y), torch.trace(y.t()),
                     torch.renorm(y, 2, 0, 1.0), torch.renorm(y, 1, 1, 0.5), torch.renorm(y, float("inf"), 0, 0.7)),
          Y, grad=True)
    check(lambda i: (torch.aminmax(i), torch.nansum(i), torch.trace(i)), torch.randint(-5, 5, (3, 3)))


def test_products_and_shuffle(mode):
    a, b = torch.randn(6, requires_grad=True), torch.randn(6, requires_grad=True)
    check(lambda a, b: (torch.vdot(a, b), torch.linalg.cross(a.reshape(2, 3), b.reshape(2, 3)),
                        torch.cross(a.reshape(3, 2), b.reshape(3, 2), dim=0),
                        torch.linalg.cross(a.reshape(2, 3), b[:3].reshape(1, 3))), a, b, grad=True)
    x = torch.arange(2 * 6 * 2 * 2, dtype=torch.float32).reshape(2, 6, 2, 2).requires_grad_()
    check(lambda x: F.channel_shuffle(x, 3), x, grad=True)
    check(lambda x: torch.native_channel_shuffle(x, 2), x.detach())


def test_equal(mode):
    x = torch.tensor([1.0, 2.0, float("nan")], device="tpu")
    assert torch.equal(x[:2], torch.tensor([1.0, 2.0], device="tpu"))
    assert torch.equal(x[:2], torch.tensor([1, 2], device="tpu"))  # promoted, as on CPU
    assert not torch.equal(x, x)  # NaN is unequal
    assert not torch.equal(x[:2], x)  # sizes differ
    assert not torch.equal(x[:2], torch.tensor([1.0, 2.5], device="tpu"))
    assert not torchtpu.metrics.counters()["fallback_ops"].get("aten::equal")


def test_factories(mode):
    check(lambda: (torch.logspace(0, 2, 5, device="tpu").cpu(), torch.logspace(-1, 1, 4, base=2, device="tpu").cpu(),
                   torch.logspace(0, 3, 4, dtype=torch.int64, device="tpu").cpu(),
                   torch.logspace(1, 1, 1, device="tpu").cpu()))
    out = torch.empty(0, device="tpu")
    torch.arange(-1.0, 0.5, 0.5, out=out)
    torch.testing.assert_close(out.cpu(), torch.arange(-1.0, 0.5, 0.5))
    check(lambda x: torch.mvlgamma(x, 3), torch.rand(3, 4) + 3)
