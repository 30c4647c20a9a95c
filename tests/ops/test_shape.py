"""Shape ops: the *_copy views functionalization emits, view scatters (in-place ops on
views), concatenation, flip/roll/repeat/tril/triu and padding, forward and backward."""
import pytest
import torch
import torch.nn.functional as F

import torchtpu
from utils import check, to_tpu

torch.manual_seed(0)
X = torch.randn(4, 5, requires_grad=True)
X3 = torch.randn(2, 3, 4, requires_grad=True)
E = torch.randn(0, 3, requires_grad=True)
S = torch.tensor(2.5, requires_grad=True)
I = torch.arange(20).reshape(4, 5)
B = torch.tensor([[True, False, True], [False, False, True]])
X4 = torch.randn(2, 3, 4, 5, requires_grad=True)  # (N, C, D, H, W) for the 3-d pads: C, D, H, W


def cpu_differentiates(fn) -> bool:
    try:
        fn(torch.ones(2, 2, requires_grad=True)).sum().backward()
        return True
    except RuntimeError:
        return False


def narrow_copy(x):
    # PyTorch 2.11 has no derivative for narrow_copy on any device (CPU included); where CPU
    # has none, compare the forward only.
    return x.narrow_copy(0, 1, 2) if NARROW_COPY_GRAD else x.detach().narrow_copy(0, 1, 2)


NARROW_COPY_GRAD = cpu_differentiates(lambda x: x.narrow_copy(0, 0, 1))

VIEWS = {
    "as_strided": (lambda x: x.as_strided((2, 3), (4, 1), 2), X),
    "as_strided_overlap": (lambda x: x.as_strided((3, 3), (1, 1)), X),
    "diagonal": (lambda x: x.diagonal(), X),
    "diagonal_off": (lambda x: x.diagonal(1), X),
    "diagonal_neg": (lambda x: x.diagonal(-2, 1, 0), X),
    "diagonal_3d": (lambda x: x.diagonal(0, -1, 0), X3),
    "unfold": (lambda x: x.unfold(1, 2, 2), X),
    "unfold_overlap": (lambda x: x.unfold(-1, 3, 1), X3),
    "split": (lambda x: x.split(2, dim=1), X),
    "split_sizes": (lambda x: x.split([1, 3], dim=0), X),
    "chunk": (lambda x: x.chunk(3, dim=-1), X3),
    "unbind": (lambda x: x.unbind(1), X),
    "narrow": (lambda x: x.narrow(1, -3, 2), X),
    "narrow_copy": (narrow_copy, X),
    "expand": (lambda x: x[:, :1].expand(4, 3), X),
    "permute": (lambda x: x.permute(2, 0, 1), X3),
    "transpose": (lambda x: x.transpose(-1, 0), X3),
    "t": (lambda x: x.t(), X),
    "slice_step": (lambda x: x[::2, 1:-1:2], X),
    "slice_neg": (lambda x: x[-3:, -2:], X),
    "select_neg": (lambda x: x[-1, :, -2], X3),
    "view": (lambda x: x.view(5, 4).view(-1), X),
    "reshape_nc": (lambda x: x.t().reshape(-1), X),
    "squeeze": (lambda x: x[None, :, None].squeeze(), X),
    "alias": (lambda x: torch.ops.aten.alias(x) * 1, X),
    "scalar_view": (lambda s: s.view(1, 1).expand(2, 3), S),
    "empty_split": (lambda e: e.split(1, dim=1), E),
    "empty_t": (lambda e: e.t().diagonal(), E),
    "int_select": (lambda i: i[1:, 2], I),
    "bool_diag": (lambda b: b.diagonal(), B),
}


def flat(out):
    if isinstance(out, (list, tuple)):
        return tuple(t for o in out for t in flat(o))
    return (out,)


def grouped(cases, size):
    """Cases sharing an input, `size` per test: one compiled graph checks several ops."""
    by_input = {}
    for name, (fn, x) in cases.items():
        by_input.setdefault(id(x), (x, []))[1].append((name, fn))
    groups = []
    for x, items in by_input.values():
        for k in range(0, len(items), size):
            chunk = items[k:k + size]
            groups.append(pytest.param([fn for _, fn in chunk], x, id="+".join(n for n, _ in chunk)))
    return groups


def check_group(fns, x):
    check(lambda t: tuple(o for fn in fns for o in flat(fn(t))), x, grad=x.is_floating_point())


@pytest.mark.parametrize("fns,x", grouped(VIEWS, 6))
def test_views(mode, fns, x):
    check_group(fns, x)


OPS = {
    "cat": (lambda x: torch.cat([x, x * 2, x[:, :0], torch.zeros(0, device=x.device)], dim=-1), X),
    "cat_mixed": (lambda i: torch.cat([i, i.float()]), I),
    "stack": (lambda x: torch.stack([x, x * 2], dim=1), X),
    "stack_neg": (lambda x: torch.stack([x, x], dim=-1), X3),
    "hstack": (lambda x: torch.hstack([x, x]), X),
    "flip": (lambda x: x.flip(0, -1), X3),
    "flip_int": (lambda i: i.flip(1), I),
    "roll": (lambda x: x.roll(2, 1), X),
    "roll_neg_multi": (lambda x: x.roll((-1, 3), (0, 2)), X3),
    "roll_flat": (lambda x: x.roll(-7), X),
    "repeat": (lambda x: x.repeat(2, 1, 3), X),
    "repeat_scalar": (lambda s: s.repeat(3), S),
    "repeat_bool": (lambda b: b.repeat(2, 2), B),
    "tile": (lambda x: x.tile(2), X),
    "tril": (lambda x: x.tril(), X),
    "triu_k": (lambda x: x.triu(-1), X3),
    "tril_int": (lambda i: i.tril(2), I),
    "pad": (lambda x: F.pad(x, (1, 2, 0, 1), value=3.5), X),
    "pad_neg": (lambda x: F.pad(x, (-1, 2, 1, -2)), X),
    "pad_int": (lambda i: F.pad(i, (1, 1), value=7), I),
    "reflect1d": (lambda x: F.pad(x, (2, 3), mode="reflect"), X),
    "reflect2d": (lambda x: F.pad(x, (2, 1, 1, 2), mode="reflect"), X3),
    "replicate1d": (lambda x: F.pad(x, (3, 1), mode="replicate"), X),
    "replicate2d": (lambda x: F.pad(x, (1, 2, 2, 0), mode="replicate"), X3),
    "reflect3d": (lambda x: F.pad(x, (2, 1, 1, 2, 2, 0), mode="reflect"), X4),
    "replicate3d": (lambda x: F.pad(x, (1, 3, 0, 2, 2, 1), mode="replicate"), X4),
    "unfold_module": (lambda x: x.unfold(0, 2, 1).sum(-1), X),
}


@pytest.mark.parametrize("fns,x", grouped(OPS, 6))
def test_ops(mode, fns, x):
    check_group(fns, x)


def _inplace_cases():
    def setitem_col(x):
        x = x.clone()
        x[:, 1] = 0
        return x

    def add_rows(x):
        x = x.clone()
        x[1:3].add_(1)
        return x

    def view_of_view(x):
        x = x.clone()
        x[1:][:, ::2].mul_(3)
        x.select(1, -1)[1:3].fill_(-1)
        return x

    def transposed(x):
        x = x.clone()
        x.t().mul_(2)
        return x

    def diag_fill(x):
        x = x.clone()
        x.diagonal().fill_(1)
        return x

    def flat_view(x):
        x = x.clone()
        y = x.view(-1)
        y[3] = 5
        return x, y

    def as_strided_write(x):
        x = x.clone()
        x.as_strided((2, 2), (5, 1), 1).zero_()
        return x

    def unbind_write(x):
        x = x.clone()
        a, b = x.unbind(0)[:2]
        a.add_(b)
        return x

    def split_write(x):
        x = x.clone()
        x.split(2, dim=1)[1].sub_(10)
        return x

    def scalar_select(x):
        x = x.clone()
        x[2, 3] = x[0, 0] * 2
        return x

    def int_slice(i):
        i = i.clone()
        i[::2, 1:] += 100
        return i

    return {k: v for k, v in locals().items() if callable(v)}


INPLACE = _inplace_cases()


@pytest.mark.parametrize("name", list(INPLACE))
def test_inplace_on_views(mode, name):
    # Outputs of multi-view functions (unbind, split) may only be mutated without autograd.
    x = I if name.startswith("int") else X.detach() if name in ("unbind_write", "split_write") else X
    check(INPLACE[name], x, grad=x.requires_grad)


def test_no_grad_parameter_update(mode):
    p_cpu = torch.randn(3, 4)
    p = torch.nn.Parameter(p_cpu.clone().to("tpu"))
    before = dict(torchtpu.metrics.counters()["fallback_ops"])
    with torch.no_grad():
        p.add_(torch.ones(3, 4, device="tpu"), alpha=-0.5)
        p[0].mul_(2)
    expected = p_cpu - 0.5
    expected[0] *= 2
    torch.testing.assert_close(p.detach().cpu(), expected)
    assert p.requires_grad and p.is_leaf
    assert torchtpu.metrics.counters()["fallback_ops"] == before


def test_view_reflects_in_base(mode):
    x = torch.zeros(2, 3, device="tpu")
    y = x.view(-1)
    y[3] = 5
    d = x.diagonal()
    d.add_(1)
    assert x.cpu().tolist() == [[1.0, 0.0, 0.0], [5.0, 1.0, 0.0]]
    assert y.cpu().tolist() == [1.0, 0.0, 0.0, 5.0, 1.0, 0.0]


def test_scatter_ops_direct(mode):
    base = torch.randn(4, 5)
    src = torch.randn(5)
    check(lambda b, s: torch.select_scatter(b, s, 0, -1), base, src)
    check(lambda b, s: torch.slice_scatter(b, s[None, :2].expand(4, 2), 1, 1, 5, 2), base, src)
    check(lambda b, s: torch.diagonal_scatter(b, s[:4], 1), base, src)
    check(lambda b, s: torch.as_strided_scatter(b, s[:4].view(2, 2), (2, 2), (5, 2), 1), base, src)
