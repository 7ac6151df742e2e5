"""Buffer donation: a compiled graph that overwrites tpu-device inputs reuses their buffers.

The reference is eager PyTorch on the CPU for values, and PJRT itself for memory: a donated
buffer is deleted and the program's result sits at its address. AdamW, whose trace takes
seconds, is in ``tests/slow/test_donation_adamw.py``.
"""
import copy
import gc

import torch

from torchtpu_compile import config
from tests.support.donation import backward, compiled_step, donation, models


def test_a_shared_buffer_is_not_donated_and_stays_correct(fresh_dynamo):
    cpu, tpu = models(layers=1)
    opt_cpu = torch.optim.SGD(cpu.parameters(), lr=0.5, momentum=0.9)
    opt_tpu = torch.optim.SGD(tpu.parameters(), lr=0.5, momentum=0.9)
    step = compiled_step(opt_tpu)
    weight, bias = tpu[0].weight, tpu[0].bias
    x = torch.randn(4, 32)
    with config.patch(matmul_precision="highest"):
        for _ in range(2):
            opt_cpu.zero_grad()
            opt_tpu.zero_grad()
            backward(cpu, x)
            backward(tpu, x.to("tpu"))
            # A clone shares the weight's buffer (buffers are immutable), a view its storage.
            before = weight.detach().clone()
            view = weight.detach().view(-1)
            expected_before = cpu[0].weight.detach().clone()
            where = bias._st.value.unsafe_buffer_pointer()
            opt_cpu.step()
            step()
            torch.testing.assert_close(before.cpu(), expected_before)       # still readable
            torch.testing.assert_close(view.cpu(), cpu[0].weight.detach().view(-1))
            for a, b in zip(cpu.parameters(), tpu.parameters()):
                torch.testing.assert_close(b.cpu(), a, rtol=1e-5, atol=1e-6)
            # The new bias sits in the old one's memory: its buffer was donated.
            assert bias._st.value.unsafe_buffer_pointer() == where
            del before, view
    # The weight was shared at each step; the bias at each step and, at the second (they
    # exist before it), both momentum buffers were donated.
    assert donation()["not_donated_shared"] == 2
    assert donation()["donated_inputs"] == 2 + 2


def test_batch_norm_running_stats_are_donated_in_a_training_forward(fresh_dynamo):
    torch.manual_seed(0)
    cpu = torch.nn.BatchNorm1d(16)
    tpu = copy.deepcopy(cpu).to("tpu")
    compiled = torch.compile(tpu, backend="torchtpu")
    for _ in range(2):
        x = torch.randn(8, 16)
        torch.testing.assert_close(compiled(x.to("tpu")).cpu(), cpu(x), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(tpu.running_mean.cpu(), cpu.running_mean)
    torch.testing.assert_close(tpu.running_var.cpu(), cpu.running_var)
    assert tpu.num_batches_tracked.item() == 2
    assert donation()["donated_inputs"] >= 2 * 2          # mean and var at each call


def test_host_tensors_are_never_donated(fresh_dynamo):
    model = torch.nn.Linear(8, 8)
    step = compiled_step(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
    for _ in range(2):
        model(torch.randn(2, 8)).sum().backward()
        step()
    assert donation()["donated_inputs"] == 0


def test_a_donated_step_peaks_below_an_undonated_one(fresh_dynamo):
    # One compiled step, run with every buffer held elsewhere too (nothing can be donated: the
    # program without aliasing runs), then with none held. The config-off comparison, which
    # compiles twice, is in tests/slow/test_donation_adamw.py.
    _, tpu = models(layers=1, width=128)
    optimizer = torch.optim.SGD(tpu.parameters(), lr=0.1, momentum=0.9)
    step = compiled_step(optimizer)
    x = torch.randn(4, 128, device="tpu")
    backward(tpu, x)
    step()                                   # the momentum buffers exist from here on
    state_bytes = 2 * (128 * 128 + 128) * 4  # parameters and momentum buffers, f32
    peaks = {}
    for donate in (False, True):
        backward(tpu, x)
        state = list(tpu.parameters()) + [s["momentum_buffer"]
                                          for s in optimizer.state.values()]
        held = [] if donate else [t.detach().clone() for t in state]
        del state
        gc.collect()
        torch.tpu.synchronize()
        torch.tpu.reset_peak_memory_stats()
        before = torch.tpu.memory_allocated()
        step()
        peaks[donate] = torch.tpu.max_memory_allocated() - before
        del held
    # Undonated, every new parameter and buffer is live beside the old one; donated, none is.
    assert peaks[False] >= state_bytes
    assert peaks[True] < peaks[False] - state_bytes * 0.9
    assert donation()["not_donated_shared"] == 4 and donation()["donated_inputs"] == 2 + 4

