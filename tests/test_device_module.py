"""torch.tpu as code written for torch.cuda uses it: streams, events, memory, device facts,
and what DDP / FSDP2 ask of a device module (through torch.get_device_module and
torch.accelerator)."""
import pytest
import torch

import torchtpu

PUBLIC = {
    "Event", "Stream", "StreamContext", "current_device", "current_stream", "default_stream", "device",
    "device_count", "empty_cache", "get_amp_supported_dtype", "get_device_name", "get_device_properties",
    "get_rng_state", "get_rng_state_all", "initial_seed", "is_available", "is_bf16_supported",
    "is_initialized", "manual_seed", "manual_seed_all", "max_memory_allocated", "max_memory_reserved",
    "mem_get_info", "memory_allocated", "memory_reserved", "memory_stats", "reset_max_memory_allocated",
    "reset_peak_memory_stats", "seed", "seed_all", "set_device", "set_per_process_memory_fraction",
    "set_rng_state", "set_rng_state_all", "set_stream", "stream", "synchronize",
}


def test_public_names_are_exactly_the_documented_ones():
    public = {name for name in dir(torch.tpu) if not name.startswith("_")}
    assert public == PUBLIC
    assert set(torch.tpu.__all__) == PUBLIC
    assert torch.get_device_module("tpu") is torch.tpu


def test_memory_numbers_follow_live_tensors(mode):
    torch.tpu.synchronize()
    torch.tpu.reset_peak_memory_stats()
    before = torch.tpu.memory_allocated()
    x = torch.ones(1024, 256, device="tpu")
    x.cpu()  # materialized in every mode
    assert torch.tpu.memory_allocated() - before == 1024 * 256 * 4
    assert torch.tpu.memory_reserved() >= torch.tpu.memory_allocated()
    stats = torch.tpu.memory_stats()
    assert stats["allocated_bytes.all.current"] == torch.tpu.memory_allocated()
    assert stats["allocated_bytes.all.peak"] >= stats["allocated_bytes.all.current"]
    assert stats["reserved_bytes.all.peak"] >= stats["reserved_bytes.all.current"]
    del x
    torch.tpu.empty_cache()
    assert torch.tpu.memory_allocated() == before
    assert torch.tpu.max_memory_allocated() >= before + 1024 * 256 * 4
    torch.tpu.reset_peak_memory_stats()
    assert torch.tpu.max_memory_allocated() == torch.tpu.memory_allocated()


def test_accelerator_memory_api_reads_the_same_numbers(mode):
    torch.tpu.synchronize()
    x = torch.ones(512, 128, device="tpu")
    x.cpu()
    assert torch.accelerator.memory_allocated() == torch.tpu.memory_allocated() >= 512 * 128 * 4
    assert torch.accelerator.memory_reserved() == torch.tpu.memory_reserved()
    assert torch.accelerator.max_memory_allocated() == torch.tpu.max_memory_allocated()
    stats = torch.accelerator.memory_stats()
    assert stats["allocated_bytes.all.current"] == torch.tpu.memory_stats()["allocated_bytes.all.current"]
    free, total = torch.accelerator.get_memory_info()
    assert 0 < free <= total
    del x
    torch.accelerator.empty_cache()
    torch.accelerator.reset_peak_memory_stats()
    assert torch.accelerator.max_memory_allocated() == torch.tpu.memory_allocated()


def test_device_facts():
    free, total = torch.tpu.mem_get_info()
    assert 0 < free <= total
    name = torch.tpu.get_device_name()
    assert isinstance(name, str) and name
    props = torch.tpu.get_device_properties(0)
    assert props.name == name and props.total_memory == total and props.platform == torchtpu.platform()
    assert torch.tpu.get_device_name("tpu:0") == name
    assert torch.tpu.is_bf16_supported()
    with pytest.raises(AssertionError, match="Invalid device id"):
        torch.tpu.get_device_properties(torch.tpu.device_count())


def test_streams_are_current_in_their_context():
    default = torch.tpu.default_stream()
    assert torch.tpu.current_stream() == default == torch.accelerator.current_stream()
    side = torch.tpu.Stream(priority=-1)
    assert side != default and isinstance(side, torch.Stream) and side.device == torch.device("tpu:0")
    with torch.tpu.stream(side):
        assert torch.tpu.current_stream() == side
        with side:  # re-entering the current stream, as torch.cuda.Stream allows
            assert torch.tpu.current_stream() == side
        assert torch.tpu.current_stream() == side
    assert torch.tpu.current_stream() == default
    torch.tpu.set_stream(side)
    assert torch.tpu.current_stream() == side
    torch.tpu.set_stream(default)
    with torch.tpu.stream(None):
        assert torch.tpu.current_stream() == default


def test_torch_stream_event_and_accelerator_agree_with_torch_tpu(mode):
    plain = torch.Stream(device="tpu")  # PyTorch's own class, served by the device guard
    assert plain.device == torch.device("tpu:0") and plain != torch.tpu.default_stream()
    side = torch.tpu.Stream()
    assert side.stream_id not in (0, plain.stream_id)
    with torch.tpu.stream(side):
        assert torch.accelerator.current_stream() == side
        x = torch.arange(4.0, device="tpu") * 3
    assert torch.accelerator.current_stream() == torch.tpu.default_stream()
    with plain:  # torch.Stream's own context manager
        assert torch.tpu.current_stream() == plain
    start, end = torch.Event(device="tpu", enable_timing=True), torch.Event(device="tpu", enable_timing=True)
    start.record()
    y = (x @ x).sqrt()
    end.record()
    end.synchronize()
    assert end.query() and start.elapsed_time(end) >= 0
    assert torchtpu._C.pending_ops() == 0  # a timing event's record waited for the work before it
    plain.synchronize()
    assert plain.query()
    assert y.item() == pytest.approx((126.0) ** 0.5)


def test_current_stream_is_per_thread():
    import threading

    side = torch.tpu.Stream()
    seen = []
    with torch.tpu.stream(side):
        worker = threading.Thread(target=lambda: seen.append(torch.accelerator.current_stream()))
        worker.start()
        worker.join()
        assert torch.accelerator.current_stream() == side
    assert seen == [torch.tpu.default_stream()]


def test_work_on_side_streams_is_ordered_like_one_queue(mode):
    # The FSDP2 pattern: produce on a side stream, record, wait on the compute stream.
    compute = torch.tpu.current_stream()
    side = torch.tpu.Stream()
    x = torch.arange(6.0, device="tpu")
    side.wait_stream(compute)
    with torch.tpu.stream(side):
        y = x * 2
        done = side.record_event()
    compute.wait_event(done)
    torch.accelerator.current_stream().wait_event(done)  # FSDP2 mixes both forms
    assert torch.equal((y + 1).cpu(), torch.arange(6.0) * 2 + 1)
    assert done.query() and side.query()


def test_event_synchronize_waits_and_times(mode):
    start, end = torch.tpu.Event(enable_timing=True), torch.tpu.Event(enable_timing=True)
    x = torch.randn(128, 128, device="tpu", generator=None)
    start.record()
    for _ in range(10):
        x = torch.tanh(x @ x)
    end.record()
    end.synchronize()
    assert torchtpu._C.pending_ops() == 0  # the recorded work ran
    assert end.elapsed_time(start) <= 0 <= start.elapsed_time(end)
    plain = torch.tpu.Event()
    with pytest.raises(RuntimeError, match="enable_timing=True"):
        plain.elapsed_time(end)
    with pytest.raises(RuntimeError, match="must be recorded"):
        torch.tpu.Event(enable_timing=True).elapsed_time(end)
    plain.record(torch.tpu.current_stream())
    plain.wait()
    plain.synchronize()
    assert plain.query()


@pytest.mark.modes("fused")
def test_recording_an_event_does_not_split_the_fused_graph(mode):
    x = torch.ones(8, device="tpu")
    y = x + 1
    torch.tpu.Event().record()
    assert torchtpu._C.pending_ops() > 0  # still pending: one graph for the step
    assert torch.equal((y * 2).cpu(), torch.full((8,), 4.0))


def test_what_ddp_and_fsdp2_ask_of_the_device_module():
    handle = torch.get_device_module("tpu")
    high = handle.Stream(priority=-1)
    low = handle.Stream()
    assert torch.accelerator.current_accelerator().type == "tpu"
    with handle.stream(high):
        event = high.record_event()
    handle.current_stream().wait_event(event)
    low.wait_stream(high)
    event2 = handle.Event()
    event2.record()
    event2.synchronize()
    torch.accelerator.current_stream().wait_stream(high)
    assert handle.current_device() == torch.accelerator.current_device_index()
    # DDP's side-stream input copy records the stream on the moved tensor.
    moved = torch.ones(3).to("tpu")
    moved.record_stream(torch.accelerator.current_stream())
    assert torch.equal(moved.cpu(), torch.ones(3))
