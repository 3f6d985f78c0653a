"""The Waltz client that applications embed (docs/design/client.md "The client's parts").

Public API (also re-exported from :mod:`waltz`): :class:`WaltzClient`, :class:`AsyncWaltzClient`,
:class:`WaltzClientConfig`, :class:`WaltzClientCallbacks`, :class:`TransactionContext`,
:class:`TransactionBuilder`, :class:`Transaction`, :class:`Outcome` (with :class:`OutcomeKind`),
:class:`PartitionLocalLock`, :class:`LockMode`, :class:`Serializer` (with :class:`BytesSerializer` and
:class:`JsonSerializer`).

Modules: ``client`` (the two facades), ``core`` (partitions, discovery, server messages),
``attempt_runner`` (the attempt path, from ``submit`` to a context's outcome), ``in_flight`` (the
contexts in flight and their concurrency slots), ``submission`` (a context's attempts and its
outcome), ``client_partition`` (a partition: the feed and its parts), ``mount_procedure`` (mount
state and mounts), ``feed_window`` (apply flow control), ``pending_appends`` (appends on their way),
``lock_holds`` and ``lock_claims`` (locks of own appends in flight, claims of first attempts),
``monitor`` (the transaction monitor), ``event_loop`` (the process's client loop thread),
``connection`` (one stream per server), ``connection_pool`` (network clients by endpoint),
``transaction_data`` (the data RPC), ``discovery`` (ZooKeeper), ``apply_worker`` (ordered
``apply_transaction``), ``metrics`` (Prometheus), ``context``, ``locks``, ``transaction``,
``callbacks``, ``config``, ``waiting``, ``outcome`` (what ``submit`` resolves to).
"""

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from waltz.client.callbacks import WaltzClientCallbacks
    from waltz.client.client import AsyncWaltzClient, WaltzClient
    from waltz.client.config import WaltzClientConfig
    from waltz.client.context import (
        BytesSerializer,
        JsonSerializer,
        Serializer,
        TransactionBuilder,
        TransactionContext,
    )
    from waltz.client.locks import LockMode, PartitionLocalLock, lock_hash
    from waltz.client.outcome import Outcome, OutcomeKind
    from waltz.client.transaction import Transaction

#: Public name -> the module that defines it. The package imports a module when one of its names
#: is first used, so a process that needs one small part (``locks``'s lock hashes, in a Spark task
#: or the SQL framework's entity declarations) does not load the client (gRPC, kazoo, pydantic).
_EXPORTS: dict[str, str] = {
    "AsyncWaltzClient": "waltz.client.client",
    "BytesSerializer": "waltz.client.context",
    "JsonSerializer": "waltz.client.context",
    "LockMode": "waltz.client.locks",
    "Outcome": "waltz.client.outcome",
    "OutcomeKind": "waltz.client.outcome",
    "PartitionLocalLock": "waltz.client.locks",
    "Serializer": "waltz.client.context",
    "Transaction": "waltz.client.transaction",
    "TransactionBuilder": "waltz.client.context",
    "TransactionContext": "waltz.client.context",
    "WaltzClient": "waltz.client.client",
    "WaltzClientCallbacks": "waltz.client.callbacks",
    "WaltzClientConfig": "waltz.client.config",
    "lock_hash": "waltz.client.locks",
}

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
    "lock_hash",
]


def __getattr__(name: str) -> Any:
    """The public name ``name``, imported from its module on first use (PEP 562)."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
