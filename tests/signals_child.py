"""The process tests/test_signals.py interrupts: phases that each print READY <phase> and
then run work the parent interrupts with SIGINT, catch KeyboardInterrupt as a user's
checkpoint handler would, and print what they saw: HANDLED <phase> <where> when the
handler ran (where: "inside" when the interrupted call had started, "before" when the
signal came before it), then OK <phase> <error> after checking that tpu work computes
correctly afterwards. Run as: python signals_child.py PHASE [PHASE ...]; phases:
compile (a fused graph that compiles for seconds), train-strict, train-fused (a training
loop), torch-compile (torch.compile(backend="tpu") compiling), startup (import torchtpu
and its first op; the process ends in the handler).
"""
import os
import signal
import sys
import time

# Python installs its KeyboardInterrupt handler only where SIGINT is not ignored at start, and
# a shell ignores SIGINT in the commands it starts in the background (`make test &` in a
# script): the handler is set here so the test checks torchtpu, not how the suite was started.
signal.signal(signal.SIGINT, signal.default_int_handler)

_T0 = time.monotonic()


def ready(phase):
    print(f"READY {phase}", flush=True)


def where_interrupted(error):
    """ "inside" when KeyboardInterrupt came out of the interrupted call (raised in code it
    called, or on its line once C++ returned), "elsewhere" when it hit other Python code."""
    import traceback

    frames = traceback.extract_tb(error.__traceback__)
    last = frames[-1]
    if last.filename != __file__ or "# interrupted call" in (last.line or ""):
        return "inside"
    return "elsewhere"


def handled(phase, error):
    if os.environ.get("SIGNALS_CHILD_TRACEBACK"):
        import traceback

        traceback.print_exception(error)
    print(f"HANDLED {phase} {where_interrupted(error)} {time.monotonic() - _T0:.1f}s", flush=True)


def ok(phase, error):
    print(f"OK {phase} {error:.3g}", flush=True)


def chain(y, n):
    """A chain of n distinct slices: one fused graph of ~4n ops that XLA compiles slowly."""
    import torch

    for i in range(n):
        y = torch.sin(y) * 1.0001 + torch.cos(y[:, (i % 31):(i % 31) + 1])
    return y.sum()


def phase_compile(torch, torchtpu):
    torchtpu.set_mode("fused")
    torch.manual_seed(0)
    x = torch.randn(32, 32)
    for attempt in range(3):  # a signal that misses the compile (machine stalls) tries again
        total = chain(x.to("tpu"), 300 + attempt)  # recorded only; .item() lowers and compiles it
        try:
            ready("compile")
            value = total.item()  # interrupted call
            print("FINISHED compile (the signal came too late)", flush=True)
        except KeyboardInterrupt as error:
            handled("compile", error)
            if where_interrupted(error) == "inside":
                break
    value = total.item()  # the interrupted value is still pending and computes
    expected = chain(x.double(), 300 + attempt).item()
    ok("compile", abs(value - expected) / max(1.0, abs(expected)))


def phase_train(torch, torchtpu, mode):
    torchtpu.set_mode(mode)
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4)).to("tpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    data = torch.randn(8, 16), torch.randn(8, 4)

    def step(m, o, device):
        o.zero_grad()
        loss = torch.nn.functional.mse_loss(m(data[0].to(device)), data[1].to(device))
        loss.backward()
        o.step()
        return loss.item()

    for _ in range(2):  # interrupted twice: the loop goes on after the first handler
        steps = 0
        try:
            while True:  # a loop only Ctrl-C ends
                step(model, opt, "tpu")  # interrupted call
                steps += 1
                if steps == 3:
                    ready(f"train-{mode}")
        except KeyboardInterrupt as error:
            handled(f"train-{mode}", error)
    # The state the interrupt left (whatever step it stopped in) takes one more step on tpu
    # and, copied, on CPU: both must agree.
    cpu_model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
    cpu_model.load_state_dict({k: v.cpu() for k, v in model.state_dict().items()})
    cpu_opt = torch.optim.SGD(cpu_model.parameters(), lr=0.05)
    tpu_loss, cpu_loss = step(model, opt, "tpu"), step(cpu_model, cpu_opt, "cpu")
    error = max(abs(a.cpu() - b).max().item() for a, b in zip(model.parameters(), cpu_model.parameters()))
    ok(f"train-{mode}", max(error, abs(tpu_loss - cpu_loss)))


def phase_torch_compile(torch, torchtpu):
    torchtpu.set_mode("fused")
    torch.manual_seed(2)
    x = torch.randn(32, 32)
    xt = x.to("tpu")
    torchtpu.sync(wait=True)
    for attempt in range(3):  # as in phase_compile: a signal that misses is tried again

        def fn(y):
            return chain(y, 60 + attempt)

        compiled_fn = torch.compile(fn, backend="tpu")
        try:
            ready("torch-compile")
            compiled_fn(xt).item()  # interrupted call
            print("FINISHED torch-compile (the signal came too late)", flush=True)
        except KeyboardInterrupt as error:
            handled("torch-compile", error)
            if where_interrupted(error) == "inside":
                break
    value = compiled_fn(xt).item()  # compiles again or replays: the right answer either way
    expected = fn(x.double()).item()
    ok("torch-compile", abs(value - expected) / max(1.0, abs(expected)))


def wait_for_signal_in_startup():
    """An audit hook that, the first time Python does anything (opens a file, imports)
    inside jax's get_backend called by torchtpu's C++ start-up (the runtime starter creating
    the jax client at the first tpu use), prints READY and waits there for the parent's SIGINT: the KeyboardInterrupt
    starts deep in start-up, under the C++ that used to swallow it, every time."""
    state = {"busy": False, "fired": False}

    def hook(event, args):
        if state["fired"] or state["busy"] or event in ("sys._getframe", "object.__getattr__"):
            return
        state["busy"] = True
        try:
            frame, names = sys._getframe(0), set()
            while frame is not None:
                names.add(frame.f_code.co_name)
                frame = frame.f_back
        finally:
            state["busy"] = False
        # The jax client starts at the first tpu use (torchtpu's runtime starts lazily, so that
        # torch.distributed can join the job first): get_backend, anywhere in the phase.
        if "get_backend" in names and "phase_startup" in names:
            state["fired"] = True
            ready("startup")
            while True:
                time.sleep(0.01)

    sys.addaudithook(hook)


def phase_startup():
    """import torch (autoloading torchtpu) or import torchtpu, then tpu work: Ctrl-C during
    the jax client's creation reaches the handler; nothing swallows it and goes on."""
    try:
        if os.environ.get("TORCH_DEVICE_BACKEND_AUTOLOAD") == "0":
            import torch

            wait_for_signal_in_startup()
            import torchtpu  # noqa: F401  # interrupted call
        else:
            wait_for_signal_in_startup()
            import torch  # interrupted call (torch's backend autoload imports torchtpu)
        torch.ones(3, device="tpu").add(1).sum().item()  # interrupted call (the runtime starts here)
        print("FINISHED startup (start-up went on after Ctrl-C)", flush=True)
    except KeyboardInterrupt as error:
        import traceback

        files = [f.filename for f in traceback.extract_tb(error.__traceback__)]
        modules = {"torchtpu" if "/torchtpu/" in f else f.split("site-packages/")[1].split("/")[0]
                   for f in files if "/torchtpu/" in f or "site-packages/" in f}
        handled("startup", error)
        print("MODULES", " ".join(sorted(modules)), flush=True)
        sys.exit(0)


def main(phases):
    if phases == ["startup"]:  # TORCH_DEVICE_BACKEND_AUTOLOAD=0 when the test sets it: import torchtpu
        return phase_startup()
    import torch
    import torchtpu

    for phase in phases:
        if phase == "compile":
            phase_compile(torch, torchtpu)
        elif phase.startswith("train-"):
            phase_train(torch, torchtpu, phase[len("train-"):])
        elif phase == "torch-compile":
            phase_torch_compile(torch, torchtpu)
        else:
            raise SystemExit(f"unknown phase {phase}")
    print("EXIT", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
