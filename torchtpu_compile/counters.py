"""The counters behind ``torchtpu_compile.stats()``: a registry of groups, one per subsystem.

Each subsystem registers its own group of counters when it loads (``register``): the compile
path's are below; the eager device's (``torchtpu_eager/stats.py``) and tpu_dist's
(``torchtpu_eager/distributed/stats.py``) live in their packages. ``stats()`` merges every
registered group into one snapshot; a group sits at the top level or under a key of its own
(``under="tpu_dist"``). This module imports nothing heavy: the eager device registers its group
at ``import torch``.

Example::

    COUNTERS = register("my_subsystem", lambda: {"things_done": 0}, under="mine")
    COUNTERS.add("things_done")
    stats()["mine"]["things_done"]           # 1
"""
from __future__ import annotations

import collections
import copy
import threading
from collections.abc import Callable

# Reentrant: a counter update can run Python code of a Counter (``__missing__``), whose frame
# Dynamo's callback sees while a compiled function runs eagerly past a graph break; the Dynamo
# cache's lookup for it counts too, in the same thread, and a plain lock hung the process (a
# compiled function on tpu tensors whose bincount ran on the host).
_lock = threading.RLock()
_groups: dict = {}   # name -> Group, in registration order


class Group:
    """One subsystem's counters (see ``register``)."""

    def __init__(self, name: str, fresh: Callable[[], dict], under: str | None,
                 report: Callable[[dict], None] | None, values: dict | None):
        self.name, self.under = name, under
        self._fresh, self._report = fresh, report
        # Counted in place: a reset refills the same dict, so code holding it keeps counting.
        self.values = fresh() if values is None else values

    def add(self, name: str, value=1) -> None:
        """Add ``value`` to the counter ``name`` of this group.

        Example::

            COUNTERS.add("eager_fallbacks")
        """
        with _lock:
            self.values[name] += value

    def reset(self) -> None:
        fresh = self._fresh()
        with _lock:
            self.values.clear()
            self.values.update(fresh)

    def snapshot(self) -> dict:
        with _lock:
            snap = copy.deepcopy(self.values)
        if self._report is not None:
            self._report(snap)
        return snap


def register(name: str, fresh: Callable[[], dict], *, under: str | None = None,
             report: Callable[[dict], None] | None = None, values: dict | None = None) -> Group:
    """Register (once; again: the same group) a group of counters that ``stats()`` reports.

    ``fresh()`` gives the counters at zero, ``under`` the ``stats()`` key they sit under (None:
    the top level), ``report(snapshot)`` finishes a snapshot in place (derived values), and
    ``values`` is the dict to count in (default: a new one). A counter name another group
    already reports at the same place is an error: two subsystems would count into one key.

    Example::

        COUNTERS = register("eager", lambda: {"eager_fallbacks": 0})
    """
    with _lock:
        known = _groups.get(name)
        if known is not None:
            return known
        taken = {key for group in _groups.values() if group.under == under
                 for key in group.values}
        clash = taken & set(fresh())
        if clash:
            raise ValueError(f"counter group {name!r}: {', '.join(sorted(clash))} already "
                             f"reported by another group")
        group = _groups[name] = Group(name, fresh, under, report, values)
    return group


def stats() -> dict:
    """A snapshot of every registered group's counters (the compile path's at the top level).

    Example::

        >>> import torchtpu_compile
        >>> torchtpu_compile.stats()["graphs_compiled"]
        0
    """
    snap: dict = {}
    for group in list(_groups.values()):
        values = group.snapshot()
        (snap if group.under is None else snap.setdefault(group.under, {})).update(values)
    return snap


def reset_stats() -> None:
    """Zero every counter of every group (the compile cache itself is kept)."""
    for group in list(_groups.values()):
        group.reset()


# --- the compile path's counters (runtime, lowering, programs, buckets, caches) ------------------

def _fresh() -> dict:
    stats = {
        "graphs_compiled": 0,        # XLA compilations (cache misses that reached PJRT compile)
        "xla_compile_seconds": 0.0,  # time spent in PJRT compile
        "lowering_seconds": 0.0,     # time spent in torch-mlir import and StableHLO passes
        "fallback_ops": collections.Counter(),   # op name -> nodes sent to eager PyTorch
        "graphs_with_fallback": 0,
        # Backward graphs run as several programs so that their inputs die sooner
        # (program/memory_split.py).
        "graphs_cut_for_memory": 0,
        # Dynamo graph breaks in frames compiled for torchtpu: reason -> breaks traced (the code
        # at each runs in eager PyTorch between graphs; graph_breaks.py).
        "graph_breaks": collections.Counter(),
        "resident_uploads": 0,       # parameters/buffers/constants uploaded (kept if aliased)
        "resident_copies": 0,        # ... of which were copies, made again at every call
        # Programs built per graph (static, per bucket, or per exact shape) and bucket use.
        "graphs": {},
        "buckets": {"compiles": 0, "hits": 0, "exact_shape_compiles": 0,
                    "padded_elements": 0, "real_elements": 0,
                    "built_ahead": 0},   # of the compiles: next buckets built in the background
        # Every cache (runtime/cache/levels.py), by name, then by level ("process", "disk",
        # "remote", and "all" for the cache as a whole): hits, misses, corrupt (damaged
        # entries discarded), untrusted (entries refused for their signature or owner), bytes
        # read and written, seconds saved. "all" holds the sums over the levels (``stats``
        # adds them), but for misses (lookups no level answered) and the cache's own events.
        "caches": {name: _cache_counters(events) for name, events in _cache_events.items()},
    }
    return stats


#: The levels of every cache, and what each counts there.
CACHE_LEVELS = ("process", "disk", "remote")
CACHE_COUNTERS = ("hits", "misses", "corrupt", "untrusted", "bytes_read", "bytes_written",
                  "seconds_saved")
_cache_events: dict = {}  # cache name -> its own counters (kept under "all")


def _cache_counters(events: tuple) -> dict:
    zero = {name: 0.0 if name == "seconds_saved" else 0 for name in CACHE_COUNTERS}
    counts = {level: dict(zero) for level in CACHE_LEVELS}
    counts["all"] = {"misses": 0, **{event: 0 for event in events}}
    return counts


def _with_sums(counts: dict) -> dict:
    """``counts`` of one cache with "all" complete: its counters summed over the levels."""
    events = dict(counts["all"])  # misses, and the cache's own counters
    summed = {name: events.pop(name) if name == "misses" else
              sum(counts[level][name] for level in CACHE_LEVELS) for name in CACHE_COUNTERS}
    return {**counts, "all": {**summed, **events}}


_stats = _fresh()  # the compile path's group (registered at the end) counts here


def add(name: str, value=1) -> None:
    """Add ``value`` to the counter ``name``.

    Example::

        add("graphs_compiled")
    """
    with _lock:
        _stats[name] += value


def declare_cache(name: str, events: tuple = ()) -> None:
    """Give the cache ``name`` its counters in ``stats()["caches"]`` (``events``: counters of
    its own, under "all"). Each ``Levels`` cache declares itself when it is made.

    Example::

        declare_cache("dynamo", events=("bypasses",))
    """
    with _lock:
        _cache_events[name] = tuple(events)
        _stats["caches"].setdefault(name, _cache_counters(tuple(events)))


def add_cache(name: str, changes: dict) -> None:
    """Add to counters of the cache ``name``: ``changes`` maps a level ("process", "disk",
    "remote"; "all" only for misses and the cache's events) to {counter: value}.

    Example::

        add_cache("lowering", {"process": {"misses": 1}, "disk": {"hits": 1}})
    """
    with _lock:
        counts = _stats["caches"][name]
        for level, values in changes.items():
            where = counts[level]
            for counter, value in values.items():
                where[counter] += value


def count_fallback(op_name: str) -> None:
    """Record one node of ``op_name`` that runs in eager PyTorch instead of through XLA."""
    with _lock:
        _stats["fallback_ops"][op_name] += 1


def count_graph_break(reason: str) -> None:
    """Record one Dynamo graph break (``reason``) in a frame compiled with torchtpu."""
    with _lock:
        _stats["graph_breaks"][reason] += 1


def _graph(name: str) -> dict:
    entry = _stats["graphs"].get(name)
    if entry is None:
        entry = _stats["graphs"][name] = {"compiles": 0, "bucket_hits": 0,
                                          "exact_shape_compiles": 0, "buckets": [],
                                          "padded_elements": 0, "real_elements": 0}
    return entry


def record_compile(graph: str, exact_shape: bool = False) -> None:
    """Count one program built for ``graph``; ``exact_shape``: one the buckets could not serve.

    Example::

        record_compile("graph_0/forward")
    """
    with _lock:
        entry = _graph(graph)
        entry["compiles"] += 1
        if exact_shape:
            entry["exact_shape_compiles"] += 1
            _stats["buckets"]["exact_shape_compiles"] += 1


def record_bucket_call(graph: str, bucket: tuple, new: bool, padded_elements: int,
                       real_elements: int, ahead: bool = False) -> None:
    """Count one call of ``graph`` served by ``bucket`` (a new one, or a hit) and its padding;
    ``ahead``: no call, ``bucket`` was built in the background (buckets/background.py)."""
    with _lock:
        entry = _graph(graph)
        totals = _stats["buckets"]
        if ahead:
            entry["compiles"] += 1
            entry["buckets"].append(list(bucket))
            totals["compiles"] += 1
            totals["built_ahead"] += 1
            return
        if new:
            entry["compiles"] += 1
            entry["buckets"].append(list(bucket))
            totals["compiles"] += 1
        else:
            entry["bucket_hits"] += 1
            totals["hits"] += 1
        for where in (entry, totals):
            where["padded_elements"] += padded_elements
            where["real_elements"] += real_elements


def _waste_pct(entry: dict) -> float:
    padded = entry["padded_elements"]
    return round(100.0 * (padded - entry["real_elements"]) / padded, 2) if padded else 0.0


def _report(snap: dict) -> None:
    snap["fallback_ops"] = dict(snap["fallback_ops"])
    snap["graph_breaks"] = dict(snap["graph_breaks"])
    snap["caches"] = {name: _with_sums(counts) for name, counts in snap["caches"].items()}
    # The executable cache's totals, under the names they had before there were other caches.
    executables = snap["caches"].get("executable", {}).get("all", {})
    snap["cache_hits"] = executables.get("hits", 0)
    snap["cache_misses"] = executables.get("misses", 0)
    # padding waste: % of the elements fed to bucketed programs that are padding
    for entry in list(snap["graphs"].values()) + [snap["buckets"]]:
        entry["padding_waste_pct"] = _waste_pct(entry)


register("compile", _fresh, report=_report, values=_stats)
# Functional collectives in compiled graphs, reported with tpu_dist's: graphs cut at a
# collective (which then runs through the process group) and collectives lowered into programs.
COLLECTIVES = register("compiled collectives", lambda: {"compiled_graph_collectives": 0,
                                                        "lowered_collectives": 0},
                       under="tpu_dist")
