"""Plain-PyTorch models used by the benchmarks and the demo.

Nothing in here knows about torchtpu: the models are ordinary ``nn.Module``s
that can be moved to any device. Both models return ``(logits, loss)`` from
``forward(x, targets=None)`` so that one ``train_step`` serves both.

Public API:
    GPTConfig, GPT                 GPT-style causal language model
    ResNetConfig, ResNet           ResNet-style image classifier
    ADAMW                          AdamW hyperparameters shared with bench/jax_lm.py
    uses_weight_decay(name, p)     parameter-group rule shared with bench/jax_lm.py
    make_optimizer(model, ...)     torch.optim.AdamW with the two parameter groups
    make_lm_batch(cfg, batch, seed)
    make_image_batch(cfg, batch, seed)
    train_step(model, opt, batch)  one optimisation step, returns the loss tensor
    count_params(model)
"""

from __future__ import annotations

import dataclasses
import math
import sys
from dataclasses import dataclass
from typing import Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F


# --------------------------------------------------------------------------
# GPT
# --------------------------------------------------------------------------


@dataclass
class GPTConfig:
    vocab_size: int = 256
    block_size: int = 128  # maximum sequence length
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 256
    dropout: float = 0.0
    bias: bool = True  # biases in Linear layers and LayerNorms

    @classmethod
    def small(cls, **overrides) -> "GPTConfig":
        """A few-million-parameter model that trains quickly on a laptop CPU."""
        base = dict(vocab_size=256, block_size=128, n_layer=4, n_head=4, n_embd=256)
        base.update(overrides)
        return cls(**base)

    @classmethod
    def gpt2_124m(cls, **overrides) -> "GPTConfig":
        """GPT-2 small; vocab padded from 50257 to 50304 (a multiple of 64)."""
        base = dict(vocab_size=50304, block_size=1024, n_layer=12, n_head=12, n_embd=768)
        base.update(overrides)
        return cls(**base)

    def replace(self, **changes) -> "GPTConfig":
        return dataclasses.replace(self, **changes)


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        assert cfg.n_embd % cfg.n_head == 0, "n_embd must be divisible by n_head"
        self.n_head = cfg.n_head
        self.dropout = cfg.dropout
        self.qkv = nn.Linear(cfg.n_embd, 3 * cfg.n_embd, bias=cfg.bias)
        self.proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.resid_drop = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        # (B, T, C) -> (B, n_head, T, head_dim)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        y = F.scaled_dot_product_attention(
            q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True
        )
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_drop(self.proj(y))


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd, bias=cfg.bias)
        self.proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.proj(F.gelu(self.fc(x))))


class Block(nn.Module):
    """Pre-LayerNorm transformer block."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.attn = CausalSelfAttention(cfg)
        self.ln2 = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        x = x + self.mlp(self.ln2(x))
        return x


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.pos_emb = nn.Embedding(cfg.block_size, cfg.n_embd)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList([Block(cfg) for _ in range(cfg.n_layer)])
        self.ln_f = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        self.lm_head.weight = self.tok_emb.weight  # weight tying

        self.apply(self._init_weights)
        # Residual projections get a smaller init, scaled by depth (GPT-2 paper).
        for name, p in self.named_parameters():
            if name.endswith("proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layer))

    def tie_weights(self) -> "GPT":
        """Re-ties the LM head to the token embedding; returns self.

        ``model.to("tpu")`` currently creates a separate Parameter per module (the tie is
        lost: 53 instead of 52 parameters, and the trajectory diverges from CPU). Calling
        this after moving the model restores it; it is a no-op when the tie is intact.
        """
        self.lm_head.weight = self.tok_emb.weight
        return self

    def run_blocks(self, x: torch.Tensor) -> torch.Tensor:
        """The transformer blocks in order; a benchmark may replace this per instance (the
        GPT of bench/run.py's section "scan" runs them as one loop, see set_blocks)."""
        for block in self.blocks:
            x = block(x)
        return x

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        B, T = idx.shape
        assert T <= self.cfg.block_size, f"sequence length {T} > block_size {self.cfg.block_size}"
        pos = torch.arange(T, device=idx.device)
        x = self.drop(self.tok_emb(idx) + self.pos_emb(pos))
        x = self.run_blocks(x)
        logits = self.lm_head(self.ln_f(x))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(B * T, -1), targets.reshape(B * T))
        return logits, loss


# --------------------------------------------------------------------------
# ResNet
# --------------------------------------------------------------------------


@dataclass
class ResNetConfig:
    block: str = "basic"  # "basic" (2 x 3x3 convs) or "bottleneck" (1x1, 3x3, 1x1)
    layers: Sequence[int] = (1, 1, 1)  # blocks per stage
    widths: Sequence[int] = (16, 32, 64)  # base channels per stage
    stem_width: int = 16
    stem_kernel: int = 3
    stem_stride: int = 1
    in_channels: int = 3
    image_size: int = 32
    num_classes: int = 10

    @classmethod
    def small(cls, **overrides) -> "ResNetConfig":
        """A tiny CIFAR-sized network (32x32 inputs, 10 classes)."""
        base = dict(block="basic", layers=(1, 1, 1), widths=(16, 32, 64), stem_width=16,
                    stem_kernel=3, stem_stride=1, image_size=32, num_classes=10)
        base.update(overrides)
        return cls(**base)

    @classmethod
    def resnet50(cls, **overrides) -> "ResNetConfig":
        """ResNet-50 for 224x224 ImageNet inputs."""
        base = dict(block="bottleneck", layers=(3, 4, 6, 3), widths=(64, 128, 256, 512),
                    stem_width=64, stem_kernel=7, stem_stride=2, image_size=224,
                    num_classes=1000)
        base.update(overrides)
        return cls(**base)

    def replace(self, **changes) -> "ResNetConfig":
        return dataclasses.replace(self, **changes)


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, in_ch: int, width: int, stride: int):
        super().__init__()
        out_ch = width * self.expansion
        self.conv1 = nn.Conv2d(in_ch, width, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, out_ch, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_ch)
        self.shortcut = _shortcut(in_ch, out_ch, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, in_ch: int, width: int, stride: int):
        super().__init__()
        out_ch = width * self.expansion
        self.conv1 = nn.Conv2d(in_ch, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, out_ch, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out_ch)
        self.shortcut = _shortcut(in_ch, out_ch, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = F.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return F.relu(out + self.shortcut(x))


def _shortcut(in_ch: int, out_ch: int, stride: int) -> nn.Module:
    if stride == 1 and in_ch == out_ch:
        return nn.Identity()
    return nn.Sequential(
        nn.Conv2d(in_ch, out_ch, 1, stride=stride, bias=False),
        nn.BatchNorm2d(out_ch),
    )


class ResNet(nn.Module):
    def __init__(self, cfg: ResNetConfig):
        super().__init__()
        assert len(cfg.layers) == len(cfg.widths)
        self.cfg = cfg
        block_cls = {"basic": BasicBlock, "bottleneck": Bottleneck}[cfg.block]

        self.stem = nn.Sequential(
            nn.Conv2d(cfg.in_channels, cfg.stem_width, cfg.stem_kernel,
                      stride=cfg.stem_stride, padding=cfg.stem_kernel // 2, bias=False),
            nn.BatchNorm2d(cfg.stem_width),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(kernel_size=3, stride=2, padding=1),
        )
        stages = []
        in_ch = cfg.stem_width
        for i, (n_blocks, width) in enumerate(zip(cfg.layers, cfg.widths)):
            blocks = []
            for j in range(n_blocks):
                stride = 2 if (i > 0 and j == 0) else 1
                blocks.append(block_cls(in_ch, width, stride))
                in_ch = width * block_cls.expansion
            stages.append(nn.Sequential(*blocks))
        self.stages = nn.Sequential(*stages)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(in_ch, cfg.num_classes)

        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)

    def forward(self, x: torch.Tensor, targets: torch.Tensor | None = None):
        x = self.stages(self.stem(x))
        logits = self.fc(torch.flatten(self.pool(x), 1))
        loss = None if targets is None else F.cross_entropy(logits, targets)
        return logits, loss


# --------------------------------------------------------------------------
# LSTM language model
# --------------------------------------------------------------------------


@dataclass
class LSTMConfig:
    # Small: a step is 2 layers x 32 fused cells forward and backward (~1,900 ops), which
    # fused mode compiles as one graph (XLA:CPU takes minutes for 64 steps).
    vocab_size: int = 256
    block_size: int = 32  # sequence length (make_lm_batch reads it)
    n_embd: int = 128
    n_hidden: int = 128
    n_layer: int = 2

    @classmethod
    def small(cls, **overrides) -> "LSTMConfig":
        return cls(**overrides)

    @classmethod
    def large(cls, **overrides) -> "LSTMConfig":
        base = dict(vocab_size=10000, block_size=128, n_embd=512, n_hidden=1024, n_layer=2)
        base.update(overrides)
        return cls(**base)


class LSTMLM(nn.Module):
    """Embedding, a stacked nn.LSTM (batch first), a linear head; a step per token inside ATen
    (on tpu: the fused LSTM cell per step and layer)."""

    def __init__(self, cfg: LSTMConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.lstm = nn.LSTM(cfg.n_embd, cfg.n_hidden, num_layers=cfg.n_layer, batch_first=True)
        self.head = nn.Linear(cfg.n_hidden, cfg.vocab_size)

    def forward(self, idx, targets=None):
        h, _ = self.lstm(self.embed(idx))
        logits = self.head(h)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
        return logits, loss


# --------------------------------------------------------------------------
# Optimiser, data and the training step
# --------------------------------------------------------------------------

# AdamW hyperparameters used everywhere (bench/jax_lm.py reads these too).
ADAMW = dict(lr=3e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)


def uses_weight_decay(name: str, param: torch.Tensor, stacked: bool = False) -> bool:
    """Matrices and embeddings are decayed; biases and norm scales are not. A stacked
    parameter (torchtpu.StackedLayers) has a leading depth dimension: a layer's is one less."""
    return param.ndim - int(stacked) >= 2


def _stacked_param_ids(model: nn.Module) -> set:
    """Ids of the parameters stored stacked (in a torchtpu.StackedLayers; none if torchtpu
    was never imported, as in the host-only variants)."""
    torchtpu = sys.modules.get("torchtpu")
    stacks = [m for m in model.modules() if torchtpu is not None and isinstance(m, torchtpu.StackedLayers)]
    return {id(p) for m in stacks for p in m.parameters()}


def make_optimizer(model: nn.Module, lr: float | None = None, betas=None, eps=None,
                   weight_decay: float | None = None, **kwargs) -> torch.optim.AdamW:
    """AdamW with two groups: decayed (ndim >= 2) and not decayed (ndim < 2).

    Arguments left as None take their value from ``ADAMW``; extra keyword
    arguments (e.g. ``foreach=False``) go to ``torch.optim.AdamW``.
    """
    hp = dict(ADAMW)
    for key, value in dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay).items():
        if value is not None:
            hp[key] = value
    decay, no_decay = [], []
    stacked = _stacked_param_ids(model)
    for name, p in model.named_parameters():  # tied weights appear once
        if p.requires_grad:
            (decay if uses_weight_decay(name, p, id(p) in stacked) else no_decay).append(p)
    groups = [
        {"params": decay, "weight_decay": hp["weight_decay"]},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=hp["lr"], betas=hp["betas"], eps=hp["eps"], **kwargs)


def make_lm_batch(cfg: GPTConfig, batch: int, seed: int, seq_len: int | None = None):
    """Random token ids (int64, CPU): ``(idx, targets)`` with targets = idx shifted by one."""
    T = cfg.block_size if seq_len is None else seq_len
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, cfg.vocab_size, (batch, T + 1), generator=g)
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


def make_image_batch(cfg: ResNetConfig, batch: int, seed: int):
    """Gaussian images (float32, NCHW, CPU) and int64 labels: ``(images, labels)``."""
    g = torch.Generator().manual_seed(seed)
    images = torch.randn(batch, cfg.in_channels, cfg.image_size, cfg.image_size, generator=g)
    labels = torch.randint(0, cfg.num_classes, (batch,), generator=g)
    return images, labels


def train_step(model: nn.Module, opt: torch.optim.Optimizer, batch) -> torch.Tensor:
    """zero_grad / forward / backward / step. Returns the (un-synced) loss tensor."""
    inputs, targets = batch
    opt.zero_grad(set_to_none=True)
    _, loss = model(inputs, targets)
    loss.backward()
    opt.step()
    return loss.detach()


def count_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())  # tied weights counted once
