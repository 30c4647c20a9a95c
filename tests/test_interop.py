"""PyTorch idioms libraries rely on: torch.tensor(..., device="tpu") in in-place math,
module.to("tpu") keeping Parameter objects, DataLoader pinning and non_blocking uploads,
torchtpu.data.DeviceLoader, and safetensors save/load of tpu tensors."""
import collections
import threading

import pytest
import torch

import torchtpu
from torchtpu.data import DeviceLoader


def test_torch_tensor_on_tpu_takes_in_place_updates(mode):
    total = torch.tensor(0.0, device="tpu")  # transformers' Trainer accumulates its loss so
    for value in (1.5, 2.0):
        total += torch.tensor(value, device="tpu") * 2
    assert total.item() == 7.0
    rows = torch.tensor([[1, 2], [3, 4]], device="tpu")
    rows.add_(torch.ones(2, 2, dtype=torch.int64, device="tpu"))
    assert rows.tolist() == [[2, 3], [4, 5]]
    leaf = torch.tensor([1.0, 2.0], device="tpu", requires_grad=True)
    (leaf * 3).sum().backward()
    assert leaf.grad.tolist() == [3.0, 3.0]


def test_optimizer_built_before_the_move_trains_the_moved_model(mode):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 1))
    reference = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 1))
    reference.load_state_dict(model.state_dict())
    params = list(model.parameters())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)  # CPU parameters
    reference_optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    model.to("tpu")
    assert [p for p in model.parameters()] == params and all(p.device.type == "tpu" for p in params)
    x = torch.randn(16, 4)
    for _ in range(2):
        for m, opt, inp in ((model, optimizer, x.to("tpu")), (reference, reference_optimizer, x)):
            opt.zero_grad()
            m(inp).square().mean().backward()
            opt.step()
    for a, b in zip(model.state_dict().values(), reference.state_dict().values()):
        torch.testing.assert_close(a.cpu(), b, rtol=1e-5, atol=1e-6)
    model.cpu()
    assert [p for p in model.parameters()] == params and params[0].device.type == "cpu"


def test_module_to_keeps_tied_weights_and_swap_setting():
    class Tied(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(5, 4)
            self.head = torch.nn.Linear(4, 5, bias=False)
            self.head.weight = self.embed.weight

    model = Tied().to("tpu")
    assert model.head.weight is model.embed.weight and model.head.weight.device.type == "tpu"
    assert not torch.__future__.get_swap_module_params_on_conversion()  # the user's setting is untouched
    cpu_only = torch.nn.Linear(2, 2)
    weight = cpu_only.weight
    cpu_only.double()
    assert cpu_only.weight is weight and weight.dtype == torch.float64


@pytest.mark.filterwarnings("ignore:pin_memory_device is deprecated")  # PyTorch's own notice
def test_dataloader_pin_memory_and_non_blocking(mode):
    data = torch.utils.data.TensorDataset(torch.arange(24.0).view(8, 3), torch.arange(8))
    loader = torch.utils.data.DataLoader(data, batch_size=4, pin_memory=True, pin_memory_device="tpu")
    seen = []
    for x, y in loader:
        x, y = x.to("tpu", non_blocking=True), y.to("tpu", non_blocking=True)
        seen.append((x * 2).sum().item() + y.sum().item())
    assert seen == [(torch.arange(12.0) * 2).sum().item() + 6, (torch.arange(12.0, 24.0) * 2).sum().item() + 22]


Pair = collections.namedtuple("Pair", "image label")


class Batches(torch.utils.data.Dataset):
    def __len__(self):
        return 5

    def __getitem__(self, i):
        return {"pair": Pair(torch.full((2, 3), float(i)), torch.tensor(i)), "ids": [torch.arange(i + 1)], "name": f"b{i}"}


@pytest.mark.parametrize("prefetch", [0, 1, 2])
def test_device_loader_yields_batches_on_tpu_in_order(mode, prefetch):
    loader = torch.utils.data.DataLoader(Batches(), batch_size=None)
    device_loader = DeviceLoader(loader, prefetch=prefetch)
    assert len(device_loader) == 5
    for epoch in range(2):
        count = 0
        for i, batch in enumerate(device_loader):
            assert isinstance(batch["pair"], Pair) and batch["name"] == f"b{i}"
            assert batch["pair"].image.device == torch.device("tpu:0")
            assert torch.equal(batch["pair"].image.cpu(), torch.full((2, 3), float(i)))
            assert batch["pair"].label.item() == i and batch["ids"][0].tolist() == list(range(i + 1))
            count += 1
        assert count == 5


def test_device_loader_keeps_batches_ready_ahead():
    produced = []

    class Counting(torch.utils.data.Dataset):
        def __len__(self):
            return 6

        def __getitem__(self, i):
            produced.append(i)
            return torch.full((4,), float(i))

    iterator = iter(DeviceLoader(torch.utils.data.DataLoader(Counting(), batch_size=None), prefetch=2))
    first = next(iterator)
    for _ in range(100):  # the thread fills the queue while the consumer holds batch 0
        if len(produced) >= 3:
            break
        threading.Event().wait(0.02)
    # batch 0 handed out, batches 1 and 2 waiting on the device (a third may be in flight)
    assert 3 <= len(produced) <= 4
    assert first.device.type == "tpu" and [t.tolist()[0] for t in iterator] == [1.0, 2.0, 3.0, 4.0, 5.0]


def test_device_loader_stops_cleanly_and_reraises_loader_errors():
    before = threading.active_count()
    for batch in DeviceLoader(torch.utils.data.DataLoader(Batches(), batch_size=None), prefetch=2):
        break
    assert threading.active_count() == before  # breaking out ends the thread

    class Broken(torch.utils.data.Dataset):
        def __len__(self):
            return 3

        def __getitem__(self, i):
            if i == 1:
                raise KeyError("bad sample 1")
            return torch.zeros(2)

    with pytest.raises(KeyError, match="bad sample 1"):
        for _ in DeviceLoader(torch.utils.data.DataLoader(Broken(), batch_size=None)):
            pass
    with pytest.raises(ValueError, match="prefetch"):
        DeviceLoader([], prefetch=-1)
    with pytest.raises(ValueError, match="tpu device"):
        DeviceLoader([], device="cpu")


@pytest.mark.modes("fused")
def test_device_loader_feeds_a_training_loop_like_cpu(mode):
    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(32, 6), torch.randint(0, 3, (32,)))
    loader = torch.utils.data.DataLoader(data, batch_size=8)
    model, reference = torch.nn.Linear(6, 3), torch.nn.Linear(6, 3)
    reference.load_state_dict(model.state_dict())
    model.to("tpu")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    reference_optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    losses = []
    for x, y in DeviceLoader(loader, prefetch=2):
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        losses.append(loss)
    for (x, y), loss in zip(loader, losses):
        reference_optimizer.zero_grad()
        expected = torch.nn.functional.cross_entropy(reference(x), y)
        expected.backward()
        reference_optimizer.step()
        assert abs(loss.item() - expected.item()) < 1e-5


safetensors_torch = pytest.importorskip("safetensors.torch")


def test_safetensors_save_and_load_tpu_tensors(mode, tmp_path):
    torch.manual_seed(0)
    tensors = {"w": torch.randn(3, 4), "ids": torch.arange(5), "half": torch.randn(2, dtype=torch.bfloat16)}
    on_tpu = {k: v.to("tpu") for k, v in tensors.items()}
    safetensors_torch.save_file(on_tpu, tmp_path / "t.safetensors")
    loaded = safetensors_torch.load_file(tmp_path / "t.safetensors")
    assert all(torch.equal(loaded[k], tensors[k]) for k in tensors)
    for device in ("tpu", "tpu:0", torch.device("tpu")):
        back = safetensors_torch.load_file(tmp_path / "t.safetensors", device=device)
        assert all(back[k].device == torch.device("tpu:0") and torch.equal(back[k].cpu(), tensors[k]) for k in tensors)
    assert safetensors_torch.load(safetensors_torch.save(on_tpu))["w"].equal(tensors["w"])


def test_safetensors_shared_tpu_tensors_like_cpu(tmp_path):
    weight = torch.randn(3, device="tpu")
    with pytest.raises(RuntimeError, match="Some tensors share memory"):  # as for CPU tensors
        safetensors_torch.save_file({"a": weight, "b": weight}, tmp_path / "s.safetensors")

    class Tied(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(5, 3)
            self.head = torch.nn.Linear(3, 5, bias=False)
            self.head.weight = self.embed.weight

    model = Tied().to("tpu")
    safetensors_torch.save_model(model, tmp_path / "m.safetensors")  # one copy of the tied weight
    assert list(safetensors_torch.load_file(tmp_path / "m.safetensors")) == ["embed.weight"]
    restored = Tied()
    assert safetensors_torch.load_model(restored, tmp_path / "m.safetensors") == (set(), [])
    assert torch.equal(restored.head.weight, model.embed.weight.cpu())
    on_tpu = Tied().to("tpu")
    safetensors_torch.load_model(on_tpu, tmp_path / "m.safetensors", device="tpu")
    assert torch.equal(on_tpu.head.weight.cpu(), model.embed.weight.cpu()) and on_tpu.head.weight is on_tpu.embed.weight
