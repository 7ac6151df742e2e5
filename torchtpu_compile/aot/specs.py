"""What an artifact records about tensors, pytrees and versions, shared by export and load."""
from __future__ import annotations

import collections
import importlib.metadata
import json
import sys

import torch
from torch.utils import _pytree as pytree

_DTYPES = {str(d).removeprefix("torch."): d for d in (
    torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32,
    torch.int16, torch.int8, torch.uint8, torch.bool, torch.complex64, torch.float8_e4m3fn,
    torch.float8_e5m2, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz)}
#: The dtype names an artifact may record.
DTYPE_NAMES = tuple(_DTYPES)


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def dtype_from_name(name: str) -> torch.dtype:
    return _DTYPES[name]


def tensor_spec(name: str, value) -> dict:
    return {"name": name, "shape": [int(s) for s in value.shape], "dtype": dtype_name(value.dtype)}


#: The prefix of our own encoding of a structure, for the nodes pytree's JSON cannot name.
_OWN_ENCODING = "torchtpu-tree:"


def dump_treespec(spec) -> str | None:
    """A JSON string for ``spec``: pytree's, or ours where pytree's cannot name a node (a
    namedtuple not registered for serialization, a ``torch.return_types`` structseq such as
    ``x.max(1)``'s); None where neither can (a class registered without a serialized name).

    Example::

        dump_treespec(tree_flatten((Pair(x, y),))[1])  # 'torchtpu-tree:{"type": "tuple", ...'
    """
    try:
        return pytree.treespec_dumps(spec)
    except NotImplementedError:
        pass
    try:
        return _OWN_ENCODING + json.dumps(_encode(spec))
    except NotImplementedError:
        return None


def load_treespec(text: str | None, stand_ins: bool = False):
    """The structure ``dump_treespec`` wrote. A namedtuple class that is not importable here
    raises NotImplementedError, or, with ``stand_ins`` (outputs, which only need building),
    becomes a namedtuple of the same name and fields."""
    if text is None:
        return None
    if text.startswith(_OWN_ENCODING):
        return _decode(json.loads(text[len(_OWN_ENCODING):]), stand_ins)
    return pytree.treespec_loads(text)


def _encode(spec) -> dict:
    if spec.is_leaf():
        return {"type": "leaf"}
    node = {"children": [_encode(child) for child in spec.children()]}
    kind = spec.type
    if kind in (tuple, list):
        node["type"] = kind.__name__
    elif kind in (dict, collections.OrderedDict) and all(isinstance(k, str)
                                                         for k in spec.context):
        node.update(type=kind.__name__, keys=list(spec.context))
    elif kind is collections.namedtuple:
        cls = spec.context
        node.update(type="namedtuple", module=cls.__module__, qualname=cls.__qualname__,
                    fields=list(cls._fields))
    elif pytree.is_structseq_class(kind):
        node.update(type="structseq", module=kind.__module__, qualname=kind.__qualname__)
    else:
        raise NotImplementedError(f"no encoding for a {kind.__qualname__} node")
    return node


def _decode(node: dict, stand_ins: bool):
    kind = node["type"]
    if kind == "leaf":
        return pytree.treespec_leaf()
    children = [_decode(child, stand_ins) for child in node["children"]]
    if kind in ("tuple", "list"):
        return pytree.TreeSpec({"tuple": tuple, "list": list}[kind], None, children)
    if kind in ("dict", "OrderedDict"):
        return pytree.TreeSpec({"dict": dict, "OrderedDict": collections.OrderedDict}[kind],
                               list(node["keys"]), children)
    if kind == "structseq":
        return pytree.TreeSpec(_importable(node["module"], node["qualname"]), None, children)
    if kind == "namedtuple":
        try:
            cls = _importable(node["module"], node["qualname"])
            if list(getattr(cls, "_fields", ())) != node["fields"]:
                raise NotImplementedError(f"{node['module']}.{node['qualname']} here has "
                                          f"fields {getattr(cls, '_fields', None)}, not "
                                          f"{node['fields']}")
        except NotImplementedError:
            if not stand_ins:
                raise
            cls = collections.namedtuple(node["qualname"].rpartition(".")[2], node["fields"])
        return pytree.TreeSpec(collections.namedtuple, cls, children)
    raise ValueError(f"unknown node type {kind!r}")


def _importable(module: str, qualname: str):
    """The class ``module.qualname`` where its module is imported already, else
    NotImplementedError: loading an artifact imports nothing it names."""
    value = sys.modules.get(module)
    for part in qualname.split("."):
        value = getattr(value, part, None)
    if not isinstance(value, type):
        raise NotImplementedError(f"class {module}.{qualname} is not imported here")
    return value


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
