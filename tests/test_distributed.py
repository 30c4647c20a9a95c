"""torch.distributed on tpu: each test launches `torchrun --nproc_per_node=2` on a worker
script (tests/dist/worker_*.py) on the CPU platform and checks what every rank reported.

A launch pays process start-up, imports and compiles, so each worker batches many checks."""
import json
import os
import signal
import socket
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKERS = os.path.join(REPO, "tests", "dist")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(tmp_path, worker, *args, nproc=2, timeout=300, env=None, torchrun_args=()):
    """Runs the worker under torchrun; returns (completed process, per-rank reports)."""
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    full_env = dict(os.environ)
    full_env["PYTHONPATH"] = REPO + os.pathsep + full_env.get("PYTHONPATH", "")
    full_env["TORCHTPU_PLATFORM"] = "cpu"
    full_env.update(env or {})
    command = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}",
               *(torchrun_args or ["--master_addr=127.0.0.1", f"--master_port={free_port()}"]),
               os.path.join(WORKERS, worker), str(out), *map(str, args)]
    result = run_killable(command, full_env, timeout)
    reports = {}
    for name in os.listdir(out):
        if name.startswith("rank") and name.endswith(".json"):
            reports[int(name[4:-5])] = json.loads((out / name).read_text())
    return result, reports


def spawn(tmp_path, worker, *args, nproc=2, timeout=120, env=None):
    """Starts the ranks as plain processes with torchrun's environment but no torchrun
    agent (which would end every rank as soon as one fails): what each rank itself reports."""
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    port = free_port()
    processes = []
    for rank in range(nproc):
        rank_env = dict(os.environ)
        rank_env.update(PYTHONPATH=REPO + os.pathsep + rank_env.get("PYTHONPATH", ""), TORCHTPU_PLATFORM="cpu",
                        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(nproc),
                        LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(nproc))
        rank_env.update(env or {})
        command = [sys.executable, os.path.join(WORKERS, worker), str(out), *map(str, args)]
        processes.append(subprocess.Popen(command, env=rank_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                          text=True, start_new_session=True))
    logs = []
    for process in processes:
        try:
            logs.append(process.communicate(timeout=timeout)[0])
        except subprocess.TimeoutExpired:
            for p in processes:
                os.killpg(p.pid, signal.SIGKILL)
            raise AssertionError(f"rank processes did not finish within {timeout} s")
    reports = {int(n[4:-5]): json.loads((out / n).read_text()) for n in os.listdir(out) if n.startswith("rank")}
    return logs, reports


def run_killable(command, env, timeout):
    # jax catches SIGTERM (preemption notices): a hung run is ended with SIGKILL, whole group.
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True)
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        stdout, stderr = process.communicate()
        raise AssertionError(f"torchrun did not finish within {timeout} s\n{stdout[-3000:]}\n{stderr[-6000:]}")
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


def assert_all_passed(result, reports, nproc=2):
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-8000:]
    assert sorted(reports) == list(range(nproc)), f"reports from ranks {sorted(reports)}\n{result.stderr[-5000:]}"
    for rank, report in reports.items():
        assert report["checks"] > 0
        assert not report["failures"], f"rank {rank}:\n" + "\n".join(report["failures"])


def test_collectives_exact(tmp_path):
    result, reports = launch(tmp_path, "worker_collectives.py")
    assert_all_passed(result, reports)
    # One process per device: rank r drives tpu:r of the node's two.
    assert [reports[r]["device"] for r in (0, 1)] == ["tpu:0", "tpu:1"]
    assert reports[0]["device_count"] == 2
    # Ranks that issue different collectives get an error naming each rank's call.
    shape, dtype = reports[0]["values"]["shape"], reports[0]["values"]["dtype"]
    assert "does not match across ranks" in shape, shape
    assert "rank 0 issued all_reduce of a float32 tensor of shape [4]" in shape, shape
    assert "rank 1 issued all_reduce of a float32 tensor of shape [5]" in shape, shape
    assert "rank 1 issued all_reduce of a int64 tensor of shape [4]" in dtype, dtype


def test_ddp_matches_single_process_training(tmp_path):
    result, reports = launch(tmp_path, "worker_ddp.py")
    assert_all_passed(result, reports)
    for rank, report in reports.items():
        for mode in ("fused", "compiled"):
            # Steps 3-5 (DDP rebuilds its buckets after step 1): the whole step - forward,
            # backward with the bucket all-reduces, AdamW - is one executable, and nothing
            # comes back to the host. What goes to the device is the batch plus AdamW's few
            # scalar tensors (48 bytes here), never gradients (3.5 KB).
            for step in report["steps"][mode][2:]:
                assert step["execute_count"] == 1, (rank, mode, step)
                assert step["bytes_to_host"] == 0, (rank, mode, step)
                assert step["bytes_to_device"] - step["input_bytes"] <= 64, (rank, mode, step)


def test_two_nodes(tmp_path):
    # Two torchrun agents on this host stand for two hosts of one process each.
    out = tmp_path / "out"
    out.mkdir()
    port = free_port()
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""), TORCHTPU_PLATFORM="cpu")
    agents = [subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc_per_node=1", f"--node_rank={node}",
         "--master_addr=127.0.0.1", f"--master_port={port}", os.path.join(WORKERS, "worker_collectives.py"),
         str(out), "quick"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True) for node in (0, 1)]
    logs = []
    for agent in agents:
        try:
            logs.append(agent.communicate(timeout=300)[0])
        except subprocess.TimeoutExpired:
            for a in agents:
                os.killpg(a.pid, signal.SIGKILL)
            raise
    assert all(a.returncode == 0 for a in agents), "\n".join(log[-3000:] for log in logs)
    reports = {int(n[4:-5]): json.loads((out / n).read_text()) for n in os.listdir(out)}
    assert sorted(reports) == [0, 1]
    for rank, report in reports.items():
        assert not report["failures"] and report["checks"] > 20, report["failures"]
        # One device per host: each process drives tpu:0 of its node.
        assert report["device"] == "tpu:0" and report["device_count"] == 1 and report["local_rank"] == 0


# The failure cases use a process-group timeout of 8 s (tests/dist/worker_failures.py).
FAILURE_TIMEOUT_S = 8


@pytest.mark.parametrize("scenario", ["dies", "stuck"])
def test_failed_rank_is_named(tmp_path, scenario):
    logs, reports = spawn(tmp_path, "worker_failures.py", scenario)
    error = reports[0]["values"]["error"]
    assert "Rank(s) 1 did not reach these collectives" in error, error
    assert "collectives #2..2 over ranks 0, 1" in error, error
    # A dead peer breaks the connection at once; a stuck one is given the group's timeout,
    # then the ranks compare notes for a few seconds.
    assert reports[0]["values"]["seconds"] < FAILURE_TIMEOUT_S + 12, reports[0]["values"]


def test_rank_absent_at_init_is_named(tmp_path):
    result, reports = launch(tmp_path, "worker_failures.py", "absent_at_init", timeout=120)
    error = reports[0]["values"]["error"]
    assert "rank(s) 1 did not reach init_process_group() within 8 s" in error, error
    assert reports[0]["values"]["seconds"] < FAILURE_TIMEOUT_S + 15, reports[0]["values"]


def test_unreachable_coordinator_says_what_to_check(tmp_path):
    logs, reports = spawn(tmp_path, "worker_failures.py", "unreachable",
                          env={"STORE_PORT": str(free_port()), "MASTER_ADDR": "203.0.113.1"})
    error = reports[1]["values"]["error"]
    assert "could not join the distributed job" in error and "MASTER_ADDR" in error and "firewall" in error, error
    assert "203.0.113.1" in error, error
    assert reports[1]["values"]["seconds"] < FAILURE_TIMEOUT_S + 15, reports[1]["values"]


def test_fsdp2_dtensor_tensor_parallel_checkpoints(tmp_path):
    # The checkpoint round trip 1 -> 2 -> 1 processes: this process saves a model, the two
    # ranks load it into an FSDP2 model (tests/dist/worker_sharded.py), train another and
    # save it sharded; this process loads that into a plain tpu model.
    import torch
    import torch.distributed.checkpoint as dcp

    sys.path.insert(0, WORKERS)
    try:
        from worker_sharded import make_model
    finally:
        sys.path.remove(WORKERS)
    out = tmp_path / "out"
    out.mkdir()
    dcp.save({"model": make_model(seed=5).to("tpu").state_dict()}, checkpoint_id=out / "single")
    result, reports = launch(tmp_path, "worker_sharded.py")
    assert_all_passed(result, reports)
    assert reports[0]["checks"] >= 40, reports[0]["checks"]
    assert {"strict FSDP2 memory", "fused FSDP2 memory"} <= set(reports[0]["values"]), reports[0]["values"]
    model = make_model(seed=7).to("tpu")
    state = {"model": model.state_dict()}
    dcp.load(state, checkpoint_id=out / "checkpoint")
    model.load_state_dict(state["model"])
    expected = torch.load(out / "expected.pt")
    for name, value in model.state_dict().items():
        assert value.device.type == "tpu"
        # The same float32 values the ranks held, bit for bit.
        assert torch.equal(value.cpu(), expected[name]), name
    # Every tpu collective's Work left c10d's registry (DTensor never waits on its outputs).
    assert "unwaited collective calls" not in result.stderr, result.stderr[-3000:]


def test_readme_example(tmp_path):
    # README.md's "Distributed" example, as written there, under torchrun with 2 processes.
    readme = open(os.path.join(REPO, "README.md")).read()
    start = readme.index("```python\n# train.py: torchrun") + len("```python\n")
    script = tmp_path / "train.py"
    script.write_text(readme[start:readme.index("```", start)])
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""), TORCHTPU_PLATFORM="cpu")
    result = run_killable([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
                           "--master_addr=127.0.0.1", f"--master_port={free_port()}", str(script)], env, 300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    assert "mean loss after 5 steps: " in result.stdout, result.stdout[-3000:]
