"""Never a silent wrong answer, never lost state, never a hang: the private disk cache,
checked indexing, argument checks, transactional flushes and out-of-memory errors. CPU is
the oracle for error types and messages."""
import contextlib
import os
import stat
import warnings

import pytest
import torch

import torchtpu
from utils import run_python

_C = torchtpu._C


# ---- the private, verified disk cache ---------------------------------------------------


@contextlib.contextmanager
def cache_dir(path):
    """Compiles into the disk cache at `path` (a cold memory cache), then restores the test
    session's cache."""
    previous = _C.cache_dir()
    _C.set_cache_dir(str(path))
    _C.clear_memory_cache()
    try:
        yield
    finally:
        _C.set_cache_dir(previous)
        _C.clear_memory_cache()


def run_graph(offset, n=7, reduce="sum"):
    # Sizes used by no other test, so the graph is new to every cache.
    x = torch.arange(n * 3, dtype=torch.float32).reshape(n, 3)
    return getattr(x.to("tpu") + offset, reduce)(0).cpu(), getattr(x + offset, reduce)(0)


def cache_warnings(caught, text):
    return [w for w in caught if text in str(w.message)]


def test_cache_folder_and_entries_are_private_whatever_the_umask(tmp_path):
    folder = tmp_path / "parent" / "cache"
    old = os.umask(0)
    try:
        with cache_dir(folder):
            got, want = run_graph(1.5)
    finally:
        os.umask(old)
    assert torch.equal(got, want)
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    entries = list(folder.iterdir())
    assert entries and all(stat.S_IMODE(e.stat().st_mode) == 0o600 for e in entries)


def test_cache_refuses_a_folder_others_can_write_with_one_warning(tmp_path):
    folder = tmp_path / "shared"
    folder.mkdir()
    folder.chmod(0o777)
    with cache_dir(folder), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for offset in (2.5, 3.5):  # two graphs: still one warning
            got, want = run_graph(offset, n=9)
            assert torch.equal(got, want)
    refused = cache_warnings(caught, "not using the compilation cache")
    assert len(refused) == 1 and "other users can write to it (mode 0777)" in str(refused[0].message)
    assert list(folder.iterdir()) == []


def test_cache_refuses_a_folder_owned_by_another_user(tmp_path):
    if os.geteuid() == 0:
        folder = tmp_path / "theirs"
        folder.mkdir(mode=0o700)
        os.chown(folder, 65534, 65534)
    else:
        folder = "/usr"  # owned by root, not by this user
    with cache_dir(folder), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got, want = run_graph(4.5, n=10)
    assert torch.equal(got, want)
    refused = cache_warnings(caught, "not using the compilation cache")
    assert len(refused) == 1 and "owned by another user" in str(refused[0].message)
    if folder != "/usr":
        assert not os.listdir(folder)


def test_an_entry_copied_over_another_graphs_entry_is_recompiled(tmp_path):
    # The case: graph A's valid entry under graph B's file name made B return A's
    # results. Each entry records its full key, so B now recompiles.
    with cache_dir(tmp_path / "a"):
        run_graph(100.0, n=11, reduce="amax")
    with cache_dir(tmp_path / "b"):
        run_graph(-100.0, n=11)
    (entry_a,) = (tmp_path / "a").iterdir()
    (entry_b,) = (tmp_path / "b").iterdir()
    entry_b.write_bytes(entry_a.read_bytes())
    before = torchtpu.metrics.counters()
    with cache_dir(tmp_path / "b"), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got, want = run_graph(-100.0, n=11)
    after = torchtpu.metrics.counters()
    assert torch.equal(got, want)
    assert after["cache_hits_disk"] == before["cache_hits_disk"]
    assert after["graphs_compiled"] == before["graphs_compiled"] + 1
    assert len(cache_warnings(caught, "holds another graph's executable")) == 1
    # The recompiled executable replaced the foreign entry: the next process hits it.
    with cache_dir(tmp_path / "b"):
        before = torchtpu.metrics.counters()["cache_hits_disk"]
        got, want = run_graph(-100.0, n=11)
        assert torch.equal(got, want)
        assert torchtpu.metrics.counters()["cache_hits_disk"] == before + 1


def test_a_failed_cache_write_warns_once(tmp_path):
    # A file size limit makes every entry write fail part-way, as a full disk does (and
    # unlike a read-only folder, it also stops a root user).
    script = f"""
        import resource, signal, warnings, torch, torchtpu
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (64, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
        x = torch.arange(6.).to("tpu")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            a, b = (x * 3).cpu(), (x - 3).sum().cpu()
        print(a.tolist(), b.item())
        print([str(w.message) for w in caught if "cannot write the compilation cache" in str(w.message)])
    """
    result = run_python(script, TORCHTPU_CACHE_DIR=str(tmp_path / "cache"))
    assert result.returncode == 0, result.stderr
    values, messages = result.stdout.strip().splitlines()[-2:]
    assert values == "[0.0, 3.0, 6.0, 9.0, 12.0, 15.0] -3.0"
    messages = eval(messages)
    assert len(messages) == 1 and "File too large" in messages[0]  # names the OS error
    assert not [p for p in (tmp_path / "cache").iterdir() if ".tmp." in p.name]


# ---- checked indexing: CPU's error, at the next wait (at the op in debug mode) ------------

F = torch.nn.functional


def _src(n=5):
    return torch.arange(float(n))


# (name, fn(x, i) -> tensor): x is arange(5.) on the test's device, i a 1-element int64
# index tensor. Every op here reads the index on tpu (no CPU fallback).
INDEXING = {
    "index": lambda x, i: x[i],
    "index_second_dim": lambda x, i: x.reshape(1, 5)[:, i],
    "index_two_tensors": lambda x, i: x.reshape(5, 1).expand(5, 3)[torch.zeros_like(i), i],
    "index_put": lambda x, i: x.clone().index_put_((i,), torch.ones(1, device=x.device)),
    "index_put_accumulate": lambda x, i: x.clone().index_put_((i,), torch.ones(1, device=x.device), accumulate=True),
    "setitem": lambda x, i: _setitem(x.clone(), i),
    "index_select": lambda x, i: x.index_select(0, i),
    "gather": lambda x, i: x.gather(0, i),
    "take_along_dim": lambda x, i: torch.take_along_dim(x, i),
    "scatter": lambda x, i: x.clone().scatter_(0, i, torch.ones(1, device=x.device)),
    "scatter_add": lambda x, i: x.clone().scatter_add_(0, i, torch.ones(1, device=x.device)),
    "scatter_reduce": lambda x, i: x.clone().scatter_reduce_(0, i, torch.ones(1, device=x.device), "amax"),
    "index_add": lambda x, i: x.clone().index_add_(0, i, torch.ones(1, device=x.device)),
    # These five dropped or clamped an index out of range (take read x[4] for index 10); torch
    # 2.15 sends x[i] = 7.0 through index_fill_.
    "take": lambda x, i: torch.take(x, i),
    "put": lambda x, i: x.clone().put_(i, torch.ones(1, device=x.device)),
    "index_fill": lambda x, i: x.clone().index_fill_(0, i, 7.0),
    "index_copy": lambda x, i: x.clone().index_copy_(0, i, torch.ones(1, device=x.device)),
    "index_reduce": lambda x, i: x.clone().index_reduce_(0, i, torch.ones(1, device=x.device), "prod"),
    "embedding": lambda x, i: F.embedding(i, x.reshape(5, 1)),
    "one_hot": lambda x, i: F.one_hot(i, 5),
    "nll_loss": lambda x, i: F.nll_loss(x.reshape(1, 5), i),
    "cross_entropy": lambda x, i: F.cross_entropy(x.reshape(1, 5), i),
    "cross_entropy_none": lambda x, i: F.cross_entropy(x.reshape(1, 5), i, reduction="none"),
    "nll_loss2d": lambda x, i: F.nll_loss(x.reshape(1, 5, 1, 1), i.reshape(1, 1, 1)),
}


def _setitem(x, i):
    x[i] = 7.0
    return x


def _cpu_outcome(fn, value):
    try:
        return fn(_src(), torch.tensor([value])), None
    except Exception as error:  # the oracle: CPU's exception
        return None, error


@pytest.mark.parametrize("value", [10, -1, -6])
@pytest.mark.parametrize("name", sorted(INDEXING))
def test_indexing_out_of_range_raises_like_cpu(name, value, mode):
    fn = INDEXING[name]
    expected, cpu_error = _cpu_outcome(fn, value)
    x, i = _src().to("tpu"), torch.tensor([value]).to("tpu")
    before = dict(torchtpu.metrics.counters()["fallback_ops"])
    if cpu_error is None:  # negative indices where PyTorch allows them
        torch.testing.assert_close(fn(x, i).cpu(), expected)
    else:
        with pytest.raises(type(cpu_error)) as raised:
            if mode == "debug":
                fn(x, i)  # debug mode raises at the op itself
            else:
                fn(x, i).cpu()  # the others when the host next waits
        message = str(raised.value)
        assert message.startswith(str(cpu_error)), (message, str(cpu_error))
        assert "test_reliability.py" in message  # the user's line
    assert torchtpu.metrics.counters()["fallback_ops"] == before
    # Nothing sticks: the next computation is right.
    assert torch.equal((x * 2).cpu(), _src() * 2)


@pytest.mark.modes("strict", "fused")
def test_a_failed_check_surfaces_at_the_next_wait_with_the_op_and_line(mode):
    x = torch.arange(5.).to("tpu")
    picked = x[torch.tensor([7]).to("tpu")]  # nothing raised yet: the check runs on the device
    line = picked  # noqa: F841
    with pytest.raises(IndexError, match=r"index 7 is out of bounds .*aten::index\.Tensor.*test_reliability\.py:\d+"):
        torchtpu.sync(wait=True)
    torchtpu.sync(wait=True)  # raised once, then forgotten


def test_in_range_indexing_is_unchanged(mode):
    torch.manual_seed(0)
    x = torch.randn(6, 4)
    idx = torch.tensor([[5, 0, -1], [2, -6, 3]])
    got = x.to("tpu")[idx.to("tpu")].cpu()
    assert torch.equal(got, x[idx])
    w = torch.randn(10, 3)
    tokens = torch.tensor([[1, 9, 0], [4, 4, 2]])
    assert torch.equal(F.embedding(tokens.to("tpu"), w.to("tpu")).cpu(), F.embedding(tokens, w))
    logits, target = torch.randn(4, 10), torch.tensor([1, -100, 9, 0])
    torch.testing.assert_close(F.cross_entropy(logits.to("tpu"), target.to("tpu")).cpu(), F.cross_entropy(logits, target))


def test_masked_scatter_with_too_few_source_elements_raises_like_cpu(mode):
    x = torch.arange(5.)
    with pytest.raises(RuntimeError) as cpu:
        x.clone().masked_scatter_(x > 0, torch.ones(2))
    with pytest.raises(RuntimeError) as tpu:
        xt = x.to("tpu")
        xt.clone().masked_scatter_(xt > 0, torch.ones(2).to("tpu")).cpu()
    assert str(tpu.value).startswith(str(cpu.value))


# ---- integer division by zero --------------------------------------------------------------

DIVISIONS = {
    "remainder": lambda a, b: a % b,
    "fmod": lambda a, b: torch.fmod(a, b),
    "div_floor": lambda a, b: torch.div(a, b, rounding_mode="floor"),
    "div_trunc": lambda a, b: torch.div(a, b, rounding_mode="trunc"),
    "remainder_int32": lambda a, b: a.int() % b.int(),
    "remainder_scalar_zero": lambda a, b: a % 0,
    "fmod_scalar_zero": lambda a, b: torch.fmod(a, 0),
    "div_floor_scalar_zero": lambda a, b: torch.div(a, 0, rounding_mode="floor"),
}


@pytest.mark.parametrize("name", sorted(DIVISIONS))
def test_integer_division_by_zero_raises_like_cpu(name, mode):
    fn = DIVISIONS[name]
    a, b = torch.tensor([5, -7, 6]), torch.tensor([2, 0, 3])
    with pytest.raises(RuntimeError) as cpu:
        fn(a, b)
    with pytest.raises(RuntimeError) as tpu:
        fn(a.to("tpu"), b.to("tpu")).cpu()
    assert str(tpu.value).startswith(str(cpu.value)) and str(cpu.value) == "ZeroDivisionError"
    # Nonzero divisors (negative ones included) still divide like CPU.
    b = torch.tensor([2, -3, 4])
    if "zero" not in name:
        assert torch.equal(fn(a.to("tpu"), b.to("tpu")).cpu(), fn(a, b))
    assert torch.equal((a.to("tpu") / 2).cpu(), a / 2)  # true division of ints never raises


def test_compiled_graphs_check_indices_on_every_call():
    fn = torch.compile(lambda x, i: x[i] * 2, backend="tpu", dynamic=False)
    x = torch.arange(5.).to("tpu")
    assert torch.equal(fn(x, torch.tensor([1, -1]).to("tpu")).cpu(), torch.tensor([2.0, 8.0]))
    replays = _C.capture_stats()["replays"]
    assert torch.equal(fn(x, torch.tensor([3, 0]).to("tpu")).cpu(), torch.tensor([6.0, 0.0]))
    with pytest.raises(IndexError, match="index 9 is out of bounds for dimension 0 with size 5"):
        fn(x, torch.tensor([2, 9]).to("tpu")).cpu()
    assert _C.capture_stats()["replays"] == replays + 2  # the captured executable checked it


# ---- argument checks CPU makes (at the op, in every mode) --------------------------------
# (Ops whose meta kernel already rejects the arguments - addmv's self dtype, var_mean of
# integers - run on CPU, which raises its own error; these are the ones tpu checks itself, but
# std/var of integers, whose rule refuses them through CPU's kernel: its error type is torch's.)

ARGUMENT_ERRORS = {
    "linear_int64_by_float": lambda d: F.linear(torch.ones(2, 3, dtype=torch.int64, device=d), torch.ones(4, 3, device=d)),
    "mm": lambda d: torch.mm(torch.ones(2, 3, dtype=torch.int64, device=d), torch.ones(3, 4, device=d)),
    "mm_bfloat16": lambda d: torch.mm(torch.ones(2, 3, dtype=torch.bfloat16, device=d), torch.ones(3, 4, device=d)),
    "matmul_batched": lambda d: torch.matmul(torch.ones(2, 2, 3, dtype=torch.int64, device=d), torch.ones(3, 4, device=d)),
    "addmm_mat1": lambda d: torch.addmm(torch.ones(2, 4, device=d), torch.ones(2, 3, dtype=torch.int64, device=d),
                                        torch.ones(3, 4, device=d)),
    "linear_float64_bias": lambda d: F.linear(torch.ones(2, 3, device=d), torch.ones(4, 3, device=d),
                                              torch.ones(4, dtype=torch.float64, device=d)),
    "mv": lambda d: torch.mv(torch.ones(2, 3, dtype=torch.int64, device=d), torch.ones(3, device=d)),
    "mv_vector": lambda d: torch.mv(torch.ones(2, 3, device=d), torch.ones(3, dtype=torch.int64, device=d)),
    "addbmm": lambda d: torch.addbmm(torch.ones(2, 4, device=d), torch.ones(1, 2, 3, dtype=torch.int64, device=d),
                                     torch.ones(1, 3, 4, device=d)),
    "conv2d_weight": lambda d: F.conv2d(torch.ones(1, 1, 3, 3, dtype=torch.int64, device=d), torch.ones(1, 1, 2, 2, device=d)),
    "conv2d_bias": lambda d: F.conv2d(torch.ones(1, 1, 3, 3, device=d), torch.ones(1, 1, 2, 2, device=d),
                                      torch.ones(1, dtype=torch.float64, device=d)),
    "std_int": lambda d: torch.ones(4, dtype=torch.int32, device=d).std(),
    "var_int": lambda d: torch.ones(4, dtype=torch.int64, device=d).var(),
    "randint_empty_range": lambda d: torch.randint(5, 2, (3,), device=d),
    "randint_to_zero": lambda d: torch.randint(0, (3,), device=d),
    "random_from_to": lambda d: torch.empty(3, device=d).random_(5, 2),
    "random_to_int8_bounds": lambda d: torch.randint(0, 300, (3,), dtype=torch.int8, device=d),
    "random_from_uint8_bounds": lambda d: torch.empty(3, dtype=torch.uint8, device=d).random_(-1, 5),
    "random_bool_bounds": lambda d: torch.empty(3, dtype=torch.bool, device=d).random_(0, 3),
    "random_half_bounds": lambda d: torch.empty(3, dtype=torch.half, device=d).random_(0, 70000),
    "uniform_reversed": lambda d: torch.empty(3, device=d).uniform_(5, 2),
    "uniform_infinite": lambda d: torch.empty(3, device=d).uniform_(0, float("inf")),
    "bernoulli_p": lambda d: torch.empty(3, device=d).bernoulli_(1.5),
    "bernoulli_negative_p": lambda d: torch.empty(3, device=d).bernoulli_(-0.1),
    "index_select_float_index": lambda d: torch.index_select(torch.ones(3, 2, device=d), 0, torch.zeros(2, device=d)),
    "index_select_matrix_index": lambda d: torch.index_select(torch.ones(3, 2, device=d), 0,
                                                              torch.zeros(1, 1, dtype=torch.int64, device=d)),
    "softmax_dim": lambda d: F.softmax(torch.ones(2, 3, device=d), 5),
}

# Data-dependent: raised at the next wait (at the op in debug mode).
DATA_ERRORS = {
    "normal_tensor_std": lambda d: torch.normal(torch.zeros(2, device=d), -torch.ones(2, device=d)),
    "bernoulli_tensor_p": lambda d: torch.bernoulli(torch.tensor([0.5, 1.5], device=d)),
}


def _raised(fn, device):
    try:
        result = fn(device)
        if isinstance(result, tuple):
            result = result[0]
        result.cpu()
    except Exception as error:
        return error
    return None


@pytest.mark.parametrize("name", sorted(ARGUMENT_ERRORS) + sorted(DATA_ERRORS))
def test_argument_errors_match_cpu(name, mode):
    fn = ARGUMENT_ERRORS.get(name) or DATA_ERRORS[name]
    cpu = _raised(fn, "cpu")
    assert cpu is not None, "the oracle must raise"
    before = dict(torchtpu.metrics.counters()["fallback_ops"])
    if name in ARGUMENT_ERRORS or mode == "debug":
        with pytest.raises(type(cpu)) as tpu:
            fn("tpu")  # at the op itself
    else:
        tpu_error = _raised(fn, "tpu")
        assert type(tpu_error) is type(cpu)
        tpu = pytest.ExceptionInfo.from_exc_info((type(tpu_error), tpu_error, tpu_error.__traceback__))
    assert str(tpu.value).startswith(str(cpu)), (str(tpu.value), str(cpu))
    assert torchtpu.metrics.counters()["fallback_ops"] == before  # tpu's own check, not CPU's
    assert torch.equal(torch.mm(torch.ones(2, 3).to("tpu"), torch.ones(3, 1).to("tpu")).cpu(), torch.full((2, 1), 3.0))


# ---- arguments PyTorch's own checks reject (at the op, in every mode) ---------------------
# The meta kernel of an op with a lowering rejects these; CPU's kernel then gives the error,
# the same exception and words as on CPU. Nothing fell back: no "no tpu lowering" warning, no
# count, and TORCHTPU_FALLBACK=error does not replace the user's error with its own.

REJECTED_ARGUMENTS = {
    "mm_shapes": lambda d: torch.mm(torch.ones(2, 3, device=d), torch.ones(4, 5, device=d)),
    "linear_shapes": lambda d: F.linear(torch.ones(2, 3, device=d), torch.ones(4, 5, device=d)),
    "bmm_shapes": lambda d: torch.bmm(torch.ones(2, 2, 3, device=d), torch.ones(2, 4, 5, device=d)),
    "mv_shapes": lambda d: torch.ones(2, 3, device=d) @ torch.ones(4, device=d),
    "dot_sizes": lambda d: torch.dot(torch.ones(2, device=d), torch.ones(3, device=d)),
    "cat_shapes": lambda d: torch.cat([torch.ones(2, 3, device=d), torch.ones(2, 4, device=d)]),
    "stack_shapes": lambda d: torch.stack([torch.ones(2, device=d), torch.ones(3, device=d)]),
    "conv2d_weight_shape": lambda d: F.conv2d(torch.ones(1, 2, 5, 5, device=d), torch.ones(1, 3, 2, 2, device=d)),
    "add_broadcast": lambda d: torch.ones(2, 3, device=d) + torch.ones(4, device=d),
    "where_broadcast": lambda d: torch.where(torch.ones(2, 3, dtype=torch.bool, device=d), torch.ones(4, device=d), 0.0),
    "view_numel": lambda d: torch.ones(6, device=d).reshape(4, 2),
    "expand_size": lambda d: torch.ones(2, 3, device=d).expand(4, 3),
    "sum_dim": lambda d: torch.ones(2, 3, device=d).sum(5),
    "gather_float_index": lambda d: torch.gather(torch.ones(3, device=d), 0, torch.zeros(2, device=d)),
    "embedding_float_index": lambda d: F.embedding(torch.zeros(2, device=d), torch.ones(3, 4, device=d)),
    "layer_norm_shape": lambda d: F.layer_norm(torch.ones(2, 3, device=d), (4,)),
    "max_pool_output_size": lambda d: F.max_pool2d(torch.ones(1, 1, 2, 2, device=d), 5),
    "var_mean_int": lambda d: torch.var_mean(torch.ones(3, dtype=torch.int64, device=d)),
}


@contextlib.contextmanager
def fallback_policy(policy):
    _C.set_fallback_policy(policy)
    try:
        yield
    finally:
        _C.set_fallback_policy(os.environ.get("TORCHTPU_FALLBACK", "warn"))


@pytest.mark.parametrize("policy", ["warn", "error"])
@pytest.mark.parametrize("name", sorted(REJECTED_ARGUMENTS))
def test_rejected_arguments_raise_cpu_error_and_do_not_fall_back(name, policy, mode):
    fn = REJECTED_ARGUMENTS[name]
    cpu = _raised(fn, "cpu")
    assert cpu is not None, "the oracle must raise"
    torchtpu.metrics.reset()  # each op warns once: forget earlier warnings
    with fallback_policy(policy), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tpu = _raised(fn, "tpu")
    assert type(tpu) is type(cpu) and str(tpu) == str(cpu), (repr(tpu), repr(cpu))
    assert [str(w.message) for w in caught if "no tpu lowering" in str(w.message)] == []
    assert torchtpu.metrics.counters()["fallback_ops"] == {}


def test_a_declined_call_cpu_computes_is_still_a_counted_fallback(mode):
    # pow of a bool tensor and a bool is refused on tpu (bool pow) but CPU computes it, as a
    # copy in bool (the meta kernel says int64): a fallback, counted and warned once it ran.
    b = torch.tensor([True, False])
    torchtpu.metrics.reset()
    with pytest.warns(UserWarning, match="aten::pow.Tensor_Scalar has no tpu lowering"):
        out = torch.pow(b.to("tpu"), True)
    assert out.device.type == "tpu" and out.dtype == torch.bool and torch.equal(out.cpu(), b)
    assert torchtpu.metrics.counters()["fallback_ops"] == {"aten::pow.Tensor_Scalar": 1}
    with fallback_policy("error"), pytest.raises(NotImplementedError, match="TORCHTPU_FALLBACK=error"):
        torch.pow(b.to("tpu"), True)


def test_valid_random_ranges_still_sample_in_range(mode):
    torch.manual_seed(0)
    ints = torch.randint(-3, 4, (200,), device="tpu").cpu()
    assert ints.min() >= -3 and ints.max() <= 3 and len(ints.unique()) == 7
    small = torch.randint(0, 128, (100,), dtype=torch.int8, device="tpu").cpu()
    assert small.min() >= 0 and small.max() <= 127
    u = torch.empty(100, device="tpu").uniform_(2, 2).cpu()  # an empty range is allowed: all 2
    assert torch.equal(u, torch.full((100,), 2.0))


# ---- transactional optimizer steps and flushes --------------------------------------------


class _StepThenFail(torch.optim.Adam):
    """Adam whose step applies its whole update, then meets the issue's bad op: std() of
    integers, which CPU's kernel refuses. Its input is made and read before the step, so the
    refusal reads no value of the step (one that did would run the fused step's graph first,
    and a step whose graph ran cannot be undone: the error then says so)."""

    def __init__(self, params, **kwargs):
        super().__init__(params, **kwargs)
        self.integers = torch.ones(4, dtype=torch.int32, device=self.param_groups[0]["params"][0].device)
        self.integers.cpu()

    def step(self, closure=None):
        super().step(closure)
        self.integers.std()


def _twins(optimizer=torch.optim.Adam):
    torch.manual_seed(0)
    cpu = torch.nn.Linear(3, 2)
    tpu = torch.nn.Linear(3, 2).to("tpu")
    tpu.load_state_dict(cpu.state_dict())
    x = torch.randn(4, 3)
    return (cpu, torch.optim.Adam(cpu.parameters(), lr=0.1), x), (tpu, optimizer(tpu.parameters(), lr=0.1), x.to("tpu"))


def _backward(model, x):
    model.zero_grad()
    model(x).pow(2).sum().backward()


def _assert_same(cpu, tpu):
    # Adam on XLA:CPU and on PyTorch's CPU differ in the last bits (fused vs separate
    # multiply-adds); measured 6e-8 after three steps.
    torch.testing.assert_close(tpu.cpu(), cpu, rtol=1e-5, atol=1e-6)


def _check_after_a_failed_step(cpu_side, tpu_side):
    """The tpu model failed its second step: it still holds the first step's values (as the
    CPU twin does before its second step) and trains on like the CPU twin."""
    (cpu, cpu_opt, x), (tpu, tpu_opt, xt) = cpu_side, tpu_side
    _backward(cpu, x)
    for p, q in zip(cpu.parameters(), tpu.parameters()):
        _assert_same(p, q)
        _assert_same(p.grad, q.grad)
    assert tpu_opt.state[tpu.weight]["step"].item() == 1
    _assert_same(cpu_opt.state[cpu.weight]["exp_avg"], tpu_opt.state[tpu.weight]["exp_avg"])
    cpu_opt.step()
    torch.optim.Adam.step(tpu_opt)  # the next good step
    for p, q in zip(cpu.parameters(), tpu.parameters()):
        _assert_same(p, q)
    _assert_same(cpu_opt.state[cpu.bias]["exp_avg_sq"], tpu_opt.state[tpu.bias]["exp_avg_sq"])


def test_a_failed_optimizer_step_is_undone(mode):
    cpu_side, tpu_side = _twins(_StepThenFail)
    (cpu, cpu_opt, x), (tpu, tpu_opt, xt) = cpu_side, tpu_side
    _backward(cpu, x)
    cpu_opt.step()
    _backward(tpu, xt)
    torch.optim.Adam.step(tpu_opt)
    _backward(tpu, xt)
    with pytest.raises(Exception) as on_cpu:  # its type is torch's release's (RuntimeError to 2.14)
        torch.ones(4, dtype=torch.int32).std()
    with pytest.raises(type(on_cpu.value), match="std and var only support floating point") as error:
        tpu_opt.step()  # applied in full (strict, debug) or recorded (fused), then undone
    assert any(entry.name == "step" and "test_reliability" in str(entry.path) for entry in error.traceback)
    _check_after_a_failed_step(cpu_side, tpu_side)


@contextlib.contextmanager
def memory_budget(extra_bytes):
    """Lets tpu tensors hold only `extra_bytes` more than they hold now."""
    torchtpu.sync(wait=True)
    total = _C.memory_budget(0)
    torch.tpu.set_per_process_memory_fraction((torch.tpu.memory_allocated() + extra_bytes) / total)
    try:
        yield
    finally:
        torch.tpu.set_per_process_memory_fraction(1.0)


def test_an_optimizer_step_out_of_memory_is_undone(mode):
    cpu_side, tpu_side = _twins()
    (cpu, cpu_opt, x), (tpu, tpu_opt, xt) = cpu_side, tpu_side
    _backward(cpu, x)
    cpu_opt.step()
    _backward(tpu, xt)
    tpu_opt.step()
    _backward(tpu, xt)
    with memory_budget(16):  # the gradients fit; Adam's updates do not
        with pytest.raises(torch.OutOfMemoryError, match="tpu out of memory"):
            tpu_opt.step()
    _check_after_a_failed_step(cpu_side, tpu_side)


@pytest.mark.modes("fused")
def test_a_flush_out_of_memory_keeps_every_pending_value():
    x = torch.arange(6.0, device="tpu")
    with memory_budget(16):  # the graph's results (28 bytes) do not fit
        y = x * 2
        total = (y + 1).sum()
        with pytest.raises(torch.OutOfMemoryError, match="graph of .* started at .*test_reliability.py"):
            torchtpu.sync()
        with pytest.raises(torch.OutOfMemoryError):  # again, not a hang or a lost value
            y.cpu()
    assert torch.equal(y.cpu(), torch.arange(6.0) * 2)
    assert total.item() == 36.0


@pytest.mark.modes("fused")
def test_a_graph_loaded_from_the_disk_cache_still_checks_its_memory(tmp_path):
    # The entry keeps the graph's memory need: a process that loads it raises as one that compiled it.
    x = torch.arange(7.0, device="tpu")
    torchtpu.sync()

    def graph():
        y = x * 3
        return y, (y + 1).sum()

    with cache_dir(tmp_path):
        y, total = graph()
        torchtpu.sync()  # compiled and stored
        del y, total
        _C.clear_memory_cache()
        hits = torchtpu.metrics.counters()["cache_hits_disk"]
        with memory_budget(16):  # the graph's results (32 bytes) do not fit
            y, total = graph()
            with pytest.raises(torch.OutOfMemoryError, match="graph of"):
                torchtpu.sync()
        assert torchtpu.metrics.counters()["cache_hits_disk"] == hits + 1  # loaded, not recompiled
        assert total.item() == 70.0


def test_a_result_larger_than_the_device_raises_out_of_memory_at_once(mode):
    x = torch.ones(8, device="tpu")
    torchtpu.sync(wait=True)
    before = torch.tpu.memory_allocated()
    loss = (x * 2).sum()
    with pytest.raises(torch.OutOfMemoryError, match=r"Tried to allocate 37252\.90 GiB .*zeros.*del them"):
        torch.zeros(10**13, device="tpu")
    torchtpu.sync()
    assert torch.tpu.memory_allocated() <= before + 4  # the loss, not 40 TB
    assert loss.item() == 16.0


def test_memory_fraction_is_checked_like_cuda():
    with pytest.raises(TypeError, match="must be `float`"):
        torch.tpu.set_per_process_memory_fraction(1)
    with pytest.raises(ValueError, match="Allowed range: 0~1"):
        torch.tpu.set_per_process_memory_fraction(1.5)


# ---- compiles the runtime refuses; the executable cache's bound -------------------------


@pytest.mark.modes("strict", "fused")
def test_a_failed_compile_raises_and_the_engine_stays_usable(mode):
    x = torch.randn(7, 1013)
    xt = x.to("tpu")
    torchtpu.sync(wait=True)
    _C._corrupt_next_compile()  # XLA gets an invalid module for the next graph it compiles
    with pytest.raises(RuntimeError, match=r"XLA could not compile graph .*\(\d+ ops"):
        (xt.exp() * 3 - 1).cpu()
    # The same work, and new work, compile and compute afterwards.
    torch.testing.assert_close((xt.exp() * 3 - 1).cpu(), x.exp() * 3 - 1)
    torch.testing.assert_close((xt + 2).sum().cpu(), (x + 2).sum())


def test_the_executable_cache_keeps_the_most_recently_used():
    previous = _C.executable_cache_size()
    _C.set_executable_cache_size(4)
    try:
        with torchtpu.mode("strict"):
            before = torchtpu.metrics.counters()["executables_evicted"]
            x = torch.randn(3, 11)
            # Six graphs of distinct shapes: two are dropped; the last four hit the cache.
            tensors = [torch.randn(3, 20 + i, device="tpu") for i in range(6)]
            torchtpu.sync(wait=True)
            for t in tensors:
                (t.cos() + 1).cpu()
            assert torchtpu.metrics.counters()["executables_evicted"] - before >= 2
            hits = torchtpu.metrics.counters()["cache_hits_memory"]
            (tensors[-1].cos() + 1).cpu()
            assert torchtpu.metrics.counters()["cache_hits_memory"] > hits
            # An evicted graph runs again (from the disk cache or a new compile), correctly.
            torch.testing.assert_close((x.to("tpu").cos() + 1).cpu(), x.cos() + 1)
            torch.testing.assert_close((tensors[0].cos() + 1).cpu(), tensors[0].cpu().cos() + 1)
    finally:
        _C.set_executable_cache_size(previous)
    with pytest.raises(ValueError, match="TORCHTPU_EXECUTABLE_CACHE_SIZE"):
        torchtpu._settings.read({"TORCHTPU_EXECUTABLE_CACHE_SIZE": "0"})
    assert torchtpu._settings.read({"TORCHTPU_EXECUTABLE_CACHE_SIZE": "64"}).executable_cache_size == 64
