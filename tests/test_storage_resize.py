"""untyped_storage().resize_ on tpu: resize_(0) frees a storage's device data and resize_(nbytes)
re-allocates it for the next write, which every view over the storage then sees, as on CPU
(FSDP2 frees and re-allocates its unsharded parameters this way). Reading a freed storage
raises where CPU would read freed memory."""
import pytest
import torch

import torchtpu

N = 64 * 1024  # elements: a 256 KiB float32 storage, far above any scalar the test leaves


def _allocated():
    torchtpu.sync(wait=True)
    return torch.tpu.memory_allocated()


def _steps(device):
    """The same sequence on CPU (the oracle) and tpu: returns what a view saw at each stage
    and the storage sizes."""
    base = torch.empty(N, device=device)
    base.copy_(torch.arange(N, dtype=torch.float32))
    view = torch.as_strided(base, (N // 256, 256), (256, 1), 0)[2:5, 7:20]  # a view of a view
    first = view.clone()
    sizes = [base.untyped_storage().size()]
    base.untyped_storage().resize_(0)
    sizes += [base.untyped_storage().size(), view.untyped_storage().size()]
    _release(view)
    base.untyped_storage().resize_(N * 4)
    sizes.append(view.untyped_storage().size())
    base.copy_(torch.linspace(-1, 1, N))
    second = view.clone()
    view.mul_(3)  # a write through the view reaches the base, as on CPU
    return first, second, base.clone(), sizes


def _release(view):
    if view.device.type == "tpu":
        torchtpu._C.release_freed_alias(view)


@pytest.mark.modes("strict", "fused")
def test_free_and_reallocate_like_cpu(mode):
    got = _steps("tpu")
    want = _steps("cpu")
    assert got[3] == want[3] == [N * 4, 0, 0, N * 4]
    for g, w in zip(got[:3], want[:3]):
        torch.testing.assert_close(g.cpu(), w, rtol=0, atol=0)


@pytest.mark.modes("strict", "fused")
def test_free_returns_the_memory(mode):
    start = _allocated()
    base = torch.empty(N, device="tpu")
    base.copy_(torch.arange(N, dtype=torch.float32).to("tpu"))
    param = torch.nn.Parameter(torch.as_strided(base, (N // 256, 256), (256, 1), 0))
    assert param.sum().item() == N * (N - 1) / 2
    # The base and the view's own computed copy (functionalization's view_copy).
    assert _allocated() - start == 2 * N * 4
    base.untyped_storage().resize_(0)
    assert _allocated() - start == N * 4  # the base's buffer is gone; the computed view remains
    torchtpu._C.release_freed_alias(param)
    assert _allocated() - start == 0
    base.untyped_storage().resize_(N * 4)
    base.copy_(torch.ones(N, device="tpu"))
    assert param.sum().item() == N


@pytest.mark.modes("strict", "fused")
def test_pending_reads_keep_what_they_read(mode):
    # Ops recorded before the free read the contents before it, as kernels queued on a CUDA
    # stream before a free do; in fused mode they are still pending when it happens.
    base = torch.arange(N, dtype=torch.float32).to("tpu")
    total = base.sum() * 2
    head = base[:4] + 1
    base.untyped_storage().resize_(0)
    assert total.item() == N * (N - 1)
    assert head.tolist() == [1.0, 2.0, 3.0, 4.0]


@pytest.mark.modes("debug", "strict", "fused")
def test_reading_a_freed_storage_raises(mode):
    base = torch.arange(N, dtype=torch.float32).to("tpu")
    view = base.view(256, -1)
    base.untyped_storage().resize_(0)
    message = r"tpu storage was freed \(untyped_storage\(\)\.resize_\(0\)\)"
    with pytest.raises(RuntimeError, match=message):
        base.sum()
    with pytest.raises(RuntimeError, match=message):
        view[3].tolist()  # a view taken before the free
    with pytest.raises(RuntimeError, match=message):
        base.view(2, -1).cpu()  # and one taken after it
    # Re-allocated but not written yet: zeros, never stale or garbage data.
    base.untyped_storage().resize_(N * 4)
    assert view.abs().sum().item() == 0


def test_unsupported_resizes_raise():
    base = torch.arange(16, dtype=torch.float32).to("tpu")
    storage = base.untyped_storage()
    with pytest.raises(RuntimeError, match=r"re-allocated at its full size \(resize_\(64\)\) only"):
        storage.resize_(32)  # shrinking keeps tensors whose shapes no longer fit on the device
    storage.resize_(0)
    with pytest.raises(RuntimeError, match=r"resize_\(128\) of a storage of 0 bytes is not supported"):
        storage.resize_(128)
    with pytest.raises(RuntimeError, match=r"Requested storage size \(-1\) cannot be represented"):  # CUDA's
        storage.resize_(-1)
    with pytest.raises(RuntimeError, match="resize_ expects an int, but got float"):  # CPU's wording
        storage.resize_(2.5)
    storage.resize_(64)
    base.copy_(torch.arange(16.0))
    assert base.tolist() == list(range(16))
