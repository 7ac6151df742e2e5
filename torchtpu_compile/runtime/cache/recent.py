"""A table of this process that keeps its most recently used entries: every in-process table
that holds compiled programs.

An XLA CPU executable maps pages of its own (3 to 4 mappings for an op's program), and a process
may hold ``vm.max_map_count`` mappings (65530 by default on Linux). A process that kept every
program it ever compiled (an eager tpu device meeting new shapes for hours: about 18 mappings a
shape for a five-op loop; a fuzz sweep after 124 programs) ran out of them, LLVM failed with
"Cannot allocate memory" and the process died in a segmentation fault. Each such table keeps at
most ``config.process_cache_entries`` entries, the least recently used dropped first; a program
dropped is freed with its last reference, and compiled again (or loaded from the disk cache)
when it is met again.

Example::

    programs = RecentlyUsed()
    programs[key] = program          # past the bound, the least recently used entry goes
    program = programs.get(key)      # None once dropped; a hit makes it the most recent
"""
from __future__ import annotations

import collections

from ... import config

_MISSING = object()


class RecentlyUsed(collections.OrderedDict):
    """A dict of at most ``config.process_cache_entries`` entries (read at each insertion),
    the least recently set or got dropped first. Safe to share between threads as a dict is:
    an entry another thread drops between a lookup's steps is still returned."""

    __slots__ = ()
    _get = collections.OrderedDict.get

    def get(self, key, default=None):
        value = self._get(key, _MISSING)
        if value is _MISSING:
            return default
        try:
            self.move_to_end(key)
        except KeyError:  # dropped by another thread since
            pass
        return value

    def __setitem__(self, key, value) -> None:
        super().__setitem__(key, value)
        self.move_to_end(key)
        limit = config.process_cache_entries
        while len(self) > limit:
            try:
                self.popitem(last=False)
            except KeyError:  # emptied by another thread
                break
