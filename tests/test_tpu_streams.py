"""torch.tpu's stream API (ordered no-ops that really wait) and in-place storage freeing,
the device features FSDP2 uses; checked against CPU values."""
from __future__ import annotations

import gc

import pytest
import torch

import torchtpu_eager  # noqa: F401
from torchtpu_eager.storage_ops import resize_storage_bytes_, storage_bytes


def test_streams_and_events_order_and_wait():
    x = torch.arange(6.0).to("tpu")
    side = torch.tpu.Stream(priority=-1)
    assert isinstance(side, torch.Stream) and isinstance(torch.tpu.Event(), torch.Event)
    with torch.tpu.stream(side):
        assert torch.tpu.current_stream() is side
        y = x * 2
    assert torch.tpu.current_stream() is torch.tpu.default_stream()
    torch.tpu.current_stream().wait_stream(side)
    event = side.record_event()
    torch.tpu.current_stream().wait_event(event)
    event.synchronize()
    assert event.query() and side.query()
    y.record_stream(side)                      # nothing to do, and no host fallback
    assert torch.equal(y.cpu(), torch.arange(6.0) * 2)
    start, end = torch.tpu.Event(enable_timing=True), torch.tpu.Event(enable_timing=True)
    start.record()
    (y @ y).cpu()
    end.record()
    assert start.elapsed_time(end) >= 0
    with pytest.raises(ValueError, match="enable_timing"):  # torch.Event's own check
        torch.tpu.Event().elapsed_time(end)
    from torch.distributed.device_mesh import _get_device_handle
    assert _get_device_handle("tpu").Stream is torch.tpu.Stream


def test_device_agnostic_events_record_wait_and_time():
    # torch.Event(device="tpu") (device-agnostic code: transformers' generation and continuous
    # batching) raised "Backend doesn't support synchronizing events" at synchronize() and
    # "Backend doesn't support elapsedTime" at elapsed_time(); CUDA's events do both.
    x = torch.arange(6.0).to("tpu")
    start, end = torch.Event(device="tpu", enable_timing=True), torch.Event(device="tpu",
                                                                             enable_timing=True)
    plain = torch.Event(device="tpu")
    assert plain.query()                       # never recorded: nothing to wait for
    start.record()
    y = x @ x
    plain.record()
    end.record()
    plain.synchronize()
    assert plain.query() and end.query()
    assert start.elapsed_time(end) >= 0 and end.elapsed_time(start) <= 0
    assert isinstance(plain, torch.tpu.Event) and not isinstance(torch.Event(device="cpu"),
                                                                  torch.tpu.Event)
    stream = torch.Stream(device="tpu")
    stream.wait_event(plain)
    assert float(y) == float(torch.arange(6.0) @ torch.arange(6.0))
    with pytest.raises(ValueError, match="recorded"):
        torch.Event(device="tpu", enable_timing=True).elapsed_time(end)


def test_device_agnostic_synchronize_waits_and_raises_what_the_device_found():
    # torch.accelerator.synchronize() (PyTorch's device-agnostic API, what code written for any
    # accelerator calls) raised "Backend doesn't support synchronizing all streams on device";
    # CUDA's waits. It must wait as torch.tpu.synchronize() does, raising an error the device
    # found after the op was issued (an index out of range) as eager raises it.
    assert torch.accelerator.current_accelerator().type == "tpu"
    y = torch.arange(4.0).to("tpu") * 3
    torch.accelerator.synchronize()
    stream = torch.accelerator.current_stream()
    stream.synchronize()
    assert stream.query()
    assert torch.equal(y.cpu(), torch.arange(4.0) * 3)
    with pytest.raises(IndexError) as on_cpu:
        torch.zeros(3)[torch.tensor([5])]
    with pytest.raises(IndexError) as on_tpu:
        torch.zeros(3, device="tpu")[torch.tensor([5], device="tpu")]
        torch.accelerator.synchronize()
    assert str(on_cpu.value) in str(on_tpu.value)
    del on_tpu   # its traceback holds tpu tensors, which later tests' memory counts would see


def test_a_stream_reports_its_priority_as_cudas_does():
    # printing a torch.tpu.Stream raised AttributeError: torch.Stream keeps no priority
    side = torch.tpu.Stream(priority=-1)
    assert side.priority == -1 and "priority=-1" in repr(side)
    assert torch.tpu.Stream().priority == 0


def test_storage_free_and_realloc_keeps_views():
    gc.collect()   # an earlier test's garbage freed now, not while this one counts bytes
    base = torch.arange(8.0).to("tpu")
    view = base.view(2, 4)[1]
    before = torch.tpu.memory_allocated()
    resize_storage_bytes_(base, 0)
    assert storage_bytes(view) == 0
    assert torch.tpu.memory_allocated() == before - 32
    with pytest.raises(RuntimeError, match="freed"):
        view.cpu()
    with pytest.raises(RuntimeError, match="0 \\(freed\\) or back to 32"):
        resize_storage_bytes_(base, 16)
    resize_storage_bytes_(base, 32)
    base.view(2, 4).copy_(torch.ones(2, 4))    # the same view objects see the new data
    view.mul_(3)
    assert torch.tpu.memory_allocated() == before   # a buffer again once written
    assert torch.equal(base.cpu(), torch.tensor([1.0] * 4 + [3.0] * 4))


def test_fsdp2_moves_a_cpu_built_model_to_the_tpu_mesh_in_place():
    # fully_shard(model, mesh=tpu_mesh) on a model built on the CPU (as PyTorch's FSDP2
    # tutorial does) moves its states with `param.data = param.to(device)`, which a tpu tensor
    # refused ("incompatible tensor type"); the mover now swaps them in, keeping each object.
    from torch.distributed.fsdp._fully_shard import _fsdp_init
    from torchtpu_eager.storage_ops import install_fsdp_hooks
    install_fsdp_hooks()
    model = torch.nn.BatchNorm1d(3)
    weight, mean, frozen = model.weight, model.running_mean, torch.nn.Parameter(
        torch.arange(3.0), requires_grad=False)
    want = [weight.detach().clone(), mean.clone(), frozen.detach().clone()]
    _fsdp_init._move_states_to_device([weight, frozen], [mean], torch.device("tpu", 0))
    assert model.weight is weight and model.running_mean is mean
    assert isinstance(weight, torch.nn.Parameter) and weight.requires_grad
    assert isinstance(frozen, torch.nn.Parameter) and not frozen.requires_grad
    for tensor, value in zip([weight, mean, frozen], want):
        assert tensor.device.type == "tpu"
        assert torch.equal(tensor.cpu(), value)
