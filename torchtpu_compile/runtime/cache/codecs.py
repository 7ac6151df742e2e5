"""How a cache turns its values into bytes and back: one codec per cache.

A codec has ``encode(value) -> bytes`` and ``decode(payload) -> value``. ``decode`` raises, with
any exception, for a payload it cannot read: the levels then count the entry ``corrupt``,
discard it and go on as for a miss. It only ever sees payloads that passed the frame's checks
(checksum, the key it was stored under, and the signature or the store's ownership:
``frame.py``, ``stores.py``), so a pickle codec unpickles only what this user, or a holder of
``TORCHTPU_CACHE_KEY``, wrote.

The codecs of values the runtime does not know live with those values: executables in
``runtime/executable.py``, lowered StableHLO in ``lower/cache.py``. This module holds the ones
for pickled values, which the caches above aot_autograd and Dynamo use.

Example::

    def lists_only(value):
        if not isinstance(value, list):
            raise TypeError(f"a pickled {type(value).__name__}, not a list")

    codec = PickleCodec(check=lists_only)
    assert codec.decode(codec.encode([1, 2])) == [1, 2]
"""
from __future__ import annotations

import pickle
from collections.abc import Callable
from typing import Any, Protocol


class Codec(Protocol):
    """What a ``Levels`` cache needs of its values (module docstring)."""

    def encode(self, value: Any) -> bytes: ...

    def decode(self, payload: bytes) -> Any: ...


class PickleCodec:
    """Values stored as pickles. ``check(value)`` raises where an unpickled value is not one
    this cache stores (a pickle of something else is as damaged as a truncated one).

    Example::

        codec = PickleCodec(check=lists_only)   # module docstring
    """

    def __init__(self, check: Callable[[Any], None]):
        self.check = check

    def encode(self, value: Any) -> bytes:
        return pickle.dumps(value)

    def decode(self, payload: bytes) -> Any:
        value = pickle.loads(payload)
        self.check(value)
        return value


class PickledBytesCodec:
    """Values that already are pickles, written by someone else's serializer (torch's
    AOTAutogradCache): kept as the bytes, which ``decode`` checks unpickle to a value that
    ``check`` accepts, so that a damaged one is caught here, not by its owner at load.

    Example::

        codec = PickledBytesCodec(check=lists_only)
        payload = codec.decode(stored)          # the same bytes, known to unpickle to a list
    """

    def __init__(self, check: Callable[[Any], None]):
        self.check = check

    def encode(self, value: bytes) -> bytes:
        return value

    def decode(self, payload: bytes) -> bytes:
        self.check(pickle.loads(payload))
        return payload
