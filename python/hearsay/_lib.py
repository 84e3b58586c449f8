"""Finds and loads libhearsay.so.0 and declares the node API's C signatures (include/hearsay/node.h).

Loading is lazy (first use), so `import hearsay` works on a machine without the library and the
error names every place that was tried."""
import ctypes
import ctypes.util
import os
import threading
from typing import Any, List, Optional

from . import errors

_lock = threading.Lock()
_lib: Optional[Any] = None  # the ctypes.CDLL, with _hearsay_path set

_c_float_p = ctypes.POINTER(ctypes.c_float)


def _candidates() -> List[str]:
    env = os.environ.get("HEARSAY_LIB")
    if env:
        # An explicit choice is the only one tried: falling back would hide a wrong path.
        return [env]
    here = os.path.dirname(os.path.abspath(__file__))
    # An installed wheel carries its own copy beside the modules.
    out = [os.path.join(here, "libhearsay.so")]
    # The package inside a source checkout (python/hearsay/): the meson build directories beside it.
    root = os.path.dirname(os.path.dirname(here))
    for b in ("build", "builddir"):
        out.append(os.path.join(root, b, "libhearsay.so.0"))
    found = ctypes.util.find_library("hearsay")
    if found:
        out.append(found)
    out.append("libhearsay.so.0")  # the dynamic loader's own search (LD_LIBRARY_PATH, ld.so.cache)
    return out


def _declare(lib: Any) -> None:
    P = ctypes.c_void_p
    sig = {
        "hs_node_options_new": (ctypes.c_int, [ctypes.POINTER(P)]),
        "hs_node_options_set": (ctypes.c_int, [P, ctypes.c_char_p, ctypes.c_char_p]),
        "hs_node_options_free": (None, [P]),
        "hs_node_new": (ctypes.c_int, [ctypes.POINTER(P), P, ctypes.c_size_t]),
        "hs_node_start": (ctypes.c_int, [P, _c_float_p, ctypes.c_size_t]),
        "hs_node_step": (ctypes.c_int, [P, _c_float_p, ctypes.c_size_t]),
        "hs_node_round": (ctypes.c_uint64, [P]),
        "hs_node_id": (ctypes.c_uint32, [P]),
        "hs_node_rank": (ctypes.c_int, [P]),
        "hs_node_report": (None, [P, ctypes.c_double, ctypes.c_double]),
        "hs_node_metrics_json": (ctypes.c_int, [P, ctypes.c_char_p, ctypes.c_size_t]),
        "hs_node_leave": (ctypes.c_int, [P]),
        "hs_node_free": (None, [P]),
        "hs_node_request_stop": (None, [P, ctypes.c_int]),
        "hs_node_checkpoint": (ctypes.c_int, [P, ctypes.c_char_p]),
        "hs_algo_kind_parse": (ctypes.c_int, [ctypes.c_char_p, ctypes.POINTER(ctypes.c_int)]),
        "hs_algo_cfg_default": (None, [ctypes.c_void_p]),
        "hs_algo_kind_name": (ctypes.c_char_p, [ctypes.c_int]),
        "hs_algo_kind_qg_momentum": (ctypes.c_int, [ctypes.c_int]),
        "hs_error_message": (ctypes.c_char_p, []),
        "hs_err_name": (ctypes.c_char_p, [ctypes.c_int]),
        "hs_strerror": (ctypes.c_char_p, [ctypes.c_int]),
    }
    for name, (res, args) in sig.items():
        f = getattr(lib, name)  # AttributeError: a library older than this package
        f.restype = res
        f.argtypes = args


def lib() -> Any:
    """The loaded library with its signatures declared; raises hearsay.LibraryNotFound."""
    global _lib
    with _lock:
        if _lib is not None:
            return _lib
        tried = []
        for path in _candidates():
            if os.sep in path and not os.path.exists(path):
                tried.append(f"{path} (absent)")
                continue
            try:
                cand: Any = ctypes.CDLL(path)
                _declare(cand)
            except (OSError, AttributeError) as e:
                tried.append(f"{path} ({e})")
                continue
            _lib = cand
            from . import _log

            _log.install(_lib)
            _lib._hearsay_path = path
            return _lib
        raise errors.LibraryNotFound(
            "libhearsay.so.0 not found or too old; set HEARSAY_LIB to its path. Tried: "
            + "; ".join(tried))


def default_algo() -> str:
    """The algorithm a node runs when none is given (hs_algo_cfg_default's)."""
    L = lib()
    # hs_algo_cfg's first member is its kind (an enum, an int); the buffer is far larger than
    # the struct, so the call writes inside it whatever the struct grows to.
    buf = (ctypes.c_int * 1024)()
    L.hs_algo_cfg_default(ctypes.cast(buf, ctypes.c_void_p))
    return str((L.hs_algo_kind_name(buf[0]) or b"").decode())


def check(rc: int, what: str) -> int:
    """Raises the hearsay.Error subclass of a negative return code, with the C message of the
    calling thread (call it on the thread that made the failing call); returns rc otherwise."""
    if rc >= 0:
        return rc
    L = lib()
    msg = (L.hs_error_message() or b"").decode("utf-8", "replace")
    name = (L.hs_err_name(rc) or b"").decode("ascii", "replace")
    raise errors.from_code(rc, name, msg or (L.hs_strerror(rc) or b"").decode(), what)
