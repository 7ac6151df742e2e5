"""The ``torchtpu`` logger, its ``TORCH_LOGS``-style switch, and one-time warnings."""
from __future__ import annotations

import logging
import os

log = logging.getLogger("torchtpu")

_LEVELS = {"+torchtpu": logging.DEBUG, "torchtpu": logging.INFO, "-torchtpu": logging.ERROR}


def _apply_torch_logs() -> None:
    # TORCH_LOGS="+torchtpu" (debug), "torchtpu" (info) or "-torchtpu" (errors only), like
    # PyTorch's own components; without it the logger keeps Python's default (warnings).
    for item in os.environ.get("TORCH_LOGS", "").split(","):
        level = _LEVELS.get(item.strip())
        if level is not None:
            log.setLevel(level)
            if not log.handlers:
                handler = logging.StreamHandler()
                handler.setFormatter(logging.Formatter("[torchtpu] %(levelname)s %(message)s"))
                log.addHandler(handler)


_apply_torch_logs()

_warned: set = set()


def warn_once(key, message: str, *args) -> None:
    """Log ``message`` at WARNING level the first time ``key`` is seen in this process.

    Example::

        warn_once(("fallback", "aten.nonzero"), "falling back to eager for %s", "aten.nonzero")
    """
    _log_once(logging.WARNING, key, message, *args)


def info_once(key, message: str, *args) -> None:
    """Log ``message`` at INFO level the first time ``key`` is seen (a hint, not a problem).

    Example::

        info_once(("copied", "cpu"), "a weight is copied at every call: %s", "float32[3, 4]")
    """
    _log_once(logging.INFO, key, message, *args)


def _log_once(level: int, key, message: str, *args) -> None:
    if key in _warned:
        return
    _warned.add(key)
    log.log(level, message, *args)
