"""Resident weights are never stale: every way PyTorch lets a user write a parameter or buffer
reaches the next compiled call, whether the device buffer aliases the host memory (the CPU
client, aligned memory) or is a copy (unaligned memory; every upload on a non-CPU platform,
played here by uploading a private clone of each tensor: a real copy, as PJRT makes there)."""
import copy

import numpy as np
import pytest
import torch
from torch import nn

import torchtpu_compile
from tests.support.helpers import compile_tpu
from torchtpu_compile import config
from torchtpu_compile.program import run as program_run
from torchtpu_compile.runtime import transfer

UPLOADS = ("aliased", "unaligned", "copied")


def _unaligned(t: torch.Tensor) -> torch.Tensor:
    """``t``'s values 4 bytes past torch's 64-byte alignment: PJRT's CPU client copies it."""
    flat = torch.empty(t.numel() + 1, dtype=t.dtype)[1:]
    return flat.view(t.shape).copy_(t)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 4)
        self.register_buffer("scale", torch.linspace(0.5, 2.0, 4))

    def forward(self, x):
        return self.linear(x) * self.scale


def _net(upload: str, monkeypatch) -> Net:
    torch.manual_seed(0)
    net = Net()
    if upload == "unaligned":
        net.linear.weight = nn.Parameter(_unaligned(net.linear.weight.detach()))
        net.linear.bias = nn.Parameter(_unaligned(net.linear.bias.detach()))
        net.scale = _unaligned(net.scale)
    elif upload == "copied":  # as on TPU and GPU: no upload is ever the host memory
        monkeypatch.setattr(transfer, "upload", _copying(transfer.upload))
        # nor a result (a host copy there): no input takes a result's memory
        monkeypatch.setattr(program_run, "adopt", lambda *args: False)
    return net


def _copying(upload):
    def copy_then_upload(tensor, device, *args, **kwargs):
        return upload(tensor.detach().clone(), device, *args, **kwargs)
    return copy_then_upload


def _new(shape, seed):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


def _other_device_source(shape, seed):
    import torchtpu_eager  # noqa: F401  (registers the tpu device)
    return _new(shape, seed).to("tpu")


# Each route writes the weight (and, where it can, the buffer) the way user code does; ``seed``
# varies the written values between the two writes of a test.
def _data_add(net, seed):
    net.linear.weight.data.add_(1.0)
    net.scale.data.add_(0.5)


def _data_copy(net, seed):
    net.linear.weight.data.copy_(_new((4, 4), seed))
    net.scale.data.copy_(_new(4, seed + 1))


def _ema(net, seed):
    target = _new((4, 4), seed)
    net.linear.weight.data.mul_(0.9).add_(target, alpha=0.1)


def _no_grad_inplace(net, seed):
    with torch.no_grad():
        net.linear.weight.mul_(-2.0)
        net.linear.bias.add_(1.0)
        net.scale.mul_(3.0)


def _load_state_dict(net, seed):
    state = {k: _new(v.shape, seed + i) for i, (k, v) in enumerate(net.state_dict().items())}
    net.load_state_dict(state)


def _load_state_dict_assign(net, seed):
    state = {k: _new(v.shape, seed + i) for i, (k, v) in enumerate(net.state_dict().items())}
    net.load_state_dict(state, assign=True)


def _set(net, seed):
    with torch.no_grad():
        net.linear.weight.set_(_new((4, 4), seed))
        net.scale.set_(_new(4, seed + 1))


def _data_assign(net, seed):
    net.linear.weight.data = _new((4, 4), seed)
    net.scale.data = _new(4, seed + 1)


def _data_restride(net, seed):
    # The same memory seen transposed: the data pointer does not move, the strides do.
    net.linear.weight.data = net.linear.weight.data.t()


def _copy_from_other_device(net, seed):
    with torch.no_grad():
        net.linear.weight.copy_(_other_device_source((4, 4), seed))
        net.scale.copy_(_other_device_source(4, seed + 1))


def _numpy_view(net, seed):
    view = net.linear.weight.detach().numpy()  # shares the tensor's memory
    view += np.float32(0.25)
    net.scale.numpy()[:] = np.arange(4, dtype=np.float32)


def _optimizer_step(net, seed):
    optimizer = torch.optim.AdamW(net.parameters(), lr=0.1)
    for p in net.parameters():
        p.grad = _new(p.shape, seed)
    optimizer.step()


ROUTES = {
    ".data.add_": _data_add,
    ".data.copy_": _data_copy,
    "EMA .data.mul_().add_()": _ema,
    "no_grad in-place": _no_grad_inplace,
    "load_state_dict": _load_state_dict,
    "load_state_dict(assign=True)": _load_state_dict_assign,
    "set_": _set,
    ".data = new tensor": _data_assign,
    ".data = same memory restrided": _data_restride,
    "copy_ from the tpu device": _copy_from_other_device,
    "numpy array sharing the memory": _numpy_view,
    "optimizer step": _optimizer_step,
}


@pytest.mark.parametrize("upload", UPLOADS)
@pytest.mark.parametrize("route", list(ROUTES))
def test_a_write_reaches_the_next_compiled_call(route, upload, monkeypatch):
    net = _net(upload, monkeypatch)
    x = torch.randn(3, 4)
    with config.patch(matmul_precision="highest"):
        compiled = compile_tpu(net)
        torch.testing.assert_close(compiled(x), net(x))
        for seed in (1, 2):  # twice: the buffer made after the first write must not stick
            ROUTES[route](net, seed)
            torch.testing.assert_close(compiled(x), net(x), msg=f"after write {seed}")


@pytest.mark.parametrize("upload", UPLOADS)
def test_a_compiled_training_loop_matches_eager(upload, monkeypatch):
    """Forward, backward and the optimizer's in-place step, five times: the losses and final
    weights of eager CPU PyTorch."""
    net = _net(upload, monkeypatch)
    reference = copy.deepcopy(net)
    x, target = torch.randn(8, 4), torch.randn(8, 4)

    def train(model, step_fn):
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        losses = []
        for _ in range(5):
            optimizer.zero_grad()
            loss = ((step_fn(x) - target) ** 2).mean()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        return losses

    with config.patch(matmul_precision="highest"):
        losses = train(net, compile_tpu(net))
    expected = train(reference, reference)
    torch.testing.assert_close(losses, expected)
    for (name, got), want in zip(net.named_parameters(), reference.parameters()):
        torch.testing.assert_close(got, want, msg=name)


def test_aligned_weights_are_shared_once_and_copies_are_made_every_call(monkeypatch):
    net = _net("aliased", monkeypatch)
    x = torch.randn(3, 4)
    compiled = compile_tpu(net)
    with torch.no_grad():
        compiled(x)
        torchtpu_compile.reset_stats()
        for _ in range(3):
            compiled(x)
            net.linear.weight.data.add_(1.0)  # seen through the shared memory: no upload
    stats = torchtpu_compile.stats()
    assert stats["resident_uploads"] == 0 and stats["resident_copies"] == 0
    copied = _net("copied", monkeypatch)
    compiled = compile_tpu(copied)
    with torch.no_grad():
        compiled(x)
        torchtpu_compile.reset_stats()
        compiled(x)
    # weight, bias and scale, again at this call: a copy is never kept
    assert torchtpu_compile.stats()["resident_copies"] == 3


def test_the_issue_repro_from_numpy():
    m = nn.Linear(4, 3)
    m.weight = nn.Parameter(torch.from_numpy(np.random.randn(3, 4).astype("float32")))
    x = torch.randn(2, 4)
    with config.patch(matmul_precision="highest"):
        compiled = compile_tpu(m)
        compiled(x)
        m.weight.data.add_(1.0)
        torch.testing.assert_close(compiled(x), m(x))


def test_constants_of_a_graph_follow_the_same_rule(monkeypatch):
    monkeypatch.setattr(transfer, "upload", _copying(transfer.upload))
    f = compile_tpu(lambda x: x * torch.tensor([1.0, 2.0, 3.0]))
    x = torch.ones(3)
    torch.testing.assert_close(f(x), x * torch.tensor([1.0, 2.0, 3.0]))
    torchtpu_compile.reset_stats()
    f(x)
    assert torchtpu_compile.stats()["resident_copies"] == 1


def test_an_aot_artifacts_weights_are_resident_and_never_stale(tmp_path):
    from torchtpu_compile import aot
    torch.manual_seed(0)
    model = nn.Linear(4, 3).eval()
    x = torch.randn(2, 4)
    path = str(tmp_path / "linear.tpu")
    aot.compile(model, (x,)).save(path)
    run = aot.load(path)
    with torch.no_grad():
        torch.testing.assert_close(run(x), model(x), rtol=2e-2, atol=2e-2)
    for value in run.state.values():
        value.data.mul_(2.0)  # the artifact's weights, written behind the version counter
    with torch.no_grad():
        torch.testing.assert_close(run(x), 2 * model(x), rtol=2e-2, atol=2e-2)
    torchtpu_compile.reset_stats()
    run(x)
    assert torchtpu_compile.stats()["resident_copies"] == 0  # the loaded state is shared


def test_eager_device_uploads_are_copies_taken_during_the_call():
    import torchtpu_eager  # noqa: F401
    for host in (torch.arange(8.0), _unaligned(torch.arange(8.0))):
        original = host.clone()
        on_device = host.to("tpu")
        host.add_(100.0)  # the tpu tensor is a value of its own
        torch.testing.assert_close(on_device.cpu(), original)


@pytest.mark.parametrize("upload", ("aliased", "copied"))
def test_constants_of_an_eager_device_graph_follow_the_same_rule(upload, monkeypatch):
    from torchtpu_eager.programs import trace
    from torchtpu_eager.transfer import download
    if upload == "copied":
        monkeypatch.setattr(transfer, "upload", _copying(transfer.upload))
    graph = trace(lambda a: (a + torch.tensor([1.0, 2.0, 3.0]),), [torch.empty(3)], "add")
    [constant] = [getattr(graph.gm, n.target) for n in graph.gm.graph.nodes if n.op == "get_attr"]
    x = transfer.to_buffer(torch.zeros(3))
    torch.testing.assert_close(download(graph.run([x])[0]), torch.tensor([1.0, 2.0, 3.0]))
    constant.data.mul_(10.0)  # nothing writes a graph's literal, but if it did, it is seen
    torch.testing.assert_close(download(graph.run([x])[0]), torch.tensor([10.0, 20.0, 30.0]))


def _write_state(cache, count, pos, new):
    cache.index_copy_(0, pos, new)  # a static KV cache's update
    count.add_(1)                   # and its length
    return cache.sum(0) * count


@pytest.mark.parametrize("upload", UPLOADS)
def test_state_a_graph_writes_in_place_is_resident_and_never_stale(upload, monkeypatch):
    # A static KV cache (made by an earlier graph, as HF's prefill makes it) is passed to the
    # decode step again and again and written in place: it stays resident like a buffer (no
    # upload per step where the buffer is its memory), and every write, the graph's own and
    # the user's between calls, reaches the next call.
    _net(upload, monkeypatch)  # "copied": every upload a private copy, as on TPU
    make = compile_tpu(lambda x: torch.zeros(6, 4) + x)
    cache, count = make(torch.zeros(())), torch.zeros((), dtype=torch.int64)
    if upload == "unaligned":
        cache = _unaligned(cache)
    expected, expected_count = cache.clone(), count.clone()
    step = compile_tpu(_write_state)
    before = transfer.resident_count()
    for i in range(4):
        pos, new = torch.tensor([i]), _new((1, 4), i)
        torch.testing.assert_close(step(cache, count, pos, new),
                                   _write_state(expected, expected_count, pos, new))
        torch.testing.assert_close((cache, count), (expected, expected_count))
        if i == 0:
            resident = transfer.resident_count() - before
        cache[5] = expected[5] = float(i)  # a write between calls
    assert transfer.resident_count() - before == resident
    # a copy is never kept: the unaligned cache's, every one when uploads copy
    assert resident == {"aliased": 2, "unaligned": 1, "copied": 0}[upload]


def test_state_a_graph_writes_in_place_takes_its_new_value_with_no_copy():
    # A static KV cache's new value is not copied back into it after each decode step (the
    # whole cache, aot_autograd's epilogue): the cache takes the result's memory, which is
    # then its resident buffer. Where something else sees its memory (a view, a numpy array),
    # it is copied as eager would, and every holder reads eager's values.
    make = compile_tpu(lambda x: torch.zeros(6, 4) + x)
    cache, count = make(torch.zeros(())), torch.zeros((), dtype=torch.int64)
    expected, expected_count = cache.clone(), count.clone()
    step = compile_tpu(_write_state)
    moved, place = [], cache.data_ptr()
    for i in range(6):
        if i == 3:
            view, array = cache[2:], cache.numpy()  # holders: from here on, copies
        pos, new = torch.tensor([i]), _new((1, 4), i)
        torch.testing.assert_close(step(cache, count, pos, new),
                                   _write_state(expected, expected_count, pos, new),
                                   rtol=0, atol=0)
        torch.testing.assert_close((cache, count), (expected, expected_count), rtol=0, atol=0)
        moved.append(cache.data_ptr() != place)
        place = cache.data_ptr()
        if i >= 3:
            torch.testing.assert_close(view, expected[2:], rtol=0, atol=0)
            np.testing.assert_array_equal(array, expected.numpy())
    # steps 0-2 moved the cache into their result; 3-5 copied into the memory held
    assert moved == [True, True, True, False, False, False]


def _bump(x):
    x.add_(1)  # (returning nothing: a returned input stays the caller's tensor anyway)


def _from_dlpack_alias(t):
    return torch.utils.dlpack.from_dlpack(torch.utils.dlpack.to_dlpack(t))


@pytest.mark.parametrize("holder", [
    lambda: (lambda a: (torch.from_numpy(a), lambda: torch.from_numpy(a)))(np.zeros(8, np.float32)),
    lambda: (lambda b: (torch.frombuffer(b, dtype=torch.float32),
                        lambda: torch.frombuffer(b, dtype=torch.float32)))(bytearray(32)),
    lambda: (lambda t: (t, lambda: t))(torch.zeros(8).share_memory_()),
    lambda: (lambda t: (t, (lambda alias: lambda: alias)(_from_dlpack_alias(t))))(torch.zeros(8)),
], ids=["from_numpy", "frombuffer", "share_memory_", "from_dlpack"])
def test_an_input_written_in_place_keeps_memory_it_shares_with_others(holder):
    # The input took the program's result memory, so the numpy array, bytearray, shared
    # segment or DLPack alias that shared its old memory kept the old values (the alias read
    # freed memory).
    t, seen = holder()
    step = compile_tpu(_bump)
    for i in range(3):
        step(t)
        torch.testing.assert_close(seen(), torch.full((8,), i + 1.0), rtol=0, atol=0)
    assert t.is_shared() == seen().is_shared()
