"""The C library's log lines as records of Python's logging module (hearsay/log.h's callback).

Every line goes to the logger "hearsay" with the level mapped (error ERROR, warn WARNING, info
INFO, debug DEBUG, trace 5) and the peer it is about in the record: record.rank (the shard;
None before a node has joined) and record.peer (its id in the job). While neither "hearsay"
nor its ancestors have a handler (a program that never configured logging), the line is
written to stderr as the library writes it, so nothing is lost by default. The C level still
decides which lines exist: HEARSAY_LOG, or quiet=True (warn)."""
import atexit
import ctypes
import logging
import sys
import time
from typing import Any, Optional

LOGGER = logging.getLogger("hearsay")
TRACE = 5
_LEVELS = {0: logging.ERROR, 1: logging.WARNING, 2: logging.INFO, 3: logging.DEBUG, 4: TRACE}
_NAMES = {0: "error", 1: "warn", 2: "info", 3: "debug", 4: "trace"}
_NO_RANK = -1
_NO_PEER = 0xFFFFFFFF


class _Record(ctypes.Structure):
    _fields_ = [("level", ctypes.c_int), ("rank", ctypes.c_int), ("peer", ctypes.c_uint32),
                ("time", ctypes.c_double), ("message", ctypes.c_char_p)]


CALLBACK = ctypes.CFUNCTYPE(None, ctypes.POINTER(_Record), ctypes.c_void_p)


def _emit(rec_p: Any, user: Any) -> None:
    try:
        rec = rec_p.contents
        msg = (rec.message or b"").decode("utf-8", "replace")
        rank: Optional[int] = None if rec.rank == _NO_RANK else int(rec.rank)
        peer: Optional[int] = None if rec.peer == _NO_PEER else int(rec.peer)
        if not LOGGER.hasHandlers():
            t = time.localtime(rec.time)
            tag = f"peer {peer} " if peer is not None else ""
            sys.stderr.write(f"{time.strftime('%H:%M:%S', t)}.{int(rec.time * 1000) % 1000:03d} "
                             f"{tag}{_NAMES.get(rec.level, '?')}: {msg}\n")
            return
        level = _LEVELS.get(rec.level, logging.INFO)
        if not LOGGER.isEnabledFor(level):
            return
        r = LOGGER.makeRecord(LOGGER.name, level, "libhearsay", 0, msg, (), None,
                              extra={"rank": rank, "peer": peer})
        r.created = rec.time
        r.msecs = (rec.time * 1000) % 1000
        LOGGER.handle(r)
    except Exception:  # an exception must never cross into C
        pass


_callback = CALLBACK(_emit)  # kept alive for as long as the library may call it


def install(lib: Any) -> None:
    """Routes the library's lines to the "hearsay" logger (called once the library is loaded)."""
    logging.addLevelName(TRACE, "TRACE")
    lib.hs_log_set_callback.restype = None
    lib.hs_log_set_callback.argtypes = [CALLBACK, ctypes.c_void_p]
    lib.hs_log_set_callback(_callback, None)
    # A node's network thread may log while the interpreter shuts down: back to stderr first.
    atexit.register(lib.hs_log_set_callback, CALLBACK(0), None)
