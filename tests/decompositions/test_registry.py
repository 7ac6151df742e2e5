"""The decomposition registry (torchtpu_compile/lower/decompositions/registry.py): one function
per op. A second ``@decomposition`` (or ``@checked_first``, or JAX builder) for an op is an error
when its module is imported, naming both functions; before, the module imported last silently
won, so which decomposition ran depended on import order."""
from __future__ import annotations

import importlib.util
import textwrap

import pytest
import torch

from torchtpu_compile.lower.decompositions import (CHECKS, OURS, DuplicateRegistration,
                                                   Registry, decomposition_table, our_ops)
from torchtpu_compile.lower.decompositions.jax_functions import builds

aten = torch.ops.aten


def _import_module(path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_second_decomposition_for_an_op_fails_its_module_import_naming_both(tmp_path):
    our_ops()  # every family registered
    topk = OURS[aten.topk.default]
    path = tmp_path / "second_topk.py"
    path.write_text(textwrap.dedent("""
        import torch
        from torchtpu_compile.lower.decompositions import decomposition

        @decomposition(torch.ops.aten.topk.default)
        def my_topk(x, k, dim=-1, largest=True, sorted=True):
            return torch.sort(x, dim, largest)
    """))
    with pytest.raises(DuplicateRegistration) as raised:
        _import_module(path)
    message = str(raised.value)
    assert message.startswith("aten.topk.default has two decompositions: ")
    assert "torchtpu_compile.lower.decompositions.sorting.topk (" in message
    assert "sorting.py:" in message and "second_topk.my_topk (" in message
    assert str(path) in message
    assert OURS[aten.topk.default] is topk  # the first one stays
    assert decomposition_table()[aten.topk.default] is not None


def test_a_second_check_and_a_second_jax_builder_raise_too():
    from torchtpu_compile.lower.decompositions import checked_first
    our_ops()
    before = CHECKS[aten.max.default]
    with pytest.raises(DuplicateRegistration, match=r"aten\.max\.default has two checks: "
                                                    r".*checks\.check .*another_check"):
        @checked_first(aten.max.default)
        def another_check(x):
            return None
    assert CHECKS[aten.max.default] is before
    with pytest.raises(DuplicateRegistration, match=r"conj has two JAX builders: "
                                                    r".*fft_complex\._conj_fn .*_my_conj_fn"):
        @builds("conj")
        def _my_conj_fn():
            return None


def test_one_function_for_several_ops_or_registered_again_is_allowed():
    registry = Registry("decomposition")

    def silu(x):
        return x * torch.sigmoid(x)

    def other(x):
        return x
    registry.register(aten.silu.default, silu)
    registry.register(aten.silu.default, silu)      # the same function again: no conflict
    registry.register(aten.hardswish.default, silu)  # one function for several ops
    assert dict(registry) == {aten.silu.default: silu, aten.hardswish.default: silu}
    with pytest.raises(DuplicateRegistration, match="aten.silu.default has two decompositions"):
        registry.register(aten.silu.default, other)
    registry[aten.silu.default] = other              # explicit replacement, as a dict
    assert registry[aten.silu.default] is other
