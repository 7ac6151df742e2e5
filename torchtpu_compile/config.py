"""User-facing settings of the compile path.

Each setting has an environment variable that gives its default at import time; assigning the
attribute at run time wins over the variable.

Example::

    import torchtpu_compile
    torchtpu_compile.config.matmul_precision = "highest"   # fp32 matmuls, even on TPU
    torchtpu_compile.config.strict = True                  # an op that cannot lower is an error
"""
from __future__ import annotations

import os


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


#: "tpu", "cuda" or "cpu"; None picks the best platform present. Read once, when the PJRT
#: client is first needed (env: TORCHTPU_PLATFORM).
platform: str | None = os.environ.get("TORCHTPU_PLATFORM") or None

#: "medium", "high", "highest", or None to follow ``torch.set_float32_matmul_precision`` when the
#: user has set it, and "medium" (the TPU default) otherwise (env: TORCHTPU_MATMUL_PRECISION).
matmul_precision: str | None = os.environ.get("TORCHTPU_MATMUL_PRECISION") or None

#: Make every eager fallback an error naming the op, its shapes and the source line
#: (env: TORCHTPU_STRICT=1).
strict: bool = _env_flag("TORCHTPU_STRICT")


#: Check tensor indices (x[i], embedding, gather, scatter, index_select, ...) against their
#: dim as eager does, raising its IndexError/RuntimeError instead of letting XLA clamp them;
#: read when a program is built (env: TORCHTPU_CHECK_INDICES=0 turns it off).
check_indices: bool = os.environ.get("TORCHTPU_CHECK_INDICES", "1").strip().lower() not in (
    "0", "off", "false", "no")


def _cache_dir_default() -> str | None:
    value = os.environ.get("TORCHTPU_CACHE_DIR")
    if value is None or value == "":
        return os.path.join(os.path.expanduser("~"), ".cache", "torchtpu")
    return None if value.strip().lower() in ("0", "off", "none", "false") else value


#: Level 2 of the compile cache, on host disk; None turns it off
#: (env: TORCHTPU_CACHE_DIR, "off" to disable; default ~/.cache/torchtpu).
cache_dir: str | None = _cache_dir_default()

#: Size cap of the disk cache; least-recently-used entries go first
#: (env: TORCHTPU_CACHE_MAX_BYTES, default 4 GiB).
cache_max_bytes: int = int(os.environ.get("TORCHTPU_CACHE_MAX_BYTES", 4 << 30))

#: Level 3: a shared store, ``file:///path`` or any fsspec URL such as ``gs://bucket/dir``;
#: None turns it off (env: TORCHTPU_REMOTE_CACHE).
remote_cache: str | None = os.environ.get("TORCHTPU_REMOTE_CACHE") or None

#: A secret shared by the people who share a compile cache (a team's remote, a group-writable
#: folder): every entry is then signed with HMAC-SHA256 under it, and entries not signed with it
#: are refused. Without it, only a folder no other user can write is used, and a remote that is
#: not such a ``file://`` folder is not used at all (env: TORCHTPU_CACHE_KEY).
cache_key: str | None = os.environ.get("TORCHTPU_CACHE_KEY") or None

#: Cache above the StableHLO too: aot_autograd's result per Dynamo graph (so a warm process skips
#: AOT tracing and decomposition) and the StableHLO per FX graph (so it skips torch-mlir); both
#: live beside the executables, at the same levels (env: TORCHTPU_GRAPH_CACHE=0 turns it off).
graph_cache: bool = os.environ.get("TORCHTPU_GRAPH_CACHE", "1").strip().lower() not in (
    "0", "off", "false", "no")

#: Cache Dynamo's own output too (bytecode, guards rebuilt against live objects), so that a
#: warm process skips tracing the model's Python code; experimental, off by default
#: (env: TORCHTPU_DYNAMO_CACHE=1; see dynamo_cache.py for what it refuses to cache).
dynamo_cache: bool = _env_flag("TORCHTPU_DYNAMO_CACHE")

#: Bounded dynamism: a dim that Dynamo reports dynamic is served by a few padded buckets, each
#: compiled once; False compiles once per concrete size instead (env: TORCHTPU_BUCKETS=0).
buckets: bool = os.environ.get("TORCHTPU_BUCKETS", "1").strip().lower() not in (
    "0", "off", "false", "no")

#: How a real size maps to its bucket: "pow2-128" (powers of two up to 128, multiples of 128
#: above), "pow2", "multiple-N", a ladder "16,64,256", or a callable size -> bucket
#: (env: TORCHTPU_BUCKET_POLICY).
bucket_policy = os.environ.get("TORCHTPU_BUCKET_POLICY") or "pow2-128"

#: The smallest bucket of the power-of-two policies (env: TORCHTPU_BUCKET_MIN).
bucket_min: int = int(os.environ.get("TORCHTPU_BUCKET_MIN", 8))

#: Programs one graph may compile for its buckets; past it, sizes reuse a covering bucket and
#: only a size beyond every bucket compiles a new one, with a log line
#: (env: TORCHTPU_MAX_BUCKETS).
max_buckets: int = int(os.environ.get("TORCHTPU_MAX_BUCKETS", 8))
