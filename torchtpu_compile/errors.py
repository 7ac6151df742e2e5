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
