"""Bad cases: the ranks that fail are named, within the process group's timeout.

    worker_failures.py OUT SCENARIO
      absent_at_init   rank 1 never calls init_process_group()
      dies             rank 1 exits after the first all_reduce
      stuck            rank 1 skips the second all_reduce and sleeps
      unreachable      MASTER_ADDR (the coordinator's host) leads nowhere

Rank 0 records the error it got and how long it took; the idle ranks wait for rank 0's
report (or their own timeout) and leave."""
import datetime
import os
import sys
import time

import torch
import torch.distributed as dist

import torchtpu

sys.path.insert(0, os.path.dirname(__file__))
from common import Report, write  # noqa: E402

TIMEOUT = datetime.timedelta(seconds=8)


def wait_for_report(limit=90):
    done = os.path.join(sys.argv[1], "rank0.json")
    deadline = time.time() + limit
    while not os.path.exists(done) and time.time() < deadline:
        time.sleep(0.2)


def record(report, rank, start, error):
    report.count += 1
    report.values["error"] = f"{type(error).__name__}: {error}"
    report.values["seconds"] = time.time() - start
    write(report, rank)


def main():
    scenario = sys.argv[2]
    rank = int(os.environ["RANK"])
    report = Report()
    start = time.time()
    if scenario == "unreachable":
        # The store is reachable but MASTER_ADDR, where rank 0 serves jax's coordinator, is
        # not (an address reserved for documentation, routed nowhere).
        try:
            dist.init_process_group(init_method=f"tcp://127.0.0.1:{os.environ['STORE_PORT']}", rank=rank,
                                    world_size=2, timeout=TIMEOUT)
            report.failures.append("init_process_group succeeded")
            write(report, rank)
        except RuntimeError as error:
            record(report, rank, start, error)
        os._exit(0)
    if scenario == "absent_at_init" and rank == 1:
        wait_for_report()
        return
    try:
        dist.init_process_group(timeout=TIMEOUT)
        x = torch.ones(4, device="tpu")
        dist.all_reduce(x)
        x.cpu()
        if rank == 1 and scenario == "dies":
            os._exit(3)
        if rank == 1 and scenario == "stuck":
            wait_for_report()
            os._exit(0)
        start = time.time()
        dist.all_reduce(x)
        x.cpu()
        report.failures.append(f"rank {rank}: the second all_reduce succeeded")
        write(report, rank)
    except RuntimeError as error:
        record(report, rank, start, error)
    os._exit(0)  # leave without jax's shutdown barrier (a peer is gone)


if __name__ == "__main__":
    main()
