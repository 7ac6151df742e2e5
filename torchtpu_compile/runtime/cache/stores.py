"""Where cache entries live: a folder on the host disk and an optional remote store, and
whether this process may trust what it finds there.

A store holds framed entries (``frame.py``) by key. Trust: entries are code (a PJRT executable
is machine code on CPU and GPU, an aot_autograd or Dynamo entry is a pickle, a StableHLO entry
decides what a graph computes), so a store is used only if nobody else can put entries in it: a
folder owned by this user (or root) that no other user can write, nor any folder above it
(``writable_by_others``); or any store when ``config.cache_key`` (``TORCHTPU_CACHE_KEY``, a
secret shared by the people who share a cache) is set, in which case every entry is signed with
HMAC-SHA256 under that key and an entry without a valid signature is refused (``frame.py``). A
store that fails both is left out with one warning, and work goes on without it. So does a store
that cannot be created, read or written: ``fetch`` and ``store_entry`` turn every such failure
into a miss and one warning per store.

Example::

    store = DiskStore("/tmp/torchtpu-cache", max_bytes=1 << 30)
    store.put("key", pack(b"...", "key", compute_seconds=1.2))
    found = fetch(store, "key", "lowering")   # (blob, payload, header), or why not
"""
from __future__ import annotations

import atexit
import hashlib
import os
import queue
import stat
import tempfile
import threading

from ..._logging import log, warn_once
from .frame import CorruptEntry, StaleEntry, UntrustedEntry, entry_name, signing_key, unpack


# --- who may write a folder ----------------------------------------------------------------

def _private_group(gid: int) -> bool:
    """Whether group ``gid`` is this user's own (the user-private-group convention)."""
    try:
        import grp
        import pwd
        user = pwd.getpwuid(os.geteuid())
        group = grp.getgrgid(gid)
    except (ImportError, KeyError):
        return False
    return gid == user.pw_gid and group.gr_name == user.pw_name and \
        set(group.gr_mem) <= {user.pw_name}


def writable_by_others(directory: str) -> str | None:
    """Why a user other than this one (or root) could put files in ``directory``, or None.

    The folder must be owned by us (or root) and writable by nobody else; each folder above it
    too, unless it has the sticky bit (as /tmp has), since whoever can write one of them can
    put another folder in its place. Group write is allowed to a group that is ours alone.

    Example::

        writable_by_others(os.path.expanduser("~/.cache/torchtpu"))   # None: ours alone
    """
    if not hasattr(os, "geteuid"):
        return None  # no POSIX ownership to check
    trusted = {os.geteuid(), 0}
    path = os.path.realpath(directory)
    first = True
    while True:
        st = os.stat(path)
        if st.st_uid not in trusted:
            return f"{path} is owned by uid {st.st_uid}, not by this user"
        others = st.st_mode & 0o002 or (st.st_mode & 0o020 and not _private_group(st.st_gid))
        if others and (first or not st.st_mode & stat.S_ISVTX):
            return f"{path} is writable by other users (mode {stat.S_IMODE(st.st_mode):o})"
        parent = os.path.dirname(path)
        if parent == path:
            return None
        path, first = parent, False


# --- stores --------------------------------------------------------------------------------

class DiskStore:
    """Entries as files in one directory; atomic writes, least-recently-used eviction.

    ``get`` and ``put`` raise OSError when the folder cannot be read or written; callers go
    through ``fetch`` and ``store_entry``, which turn that into a miss and one warning.
    """

    level = "disk"
    #: Eviction deletes down to this share of ``max_bytes``, so that the writes which follow
    #: do not each find the folder full again.
    LOW_WATER = 0.9
    #: Bytes this process may write between two listings of the folder (as a share of
    #: ``max_bytes``): other processes' writes are seen at the next listing.
    RESCAN_SHARE = 0.1

    def __init__(self, directory: str, max_bytes: int, root: str | None = None):
        self.directory = os.path.expanduser(directory)
        self.root = root or self.directory  # the configured folder, named in warnings
        self.max_bytes = max_bytes
        # The folder's bytes at the last listing, and what this process wrote since: each put
        # listed and stat-ed every entry, which over a folder of 100,000 entries (weeks of
        # eager ops) took 0.5 s a put, most of an eager op's first call.
        self._listed_bytes = None
        self._written_since = 0
        os.makedirs(self.directory, mode=0o700, exist_ok=True)

    def _path(self, key: str) -> str:
        return os.path.join(self.directory, entry_name(key))

    def get(self, key: str) -> bytes | None:
        path = self._path(key)
        try:
            with open(path, "rb") as f:
                owner = os.fstat(f.fileno()).st_uid
                blob = f.read()
        except FileNotFoundError:
            return None
        if signing_key() is None and hasattr(os, "geteuid") and owner not in (os.geteuid(), 0):
            raise UntrustedEntry(f"{path} belongs to uid {owner}, not to this user")
        try:
            os.utime(path)  # recency for LRU eviction
        except OSError:
            pass
        return blob

    def put(self, key: str, blob: bytes) -> None:
        # A temp file in the same directory, then an atomic rename: readers in other processes
        # see the old entry, no entry, or the whole new one, never a part.
        fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(blob)
            os.replace(tmp, self._path(key))
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
        self._written_since += len(blob)
        if self._listed_bytes is None or \
                self._listed_bytes + self._written_since > self.max_bytes or \
                self._written_since > self.max_bytes * self.RESCAN_SHARE:
            self.evict()

    def discard(self, key: str) -> None:
        try:
            os.unlink(self._path(key))
        except OSError:
            pass

    def evict(self) -> None:
        """List the folder and, where it holds more than ``max_bytes``, delete
        least-recently-used entries until it holds ``LOW_WATER`` of it. ``put`` calls it on
        its first write and then only once its own writes may have filled the folder.

        Example::

            DiskStore("/tmp/torchtpu-cache", max_bytes=1 << 30).evict()
        """
        entries = []
        try:
            names = os.listdir(self.directory)
        except OSError as exc:  # the entry is written; eviction waits for a readable folder
            log.debug("torchtpu: cache folder %s not listed for eviction: %s",
                      self.directory, exc)
            return
        for name in names:
            if not name.endswith(".xla"):
                continue
            path = os.path.join(self.directory, name)
            try:
                st = os.stat(path)
            except OSError:
                continue  # removed meanwhile by another process
            entries.append((st.st_mtime, st.st_size, path))
        total = sum(size for _, size, _ in entries)
        if total > self.max_bytes:
            for _, size, path in sorted(entries):
                if total <= self.max_bytes * self.LOW_WATER:
                    break
                try:
                    os.unlink(path)
                    total -= size
                except OSError:
                    pass
        self._listed_bytes, self._written_since = total, 0


def _warn_store(store, kind, message: str, *args) -> None:
    """One warning per store root and kind of trouble ("io", "untrusted", or ("corrupt", what):
    which cache holds damaged entries is worth knowing)."""
    warn_once(("cache", kind, store.level, store.root), message, *args)


def fetch(store, key: str, what: str):
    """The entry under ``key`` in ``store`` as (framed blob, payload, header), or, where there
    is none to use, why: "missing", "unreadable", "corrupt" or "untrusted". Warns once per
    store and reason; a corrupt entry is discarded.

    Example::

        found = fetch(store, key, "lowering")
        if isinstance(found, tuple):
            blob, payload, meta = found
    """
    try:
        blob = store.get(key)
    except OSError as exc:
        _warn_store(store, "io", "torchtpu: %s cache at %s cannot be read (%s); its entries "
                    "are computed again (warned once)", store.level, store.root, exc)
        return "unreadable"
    except UntrustedEntry as exc:
        _warn_store(store, "untrusted", "torchtpu: %s cache entry not used: %s (warned once)",
                    store.level, exc)
        return "untrusted"
    if blob is None:
        return "missing"
    try:
        payload, meta = unpack(blob, key)
    except StaleEntry:
        store.discard(key)  # an upgrade's leftover: computed again and written anew
        return "missing"
    except UntrustedEntry as exc:
        # Not discarded: on a shared store it may be a colleague's, signed with their key.
        _warn_store(store, "untrusted", "torchtpu: %s %s cache entry at %s not used: %s; "
                    "computing it again (warned once)", store.level, what, store.root, exc)
        return "untrusted"
    except CorruptEntry as exc:
        discard_corrupt(store, key, what, exc)
        return "corrupt"
    return blob, payload, meta


def discard_corrupt(store, key: str, what: str, reason) -> None:
    """Discard the entry under ``key`` in ``store``, which is damaged: its frame, or its
    payload, does not decode (``reason``). Warns once per store."""
    _warn_store(store, ("corrupt", what), "torchtpu: discarding corrupt %s cache entry (%s) at "
                "%s: %s; computing it again (warned once)", store.level, what, store.root,
                reason)
    store.discard(key)


def store_entry(store, key: str, blob: bytes, what: str) -> bool:
    """Write ``blob`` to ``store``; False, with one warning per store, where it cannot."""
    try:
        store.put(key, blob)
        return True
    except OSError as exc:
        _warn_store(store, "io", "torchtpu: %s cache at %s cannot be written (%s); running "
                    "without storing %s entries there (warned once)", store.level, store.root,
                    exc, what)
        return False


#: How long a process that exits waits for its queued remote-cache writes.
_EXIT_FLUSH_SECONDS = 60


class RemoteStore:
    """A shared store at a URL: ``file://`` directly, other schemes through fsspec if present.

    Reads are synchronous and raise OSError when the store cannot be read (``fetch`` makes that
    a miss); writes go to a background thread, and every failure is logged once and swallowed:
    the remote can make compiles faster, never make them fail.
    """

    level = "remote"

    def __init__(self, url: str, root: str | None = None):
        self.url = url.rstrip("/")
        self.root = root or self.url
        if url.startswith("file://"):
            self._disk = DiskStore(url[len("file://"):], max_bytes=1 << 62)
            self._fs = None
        else:
            self._disk = None
            try:
                import fsspec
            except ImportError as exc:
                raise ValueError(
                    f"TORCHTPU_REMOTE_CACHE={url!r} needs fsspec (and its {url.split(':')[0]} "
                    f"plugin): pip install fsspec gcsfs / s3fs, or use a file:// URL") from exc
            self._fs, self._root = fsspec.core.url_to_fs(self.url)
        self._writes: queue.Queue = queue.Queue()
        self._writer = threading.Thread(target=self._write_loop, daemon=True,
                                        name="torchtpu-remote-cache")
        self._writer.start()
        # The writer is a daemon thread: without this, entries still queued at exit are lost.
        atexit.register(self._flush_at_exit)

    @property
    def directory(self) -> str | None:
        """The folder of a ``file://`` remote (whose permissions can be checked), else None."""
        return self._disk.directory if self._disk is not None else None

    def get(self, key: str) -> bytes | None:
        if self._disk is not None:
            return self._disk.get(key)
        try:
            path = f"{self._root}/{entry_name(key)}"
            if not self._fs.exists(path):
                return None
            with self._fs.open(path, "rb") as f:
                return f.read()
        except OSError:
            raise
        except Exception as exc:  # fsspec plugins raise their own types
            raise OSError(f"{type(exc).__name__}: {exc}") from exc

    def put(self, key: str, blob: bytes) -> None:
        self._writes.put((key, blob))

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until queued writes are done (tests and clean shutdown); False if ``timeout``
        seconds passed first."""
        done = self._writes.all_tasks_done
        with done:
            return done.wait_for(lambda: not self._writes.unfinished_tasks, timeout)

    def _flush_at_exit(self) -> None:
        if not self.flush(timeout=_EXIT_FLUSH_SECONDS):
            log.warning("torchtpu: %d compile cache entries were not written to %s before exit "
                        "(gave up after %d s)", self._writes.unfinished_tasks, self.url,
                        _EXIT_FLUSH_SECONDS)

    def discard(self, key: str) -> None:
        try:
            if self._disk is not None:
                self._disk.discard(key)
            else:
                self._fs.rm(f"{self._root}/{entry_name(key)}")
        except Exception as exc:
            log.warning("torchtpu: could not remove a corrupt remote cache entry: %s", exc)

    def _write_loop(self) -> None:
        while True:
            key, blob = self._writes.get()
            try:
                if self._disk is not None:
                    self._disk.put(key, blob)
                else:
                    tmp = f"{self._root}/.tmp-{os.getpid()}-{entry_name(key)}"
                    with self._fs.open(tmp, "wb") as f:
                        f.write(blob)
                    self._fs.mv(tmp, f"{self._root}/{entry_name(key)}")
            except Exception as exc:
                _warn_store(self, "io", "torchtpu: remote compile cache %s write failed: %s "
                            "(warned once)", self.url, exc)
            finally:
                self._writes.task_done()


_configured_lock = threading.Lock()
_configured: dict = {}


def _untrusted_reason(directory: str | None) -> str | None:
    """Why entries in ``directory`` (None: a remote that is no local folder) cannot be trusted
    as they are, or None: a folder only we can write needs no more; any other store needs
    signed entries (``config.cache_key``)."""
    if signing_key() is not None:
        return None
    if directory is None:
        return "a remote store others may write (set TORCHTPU_CACHE_KEY to a secret shared " \
               "by the people who share it: entries are then signed and checked)"
    try:
        reason = writable_by_others(directory)
    except OSError as exc:
        return f"its permissions cannot be read ({exc})"
    if reason is None:
        return None
    return f"{reason}; an entry there is code this process would run. Make it yours alone " \
           f"(chown, chmod go-w), point TORCHTPU_CACHE_DIR elsewhere, or set " \
           f"TORCHTPU_CACHE_KEY to sign and check entries"


def _open_store(make, level: str, root: str, folder: str | None):
    """The store ``make()`` builds, or None with one warning per root (its executables and
    graphs/ alike) where it cannot be built or cannot be trusted. ``folder``: the root's local
    folder (None for an fsspec remote), checked before anything is created in it."""
    def refuse(reason: str):
        warn_once(("cache", "untrusted", level, root), "torchtpu: %s compile cache at %s not "
                  "used: %s", level, root, reason)

    reason = _untrusted_reason(folder) if folder is None or os.path.isdir(folder) else None
    if reason is not None:
        return refuse(reason)
    try:
        store = make()
    except Exception as exc:  # an unusable cache (or misconfigured remote) must not stop work
        warn_once(("cache", "io", level, root), "torchtpu: %s compile cache at %s cannot be "
                  "used (%s); running without it", level, root, exc)
        return None
    reason = _untrusted_reason(store.directory)  # the folder itself, now that it exists
    if reason is not None:
        return refuse(reason)
    return store


def configured_stores(subdir: str | None = None) -> list:
    """The disk and remote stores ``config`` asks for now, under ``subdir`` of each root.

    Built once per configuration and subdir, and shared by the caches that use that subdir
    (``levels.py``: executables at the roots, the caches above them in ``graphs/``). A store
    that cannot be created, or whose entries cannot be trusted (module docstring), is left out
    with one warning, never fatal.

    Example::

        for store in configured_stores("graphs"):
            blob = store.get(key)
    """
    from ... import config
    key = signing_key()
    wanted = (subdir, config.cache_dir, config.cache_max_bytes, config.remote_cache,
              None if key is None else hashlib.sha256(key).hexdigest())
    with _configured_lock:
        stores = _configured.get(wanted)
        if stores is not None:
            return stores
        stores = []
        if config.cache_dir:
            root = os.path.expanduser(config.cache_dir)
            directory = root if subdir is None else os.path.join(root, subdir)
            stores.append(_open_store(
                lambda: DiskStore(directory, config.cache_max_bytes, root=root), "disk", root,
                root))
        if config.remote_cache:
            url = config.remote_cache if subdir is None else \
                f"{config.remote_cache.rstrip('/')}/{subdir}"
            folder = config.remote_cache[len("file://"):] \
                if config.remote_cache.startswith("file://") else None
            stores.append(_open_store(lambda: RemoteStore(url, root=config.remote_cache),
                                      "remote", config.remote_cache, folder))
        stores = [store for store in stores if store is not None]
        for old in [k for k in _configured if k[0] == subdir]:
            del _configured[old]  # one configuration per subdir at a time, as before
        _configured[wanted] = stores
        return stores


def flush_writes(timeout: float | None = None) -> bool:
    """Wait until every remote store built so far has written its queued entries (tests, and
    processes that hand their cache to another right away); False if ``timeout`` passed first.

    Example::

        flush_writes()   # every entry this process stored is on the remote now
    """
    with _configured_lock:
        stores = [store for group in _configured.values() for store in group]
    return all(store.flush(timeout) for store in stores if hasattr(store, "flush"))
