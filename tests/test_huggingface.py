"""Hugging Face on tpu, as a user runs it: transformers' Trainer and accelerate's Accelerator
put the model, batches and optimizer state on tpu with no code change; per-step losses equal
a CPU run; save_model / from_pretrained round trip through safetensors. Models come from
tiny configs (no hub), data is made here."""
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

transformers = pytest.importorskip("transformers")
accelerate = pytest.importorskip("accelerate")

from accelerate.state import AcceleratorState  # noqa: E402

# Dropout off: CPU and tpu draw different random streams, so with dropout the losses could
# not be compared step by step. 3 steps cover the first step (optimizer state created) and
# the steady ones.
STEPS = 3
LOSS_TOLERANCE = 2e-3  # the bar; measured differences are below 2e-5 (float32 on XLA vs ATen)


class TokenData(torch.utils.data.Dataset):
    """Seeded token ids; labels are the ids (causal LM) or a class from their sum."""

    def __init__(self, vocab, length, classify=False, size=16):
        self.vocab, self.length, self.classify, self.size = vocab, length, classify, size

    def __len__(self):
        return self.size

    def __getitem__(self, i):
        ids = torch.randint(0, self.vocab, (self.length,), generator=torch.Generator().manual_seed(i))
        label = ids.sum() % 2 if self.classify else ids
        return {"input_ids": ids, "labels": label}


def gpt2():
    config = transformers.GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=1, n_head=2,
                                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    return transformers.GPT2LMHeadModel(config), TokenData(64, 16)


def bert():
    config = transformers.BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=64, max_position_embeddings=16, num_labels=2,
                                     hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    return transformers.BertForSequenceClassification(config), TokenData(64, 16, classify=True)


_runs = {}


def trained(make, tmp_path_factory, use_cpu):
    """Each (model, device) Trainer run once per session; tests share it."""
    key = (make.__name__, use_cpu)
    if key not in _runs:
        _runs[key] = run_trainer(make, tmp_path_factory.mktemp(f"{make.__name__}-{use_cpu}"), use_cpu)
    return _runs[key]


def run_trainer(make, tmp_path, use_cpu):
    AcceleratorState._reset_state(reset_partial_state=True)
    torch.manual_seed(0)
    model, data = make()
    model.batch_devices = set()
    model.register_forward_pre_hook(
        lambda module, args, kwargs: module.batch_devices.add(kwargs.get("input_ids", *args[:1]).device.type),
        with_kwargs=True)
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / ("cpu" if use_cpu else "tpu")), per_device_train_batch_size=4,
        max_steps=STEPS, logging_steps=1, learning_rate=1e-3, report_to=[], save_strategy="no",
        use_cpu=use_cpu, disable_tqdm=True, seed=0)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=data)
    trainer.train()
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    return trainer, losses


@pytest.mark.parametrize("make", [gpt2, bert], ids=["gpt2", "bert"])
def test_trainer_runs_on_tpu_like_cpu(make, tmp_path_factory):
    cpu_trainer, cpu_losses = trained(make, tmp_path_factory, use_cpu=True)
    tpu_trainer, tpu_losses = trained(make, tmp_path_factory, use_cpu=False)

    assert cpu_trainer.args.device.type == "cpu"
    assert all(p.device.type == "cpu" for p in cpu_trainer.model.parameters())
    assert cpu_trainer.model.batch_devices == {"cpu"} and tpu_trainer.model.batch_devices == {"tpu"}
    assert tpu_trainer.args.device == torch.device("tpu:0")
    assert tpu_trainer.accelerator.device == torch.device("tpu:0")
    assert all(p.device.type == "tpu" for p in tpu_trainer.model.parameters())
    state = [t for s in tpu_trainer.optimizer.state.values() for t in s.values() if isinstance(t, torch.Tensor)]
    assert state and all(t.device.type == "tpu" for t in state if t.dim() > 0)

    assert len(tpu_losses) == len(cpu_losses) == STEPS
    for step, (tpu, cpu) in enumerate(zip(tpu_losses, cpu_losses)):
        print(f"step {step}: tpu {tpu} cpu {cpu} diff {abs(tpu - cpu):.2e}")
        assert abs(tpu - cpu) <= LOSS_TOLERANCE, f"step {step}: tpu {tpu} vs cpu {cpu}"


def test_save_model_and_from_pretrained_round_trip(tmp_path, tmp_path_factory):
    trainer, _ = trained(gpt2, tmp_path_factory, use_cpu=False)
    trainer.save_model(str(tmp_path / "saved"))
    assert (tmp_path / "saved" / "model.safetensors").exists()

    weights = {k: v.detach().cpu() for k, v in trainer.model.state_dict().items()}
    loaded = transformers.GPT2LMHeadModel.from_pretrained(str(tmp_path / "saved"))
    for name, tensor in loaded.state_dict().items():
        assert torch.equal(tensor, weights[name]), name
    assert loaded.lm_head.weight is loaded.transformer.wte.weight  # still tied

    ids = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(1))
    on_tpu = loaded.to("tpu")(ids.to("tpu")).logits
    torch.testing.assert_close(on_tpu.cpu(), trainer.model(ids.to("tpu")).logits.cpu(), rtol=0, atol=0)


def test_accelerator_places_model_batches_and_optimizer_state_on_tpu():
    # The optimizer is built on the CPU parameters before prepare() moves the model, the way
    # accelerate is used: the parameters must stay the same objects when they move.
    AcceleratorState._reset_state(reset_partial_state=True)
    accelerator = accelerate.Accelerator()
    assert accelerator.device == torch.device("tpu:0")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    reference = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    reference.load_state_dict(model.state_dict())
    data = torch.utils.data.TensorDataset(torch.randn(16, 8, generator=torch.Generator().manual_seed(2)),
                                          torch.arange(16) % 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    reference_optimizer = torch.optim.AdamW(reference.parameters(), lr=1e-2)
    model, optimizer, loader = accelerator.prepare(model, optimizer, torch.utils.data.DataLoader(data, batch_size=8))

    assert all(p.device.type == "tpu" for p in model.parameters())
    for x, y in loader:
        assert x.device.type == "tpu" and y.device.type == "tpu"
        loss = torch.nn.functional.cross_entropy(model(x), y)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        expected = torch.nn.functional.cross_entropy(reference(x.cpu()), y.cpu())
        expected.backward()
        reference_optimizer.step()
        reference_optimizer.zero_grad()
        assert abs(loss.item() - expected.item()) < 1e-5
    state = optimizer.optimizer.state[next(iter(model.parameters()))]
    assert state["exp_avg"].device.type == "tpu"


def test_accelerator_cpu_keeps_cpu():
    AcceleratorState._reset_state(reset_partial_state=True)
    accelerator = accelerate.Accelerator(cpu=True)
    model = accelerator.prepare(torch.nn.Linear(4, 4))
    assert accelerator.device.type == "cpu" and model.weight.device.type == "cpu"
    AcceleratorState._reset_state(reset_partial_state=True)


def test_accelerator_bf16_autocasts_on_tpu():
    AcceleratorState._reset_state(reset_partial_state=True)
    accelerator = accelerate.Accelerator(mixed_precision="bf16")
    inner = []
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
    model[0].register_forward_hook(lambda module, args, out: inner.append(out.dtype))
    model = accelerator.prepare(model)
    out = model(torch.randn(2, 4, device="tpu"))
    assert inner == [torch.bfloat16]  # the Linear ran inside accelerate's torch.autocast("tpu")
    assert out.device.type == "tpu" and out.dtype == torch.float32  # accelerate returns float32 outputs
    AcceleratorState._reset_state(reset_partial_state=True)


def test_unknown_accelerate_version_fails_loudly(monkeypatch):
    from torchtpu.integrations import UnsupportedVersionError
    from torchtpu.integrations import accelerate as adapter

    monkeypatch.setattr(accelerate, "__version__", "9.0.0")
    with pytest.raises(UnsupportedVersionError, match=r"accelerate >=1\.0,<1\.16 .*found accelerate 9\.0\.0.*TORCHTPU_INTEGRATIONS=off"):
        adapter.install(accelerate.state)


def test_adapter_applies_when_library_is_imported_later():
    # A fresh process: torch first (torchtpu loads), accelerate afterwards.
    import utils

    result = utils.run_python("""
        import torch, accelerate
        print(accelerate.Accelerator().device)
    """)
    assert result.returncode == 0 and result.stdout.strip().endswith("tpu:0"), result.stderr


def test_integrations_setting_turns_adapters_off():
    import utils

    result = utils.run_python("""
        import torch, accelerate
        print(accelerate.Accelerator().device, torch.tensor(1.0, device="tpu").device)
    """, TORCHTPU_INTEGRATIONS="off")
    assert result.returncode == 0 and result.stdout.split()[-2:] == ["cpu", "tpu:0"], result.stderr


def test_transformers_tpu_paths_run_on_torchtpu():
    # transformers keys is_torch_tpu_available() on the current accelerator (written for Google's
    # torch_tpu), so with torchtpu it is true and transformers takes its TPU paths: the Trainer's
    # device, the Dynamo backend "tpu" and the c10d backend it names "tpu_dist"
    # (distributed/utils.py), which starts torch.distributed itself; here on one rank.
    import socket

    import utils

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    result = utils.run_python("""
        import torch, torch.distributed as dist
        from transformers import TrainingArguments
        from transformers.distributed.utils import _ensure_torch_distributed, get_distributed_backend
        from transformers.utils.import_utils import is_torch_tpu_available

        assert is_torch_tpu_available()
        assert TrainingArguments(output_dir="unused", report_to=[]).device == torch.device("tpu:0")
        assert "tpu" in torch._dynamo.list_backends()
        print("BACKEND", get_distributed_backend("tpu"))
        _ensure_torch_distributed("tpu")
        x = torch.arange(4.0, device="tpu")
        dist.all_reduce(x)
        print("SUM", x.cpu().tolist(), dist.group.WORLD._get_backend(torch.device("tpu")).name())
        dist.destroy_process_group()
    """, RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "BACKEND tpu_dist" in result.stdout
    assert "SUM [0.0, 1.0, 2.0, 3.0] tpu" in result.stdout, result.stdout  # torchtpu's backend
