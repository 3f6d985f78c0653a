"""The SQL framework: exactly-once apply of the Waltz log into SQLAlchemy databases.

Source: docs/design/sql.md "What the framework guarantees", "The high-water-mark table",
"Exactly-once across instances", "Entity transactions". ``docs/sql.md`` is the guide.

Public API:

- :class:`AbstractClientCallbacksForSQL`: subclass it and implement ``apply(transaction, session)``
  for command-style transactions; it keeps each partition's high-water mark in
  ``waltz_high_water_marks`` and applies every transaction exactly once across instances that
  share the database.
- :class:`ChangeSetCallbacks`: applies change-set transactions of declared entities itself;
  ``read_entities`` reads them outside a transaction (:class:`EntityRead`), from the entity cache
  when it holds them.
- :class:`WaltzEntity`, :class:`EntityRegistry`: a model's lock name, key and partition mapping;
  :func:`partition_of` (an entity's partition) and :func:`default_partition` (the default mapping).
- :func:`check_partition_mapping`: checks, in a test or at start-up, that contexts made from sample
  inputs keep their entities in one partition, and reports what a split of the log would break
  (:class:`PartitionMappingCheck`, :class:`SplitFinding`).
- :class:`EntityTransactionContext`, :class:`EntityTransaction`: read-modify-write of entities with
  READ/WRITE locks and an exact lock check.
- :class:`ChangeSet`, :data:`CHANGE_SET_HEADER`: the change-set format.
- :func:`create_framework_engine`, :func:`prepare_engine`: engines for the framework.
- ``waltz.jdbc_style.migrations_api``: alembic migrations of the framework's tables
  (``waltz db upgrade``), and the operator's audited skip.
"""

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from waltz.jdbc_style.apply_session import ApplySession
    from waltz.jdbc_style.callbacks import AbstractClientCallbacksForSQL
    from waltz.jdbc_style.changeset import (
        CHANGE_SET_HEADER,
        ChangeSet,
        ChangeSetBatch,
        ChangeSetFormatError,
        Operation,
        RowChange,
        decode_members,
        encode_members,
    )
    from waltz.jdbc_style.changeset_callbacks import ChangeSetApplyError, ChangeSetCallbacks
    from waltz.jdbc_style.engine import create_framework_engine, is_transient, prepare_engine
    from waltz.jdbc_style.entities import (
        EntityNotDeclaredError,
        EntityRegistry,
        UnknownEntityError,
        WaltzEntity,
        default_partition,
        lock_id_of,
        partition_of,
    )
    from waltz.jdbc_style.entity_batches import EntityBatcher
    from waltz.jdbc_style.entity_context import EntityTransaction, EntityTransactionContext
    from waltz.jdbc_style.entity_reads import EntityRead
    from waltz.jdbc_style.idempotency import AppliedRequest
    from waltz.jdbc_style.mark_snapshot import MarkSnapshot
    from waltz.jdbc_style.partition_check import (
        PartitionMappingCheck,
        SplitEntity,
        SplitFinding,
        SplitFindingKind,
        check_partition_mapping,
    )
    from waltz.jdbc_style.upcasting import (
        AddAttribute,
        DropAttribute,
        RenameAttribute,
        RowUpcaster,
        ScaleAttribute,
        SchemaVersionAheadError,
        UpcastError,
        upcaster,
    )

#: Public name -> the module that defines it. The package imports a module when one of its names
#: is first used, so a process that needs one part (a Spark task decoding change-sets needs
#: ``changeset`` and ``upcasting``) does not import the client, alembic and the apply machinery.
_EXPORTS: dict[str, str] = {
    "AbstractClientCallbacksForSQL": "waltz.jdbc_style.callbacks",
    "AddAttribute": "waltz.jdbc_style.upcasting",
    "AppliedRequest": "waltz.jdbc_style.idempotency",
    "ApplySession": "waltz.jdbc_style.apply_session",
    "CHANGE_SET_HEADER": "waltz.jdbc_style.changeset",
    "ChangeSet": "waltz.jdbc_style.changeset",
    "ChangeSetApplyError": "waltz.jdbc_style.changeset_callbacks",
    "ChangeSetBatch": "waltz.jdbc_style.changeset",
    "ChangeSetCallbacks": "waltz.jdbc_style.changeset_callbacks",
    "ChangeSetFormatError": "waltz.jdbc_style.changeset",
    "DropAttribute": "waltz.jdbc_style.upcasting",
    "EntityBatcher": "waltz.jdbc_style.entity_batches",
    "EntityNotDeclaredError": "waltz.jdbc_style.entities",
    "EntityRead": "waltz.jdbc_style.entity_reads",
    "EntityRegistry": "waltz.jdbc_style.entities",
    "EntityTransaction": "waltz.jdbc_style.entity_context",
    "EntityTransactionContext": "waltz.jdbc_style.entity_context",
    "MarkSnapshot": "waltz.jdbc_style.mark_snapshot",
    "Operation": "waltz.jdbc_style.changeset",
    "PartitionMappingCheck": "waltz.jdbc_style.partition_check",
    "RenameAttribute": "waltz.jdbc_style.upcasting",
    "RowChange": "waltz.jdbc_style.changeset",
    "RowUpcaster": "waltz.jdbc_style.upcasting",
    "ScaleAttribute": "waltz.jdbc_style.upcasting",
    "SchemaVersionAheadError": "waltz.jdbc_style.upcasting",
    "SplitEntity": "waltz.jdbc_style.partition_check",
    "SplitFinding": "waltz.jdbc_style.partition_check",
    "SplitFindingKind": "waltz.jdbc_style.partition_check",
    "UnknownEntityError": "waltz.jdbc_style.entities",
    "UpcastError": "waltz.jdbc_style.upcasting",
    "WaltzEntity": "waltz.jdbc_style.entities",
    "check_partition_mapping": "waltz.jdbc_style.partition_check",
    "create_framework_engine": "waltz.jdbc_style.engine",
    "decode_members": "waltz.jdbc_style.changeset",
    "default_partition": "waltz.jdbc_style.entities",
    "encode_members": "waltz.jdbc_style.changeset",
    "is_transient": "waltz.jdbc_style.engine",
    "lock_id_of": "waltz.jdbc_style.entities",
    "partition_of": "waltz.jdbc_style.entities",
    "prepare_engine": "waltz.jdbc_style.engine",
    "upcaster": "waltz.jdbc_style.upcasting",
}

__all__ = [
    "CHANGE_SET_HEADER",
    "AbstractClientCallbacksForSQL",
    "AddAttribute",
    "AppliedRequest",
    "ApplySession",
    "ChangeSet",
    "ChangeSetApplyError",
    "ChangeSetBatch",
    "ChangeSetCallbacks",
    "ChangeSetFormatError",
    "DropAttribute",
    "EntityBatcher",
    "EntityNotDeclaredError",
    "EntityRead",
    "EntityRegistry",
    "EntityTransaction",
    "EntityTransactionContext",
    "MarkSnapshot",
    "Operation",
    "PartitionMappingCheck",
    "RenameAttribute",
    "RowChange",
    "RowUpcaster",
    "ScaleAttribute",
    "SchemaVersionAheadError",
    "SplitEntity",
    "SplitFinding",
    "SplitFindingKind",
    "UnknownEntityError",
    "UpcastError",
    "WaltzEntity",
    "check_partition_mapping",
    "create_framework_engine",
    "decode_members",
    "default_partition",
    "encode_members",
    "is_transient",
    "lock_id_of",
    "partition_of",
    "prepare_engine",
    "upcaster",
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
