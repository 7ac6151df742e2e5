"""Exceptions raised by torchtpu, each with a message a user can act on."""
from __future__ import annotations


class TorchTPUError(RuntimeError):
    """Base class of every torchtpu error."""


class PlatformError(TorchTPUError):
    """The requested PJRT platform does not exist or cannot be started."""


class LoweringError(TorchTPUError):
    """A graph (or one op of it) could not be lowered to StableHLO or compiled by XLA."""


class UnsupportedOpError(LoweringError):
    """An op cannot be lowered and ``TORCHTPU_STRICT=1`` forbids the eager fallback."""


class InvalidInputError(Exception):
    """Eager PyTorch rejects these inputs, and so do we, with its exception and message, found
    while tracing (before any device work). Raised as ``InputRuntimeError`` or
    ``InputIndexError`` (``invalid_input``): the types eager raises."""


class InputRuntimeError(InvalidInputError, RuntimeError):
    """Eager raises RuntimeError for these inputs."""


class InputIndexError(InvalidInputError, IndexError):
    """Eager raises IndexError for these inputs (a dim out of range or of size 0)."""


class InputNotImplementedError(InputRuntimeError, NotImplementedError):
    """Eager has no kernel for these inputs' dtype (``"round" not implemented for 'Long'``)."""


def invalid_input(kind: type, message: str) -> InvalidInputError:
    """The error eager raises, as ``kind`` (RuntimeError, IndexError or NotImplementedError),
    marked as ours.

    Example::

        raise invalid_input(IndexError, "max(): Expected reduction dim 0 to have non-zero size.")
    """
    if issubclass(kind, IndexError):
        return InputIndexError(message)
    if issubclass(kind, NotImplementedError):
        return InputNotImplementedError(message)
    return InputRuntimeError(message)


class ConfigError(TorchTPUError, ValueError):
    """A setting of ``torchtpu_compile.config`` was given a value it does not accept (set in
    code, or in its environment variable); the message names both and the accepted values."""


def raise_if_out_of_memory(exc: BaseException, what: str) -> None:
    """Raise ``torch.OutOfMemoryError`` for PJRT's out-of-memory error ``exc`` (status
    RESOURCE_EXHAUSTED: a buffer, a program's outputs or its compile did not fit); otherwise
    return, for the caller to re-raise ``exc``.

    ``except torch.OutOfMemoryError`` (``torch.tpu.OutOfMemoryError``, ``torch.cuda``'s
    name for the same class) then catches it, and batch-size finders that read the message
    (accelerate's ``find_executable_batch_size``: " out of memory.") reduce the batch as on CUDA.

    Example::

        try:
            results = loaded.execute_sharded(buffers)
        except JaxRuntimeError as exc:
            raise_if_out_of_memory(exc, "running graph_0")
            raise
    """
    message = str(exc).strip()
    if not message.startswith("RESOURCE_EXHAUSTED"):
        return
    import torch
    first = message.splitlines()[0].rstrip(".")
    raise torch.OutOfMemoryError(
        f"TPU out of memory. {what}: {first}. Free tensors you no longer need (del, then "
        f"torch.tpu.empty_cache()), or reduce the batch size.") from exc
