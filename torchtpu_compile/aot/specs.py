"""What an artifact records about tensors, pytrees and versions, shared by export and load."""
from __future__ import annotations

import importlib.metadata

import torch
from torch.utils import _pytree as pytree

_DTYPES = {str(d).removeprefix("torch."): d for d in (
    torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32,
    torch.int16, torch.int8, torch.uint8, torch.bool, torch.complex64)}
#: The dtype names an artifact may record.
DTYPE_NAMES = tuple(_DTYPES)


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def dtype_from_name(name: str) -> torch.dtype:
    return _DTYPES[name]


def tensor_spec(name: str, value) -> dict:
    return {"name": name, "shape": [int(s) for s in value.shape], "dtype": dtype_name(value.dtype)}


def dump_treespec(spec) -> str | None:
    """A JSON string for ``spec``, or None where a node type cannot be serialized."""
    try:
        return pytree.treespec_dumps(spec)
    except Exception:
        return None


def load_treespec(text: str | None):
    return None if text is None else pytree.treespec_loads(text)


def versions() -> dict:
    import jaxlib

    def version_of(dist):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            return None
    return {"torch": torch.__version__, "torch-mlir": version_of("torch-mlir"),
            "jaxlib": jaxlib.__version__, "torchtpu": version_of("torchtpu")}


def executable_tag(client) -> dict:
    """What an executable compiled by ``client`` depends on, recorded beside it in an artifact
    and compared at load: the platform's version, jaxlib's, and the XLA flags it was compiled
    under (``client.compile_flags``: ``--xla_cpu_enable_fast_math`` or a TPU scheduler flag
    change the code, as in the executable cache's key) and the per-compile ``xla_options``.

    Example::

        executable_tag(get_client())
        # {"platform_version": "cpu", "jaxlib": "0.10.2", "xla_flags": "",
        #  "xla_options": "xla_allow_excess_precision=False"}
    """
    import jaxlib

    from ..runtime.executable import xla_options_text
    return {"platform_version": client.pjrt.platform_version, "jaxlib": jaxlib.__version__,
            "xla_flags": client.compile_flags, "xla_options": xla_options_text(client)}
