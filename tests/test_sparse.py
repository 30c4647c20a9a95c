"""Sparse COO tensors on tpu: sparse embedding gradients, the optimizers that take them, and the
sparse ops a user reaches from such a gradient, each compared with CPU."""
import pytest
import torch

import torchtpu
from torchtpu.metrics import counters

INDICES = torch.tensor([[1, 3, 3], [7, 0, 9]])  # a repeated row: the gradient is uncoalesced


def fallbacks():
    return dict(counters()["fallback_ops"])


def new_fallbacks(before):
    return {op: n - before.get(op, 0) for op, n in fallbacks().items() if n != before.get(op, 0)}


def assert_sparse_equal(actual, expected, atol=1e-6):
    assert actual.is_sparse and actual.device.type == "tpu"
    assert actual._indices().device.type == "tpu" and actual._values().device.type == "tpu"
    host = actual.cpu()
    assert host.is_sparse and host.is_coalesced() == expected.is_coalesced()
    torch.testing.assert_close(host._indices(), expected._indices())
    torch.testing.assert_close(host._values(), expected._values(), atol=atol, rtol=1e-5)


def embedding_grad(device, functional=False, padding_idx=None):
    torch.manual_seed(0)
    embedding = torch.nn.Embedding(10, 4, sparse=True, padding_idx=padding_idx).to(device)
    x = INDICES.to(device)
    out = (torch.nn.functional.embedding(x, embedding.weight, padding_idx=padding_idx, sparse=True)
           if functional else embedding(x))
    (out ** 2).sum().backward()
    return embedding.weight.grad


@pytest.mark.parametrize("functional", [False, True])
def test_embedding_sparse_gradient(mode, functional):
    expected = embedding_grad("cpu", functional)
    before = fallbacks()
    grad = embedding_grad("tpu", functional)
    assert_sparse_equal(grad, expected)
    torch.testing.assert_close(grad.to_dense().cpu(), expected.to_dense(), atol=1e-6, rtol=1e-5)
    assert_sparse_equal(grad.coalesce(), expected.coalesce())
    assert_sparse_equal(grad.clone(), expected.clone())
    assert_sparse_equal(grad * 2, expected * 2)
    assert_sparse_equal(grad / 4, expected / 4)
    assert_sparse_equal(-grad, -expected)
    assert "device='tpu:0'" in repr(grad) and "layout=torch.sparse_coo" in repr(grad)
    assert new_fallbacks(before) == {}


def test_embedding_padding_idx_and_bag(mode):
    assert_sparse_equal(embedding_grad("tpu", padding_idx=3), embedding_grad("cpu", padding_idx=3))
    grads = []
    for device in ("cpu", "tpu"):
        torch.manual_seed(0)
        bag = torch.nn.EmbeddingBag(10, 4, mode="sum", sparse=True).to(device)
        bag(INDICES.to(device)).pow(2).sum().backward()
        grads.append(bag.weight.grad)
    torch.testing.assert_close(grads[1].to_dense().cpu(), grads[0].to_dense(), atol=1e-5, rtol=1e-5)


def test_dense_and_sparse_arithmetic(mode):
    expected, grad = embedding_grad("cpu"), embedding_grad("tpu")
    dense = torch.randn(10, 4)
    before = fallbacks()
    # dense += alpha * sparse (the SGD update), type promotion included
    torch.testing.assert_close(dense.to("tpu").add_(grad, alpha=-0.5).cpu(), dense.add(expected, alpha=-0.5))
    torch.testing.assert_close(torch.add(dense.double().to("tpu"), grad).cpu(), torch.add(dense.double(), expected))
    assert_sparse_equal(dense.to("tpu").sparse_mask(grad.coalesce()), dense.sparse_mask(expected.coalesce()))
    assert_sparse_equal(grad.coalesce() + grad.coalesce(), expected.coalesce() + expected.coalesce())
    values = grad.coalesce()
    values.values().mul_(3)  # a write through a sparse tensor's values reaches the tensor, as on CPU
    host = expected.coalesce()
    host.values().mul_(3)
    assert_sparse_equal(values, host)
    assert new_fallbacks(before) == {}
    with pytest.raises(RuntimeError, match=r"add\(sparse, dense\) is not supported"):
        grad + dense.to("tpu")
    with pytest.raises(RuntimeError, match="expected 'self' and 'other' to have same size"):
        torch.add(torch.zeros(3, 4, device="tpu"), grad)
    with pytest.raises(RuntimeError, match="Cannot get values on an uncoalesced tensor"):
        grad.values()


def test_other_sparse_ops_fall_back_counted(mode):
    expected, grad = embedding_grad("cpu"), embedding_grad("tpu")
    before = fallbacks()
    # Not both coalesced: CPU's merge keeps its inputs' order; it runs on CPU, counted.
    assert_sparse_equal(grad + grad, expected + expected)
    assert_sparse_equal(grad.pow(2), expected.pow(2))
    assert new_fallbacks(before) == {"aten::add.Tensor": 1, "aten::pow.Tensor_Scalar": 1}


OPTIMIZERS = [
    (torch.optim.SGD, {"lr": 0.1}),
    (torch.optim.SGD, {"lr": 0.1, "maximize": True}),
    (torch.optim.SGD, {"lr": 0.1, "momentum": 0.9, "dampening": 0.5}),
    (torch.optim.Adagrad, {"lr": 0.1}),
    (torch.optim.SparseAdam, {"lr": 0.01}),
    (torch.optim.SparseAdam, {"lr": 0.01, "maximize": True}),
]


def train(device, optimizer_cls, kwargs, steps=3):
    torch.manual_seed(0)
    embedding = torch.nn.Embedding(10, 4, sparse=True).to(device)
    optimizer = optimizer_cls(embedding.parameters(), **kwargs)
    x = INDICES.to(device)
    for _ in range(steps):
        optimizer.zero_grad()
        (embedding(x) ** 2).sum().backward()
        optimizer.step()
    return embedding.weight, optimizer


@pytest.mark.parametrize("optimizer_cls, kwargs", OPTIMIZERS, ids=lambda v: getattr(v, "__name__", str(v)))
def test_sparse_training_matches_cpu(mode, optimizer_cls, kwargs):
    expected, cpu_optimizer = train("cpu", optimizer_cls, kwargs)
    weight, optimizer = train("tpu", optimizer_cls, kwargs)
    assert weight.device.type == "tpu"
    torch.testing.assert_close(weight.detach().cpu(), expected.detach(), atol=1e-5, rtol=1e-5)
    for name, value in cpu_optimizer.state[expected].items():
        actual = optimizer.state[weight][name]
        if not isinstance(value, torch.Tensor):
            assert actual == value, name
        elif value.is_sparse:
            assert_sparse_equal(actual, value, atol=1e-5)
        else:
            torch.testing.assert_close(actual.cpu(), value, atol=1e-5, rtol=1e-5)


def test_failed_sparse_step_is_undone():
    # The optimizer step is a transaction: a step that raises puts back sparse state too.
    weight, optimizer = train("tpu", torch.optim.SGD, {"lr": 0.1, "momentum": 0.9}, steps=1)
    before_weight = weight.detach().cpu().clone()
    before_buffer = optimizer.state[weight]["momentum_buffer"].cpu().to_dense()
    optimizer.zero_grad()
    (torch.nn.functional.embedding(INDICES.to("tpu"), weight, sparse=True) ** 2).sum().backward()

    def fail_after_update(*args):
        raise ValueError("after the update")

    handle = optimizer.register_step_post_hook(fail_after_update)
    try:
        with pytest.raises(ValueError, match="after the update"):
            optimizer.step()
    finally:
        handle.remove()
    torch.testing.assert_close(weight.detach().cpu(), before_weight)
    torch.testing.assert_close(optimizer.state[weight]["momentum_buffer"].cpu().to_dense(), before_buffer)
    optimizer.step()  # the step runs again, once, from the restored state
    assert not torch.equal(weight.detach().cpu(), before_weight)
