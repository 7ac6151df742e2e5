"""A table of this process that keeps its most recently used entries: every in-process table
that holds compiled programs.

An XLA CPU executable maps pages of its own, 3 for each kernel it holds (about 3 for an eager
op's program, 280 for a tiny GPT-2's training step), and a process may hold
``vm.max_map_count`` mappings (65530 by default on Linux). A process that kept every program it
ever compiled (an eager tpu device meeting new shapes for hours: 18 mappings a shape for a
five-op loop; a fuzz sweep, 124 programs in) ran out of them, LLVM failed with "Cannot allocate
memory" and the process died in a segmentation fault. Each such table keeps the number of
entries its setting names, the least recently used dropped first: ``process_cache_entries``
for eager ops' programs, traces and lowerings, ``process_cache_programs`` for whole programs
(every executable kept beyond those live graphs hold, fused recordings). A program dropped is
freed with its last reference, and compiled again (or loaded from the disk cache) when met
again.

Example::

    programs = RecentlyUsed("process_cache_programs")
    programs[key] = program          # past the bound, the least recently used entry goes
    program = programs.get(key)      # None once dropped; a hit makes it the most recent
"""
from __future__ import annotations

import collections

from ... import config

_MISSING = object()


class RecentlyUsed(collections.OrderedDict):
    """A dict of at most ``config.<setting>`` entries (read at each insertion), the least
    recently set or got dropped first. Safe to share between threads as a dict is: an entry
    another thread drops between a lookup's steps is still returned."""

    _get = collections.OrderedDict.get

    def __init__(self, setting: str = "process_cache_entries"):
        super().__init__()
        self.setting = setting

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
        try:
            self.move_to_end(key)  # a key set again is the most recent too
        except KeyError:  # dropped by another thread since
            pass
        limit = getattr(config, self.setting)
        while len(self) > limit:
            try:
                self.popitem(last=False)
            except KeyError:  # emptied by another thread
                break
