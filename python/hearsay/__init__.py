"""hearsay: decentralized training from Python. `Node` gossips a float32 NumPy array or CPU
torch tensor in place through libhearsay.so.0; `hearsay.torch.Gossip` does it for a
torch.nn.Module's parameters; `hearsay.datasets` reads IDX files (Fashion-MNIST)."""
from .errors import (AuthError, Canceled, ConnectionFailed, Diverged, Error, Interrupted,
                     InvalidArgument, LibraryNotFound)
from .node import Node

__version__ = "0.1.0"
__all__ = ["Node", "Error", "InvalidArgument", "AuthError", "ConnectionFailed", "Diverged",
           "Canceled", "Interrupted", "LibraryNotFound", "library_path"]


def library_path() -> str:
    """The path of the loaded library (loads it if needed)."""
    from . import _lib

    path: str = _lib.lib()._hearsay_path
    return path
