"""waltz-py: a Python implementation of Waltz, the quorum-replicated, partitioned write-ahead log.

The public client API is re-exported here (docs/design/overview.md "Packages and their imports");
see :mod:`waltz.client`::

    from waltz import TransactionContext, WaltzClient, WaltzClientConfig

The client names are imported on first use, so that the storage and server processes, which import
``waltz.services``, do not pay for loading the client (gRPC, kazoo, pydantic) at start-up.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from waltz import errors
from waltz.errors import WaltzError
from waltz.tuning import tune_garbage_collector, tune_grpc_fork_support, tune_grpc_transport

if TYPE_CHECKING:
    from waltz.client import (
        AsyncWaltzClient,
        BytesSerializer,
        JsonSerializer,
        LockMode,
        Outcome,
        OutcomeKind,
        PartitionLocalLock,
        Serializer,
        Transaction,
        TransactionBuilder,
        TransactionContext,
        WaltzClient,
        WaltzClientCallbacks,
        WaltzClientConfig,
    )

__all__ = [
    "AsyncWaltzClient",
    "BytesSerializer",
    "JsonSerializer",
    "LockMode",
    "Outcome",
    "OutcomeKind",
    "PartitionLocalLock",
    "Serializer",
    "Transaction",
    "TransactionBuilder",
    "TransactionContext",
    "WaltzClient",
    "WaltzClientCallbacks",
    "WaltzClientConfig",
    "WaltzError",
    "__version__",
    "errors",
    "tune_garbage_collector",
    "tune_grpc_fork_support",
    "tune_grpc_transport",
]

__version__ = "0.1.0"

#: The names of ``__all__`` that this module does not define itself: the client's, imported on use.
_CLIENT_API = frozenset(__all__) - set(globals())


def __getattr__(name: str) -> object:
    if name in _CLIENT_API:
        import waltz.client

        value = getattr(waltz.client, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | _CLIENT_API)
