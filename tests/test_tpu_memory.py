"""``torch.tpu``'s memory API: figures are the bytes of live PJRT buffers.

The reference is PJRT's own list of the client's live buffers (``live_arrays``), which the
figures are not computed from: they are counted where the runtime makes buffers.
"""
import gc

import torch

import torchtpu_eager  # noqa: F401  (registers the device; autoload does too)
from torchtpu_compile.runtime.client import get_client


def _live_buffer_bytes() -> int:
    # By address: jaxlib can wrap one buffer in several arrays (unsafe_buffer_pointer does).
    device = get_client().device
    return sum({a.unsafe_buffer_pointer(): a.nbytes for a in get_client().pjrt.live_arrays()
                if device in a.sharding.device_set}.values())


def _delta_matches(work):
    """Run ``work``; the change of memory_allocated() equals that of the live buffers' bytes."""
    gc.collect()
    torch.tpu.synchronize()
    allocated, live = torch.tpu.memory_allocated(), _live_buffer_bytes()
    kept = work()
    gc.collect()
    torch.tpu.synchronize()
    assert torch.tpu.memory_allocated() - allocated == _live_buffer_bytes() - live
    return kept, torch.tpu.memory_allocated() - allocated


def test_allocated_follows_live_buffers_of_tensors():
    def make():
        x = torch.randn(64, 32, device="tpu")
        y = (x * 2).to(torch.bfloat16)            # a program's output
        i = torch.arange(10, device="tpu")        # int64: 80 bytes
        v = x[1:5].t()                            # a view: no buffer of its own
        return [x, y, i, v]
    kept, grown = _delta_matches(make)
    assert grown == 64 * 32 * 4 + 64 * 32 * 2 + 80
    _, shrunk = _delta_matches(kept.clear)
    assert shrunk == -grown


def test_resident_weights_of_a_compiled_model_count(fresh_dynamo):
    model = torch.nn.Linear(128, 64)
    compiled = torch.compile(model, backend="torchtpu")
    kept, grown = _delta_matches(lambda: compiled(torch.randn(4, 128)))
    assert kept.device.type == "cpu"
    assert grown >= (128 * 64 + 64) * 4         # the weights stay on the device


def test_peaks_and_reset():
    gc.collect()   # no garbage of earlier tests freed halfway through
    torch.tpu.synchronize()
    torch.tpu.reset_peak_memory_stats()
    base = torch.tpu.memory_allocated()
    assert torch.tpu.max_memory_allocated() == base
    big = torch.ones(256, 1024, device="tpu")
    del big
    gc.collect()
    assert torch.tpu.memory_allocated() == base
    assert torch.tpu.max_memory_allocated() >= base + 256 * 1024 * 4
    assert torch.tpu.max_memory_reserved() >= torch.tpu.max_memory_allocated()
    torch.tpu.reset_peak_memory_stats()
    assert torch.tpu.max_memory_allocated() == base


def test_ops_with_numbers_allocate_only_their_results():
    # An int argument or a view's offset is uploaded once and kept for reuse (scalars.py);
    # it was counted as allocated, so memory_allocated() grew by 8 bytes around `x.mul_(5)` or
    # a write through `x[1]` where CUDA's does not (kernel arguments are not allocations),
    # and two tests of the figures passed or failed by which test had used the number first.
    x = torch.arange(8.0).reshape(2, 4).to("tpu")
    gc.collect()
    before = torch.tpu.memory_allocated()
    x.mul_(7919)
    x[1].add_(104729)
    torch.ones(3, 5, device="tpu").fill_(15485863)   # a result, then freed
    gc.collect()
    assert torch.tpu.memory_allocated() == before
    want = torch.arange(8.0).reshape(2, 4).mul_(7919)
    want[1].add_(104729)
    assert torch.equal(x.cpu(), want)


def test_stats_summary_and_device_info_agree():
    x = torch.ones(1000, device="tpu")
    stats = torch.tpu.memory_stats()
    assert list(stats) == sorted(stats)
    assert stats["allocated_bytes.all.current"] == torch.tpu.memory_allocated()
    assert stats["reserved_bytes.all.current"] == torch.tpu.memory_reserved() \
        >= torch.tpu.memory_allocated()
    assert stats["allocated_bytes.all.allocated"] - stats["allocated_bytes.all.freed"] \
        == stats["allocated_bytes.all.current"]
    summary = torch.tpu.memory_summary()
    assert "Allocated memory" in summary and "Reserved memory" in summary
    torch.tpu.empty_cache()
    free, total = torch.tpu.mem_get_info()
    assert 0 < free <= total == torch.tpu.get_device_properties().total_memory
    assert torch.tpu.memory_allocated(0) == torch.tpu.memory_allocated("tpu:0")
    del x


def test_device_agnostic_memory_api_reads_the_devices_figures():
    # torch.accelerator.memory_allocated() and the rest of PyTorch's device-agnostic memory
    # API failed with "INTERNAL ASSERT FAILED ... Allocator for PrivateUse1 is not a
    # DeviceAllocator"; on CUDA they read the caching allocator's figures.
    accelerator = torch.accelerator
    x = torch.arange(4096.0).to("tpu") * 2
    gc.collect()
    assert accelerator.memory_allocated() == torch.tpu.memory_allocated() >= x.nbytes
    assert accelerator.max_memory_allocated() == torch.tpu.max_memory_allocated()
    assert accelerator.memory_reserved() == torch.tpu.memory_reserved()
    stats = accelerator.memory_stats()
    ours = torch.tpu.memory_stats()
    for key in ("allocated_bytes.all.current", "allocated_bytes.all.peak",
                "allocation.all.current", "reserved_bytes.all.current"):
        assert stats[key] == ours[key], key
    assert accelerator.get_memory_info()[1] == torch.tpu.mem_get_info()[1] > 0
    accelerator.reset_peak_memory_stats()
    assert accelerator.max_memory_allocated() == accelerator.memory_allocated()
    accelerator.reset_accumulated_memory_stats()
    assert accelerator.memory_stats()["allocated_bytes.all.allocated"] == 0
    y = x + 1
    assert torch.tpu.memory_stats()["allocated_bytes.all.allocated"] == y.nbytes
    accelerator.empty_cache()
    assert float(y[5]) == 11.0
