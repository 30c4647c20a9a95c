"""Lightning on tpu, as a user runs it: Trainer(accelerator="tpu") (and "auto") train on
torchtpu's device without torch_xla, losses per step equal accelerator="cpu",
bf16-mixed autocasts on tpu, and checkpoints save and restore."""
import pytest
import torch

L = pytest.importorskip("lightning")

STEPS = 3


class Regressor(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
        self.losses = []
        self.inner_dtypes = []
        self.devices_seen = set()  # (what, device type) during training; Lightning moves the model to CPU at the end
        self.net[0].register_forward_hook(lambda module, args, out: self.inner_dtypes.append(out.dtype))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x).float(), y)
        self.losses.append(loss.detach())
        self.devices_seen |= {("batch", x.device.type)} | {("param", p.device.type) for p in self.parameters()}
        return loss

    def on_train_batch_end(self, outputs, batch, batch_idx):
        state = self.optimizers().optimizer.state
        self.devices_seen |= {("optimizer state", t.device.type) for s in state.values() for t in s.values()
                              if t.dim() > 0}

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-2)


def data():
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(4 * STEPS, 8, generator=generator)
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4)


def fit(accelerator, tmp_path, precision="32-true", ckpt_path=None, steps=STEPS):
    torch.manual_seed(0)
    model = Regressor()
    trainer = L.Trainer(accelerator=accelerator, devices=1, max_steps=steps, precision=precision,
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, default_root_dir=str(tmp_path))
    trainer.fit(model, data(), ckpt_path=ckpt_path)
    return trainer, model


@pytest.mark.parametrize("accelerator", ["tpu", "auto"])
def test_trainer_on_tpu_matches_cpu(accelerator, tmp_path):
    tpu_trainer, tpu_model = fit(accelerator, tmp_path)
    cpu_trainer, cpu_model = fit("cpu", tmp_path)

    assert type(tpu_trainer.accelerator).__name__ == "TPUAccelerator"
    assert tpu_trainer.strategy.root_device == torch.device("tpu:0")
    assert tpu_model.devices_seen == {("batch", "tpu"), ("param", "tpu"), ("optimizer state", "tpu")}
    assert cpu_model.devices_seen == {("batch", "cpu"), ("param", "cpu"), ("optimizer state", "cpu")}
    assert len(tpu_model.losses) == len(cpu_model.losses) == STEPS
    for step, (tpu, cpu) in enumerate(zip(tpu_model.losses, cpu_model.losses)):
        assert tpu.device.type == "tpu"
        assert abs(tpu.item() - cpu.item()) < 1e-5, f"step {step}"  # float32 both ways; measured < 1e-6


def test_bf16_mixed_autocasts_on_tpu(tmp_path):
    trainer, model = fit("tpu", tmp_path, precision="bf16-mixed")
    assert trainer.precision_plugin.device == "tpu"
    assert model.inner_dtypes and set(model.inner_dtypes) == {torch.bfloat16}
    _, cpu_model = fit("cpu", tmp_path, precision="bf16-mixed")
    for tpu, cpu in zip(model.losses, cpu_model.losses):
        # bfloat16 activations round differently in XLA and ATen (8 mantissa bits); measured
        # differences are up to 3e-3 on losses of 3-7.
        assert abs(tpu.item() - cpu.item()) < 2e-2


def test_checkpoint_save_and_restore(tmp_path):
    trainer, model = fit("tpu", tmp_path)
    path = tmp_path / "last.ckpt"
    trainer.save_checkpoint(path)
    saved = torch.load(path, weights_only=False)
    assert saved["global_step"] == STEPS
    assert all(t.device.type == "cpu" for t in saved["state_dict"].values())

    restored = Regressor.load_from_checkpoint(path, map_location="tpu")
    for (name, a), b in zip(model.state_dict().items(), restored.state_dict().values()):
        assert b.device.type == "tpu" and torch.equal(a.cpu(), b.cpu()), name

    # Resuming continues from the saved step with the saved optimizer state, on tpu.
    resumed_trainer, resumed = fit("tpu", tmp_path, ckpt_path=str(path), steps=STEPS + 2)
    assert resumed_trainer.global_step == STEPS + 2 and len(resumed.losses) == 2
    # The same checkpoint resumed on CPU is the oracle.
    _, on_cpu = fit("cpu", tmp_path, ckpt_path=str(path), steps=STEPS + 2)
    assert len(on_cpu.losses) == 2
    for a, b in zip(resumed.losses, on_cpu.losses):
        assert a.device.type == "tpu" and abs(a.item() - b.item()) < 1e-5


def test_devices_must_exist(tmp_path):
    with pytest.raises(ValueError, match="asks for 5 tpu devices"):
        L.Trainer(accelerator="tpu", devices=5, logger=False)


def test_unknown_lightning_version_fails_loudly(monkeypatch):
    from lightning.pytorch.trainer.connectors import accelerator_connector

    from torchtpu.integrations import UnsupportedVersionError
    from torchtpu.integrations import lightning as adapter

    monkeypatch.setattr(L, "__version__", "3.0.0")
    with pytest.raises(UnsupportedVersionError, match=r"lightning >=2\.1,<2\.7 .*found lightning 3\.0\.0"):
        adapter.install(accelerator_connector)


def test_standalone_pytorch_lightning_gets_the_same_adapter():
    # pytorch_lightning is the same code as lightning.pytorch under another name.
    import pytorch_lightning
    from pytorch_lightning.trainer.connectors.accelerator_connector import _AcceleratorConnector

    assert _AcceleratorConnector._choose_auto_accelerator() == "tpu"
    accelerator = pytorch_lightning.accelerators.AcceleratorRegistry.get("tpu")
    assert type(accelerator).__name__ == "TPUAccelerator" and accelerator.auto_device_count() >= 1
