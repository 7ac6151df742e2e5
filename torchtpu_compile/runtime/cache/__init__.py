"""The one cache stack: every cached thing (executables, lowered StableHLO, aot_autograd results,
Dynamo's output per frame) is a ``Levels`` cache, looked up in this process, on the host disk and
on a remote store, with one set of counters (``stats()["caches"]``).

One module per job:

- ``levels.py``: the loop (process -> disk -> remote, filling faster levels on a slower hit),
  the write path and the counters;
- ``codecs.py``: what a codec is, and the pickle codecs (the executable and lowering codecs
  live beside their values, in ``runtime/executable.py`` and ``lower/cache.py``);
- ``stores.py``: where entries live (disk folder, remote) and whether a store may be trusted;
  every I/O failure becomes a miss and one warning;
- ``frame.py``: the entry format (checksum, the key it was stored under, HMAC signature);
- ``recent.py``: the bounded table the process level (and every other in-process table of
  compiled programs) is, its least recently used entries dropped.

Example::

    from torchtpu_compile.runtime.cache import GRAPH_FOLDER, Levels, PickleCodec

    frames = Levels("dynamo", PickleCodec(check=entries_only), folder=GRAPH_FOLDER)
"""
from .codecs import Codec, PickleCodec, PickledBytesCodec
from .levels import GRAPH_FOLDER, Levels, Lookup
from .recent import RecentlyUsed

__all__ = ["Codec", "GRAPH_FOLDER", "Levels", "Lookup", "PickleCodec", "PickledBytesCodec",
           "RecentlyUsed"]
