"""Exceptions carrying the C library's error: its code (negative HS_E*), symbolic name and the
sentence that names what was wrong (hs_error_message)."""
import errno
from typing import Dict, Type


class Error(Exception):
    """A hearsay call failed. `code` is the negative HS_E* value, `name` its symbol
    ("HS_EAUTH"), `message` the C library's sentence, `call` the C function."""

    def __init__(self, code: int, name: str, message: str, call: str = "") -> None:
        super().__init__(f"{message} [{name}]" if name else message)
        self.code = code
        self.name = name
        self.message = message
        self.call = call


class InvalidArgument(Error, ValueError):
    """HS_EINVAL: a bad option name or value, or arguments that do not fit together."""


class AuthError(Error):
    """HS_EAUTH or HS_ETLS: the peer could not authenticate (wrong secret, certificate)."""


class ConnectionFailed(Error, ConnectionError):
    """The job could not be reached or refused this peer (refused, reset, timed out, mismatched
    configuration, protocol error)."""


class Diverged(Error):
    """HS_EDIVERGED: the convergence guard stopped the run."""


class Canceled(Error):
    """HS_ECANCELED: removed from the job and could not rejoin."""


class Interrupted(Error):
    """HS_EINTR: a stop request (request_stop, a signal) was honoured."""


class LibraryNotFound(ImportError):
    """libhearsay.so.0 could not be loaded."""


# Values from include/hearsay/error.h (errno-based ones are -errno on Linux).
EINVAL = -errno.EINVAL
ERANGE = -errno.ERANGE
ECANCELED = -errno.ECANCELED
EPROTO = -4001
ETLS = -4002
EMISMATCH = -4005
EDIVERGED = -4006
EAUTH = -4007
EINTR = -4008

_by_code: Dict[int, Type[Error]] = {
    EINVAL: InvalidArgument,
    EAUTH: AuthError,
    ETLS: AuthError,
    -errno.ECONNREFUSED: ConnectionFailed,
    -errno.ECONNRESET: ConnectionFailed,
    -errno.ETIMEDOUT: ConnectionFailed,
    -errno.EPIPE: ConnectionFailed,
    EMISMATCH: ConnectionFailed,
    EPROTO: ConnectionFailed,
    EDIVERGED: Diverged,
    ECANCELED: Canceled,
    EINTR: Interrupted,
}


def from_code(code: int, name: str, message: str, call: str = "") -> Error:
    return _by_code.get(code, Error)(code, name, message, call)
