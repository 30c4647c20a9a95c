"""Export: torchtpu.export lowers a torch.export graph with torchtpu's rules into a StableHLO
module and its weights, which JAX runs (directly and after jax.export serialization) to the
model's outputs; torch.onnx.export takes a model trained on tpu as it is."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import torchtpu

# The module runs on XLA's CPU kernels, the oracle on PyTorch's: float32 sums in another
# order. Measured differences are below 2e-6 for these models; 1e-5 leaves a margin.
TOL = dict(rtol=1e-5, atol=1e-5)


def seeded(seed):
    return torch.Generator().manual_seed(seed)


class Block(torch.nn.Module):
    """A GPT-style transformer block: pre-norm causal self-attention and an MLP."""

    def __init__(self, width=32, heads=4):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = torch.nn.LayerNorm(width), torch.nn.LayerNorm(width)
        self.qkv, self.proj = torch.nn.Linear(width, 3 * width), torch.nn.Linear(width, width)
        self.fc1, self.fc2 = torch.nn.Linear(width, 4 * width), torch.nn.Linear(4 * width, width)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, c)
        x = x + self.proj(y)
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


def mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))


def cnn():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(8, 16, 3), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
        torch.nn.Linear(16, 10))


def test_mlp_module_and_weights_run_through_jax():
    model = mlp().eval()
    x = torch.randn(8, 16, generator=seeded(1))
    torchtpu.sync()  # work an earlier test left pending must not count as the export's
    executed = torchtpu.metrics.counters()["execute_count"]
    exported = torchtpu.export(model, (x,))
    assert torchtpu.metrics.counters()["execute_count"] == executed  # lowered, never run on tpu
    assert next(model.parameters()).device.type == "cpu"  # the user's model stays where it was
    assert exported.weight_names == ["0.weight", "0.bias", "2.weight", "2.bias"]
    for w, (name, p) in zip(exported.weights, model.named_parameters()):
        assert torch.equal(w, p.detach())
    assert "func.func public @main(%arg0: tensor<32x16xf32>" in exported.text
    assert "tensor<8x16xf32>) -> (tensor<8x4xf32>)" in exported.text  # weights first, then the input
    torch.testing.assert_close(exported.run(x), model(x).detach(), **TOL)


def test_jax_serving_round_trip_of_the_serialized_module():
    import jax

    model = mlp().eval()
    x = torch.randn(8, 16, generator=seeded(2))
    exported = torchtpu.export(model, (x,))
    blob = exported.jax().serialize()  # what a serving process stores, beside the weights
    served = jax.export.deserialize(blob)
    weights = [w.numpy() for w in exported.weights]
    (y,) = jax.jit(served.call)(*weights, x.numpy())
    torch.testing.assert_close(torch.from_numpy(np.array(y)), model(x).detach(), **TOL)


def test_transformer_block_with_a_dynamic_batch():
    model = Block().eval()
    x = torch.randn(2, 8, 32, generator=seeded(3))
    batch = torch.export.Dim("batch", min=1, max=64)
    exported = torchtpu.export(model, (x,), dynamic_shapes={"x": {0: batch}})
    torch.testing.assert_close(exported.run(x), model(x).detach(), **TOL)
    x5 = torch.randn(5, 8, 32, generator=seeded(4))  # another batch: a module of its own
    torch.testing.assert_close(exported.run(x5), model(x5).detach(), **TOL)
    assert "tensor<5x8x32xf32>" in exported.stablehlo(x5) and "tensor<5x8x32xf32>" not in exported.text


def test_a_size_the_export_fixed_is_refused():
    model = mlp().eval()
    exported = torchtpu.export(model, (torch.randn(8, 16, generator=seeded(5)),))
    with pytest.raises(ValueError, match="input 0 has size 3 in dimension 0, but the model was exported with 8"):
        exported.run(torch.randn(3, 16, generator=seeded(6)))


def test_cnn_with_batch_norm_in_eval_mode():
    model = cnn().eval()
    with torch.no_grad():  # running statistics that are not the identity
        model[1].running_mean.uniform_(-0.5, 0.5, generator=seeded(7))
        model[1].running_var.uniform_(0.5, 2.0, generator=seeded(8))
    x = torch.randn(2, 3, 12, 12, generator=seeded(9))
    exported = torchtpu.export(model, (x,))
    assert "stablehlo.convolution" in exported.text
    torch.testing.assert_close(exported.run(x), model(x).detach(), **TOL)


def test_a_model_that_updates_its_state_is_refused_with_what_to_do():
    with pytest.raises(ValueError, match=r"model\.eval\(\)"):
        torchtpu.export(cnn().train(), (torch.randn(2, 3, 12, 12, generator=seeded(10)),))


def test_random_ops_are_refused_with_what_to_do():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Dropout(0.5)).train()
    with pytest.raises(ValueError, match=r"draws random numbers.*model\.eval\(\)"):
        torchtpu.export(model, (torch.randn(2, 4, generator=seeded(18)),))


def test_structured_inputs_and_outputs():
    class Pair(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.Linear(4, 3), torch.nn.Linear(5, 3)

        def forward(self, inputs, scale=1.0):
            return {"sum": self.a(inputs["x"]) + self.b(inputs["y"]) * scale, "x": inputs["x"]}

    torch.manual_seed(0)
    model = Pair().eval()
    inputs = {"x": torch.randn(2, 4, generator=seeded(11)), "y": torch.randn(2, 5, generator=seeded(12))}
    exported = torchtpu.export(model, (inputs,), {"scale": 2.0})
    out = exported.run(inputs, scale=2.0)
    expected = model(inputs, scale=2.0)
    assert sorted(out) == ["sum", "x"]
    torch.testing.assert_close(out["sum"], expected["sum"].detach(), **TOL)
    torch.testing.assert_close(out["x"], inputs["x"])  # an input returned as is


@torch.library.custom_op("torchtpu_test::cube_only_on_cpu", mutates_args=(), device_types="cpu")
def cube_only_on_cpu(x: torch.Tensor) -> torch.Tensor:
    return x * x * x


@cube_only_on_cpu.register_fake
def _(x):
    return torch.empty_like(x)


def test_an_op_without_a_lowering_is_named():
    class Cube(torch.nn.Module):
        def forward(self, x):
            return cube_only_on_cpu(x) + 1

    with pytest.raises(ValueError, match="torchtpu_test::cube_only_on_cpu ran on CPU"):
        torchtpu.export(Cube(), (torch.randn(3, generator=seeded(13)),))


def train_on_tpu(model, x, y, steps=3):
    model = model.to("tpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for _ in range(steps):
        opt.zero_grad()
        F.cross_entropy(model(x.to("tpu")), y.to("tpu")).backward()
        opt.step()
    return model.eval()


def test_a_model_trained_on_tpu_exports_where_it_is():
    x, y = torch.randn(6, 16, generator=seeded(14)), torch.randint(0, 4, (6,), generator=seeded(15))
    model = train_on_tpu(mlp(), x, y)
    exported = torchtpu.export(model, (x,))
    for w, p in zip(exported.weights, model.parameters()):
        assert torch.equal(w, p.detach().cpu())  # the trained weights
    torch.testing.assert_close(exported.run(x), model(x.to("tpu")).detach().cpu(), **TOL)


def test_onnx_export_of_a_model_trained_on_tpu(tmp_path):
    import onnxruntime as ort

    x, y = torch.randn(4, 3, 12, 12, generator=seeded(16)), torch.randint(0, 10, (4,), generator=seeded(17))
    model = train_on_tpu(cnn(), x, y)
    path = str(tmp_path / "cnn.onnx")
    torch.onnx.export(model, (x.to("tpu"),), path, dynamo=True)
    assert next(model.parameters()).device.type == "tpu"  # the model was not moved
    session = ort.InferenceSession(path)
    (out,) = session.run(None, {session.get_inputs()[0].name: x.numpy()})
    expected = model(x.to("tpu")).detach().cpu()
    torch.testing.assert_close(torch.from_numpy(out), expected, **TOL)
