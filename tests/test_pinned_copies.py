"""Pinned host memory and non-blocking copies from tpu into it, with CUDA's semantics: the copy
returns at once and the bytes land at the next synchronization with that point (an event
recorded after it, the stream, the device); into pageable memory the copy stays synchronous.
The CPU oracle is the same arithmetic on CPU tensors."""
import pytest
import torch

import torchtpu
from torchtpu import metrics


def source(mode_seed=0):
    g = torch.Generator().manual_seed(mode_seed)
    cpu = torch.randint(-50, 50, (3, 5), generator=g)
    return cpu, cpu.to("tpu")


def test_pinned_memory_is_pinned_and_keeps_its_contents():
    assert torch.zeros(4, pin_memory=True).is_pinned()
    host = torch.arange(6.0)
    pinned = host.pin_memory()
    assert pinned.is_pinned() and not host.is_pinned() and torch.equal(pinned, host)
    assert not pinned[2:].clone().is_pinned()  # a fresh CPU tensor is pageable


def test_a_non_blocking_copy_lands_at_the_event_recorded_after_it(mode):  # each eager mode (conftest)
    cpu, tpu = source()
    pinned = torch.empty(3, 5, dtype=torch.int64, pin_memory=True)
    before = metrics.counters()["downloads"]
    pinned.copy_(tpu * 3 + 1, non_blocking=True)
    # Issued, not read: the host did not wait for the device.
    assert metrics.counters()["downloads"] == before
    event = torch.Event(device="tpu")
    event.record()
    event.synchronize()
    assert metrics.counters()["downloads"] == before + 1
    assert torch.equal(pinned, cpu * 3 + 1)


def test_an_event_waits_only_for_the_copies_issued_before_it():
    cpu, tpu = source(1)
    with torchtpu.mode("fused"):
        first = torch.empty(3, 5, dtype=torch.int64, pin_memory=True)
        second = torch.empty(3, 5, dtype=torch.int64, pin_memory=True)
        first.copy_(tpu - 7, non_blocking=True)
        early = torch.Event(device="tpu")
        early.record()
        second.copy_(tpu * tpu, non_blocking=True)
        late = torch.Event(device="tpu")
        late.record()
        before = metrics.counters()["downloads"]
        early.synchronize()
        assert metrics.counters()["downloads"] == before + 1  # the first copy only
        assert torch.equal(first, cpu - 7)
        late.synchronize()
        assert torch.equal(second, cpu * cpu)


def test_device_and_stream_synchronize_land_every_copy():
    cpu, tpu = source(2)
    with torchtpu.mode("fused"):
        a = torch.empty(3, 5, dtype=torch.int64, pin_memory=True)
        b = torch.empty(3, 5, dtype=torch.int64, pin_memory=True)
        a.copy_(tpu + 2, non_blocking=True)
        torch.tpu.synchronize()
        assert torch.equal(a, cpu + 2)
        b.copy_(tpu.abs(), non_blocking=True)
        torch.tpu.current_stream().synchronize()
        assert torch.equal(b, cpu.abs())


def test_pageable_or_converting_copies_stay_synchronous():
    cpu, tpu = source(3)
    with torchtpu.mode("fused"):
        pageable = torch.empty(3, 5, dtype=torch.int64)
        pageable.copy_(tpu + 1, non_blocking=True)
        assert torch.equal(pageable, cpu + 1)  # no synchronization needed, as on CUDA
        converted = torch.empty(3, 5, dtype=torch.float32, pin_memory=True)
        converted.copy_(tpu + 1, non_blocking=True)
        assert torch.equal(converted, (cpu + 1).float())
        strided = torch.empty(5, 3, dtype=torch.int64, pin_memory=True).t()
        strided.copy_(tpu + 1, non_blocking=True)
        assert torch.equal(strided, cpu + 1)


def test_a_failed_check_of_the_copied_graph_raises_at_the_synchronization():
    cpu = torch.arange(4)
    with torchtpu.mode("fused"):
        out_of_range = cpu.to("tpu").take(torch.tensor([1, 9], device="tpu"))
        pinned = torch.empty(2, dtype=torch.int64, pin_memory=True)
        pinned.copy_(out_of_range, non_blocking=True)  # issued: nothing waited for yet
        event = torch.Event(device="tpu")
        event.record()
        with pytest.raises(IndexError, match="out of range"):
            event.synchronize()
        with pytest.raises(IndexError, match="out of range"):
            cpu.take(torch.tensor([1, 9]))  # CPU's own error, for the record
