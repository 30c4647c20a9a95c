"""Fork safety: a child forked after torchtpu started raises CUDA's "Cannot re-initialize"
RuntimeError when it touches tpu (instead of hanging on a client without its threads), and
fork-based DataLoader workers that only touch CPU tensors keep working. Each case runs in a
fresh interpreter with a timeout, so a hang fails the test instead of stalling the suite."""
import utils

FORKED = "Cannot re-initialize torchtpu in forked subprocess. To use tpu with multiprocessing, you must use " \
         "the 'spawn' start method"


def test_a_forked_child_raises_on_tpu_use_and_the_parent_goes_on():
    # Every mode in one interpreter: a fresh one costs ~10 s on the CI machine.
    result = utils.run_python("""
        import multiprocessing as mp
        import torch, torchtpu
        def child(queue, x):
            out = [torch.tpu._is_in_bad_fork(), torch.tpu.device_count()]
            for use in (lambda: x + 1, lambda: x.cpu(), lambda: torch.ones(1, device="tpu"),
                        lambda: torch.zeros(2).to("tpu"), torch.tpu.synchronize):
                try:
                    use()
                    out.append("no error")
                except RuntimeError as e:
                    out.append(str(e))
            out.append((torch.ones(2) + 1).tolist())  # CPU work is unaffected
            del x  # dropping a tpu tensor in the child neither hangs nor crashes
            queue.put(out)

        ctx = mp.get_context("fork")
        for mode in ("debug", "strict", "fused"):
            torchtpu.set_mode(mode)
            x = torch.arange(4.0, device="tpu") * 2  # pending in fused mode when the child forks
            queue = ctx.Queue()
            process = ctx.Process(target=child, args=(queue, x))
            process.start()
            for line in queue.get(timeout=120):
                print(mode, "child:", line)
            process.join(120)
            print(mode, "exit:", process.exitcode, torch.tpu._is_in_bad_fork())
            print(mode, "parent:", (x + 1).cpu().tolist())
    """, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        f"{mode} {line}" for mode in ("debug", "strict", "fused") for line in (
            "child: True", "child: 1", *[f"child: {FORKED}"] * 5, "child: [2.0, 2.0]",
            "exit: 0 False", "parent: [1.0, 3.0, 5.0, 7.0]")]


def test_fork_dataloader_workers_that_stay_on_cpu_keep_working():
    result = utils.run_python("""
        import torch, torchtpu
        from torch.utils.data import DataLoader, TensorDataset
        torch.manual_seed(0)
        data = TensorDataset(torch.randn(16, 3), torch.arange(16))
        weight = torch.randn(3, 2)
        w = weight.to("tpu")  # the parent uses tpu before the workers fork
        loader = DataLoader(data, batch_size=4, num_workers=2, multiprocessing_context="fork")
        for epoch in range(2):  # a second epoch forks fresh workers
            got = torch.cat([(x.to("tpu") @ w).cpu() for x, _ in loader])
            torch.testing.assert_close(got, data.tensors[0] @ weight)
            seen = torch.cat([i for _, i in loader])
            assert seen.tolist() == list(range(16)), seen
        print("ok")
    """, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["ok"]
