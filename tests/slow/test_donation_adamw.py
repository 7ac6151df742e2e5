"""Buffer donation on the optimizer issues 19 and 20 measure: a compiled AdamW step on
tpu-device parameters. Dynamo traces AdamW for several seconds, so it is here; the fast suite
has the same checks on SGD (``tests/test_donation.py``).
"""
import pytest
import torch

from torchtpu_compile import config
from tests.support.donation import backward, compiled_step, donation, models, peak_of_a_step

pytestmark = pytest.mark.slow


def test_compiled_adamw_step_donates_and_matches_eager_cpu(fresh_dynamo):
    cpu, tpu = models()
    opt_cpu = torch.optim.AdamW(cpu.parameters(), lr=1e-2)
    opt_tpu = torch.optim.AdamW(tpu.parameters(), lr=1e-2)
    step = compiled_step(opt_tpu)
    x = torch.randn(8, 32)
    first = next(tpu.parameters())
    with config.patch(matmul_precision="highest"):
        for _ in range(3):
            opt_cpu.zero_grad()
            opt_tpu.zero_grad()
            backward(cpu, x)
            backward(tpu, x.to("tpu"))
            where = first._st.value.unsafe_buffer_pointer()
            opt_cpu.step()
            step()
            # The new value sits in the old buffer's memory: the old buffer was donated.
            assert first._st.value.unsafe_buffer_pointer() == where
    for a, b in zip(cpu.parameters(), tpu.parameters()):
        torch.testing.assert_close(b.cpu(), a, rtol=1e-5, atol=1e-6)
    for state_cpu, state_tpu in zip(opt_cpu.state.values(), opt_tpu.state.values()):
        for key in ("exp_avg", "exp_avg_sq"):
            torch.testing.assert_close(state_tpu[key].cpu(), state_cpu[key], rtol=1e-5,
                                       atol=1e-7)
    # every parameter and both moments, at each of the 3 steps
    assert donation()["donated_inputs"] == 3 * 3 * len(list(tpu.parameters()))
    assert donation()["not_donated_shared"] == 0


def test_a_donated_adamw_step_peaks_below_an_undonated_one(fresh_dynamo):
    state_bytes = 3 * 2 * (128 * 128 + 128) * 4     # parameters and both moments, f32
    undonated = peak_of_a_step(torch.optim.AdamW, False)
    donated = peak_of_a_step(torch.optim.AdamW, True)
    assert undonated >= state_bytes
    assert donated < undonated - state_bytes * 0.9
