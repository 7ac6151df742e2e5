"""A bucketed graph that writes its input in place (a static KV cache whose length Dynamo made
dynamic): the steady call pads into a kept tensor (no upload of the cache) and writes the new
value straight into the input (no copy of it by aot_autograd), with eager's values throughout.
"""
from __future__ import annotations

import torch

import torchtpu_compile
from torchtpu_compile import config


def _static_cache_step(cache, new, position, query):
    # HF's StaticCache.update, then attention over the whole cache
    cache.index_copy_(2, position, new)
    return torch.softmax(query @ cache.transpose(-1, -2), dim=-1) @ cache


def _step_matches_eager(compiled, cache, expected, position: int) -> None:
    """One decode step at ``position``, compiled on ``cache`` and eager on ``expected``: the
    outputs and the written caches are the same."""
    new, query = torch.randn(1, 2, 1, 4), torch.randn(1, 2, 1, 4)
    pos = torch.tensor([position])
    out = compiled(cache, new, pos, query)
    want = _static_cache_step(expected, new, pos, query)
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(cache, expected, rtol=0, atol=0)


class _CopiesInto:
    """Counts ``copy_`` calls writing another tensor into ``target`` (aot_autograd's epilogue
    writing a mutated input's new value back)."""

    def __init__(self, target):
        self.target, self.count, self._copy = target, 0, torch.Tensor.copy_

    def __enter__(self):
        copy = self._copy

        def counted(dst, src, *args, **kwargs):
            if dst is self.target and src is not dst:
                self.count += 1
            return copy(dst, src, *args, **kwargs)

        torch.Tensor.copy_ = counted
        return self

    def __exit__(self, *exc):
        torch.Tensor.copy_ = self._copy


def test_static_cache_of_dynamic_length_stays_resident_and_is_written_in_place(fresh_dynamo):
    compiled = torch.compile(_static_cache_step, backend="torchtpu")
    torch.manual_seed(0)
    with torch.no_grad(), config.patch(matmul_precision="highest"):
        # two cache lengths: Dynamo makes the length dynamic, then a decode loop at length 11
        for length in (9, 10, 11):
            cache, expected = torch.zeros(1, 2, length, 4), torch.zeros(1, 2, length, 4)
            for position in range(3):
                _step_matches_eager(compiled, cache, expected, position)
        uploads = torchtpu_compile.stats()["resident_uploads"]
        with _CopiesInto(cache) as copies:
            for position in range(3, 8):
                _step_matches_eager(compiled, cache, expected, position)
    graphs = torchtpu_compile.stats()["graphs"]
    assert any(g["buckets"] for g in graphs.values()), graphs  # the loop ran a bucket
    # the padded cache was kept from the first steady call on: not uploaded again
    assert torchtpu_compile.stats()["resident_uploads"] == uploads
    # its new value was written into it by the runner, not copied in by aot_autograd
    assert copies.count == 0


def test_kept_padding_sees_writes_between_calls(fresh_dynamo):
    # The padded copy is kept, but each call copies the input in again: a write to the cache
    # outside the compiled function (in place, or through .data) is what the next call reads.
    compiled = torch.compile(_static_cache_step, backend="torchtpu")
    torch.manual_seed(0)
    with torch.no_grad(), config.patch(matmul_precision="highest"):
        for length in (9, 10, 11, 11, 11, 11):
            cache = torch.randn(1, 2, length, 4)
            expected = cache.clone()
            for step, position in enumerate(range(3)):
                if step == 1:
                    cache.mul_(2)
                    expected.mul_(2)
                if step == 2:
                    cache.data[..., 0, :] = 5.0
                    expected[..., 0, :] = 5.0
                _step_matches_eager(compiled, cache, expected, position)


def test_kept_padding_of_a_shrinking_input_keeps_padding_zero(fresh_dynamo):
    # A dynamic cache inside one bucket: lengths grow (the kept tensor is reused), then shrink
    # (a fresh one: the old rows would otherwise sit in the padding). A sum over the padded
    # dim and a matmul contracting it read every position of the bucket.
    def f(x, w):
        return x.sum(1), x.transpose(1, 2) @ w

    compiled = torch.compile(f, backend="torchtpu")
    torch.manual_seed(0)
    with config.patch(matmul_precision="highest"):
        for length in (3, 4, 5, 7, 4, 6, 2, 8, 5):
            x, w = torch.randn(2, length, 3) * 100, torch.randn(2, length, 5)
            for got, want in zip(compiled(x, w), f(x, w)):
                torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-4)
    assert torchtpu_compile.stats()["buckets"]["exact_shape_compiles"] == 0


class _Uploads:
    """The shapes of the host arrays ``runtime/transfer.py`` puts on the device (jaxlib's
    ``batched_device_put``), while entered."""

    def __init__(self, monkeypatch):
        from torchtpu_compile.runtime import transfer
        jax, shapes = transfer._jax, []
        self.shapes = shapes

        class Jax:  # jaxlib's module, but for the device put that records
            def __getattr__(self, name):
                return getattr(jax, name)

            @staticmethod
            def batched_device_put(aval, sharding, arrays, *rest, **kwargs):
                shapes.append(tuple(arrays[0].shape))
                return jax.batched_device_put(aval, sharding, arrays, *rest, **kwargs)

        monkeypatch.setattr(transfer, "_jax", Jax())


def test_kept_padding_of_a_growing_input_is_not_uploaded_again(fresh_dynamo, monkeypatch):
    # A dynamic KV cache growing inside one bucket: every call copies it into the kept padded
    # tensor, whose buffer (that tensor's own memory on the CPU client) serves the call; only
    # the other inputs (the query, the real sizes) are uploaded.
    def attend(cache, query):
        return torch.softmax(query @ cache.transpose(1, 2), dim=-1) @ cache

    compiled = torch.compile(attend, backend="torchtpu")
    torch.manual_seed(0)
    with torch.no_grad(), config.patch(matmul_precision="highest"):
        for length in (3, 4, 5):  # Dynamo makes the length dynamic; the bucket is built
            compiled(torch.randn(1, length, 4), torch.randn(1, 1, 4))
        uploads = _Uploads(monkeypatch)
        for length in (5, 6, 7):  # below the bucket's length: padded (at it, passed as it is)
            cache, query = torch.randn(1, length, 4), torch.randn(1, 1, 4)
            torch.testing.assert_close(compiled(cache, query), attend(cache, query),
                                       rtol=1e-5, atol=1e-6)
    graphs = torchtpu_compile.stats()["graphs"]
    assert sum(g["compiles"] for g in graphs.values()) <= 3, graphs  # one bucket served them
    assert uploads.shapes and set(uploads.shapes) <= {(1, 1, 4), ()}, set(uploads.shapes)


def test_a_decode_loop_started_again_reuses_every_buckets_kept_padding(fresh_dynamo,
                                                                       monkeypatch):
    # A dynamic KV cache grows through several buckets, then a new prompt starts it again
    # short: each bucket's kept padded tensor from the first loop serves the second (zeroed
    # where the shorter cache no longer reaches), so no cache is uploaded again; nor is the
    # real length, a scalar input kept per value.
    def attend(cache, query):
        return torch.softmax(query @ cache.transpose(1, 2), dim=-1) @ cache

    compiled = torch.compile(attend, backend="torchtpu")
    torch.manual_seed(0)
    # not a bucket's own length (pow2-128's 8, 16, 32), which is passed as it is, unpadded
    lengths = [n for n in range(5, 40) if n & (n - 1)]
    with torch.no_grad(), config.patch(matmul_precision="highest", bucket_policy="pow2-128"):
        # (the first length again: its first call was Dynamo's static graph)
        for length in lengths + lengths[:1]:
            compiled(torch.randn(1, length, 4), torch.randn(1, 1, 4))
        buckets = torchtpu_compile.stats()["buckets"]
        uploads = _Uploads(monkeypatch)
        for length in lengths:
            cache, query = torch.randn(1, length, 4) * 100, torch.randn(1, 1, 4)
            torch.testing.assert_close(compiled(cache, query), attend(cache, query),
                                       rtol=1e-5, atol=1e-4)
    assert buckets["exact_shape_compiles"] == 0
    assert uploads.shapes and set(uploads.shapes) == {(1, 1, 4)}, set(uploads.shapes)


def test_a_size_an_output_shows_is_a_fresh_tensor_at_every_call(fresh_dynamo):
    # The real sizes are scalar inputs of a bucket's program, kept per value; where the graph
    # returns one as a tensor, the caller gets a tensor of its own, and writing to it changes
    # nothing a later call computes.
    def f(x):
        return x.sum(0), torch.scalar_tensor(x.shape[0], dtype=torch.int64)

    compiled = torch.compile(f, backend="torchtpu", dynamic=True)
    with torch.no_grad():
        for length in (3, 5, 6, 5, 6):
            x = torch.randn(length, 2)
            total, size = compiled(x)
            torch.testing.assert_close(total, x.sum(0))
            assert size.item() == length
            size.add_(100)
    assert torchtpu_compile.stats()["buckets"]["exact_shape_compiles"] == 0


def test_kept_padding_past_its_memory_bound_keeps_what_the_call_uses(monkeypatch):
    # KeptPadding keeps a tensor per position and bucket within a bound on bytes; a decode
    # step whose own caches pass the bound still keeps them all (else every step would make
    # them again), and a bucket change drops the older bucket's first. Values: the real
    # elements in front, zero padding, at every call.
    from torchtpu_compile.buckets import kept_padding

    monkeypatch.setattr(kept_padding, "_MAX_KEPT_BYTES", 3 * 64 * 4 * 4)  # 3 of the 64 bucket
    kept = kept_padding.KeptPadding()

    def step(length, bucket, positions=4):
        inputs = [torch.randn(1, length, 4) for _ in range(positions)]
        real = [t.clone() for t in inputs]
        plan = ([1, length, 4], [1, bucket, 4], (slice(0, 1), slice(0, length), slice(0, 4)),
                [1, bucket, 4])
        kept.pad_all(inputs, [(j, plan, (1, length, 4), (1, bucket, 4))
                              for j in range(positions)])
        for padded, want in zip(inputs, real):
            assert padded.shape == (1, bucket, 4)
            assert torch.equal(padded[:, :length], want) and not padded[:, length:].any()
        return inputs

    first = step(40, 64)
    assert all(a is b for a, b in zip(first, step(41, 64)))    # 4 KB kept past the 3 KB bound
    smaller = step(9, 16)
    assert all(a is b for a, b in zip(smaller, step(3, 16)))   # zeroed again, not made again
    assert sum(k.out.nbytes for k in kept._kept.values()) <= 3 * 64 * 4 * 4
