"""The coordination service of a joined PJRT world, in a process of its own, and each rank's
line to it (``Lifeline``): how a rank that dies becomes an exception on the others.

jax's distributed runtime (``pjrt_world``) has one coordination service that every process's
client talks to. When a client cannot reach it, or the service reports a dead task, the client
calls its "missed heartbeat" handler, and the default one ends the process with SIGABRT. The
handler cannot be replaced from Python in jaxlib 0.10.2: a Python callback is called with an
``absl::Status``, which has no Python conversion, and the failed conversion terminates the
process all the same. So the handler must never be called:

- the service runs here, in a process rank 0 starts (not in rank 0, where
  ``jax.distributed.initialize`` puts it): rank 0 dying no longer takes the service with it;
- it runs "recoverable": a rank that stops sending heartbeats is marked failed, and that is
  not propagated to the other ranks as a fatal error; nor does anyone wait at exit for the
  others (no shutdown barrier).

What the survivors do learn, at once, comes through their lifeline: every rank keeps a TCP
connection to this process, which the kernel closes however the rank ends (SIGKILL included).
When one closes, this process tells every other rank "gone RANK HOW" (``exited``: it said
goodbye at exit; ``died``: it did not), and the rank's ``Lifeline`` records it; the process
group then raises ``DistBackendError`` naming the rank at the next collective instead of
waiting on a peer that is gone. When every rank has gone, the service shuts down and this
process exits.

Not survived: the machine hosting rank 0 (and so this process) going away. The clients then
lose the service, and jax's handler aborts them as before.

Example::

    address, lifeline_port, process = start(num_processes=2, host="10.0.0.1", timeout=300)
    line = Lifeline("10.0.0.1", lifeline_port, rank=1)   # on every rank
    line.gone()            # {} while every rank lives; {0: "died"} once rank 0 is killed
"""
from __future__ import annotations

import os
import select
import socket
import subprocess
import sys
import threading
import time

#: How long a rank's lifeline may stay silent before TCP keepalive probes find a peer whose
#: machine went away without closing the connection (seconds: idle, interval, probes).
_KEEPALIVE = (10, 5, 3)


def start(num_processes: int, timeout: float, heartbeat_timeout: int,
          shutdown_timeout: int):
    """Start the coordinator process (rank 0 calls this); returns (service port, lifeline
    port, the Popen). Raises RuntimeError with the coordinator's own error if it fails."""
    command = [sys.executable, os.path.abspath(__file__), str(num_processes), str(int(timeout)),
               str(heartbeat_timeout), str(shutdown_timeout)]
    # Its own session: a signal meant for rank 0's process group does not reach it; it ends
    # by itself once every rank has gone. Nothing inherited keeps rank 0's pipes open.
    process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL, start_new_session=True, text=True)
    ready = [process.stdout]
    if not select.select(ready, [], [], timeout)[0]:
        process.kill()
        raise RuntimeError(f"tpu_dist: the coordinator process did not start within {timeout}s")
    line = process.stdout.readline().split()
    process.stdout.close()
    if len(line) != 3 or line[0] != "ready":
        process.wait(timeout=timeout)
        raise RuntimeError(f"tpu_dist: the coordinator process failed to start: "
                           f"{' '.join(line) or f'exit code {process.returncode}'}")
    return int(line[1]), int(line[2]), process


class Lifeline:
    """This rank's connection to the coordinator process: says which ranks have gone."""

    def __init__(self, host: str, port: int, rank: int, timeout: float = 60):
        self._gone: dict[int, str] = {}
        self._socket = socket.create_connection((host, port), timeout=timeout)
        self._socket.settimeout(None)
        _keep_alive(self._socket)
        self._socket.sendall(f"rank {rank}\n".encode())
        # A forked child (a DataLoader worker) must not hold the connection open after
        # this process ends: the others would hear of its death only when the child exits.
        os.register_at_fork(after_in_child=self._socket.close)
        threading.Thread(target=self._listen, name="tpu_dist lifeline", daemon=True).start()

    def gone(self) -> dict:
        """{rank: "exited" | "died"} of the ranks whose processes have ended; -1: the
        coordinator process itself is gone."""
        return dict(self._gone) if self._gone else {}

    def goodbye(self) -> None:
        """Tell the others this process is ending on purpose (at exit)."""
        try:
            self._socket.sendall(b"bye\n")
        except OSError:
            pass

    def _listen(self) -> None:
        for line in _lines(self._socket):
            word, rank, how = (line.split() + ["", "", ""])[:3]
            if word == "gone" and rank.lstrip("-").isdigit():
                self._gone[int(rank)] = how
        self._gone.setdefault(-1, "died")


def _keep_alive(s: socket.socket) -> None:
    s.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in zip(("TCP_KEEPIDLE", "TCP_KEEPINTVL", "TCP_KEEPCNT"), _KEEPALIVE):
        if hasattr(socket, name):
            s.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)


def _lines(s: socket.socket):
    """The lines received on ``s`` until it closes or fails."""
    pending = b""
    while True:
        try:
            data = s.recv(4096)
        except OSError:
            return
        if not data:
            return
        pending += data
        *lines, pending = pending.split(b"\n")
        yield from (line.decode(errors="replace") for line in lines)


# --- the coordinator process ---------------------------------------------------------------

def _listener() -> socket.socket:
    if socket.has_dualstack_ipv6():
        return socket.create_server(("", 0), family=socket.AF_INET6, dualstack_ipv6=True)
    return socket.create_server(("", 0))


def _free_port() -> int:
    with _listener() as s:
        return s.getsockname()[1]


def _serve(listener: socket.socket, num_processes: int, timeout: float) -> None:
    """Keep the lifelines until every rank has gone (or none came within ``timeout``)."""
    ranks: dict[socket.socket, int | None] = {}   # connection -> its rank (None: not said)
    leaving: set = set()
    pending: dict[socket.socket, bytes] = {}
    started = time.monotonic()
    joined = 0
    while ranks or (joined == 0 and time.monotonic() - started < timeout):
        readable, _, _ = select.select([listener, *ranks], [], [], 1.0)
        for s in readable:
            if s is listener:
                connection, _ = listener.accept()
                _keep_alive(connection)
                ranks[connection], pending[connection] = None, b""
                joined += 1
                continue
            try:
                data = s.recv(4096)
            except OSError:
                data = b""
            if data:
                pending[s] += data
                *lines, pending[s] = pending[s].split(b"\n")
                for line in lines:
                    word, _, value = line.decode(errors="replace").partition(" ")
                    if word == "rank" and value.isdigit():
                        ranks[s] = int(value)
                    elif word == "bye":
                        leaving.add(s)
                continue
            rank = ranks.pop(s)
            pending.pop(s)
            s.close()
            if rank is None:
                continue
            news = f"gone {rank} {'exited' if s in leaving else 'died'}\n".encode()
            leaving.discard(s)
            for other in list(ranks):
                try:
                    other.sendall(news)
                except OSError:
                    pass


def main(argv) -> None:
    num_processes, timeout, heartbeat, shutdown = (int(a) for a in argv)
    try:
        from jaxlib import _jax
        port = _free_port()
        service = _jax.get_distributed_runtime_service(
            f"[::]:{port}", num_processes, heartbeat_timeout=heartbeat,
            shutdown_timeout=shutdown, recoverable=True)
        listener = _listener()
    except Exception as exc:  # told to rank 0, which raises it
        print(f"error {type(exc).__name__}: {exc}".replace("\n", " "), flush=True)
        sys.exit(1)
    print(f"ready {port} {listener.getsockname()[1]}", flush=True)
    _serve(listener, num_processes, timeout)
    service.shutdown()


if __name__ == "__main__":
    # Run as a script: its directory is not a package path (a sibling module must not
    # shadow one that jaxlib imports).
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    main(sys.argv[1:])
