import torch

from utils import check


def test_matmul_relu(mode):
    a = torch.randn(4, 4)
    check(lambda x: (x @ x).relu(), a)


def test_linear_backward(mode):
    x = torch.randn(8, 16, requires_grad=True)
    w = torch.randn(32, 16, requires_grad=True)
    b = torch.randn(32, requires_grad=True)
    check(lambda x, w, b: torch.nn.functional.linear(x, w, b).relu().sum(1), x, w, b, grad=True)
