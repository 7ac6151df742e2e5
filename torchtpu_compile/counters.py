"""Process-wide counters behind ``torchtpu_compile.stats()``."""
from __future__ import annotations

import collections
import copy
import threading

_lock = threading.Lock()


def _fresh() -> dict:
    stats = {
        "graphs_compiled": 0,        # XLA compilations (cache misses that reached PJRT compile)
        "xla_compile_seconds": 0.0,  # time spent in PJRT compile
        "lowering_seconds": 0.0,     # time spent in torch-mlir import and StableHLO passes
        "fallback_ops": collections.Counter(),   # op name -> nodes sent to eager PyTorch
        "graphs_with_fallback": 0,
        # Dynamo graph breaks in frames compiled for torchtpu: reason -> breaks traced (the code
        # at each runs in eager PyTorch between graphs; graph_breaks.py).
        "graph_breaks": collections.Counter(),
        "resident_uploads": 0,       # parameters/buffers/constants uploaded (kept if aliased)
        "resident_copies": 0,        # ... of which were copies, made again at every call
        # The eager tpu device (torchtpu_eager).
        "eager_programs_compiled": 0,    # single-op and fused programs built
        "eager_fallbacks": 0,            # ops run on the host because they do not lower
        "fused_graphs_run": 0,           # defer-and-fuse: deferred graphs executed
        "fused_graph_cache_hits": 0,     # ... of which had been compiled before
        # Programs built per graph (static, per bucket, or per exact shape) and bucket use.
        "graphs": {},
        "buckets": {"compiles": 0, "hits": 0, "exact_shape_compiles": 0,
                    "padded_elements": 0, "real_elements": 0},
        # Every cache (runtime/cache/levels.py), by name, then by level ("process", "disk",
        # "remote", and "all" for the cache as a whole): hits, misses, corrupt (damaged
        # entries discarded), untrusted (entries refused for their signature or owner), bytes
        # read and written, seconds saved. "all" holds the sums over the levels (``stats``
        # adds them), but for misses (lookups no level answered) and the cache's own events.
        "caches": {name: _cache_counters(events) for name, events in _cache_events.items()},
        # tpu_dist (torchtpu_eager.distributed): collectives and how they travelled.
        # pjrt_*: run as StableHLO collectives by the multi-process PJRT client;
        # host_staged_*: through host memory and gloo; host_staged_groups: groups whose client
        # could not be joined (every collective of theirs is staged);
        # compiled_graph_collectives: collectives a compiled graph is cut at (run through the
        # process group); lowered_collectives: collectives lowered inside compiled programs.
        "tpu_dist": {"collectives": 0, "pjrt_collectives": 0, "pjrt_bytes": 0,
                     "host_staged_collectives": 0, "host_staged_bytes": 0,
                     "host_staged_groups": 0, "functional_collectives": 0,
                     "compiled_graph_collectives": 0, "lowered_collectives": 0},
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


_stats = _fresh()


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


def add_dist(name: str, value=1) -> None:
    """Add to the tpu_dist counter ``name``.

    Example::

        add_dist("host_staged_collectives")
    """
    with _lock:
        _stats["tpu_dist"][name] += value


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
                       real_elements: int) -> None:
    """Count one call of ``graph`` served by ``bucket`` (a new one, or a hit) and its padding."""
    with _lock:
        entry = _graph(graph)
        totals = _stats["buckets"]
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


def stats() -> dict:
    """A snapshot of the compile path's counters.

    Example::

        >>> import torchtpu_compile
        >>> torchtpu_compile.stats()["graphs_compiled"]
        0
    """
    with _lock:
        snap = copy.deepcopy(_stats)
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
    return snap


def reset_stats() -> None:
    """Zero every counter (the compile cache itself is kept)."""
    global _stats
    with _lock:
        _stats = _fresh()
