"""Character-level GPT trained on Python's own standard library, on a torchtpu device.

    python examples/demo.py                 # train on the "tpu" device
    python examples/demo.py --device cpu    # same script, plain PyTorch on the CPU

The training text is the source of a few standard-library modules, read from
this Python installation at run time. The vocabulary is the 256 byte values.
The model is the GPT of bench/models.py. The script

  1. trains for --steps steps (400: under 3 minutes on a 2-core CPU), printing a progress line every --log-every steps,
  2. samples ~200 characters from the trained model (top-k, fixed seed),
  3. times --baseline-steps training steps in PyTorch eager on the CPU and
     prints a throughput comparison (with --device cpu the training run above
     already is that measurement, so it is reused rather than repeated),
  4. writes examples/loss_curve.png if matplotlib is installed.

Only the device string differs between the devices: the model, optimiser
and training loop are ordinary PyTorch.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "bench"))

from models import GPT, GPTConfig, count_params, make_optimizer, train_step  # noqa: E402

# Standard-library modules whose source makes up the training text.
STDLIB_FILES = [
    "argparse.py", "dataclasses.py", "functools.py", "inspect.py", "os.py",
    "textwrap.py", "collections/__init__.py", "json/encoder.py", "json/decoder.py",
]


def load_text() -> tuple[bytes, list[str]]:
    """Concatenated source of STDLIB_FILES, as bytes, and the files actually used."""
    stdlib = os.path.dirname(os.__file__)
    chunks, used = [], []
    for rel in STDLIB_FILES:
        path = os.path.join(stdlib, rel)
        if os.path.isfile(path):
            with open(path, "rb") as f:
                chunks.append(f.read())
            used.append(rel)
    if not chunks:
        raise SystemExit(f"no standard-library sources found under {stdlib}")
    return b"\n\n".join(chunks), used


def get_batch(data: torch.Tensor, batch: int, seq: int, gen: torch.Generator):
    """Random windows of ``seq + 1`` bytes -> (inputs, next-byte targets), int64 on CPU."""
    starts = torch.randint(0, len(data) - seq - 1, (batch,), generator=gen)
    windows = torch.stack([data[s: s + seq + 1] for s in starts.tolist()])
    return windows[:, :-1], windows[:, 1:]


def train(model, opt, data, args, device, label):
    """Train for args.steps steps; returns (per-step losses, steady-state tokens/s).

    Throughput is the median over logging intervals, leaving out the first
    (which includes compilation / warm-up), so brief stalls from other
    processes on the machine do not dominate it.
    """
    gen = torch.Generator().manual_seed(args.seed)
    tokens_per_step = args.batch * model.cfg.block_size
    losses, pending = [], []
    interval_start = time.perf_counter()
    rates = []
    bar_width = 24
    model.train()
    for step in range(1, args.steps + 1):
        x, y = get_batch(data, args.batch, model.cfg.block_size, gen)
        pending.append(train_step(model, opt, (x.to(device), y.to(device))))
        if step % args.log_every == 0 or step == args.steps:
            # One host transfer per interval; this is also the synchronisation point.
            losses.extend(torch.stack(pending).cpu().tolist())
            n_steps = len(pending)
            pending = []
            now = time.perf_counter()
            tok_s = n_steps * tokens_per_step / (now - interval_start)
            if step > args.log_every:  # the first interval includes compilation / warm-up
                rates.append(tok_s)
            interval_start = now
            if label:
                filled = bar_width * step // args.steps
                bar = "#" * filled + "." * (bar_width - filled)
                # On a terminal the line is redrawn in place and kept every 10 updates.
                keep = not sys.stdout.isatty() or step == args.steps or \
                    step % (10 * args.log_every) == 0
                print(f"{label} step {step:4d}/{args.steps} [{bar}] loss {losses[-1]:.3f}"
                      f"  {tok_s:8.0f} tok/s", end="\n" if keep else "\r", flush=True)
    throughput = statistics.median(rates) if rates else float("nan")
    return losses, throughput


@torch.no_grad()
def sample(model, prompt: bytes, n_chars: int, device, top_k: int, temperature: float,
           seed: int) -> bytes:
    """Extend ``prompt`` by ``n_chars`` bytes.

    The model always sees a full window of block_size bytes, so every forward
    pass has the same shape (one compiled program on a compiling backend).
    Sampling happens on the CPU from the last position's logits.
    """
    model.eval()
    T = model.cfg.block_size
    assert len(prompt) >= T, "prompt must be at least block_size bytes"
    context = list(prompt[-T:])
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n_chars):
        idx = torch.tensor([context], dtype=torch.long, device=device)
        logits, _ = model(idx)
        last = logits[0, -1].float().cpu() / temperature
        values, indices = torch.topk(last, top_k)
        choice = torch.multinomial(torch.softmax(values, dim=-1), 1, generator=gen)
        byte = int(indices[choice])
        out.append(byte)
        context = context[1:] + [byte]
    model.train()
    return bytes(out)


def save_loss_curve(losses, path, title):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: skipping the loss-curve plot")
        return
    window = 20
    smooth = [sum(losses[max(0, i - window + 1): i + 1]) / len(losses[max(0, i - window + 1): i + 1])
              for i in range(len(losses))]
    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=100)
    ax.plot(range(1, len(losses) + 1), losses, alpha=0.35, label="loss per step")
    ax.plot(range(1, len(losses) + 1), smooth, label=f"mean of last {window}")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats/byte)")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    print(f"wrote {os.path.relpath(path)}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="tpu", help='torch device to train on (default "tpu")')
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--baseline-steps", type=int, default=100,
                    help="steps timed for the PyTorch eager CPU comparison (at most --steps)")
    ap.add_argument("--layers", type=int, default=3)
    ap.add_argument("--width", type=int, default=128)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--context", type=int, default=64)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--log-every", type=int, default=10)
    ap.add_argument("--sample-chars", type=int, default=200)
    ap.add_argument("--seed", type=int, default=1337)
    ap.add_argument("--no-baseline", action="store_true", help="skip the PyTorch eager CPU timing")
    ap.add_argument("--plot", default=os.path.join(REPO, "examples", "loss_curve.png"))
    args = ap.parse_args(argv)

    t_start = time.perf_counter()
    if args.device == "cpu":
        try:  # optional: also works without torchtpu built
            import torchtpu  # noqa: F401
        except ImportError:
            torchtpu = None
    else:
        import torchtpu
        print(f"torchtpu platform: {torchtpu.platform()}")
    device = torch.device(args.device)

    text, used = load_text()
    data = torch.frombuffer(bytearray(text), dtype=torch.uint8).long()
    split = int(0.95 * len(data))
    train_data, held_out = data[:split], text[split:]
    print(f"text: {len(text):,} bytes of Python source ({', '.join(used)})")

    cfg = GPTConfig.small(n_layer=args.layers, n_head=args.heads, n_embd=args.width,
                          block_size=args.context)
    torch.manual_seed(args.seed)
    init_state = {k: v.clone() for k, v in GPT(cfg).state_dict().items()}

    model = GPT(cfg)
    model.load_state_dict(init_state)
    model.to(device)
    model.tie_weights()  # keep the LM head / embedding tie explicit (torchtpu re-ties after .to())
    opt = make_optimizer(model, lr=args.lr)
    print(f"model: GPT {cfg.n_layer} layers, width {cfg.n_embd}, context {cfg.block_size}, "
          f"{count_params(model) / 1e6:.2f}M params; batch {args.batch}, {args.steps} steps "
          f"on {device}")

    label = "tpu (fused)" if device.type == "tpu" else f"{device.type} (eager)"
    losses, dev_tok_s = train(model, opt, train_data, args, device, label=device.type)

    prompt = held_out[: cfg.block_size]
    generated = sample(model, prompt, args.sample_chars, device, top_k=8, temperature=0.8,
                       seed=args.seed)
    print("\n--- prompt (last line) " + "-" * 40)
    print(prompt.decode("utf-8", "replace").splitlines()[-1] if prompt.strip() else "")
    print("--- sample " + "-" * 52)
    print(generated.decode("utf-8", "replace"))
    print("-" * 63)

    if device.type == "cpu":
        cpu_tok_s = dev_tok_s
        note = " (the training run above; not repeated)"
    elif args.no_baseline:
        cpu_tok_s, note = float("nan"), " (skipped)"
    else:
        base_args = argparse.Namespace(**{**vars(args), "steps": min(args.steps, args.baseline_steps)})
        print(f"timing {base_args.steps} steps of PyTorch eager on the CPU ...", flush=True)
        cpu_model = GPT(cfg)
        cpu_model.load_state_dict(init_state)
        cpu_opt = make_optimizer(cpu_model, lr=args.lr)
        _, cpu_tok_s = train(cpu_model, cpu_opt, train_data, base_args, torch.device("cpu"), label=None)
        note = ""
    print(f"{label}: {dev_tok_s:,.0f} tok/s, PyTorch eager cpu: {cpu_tok_s:,.0f} tok/s{note}"
          f" -> {dev_tok_s / cpu_tok_s:.2f}x")

    save_loss_curve(losses, args.plot, f"char-level GPT on stdlib source, {label}")
    print(f"final loss {losses[-1]:.3f}; total time {time.perf_counter() - t_start:.1f} s")


if __name__ == "__main__":
    main()
