"""The rebuild job: an application's views computed from the committed log with Spark, and written
to a database that an application instance can resume from.

Source: docs/design/spark.md "What the rebuild is for" (databases derive from the log),
"Computing views", "Swapping tables with the marks" (a database stores its high-water marks);
``docs/spark.md``.

:func:`compute_views` reads the committed log up to fixed marks and runs the application's
:class:`~waltz.spark.views.AppViews`; :func:`rebuild` writes them with
:func:`waltz.spark.target.write_views` (staging tables swapped in with the marks when all are
complete). The drift check is :func:`waltz.spark.drift.verify`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from waltz.archive.manifests import ArchiveManifest
from waltz.committed.plan import CommittedPartition, plan_live, plan_offline
from waltz.metadata.epochs import PartitionEpochs, PartitionEpochsZk
from waltz.metadata.zk import ClusterZk
from waltz.metadata.zk_security import (
    ZOOKEEPER_SECURITY_FILE_FIELDS,
    security_from_environment,
    security_from_files,
)
from waltz.metadata.zk_session import connect_zookeeper
from waltz.protocol.channels import TlsConfig
from waltz.spark.decoders import decode_changes
from waltz.spark.errors import CommittedReadError, RebuildError
from waltz.spark.target import check_target, marks_text, write_views
from waltz.spark.views import (
    AppViews,
    caching_replays,
    change_check,
    checked_problems,
    idempotency_key_rows,
    require_writable_columns,
)

__all__ = ["ComputedViews", "LogSource", "RebuildResult", "compute_views", "rebuild", "tail_transactions"]

Progress = Callable[[str], None]


def _quiet(_: str) -> None:
    return None


@dataclass(frozen=True, slots=True)
class LogSource:
    """Where the log is read: a live cluster, or storage directories on disk.

    Attributes:
        zookeeper: ZooKeeper connect string (live).
        cluster_root: the cluster root znode (live).
        storage_dirs: storage directories (offline).
        replicas: replicas per partition in the cluster (offline majority mode).
        high_water_marks: partition -> a high-water mark the user vouches for (offline).
        tls: client TLS files for the storage nodes' admin ports (live), or None.
        zookeeper_files: the ZooKeeper credential and TLS files (live), by settings field
            (``zookeeper_auth_digest_file``, ``zookeeper_ssl_ca_file``, ...; what
            ``LocalCluster.zookeeper_settings()`` holds besides the connect string and root);
            those not given come from the ``WALTZ_ZOOKEEPER_*`` environment.
        archive: the archive to read the ranges it holds from (a directory or a URL pyarrow
            opens; the data source's ``archive`` option): offline, the only place of what
            retention deleted from the directories; live, in place of the one ZooKeeper names;
            ``"off"``: the storage nodes only. None: offline none, live ZooKeeper's
            (docs/design/archive.md, "Reads below the local start").
        plans: the plan made already (:meth:`planned`), which :meth:`plan` returns; None: planned
            when asked (docs/design/spark.md, "Planning before Spark starts").
    """

    zookeeper: str | None = None
    cluster_root: str | None = None
    storage_dirs: Sequence[str] = ()
    replicas: int | None = None
    high_water_marks: Mapping[int, int] | None = None
    tls: TlsConfig | None = None
    zookeeper_files: Mapping[str, str | Path] = field(default_factory=dict)
    archive: str | None = None
    plans: tuple[CommittedPartition, ...] | None = None

    @classmethod
    def live(cls, settings: Mapping[str, Any]) -> LogSource:
        """A live cluster's log, from the fields of an operator's ``ClusterAdminConfig``:
        ``zookeeper_connect_string``, ``cluster_root``, ``cluster_ssl_*`` (the admin ports' TLS)
        and the ``zookeeper_*`` credential and TLS files, e.g. ``LocalCluster.admin_settings()``
        (docs/design/spark.md, "Live reads through admin ports").

        Raises:
            RebuildError: no connect string or root.
        """
        zookeeper, root = settings.get("zookeeper_connect_string"), settings.get("cluster_root")
        if not zookeeper or not root:
            raise RebuildError("a live log source needs zookeeper_connect_string and cluster_root")
        tls_files = [settings.get(f"cluster_ssl_{name}_file") for name in ("ca", "cert", "key")]
        ca, cert, key = (None if f is None else Path(f) for f in tls_files)
        return cls(
            zookeeper=str(zookeeper),
            cluster_root=str(root),
            tls=TlsConfig(ca, cert, key) if ca or cert else None,
            zookeeper_files={
                k: settings[k] for k in ZOOKEEPER_SECURITY_FILE_FIELDS if settings.get(k) is not None
            },
        )

    def plan(self) -> list[CommittedPartition]:
        """The committed high-water mark of every partition (see :mod:`waltz.committed.plan`): the
        plan made already if this source carries one (:meth:`planned`), else a new one.

        Raises:
            RebuildError: neither or both kinds of source given, or an ``archive`` that holds no
                archive or another cluster's (its ``archive.json`` does not list the cluster's key
                fingerprint, or has another partition count).
            CommittedReadError: a partition cannot be proven.
        """
        if self.plans is not None:
            return list(self.plans)
        archive = self._require_archive()
        if self.zookeeper and self.cluster_root and not self.storage_dirs:
            security = security_from_files(self.zookeeper_files) if self.zookeeper_files else None
            plans = plan_live(self.zookeeper, self.cluster_root, tls=self.tls, security=security)
        elif self.storage_dirs and not self.zookeeper:
            plans = plan_offline(
                list(self.storage_dirs), replicas=self.replicas, high_water_marks=self.high_water_marks
            )
        else:
            raise RebuildError(
                "read the log from a live cluster (zookeeper and cluster root) or from storage directories"
            )
        # Here, not at the top: the data source's module, which this one's callers may not need.
        from waltz.spark.archived import archive_cluster_problem

        problem = None if archive is None else archive_cluster_problem(archive, plans)
        if problem is not None:
            raise RebuildError(
                f"--archive {self.archive} {problem}; give the archive of the cluster the log is read from "
                "(waltz archive status names it), or a copy of it; nothing was read"
            )
        return plans

    def _require_archive(self) -> ArchiveManifest | None:
        """The archive given (``archive``, not ``off``) is one: a mistyped location would read as an
        archive that holds nothing, and the read fail in Spark asking for the archive it was given
        (docs/design/spark.md, "Planning before Spark starts"). Once the log is planned, the
        archive must be its cluster's (:func:`~waltz.spark.archived.archive_cluster_problem`).

        Returns:
            The archive's ``archive.json``; None when no archive is given.

        Raises:
            RebuildError: the location holds no ``archive.json``.
            LocationError, ArchiveFormError, OSError: the location cannot be opened or read.
        """
        if not self.archive or self.archive == "off":
            return None
        from waltz.archive.layout import ARCHIVE_MANIFEST, ArchiveFiles
        from waltz.archive.manifests import read_archive_manifest

        files = ArchiveFiles.open(self.archive)
        manifest = read_archive_manifest(files)
        if manifest is None:
            raise RebuildError(
                f"--archive {self.archive} holds no archive (no {files.name(ARCHIVE_MANIFEST)}): give the "
                "location the archiver writes to (waltz archive status names it), or a copy of it"
            )
        return manifest

    def planned(self, progress: Progress = _quiet) -> LogSource:
        """This source with its plan made now, for a command to find a wrong cluster root, an
        unreachable cluster or a directory that holds no log before it starts Spark, which takes
        seconds (docs/design/spark.md, "Planning before Spark starts"). A read up to marks above
        the plan (a live database's, which moved on meanwhile) plans again (:func:`compute_views`).

        Args:
            progress: called with a line per partition (its committed high-water mark and proof).

        Raises:
            RebuildError, CommittedReadError: as :meth:`plan`; and what reaching the cluster
                raises (``ZooKeeperUnavailableError``, ``ClusterNotFoundError``).
        """
        return replace(self, plans=tuple(replace(self, plans=None).plan_for(None, progress)))

    def plan_for(
        self, up_to: Mapping[int, int] | None, progress: Progress = _quiet
    ) -> list[CommittedPartition]:
        """The plan a read up to ``up_to`` (None: each partition's committed high-water mark) works
        on: the plan this source carries (:meth:`planned`) when it covers ``up_to``, else one made
        now and said, a line per partition (docs/design/spark.md, "Planning before Spark starts").

        Raises:
            RebuildError, CommittedReadError: as :meth:`plan`.
        """
        if self.plans is not None:
            plans = list(self.plans)
            marks = {p.partition_id: p.high_water_mark for p in plans}
            if up_to is None or all(mark <= marks.get(pid, -1) for pid, mark in up_to.items()):
                return plans
            progress("the marks asked for are above the log's plan, made before: planning it again")
        plans = replace(self, plans=None).plan()
        _say_plans(plans, progress)
        return plans

    def partition_epochs(self) -> PartitionEpochs | None:
        """The live cluster's partition epochs (``partitions/epochs``), or None for storage
        directories, which carry none (docs/design/splits.md "What ZooKeeper holds").

        Raises:
            ZooKeeperUnavailableError, ClusterNotFoundError, MetadataError: as the read.
        """
        if not (self.zookeeper and self.cluster_root) or self.storage_dirs:
            return None
        security = security_from_files(self.zookeeper_files) if self.zookeeper_files else None
        zk = connect_zookeeper(self.zookeeper, security=security or security_from_environment())
        try:
            cluster = ClusterZk(zk, self.cluster_root)
            return PartitionEpochsZk(zk, cluster.paths, timeout=cluster.timeout).read().value
        finally:
            zk.stop()
            zk.close()

    def options(self) -> dict[str, str]:
        """The ``waltz`` data source options of this source."""
        return self._where() | ({"archive": self.archive} if self.archive else {})

    def _where(self) -> dict[str, str]:
        if self.zookeeper:
            options = {"zookeeper": self.zookeeper, "cluster_root": self.cluster_root or ""}
            if self.tls is not None:
                for name, path in (
                    ("ssl_ca_file", self.tls.ca_file),
                    ("ssl_cert_file", self.tls.cert_file),
                    ("ssl_key_file", self.tls.key_file),
                ):
                    if path is not None:
                        options[name] = str(path)
            options |= {name: str(path) for name, path in self.zookeeper_files.items() if path}
            return options
        options = {"storage_dirs": ",".join(self.storage_dirs)}
        if self.replicas is not None:
            options["replicas"] = str(self.replicas)
        if self.high_water_marks:
            options["high_water_mark"] = marks_text(self.high_water_marks)
        return options


def _say_plans(plans: Sequence[CommittedPartition], progress: Progress) -> None:
    for plan in plans:
        progress(f"partition {plan.partition_id}: committed up to {plan.high_water_mark} ({plan.proof})")


@dataclass(frozen=True, slots=True)
class RebuildResult:
    """What a rebuild wrote.

    Attributes:
        marks: partition -> the transaction ID read up to (-1: nothing), as written in the marks.
        rows: table name -> rows written.
        seconds: wall time.
    """

    marks: Mapping[int, int]
    rows: Mapping[str, int]
    seconds: float


# ---- computing ----


@dataclass(frozen=True, slots=True)
class ComputedViews:
    """The views of the log at fixed marks.

    Attributes:
        marks: partition -> the transaction ID read up to (-1: nothing).
        tables: table name -> DataFrame.
        idempotency_keys: the log's ``waltz_idempotency_keys`` rows (a DataFrame).
        changes: the decoded row changes (cached while the views are used), with the model
            check's ``problem`` column when the application has entities
            (:func:`waltz.spark.views.change_check`).
        cached: other DataFrames cached while the views are used: the replays the views share
            (:func:`waltz.spark.views.caching_replays`) and, from a snapshot with an entity file
            joined with the log's keys, the log's changes after its marks and each joined
            file's rows with their touched flags.
        seeded: from a snapshot, table name -> ``(seed, own rows)`` for each table that is not
            an entity table: its ``tables`` DataFrame is the snapshot's rows then the views'
            own; :func:`rebuild` copies the seed's rows into the database as they are
            (:class:`waltz.spark.snapshot.SnapshotSeed`) and writes only the own rows with Spark.
    """

    marks: dict[int, int]
    tables: Mapping[str, Any]
    idempotency_keys: Any
    changes: Any
    cached: tuple[Any, ...] = ()
    seeded: Mapping[str, tuple[Any, Any]] = field(default_factory=dict)

    def release(self) -> None:
        """Drop the cached log."""
        _unpersist(self.changes, *self.cached)


def _unpersist(*frames: Any) -> None:
    """Drop what ``frames`` cached."""
    for frame in frames:
        frame.unpersist()


def compute_views(
    spark: Any,
    app: AppViews,
    source: LogSource,
    *,
    up_to: Mapping[int, int] | None = None,
    cluster_name: str | None = None,
    snapshot: str | None = None,
    progress: Progress = _quiet,
) -> ComputedViews:
    """The application's views at fixed marks (DataFrames over the cached, decoded log) and those marks.

    Args:
        spark: the Spark session (``waltz`` data source registered).
        app: the application's views.
        source: where to read the log.
        up_to: partition -> mark to read up to (default: each partition's committed high-water mark).
        cluster_name: the log's name in the idempotency key rows (default ``app.cluster_name``).
        snapshot: a snapshot to start from (:mod:`waltz.spark.snapshot`, docs/design/spark.md
            "Snapshots"): only the log after its marks is read, on top of its tables and keys.
        progress: called with a line per step.

    Returns:
        The marks (every partition of the log has one, -1: empty) and the tables; call
        :meth:`ComputedViews.release` when done.

    Raises:
        CommittedReadError: a requested mark is above what is proven committed.
        RebuildError: the application's views miss a table, an entity table has a column of a
            type the rebuild cannot write (before the log is read), or the snapshot is ahead of
            the log or of what ``up_to`` asks for.
        SnapshotError: the snapshot does not verify against its manifest.
    """
    require_writable_columns(app)
    plans = source.plan_for(up_to, progress)
    marks = {p.partition_id: p.high_water_mark for p in plans}
    base = _snapshot_base(snapshot, marks, up_to, app, progress) if snapshot is not None else None
    if up_to is not None:
        for pid, mark in up_to.items():
            if mark > marks.get(pid, -1):
                raise CommittedReadError(
                    f"partition {pid}: the marks ask for {mark}, but only {marks.get(pid, -1)} is proven "
                    "committed"
                )
        marks = {pid: up_to.get(pid, -1) for pid in marks}
        epochs = source.partition_epochs()
        problems = [] if epochs is None else epochs.cut_problems(marks)
        if problems:
            raise CommittedReadError(
                "the marks asked for are not a consistent cut of the log across its splits: "
                + "; ".join(problems)
                + ' (docs/design/splits.md, "Spark across a split"): read the parents up to their '
                "barriers at least"
            )
    reader = spark.read.format("waltz").options(**source.options())
    if base is not None:
        reader = reader.option("after", marks_text(base.marks))
    log_df = reader.option("up_to", marks_text(marks)).load()
    if not marks or all(m < 0 for m in marks.values()):
        log_df = log_df.limit(0)
    chains = app.entities.schema_chains() if app.entities is not None else None
    # The model check runs in the decoding pass: its answers are a column of the cached changes.
    check = change_check(app.entities) if app.entities is not None else None
    changes = decode_changes(log_df, app.decoders, chains, check=check)
    cached: tuple[Any, ...] = ()
    untouched: Mapping[str, Any] = {}
    if base is not None:
        first_ids = {p.partition_id: p.first_transaction_id for p in plans}
        cached, changes, untouched = _on_snapshot(spark, changes, base, app, marks, first_ids)
    changes = changes.cache()
    decoded = changes.count()
    progress(
        f"read and decoded the log: {decoded} row changes"
        + (", upcast to the current models" if chains is not None and chains.upcasts else "")
    )
    if app.entities is not None and len(app.entities) and decoded:
        _require_own_entities(changes, app, cached)
    if check is not None:
        problems = checked_problems(changes)
        if problems:
            _unpersist(changes, *cached)
            raise RebuildError(
                "the log holds row changes that do not fit the application's current models, after "
                "their upcasters, or that carry part of a row, which a rebuild cannot replay; nothing "
                "was written: " + "; ".join(problems) + ". A model that changed declares its "
                "schema_version and an upcaster from each older version "
                '(docs/sql.md, "Changing a model")'
            )
        progress("every row change fits its entity's current model")
    # The views read the cached changes without the check's column.
    decoded_changes = changes.drop("problem") if check is not None else changes
    with caching_replays() as replays:
        views = dict(app.build(decoded_changes, log_df))
    cached = (*cached, *replays)
    for replayed in replays:
        # Computed here, once: the tables' writes run at once and would each compute it again.
        progress(f"replayed the row changes: {replayed.count()} rows")
    missing = [t.name for t in app.tables if t.name not in views]
    if missing:
        _unpersist(changes, *cached)
        raise RebuildError(f"the application's views lack tables {missing}")
    keys = idempotency_key_rows(decoded_changes, cluster_name or app.cluster_name)
    seeded: dict[str, tuple[Any, Any]] = {}
    if base is not None:
        own = dict(views)
        views, keys, seeds = _with_snapshot_rows(
            spark, views, keys, base, app, cluster_name or app.cluster_name, untouched
        )
        seeded = {name: (seed, own[name]) for name, seed in seeds.items()}
    return ComputedViews(marks, views, keys, changes, cached, seeded)


def _require_own_entities(changes: Any, app: AppViews, cached: tuple[Any, ...]) -> None:
    """Refuse a log none of whose row changes is of an entity the application declares (or
    retires): another application's log (a wrong ``--app`` or ``--root``), whose changes its views
    would turn into rows of nothing, or into rows of the wrong application.

    Raises:
        RebuildError: the log's entities and the application's have none in common.
    """
    assert app.entities is not None
    found = {r.entity for r in changes.select("entity").where("entity IS NOT NULL").distinct().collect()}
    declared = {info.name for info in app.entities} | set(app.entities.retired)
    if found and not found & declared:
        _unpersist(changes, *cached)
        raise RebuildError(
            f"the log's row changes are of the entities {sorted(found)}, none of which the application "
            f"{app.cluster_name!r} declares ({sorted(declared)}): check that --app names the application "
            "that writes this log, and --root (or --storage-dir) its cluster; nothing was written"
        )


@dataclass(frozen=True, slots=True)
class _SnapshotBase:
    location: str
    manifest: Any
    marks: dict[int, int]


def _snapshot_base(
    location: str,
    marks: dict[int, int],
    up_to: Mapping[int, int] | None,
    app: AppViews,
    progress: Progress,
) -> _SnapshotBase:
    """The verified snapshot a rebuild starts from; its marks must not be ahead of what is read,
    and its entities at the models' schema versions or older (docs/design/spark.md "Snapshots of
    an older model")."""
    from waltz.spark.snapshot import (
        SnapshotError,
        check_stored_rows,
        describe_stored,
        stored_rows,
        verify_snapshot,
    )

    manifest = verify_snapshot(location)
    wanted = dict(up_to) if up_to is not None else marks
    ahead = {p: m for p, m in manifest.marks.items() if m > wanted.get(p, -1)}
    if ahead:
        raise RebuildError(
            f"the snapshot at {location} holds partitions {sorted(ahead)} up to {ahead}, beyond the "
            f"log's marks {dict(sorted(wanted.items()))} this rebuild reads up to; rebuild from the log "
            "alone, or up to the snapshot's marks or later"
        )
    older = []
    for info in app.entities or ():
        try:
            upcast = stored_rows(manifest, info, f"the snapshot at {location}")
            if upcast is not None:
                check_stored_rows(location, manifest, info, upcast)
        except SnapshotError as exc:
            raise RebuildError(str(exc)) from exc
        if upcast is not None:
            older.append(f"{info.name}, {describe_stored(upcast)}")
    if older:
        progress(f"the snapshot's rows of older models: {'; '.join(older)}")
    progress(
        f"starting from the snapshot at {location}, marks {dict(sorted(manifest.marks.items()))} "
        f"({sum(t.rows for t in manifest.tables)} rows, written {manifest.written_at})"
    )
    return _SnapshotBase(location, manifest, {int(p): int(m) for p, m in manifest.marks.items()})


def tail_transactions(
    marks: Mapping[int, int], snapshot_marks: Mapping[int, int], first_ids: Mapping[int, int]
) -> int:
    """How many transactions a rebuild from a snapshot reads after the snapshot's marks, at most
    (docs/design/spark.md "Snapshots"): per partition, from the snapshot's mark, or from the
    partition's first transaction ID when the snapshot does not hold it (a partition a split
    opened starts at its genesis, not at 0), up to the rebuild's mark.

    Args:
        marks: partition -> the transaction ID the rebuild reads up to (-1: nothing).
        snapshot_marks: partition -> the snapshot's mark.
        first_ids: partition -> its first transaction ID (0, or a split's genesis).
    """
    return sum(
        max(0, mark - max(snapshot_marks.get(pid, -1), first_ids.get(pid, 0) - 1))
        for pid, mark in marks.items()
    )


def _on_snapshot(
    spark: Any,
    changes: Any,
    base: _SnapshotBase,
    app: AppViews,
    marks: Mapping[int, int],
    first_ids: Mapping[int, int],
) -> tuple[tuple[Any, ...], Any, Any]:
    """The frames cached for the views (when an entity file is joined with the log's keys: the
    log's changes after the snapshot and the file's rows with their touched flags), the log's
    changes on top of the snapshot's entity rows replayed (every row of a small file, the
    touched rows of a joined one), and the untouched rows per joined entity table; a change-set
    whose idempotency key the snapshot holds already was applied before it, and is dropped (no
    join when the snapshot holds no key)."""
    from pyspark.sql import functions as F  # noqa: N812 - the PySpark convention

    from waltz.spark.snapshot import snapshot_entity_rows, snapshot_keys

    after = changes
    if base.manifest.idempotency_keys.rows > 0:
        known = snapshot_keys(spark, base.location, base.manifest).select(
            F.col("idempotency_key").alias("_known_key")
        )
        after = changes.join(known, changes["idempotency_key"] == known["_known_key"], "left_anti")
    tail = tail_transactions(marks, base.marks, first_ids)
    entity_rows = snapshot_entity_rows(
        spark, base.location, base.manifest, app, after, tail_transactions=tail
    )
    before = entity_rows.changes
    if "problem" in after.columns:
        # The snapshot's rows as whole-row inserts of their own key: nothing for the check.
        before = before.withColumn("problem", F.lit(None).cast("string"))
    return entity_rows.cached, before.unionByName(after), entity_rows.untouched


def _with_snapshot_rows(
    spark: Any,
    views: dict[str, Any],
    keys: Any,
    base: _SnapshotBase,
    app: AppViews,
    cluster_name: str,
    untouched: Mapping[str, Any],
) -> tuple[dict[str, Any], Any, dict[str, Any]]:
    """The entity tables of joined files get the snapshot's rows that no change after its
    marks touches (a file replayed whole is in the views already); the
    tables that are not entity tables get the snapshot's rows before the views' own (the views
    computed them from the log after the snapshot only), and a seed of those rows for the
    writer; the idempotency keys, those of the snapshot and the new ones."""
    from pyspark.sql import functions as F  # noqa: N812 - the PySpark convention

    from waltz.spark.snapshot import SnapshotSeed, snapshot_keys, snapshot_table

    entity_tables = {info.model.__table__.name for info in app.entities or ()}
    merged = dict(views)
    seeds: dict[str, Any] = {}
    for table in app.tables:
        if table.name in entity_tables:
            before = untouched.get(table.name)
        else:
            before = snapshot_table(spark, base.location, base.manifest, table)
            entry = base.manifest.table(table.name)
            if entry is not None:
                seeds[table.name] = SnapshotSeed(base.location, entry)
        if before is None:
            continue
        built = views[table.name]
        columns = built.columns
        typed = before.select(*[F.col(c).cast(built.schema[c].dataType).alias(c) for c in columns])
        merged[table.name] = typed.unionByName(built)
    old_keys = snapshot_keys(spark, base.location, base.manifest).select(
        F.lit(cluster_name).alias("cluster_name"),
        F.col("idempotency_key"),
        F.col("partition_id").cast("int").alias("partition_id"),
        F.col("transaction_id").cast("bigint").alias("transaction_id"),
        F.col("applied_at").cast("timestamp").alias("applied_at"),
    )
    return merged, old_keys.unionByName(keys.select(*old_keys.columns)), seeds


def rebuild(
    spark: Any,
    app: AppViews,
    source: LogSource,
    db_url: str,
    *,
    cluster_name: str | None = None,
    up_to: Mapping[int, int] | None = None,
    snapshot: str | None = None,
    progress: Progress = _quiet,
) -> RebuildResult:
    """Rebuild the application's tables in ``db_url`` from the committed log.

    Computes the views (:func:`compute_views`), writes them into staging tables and swaps them in
    with this log's high-water-mark rows and idempotency keys (:func:`waltz.spark.target.write_views`):
    an instance started on the database resumes the log after the marks.

    Args:
        spark: the Spark session (``waltz`` data source registered).
        app: the application's views.
        source: where to read the log.
        db_url: the target database (SQLAlchemy URL: PostgreSQL, MariaDB or SQLite).
        cluster_name: the log's name in the mark rows (default ``app.cluster_name``).
        up_to: partition -> mark to read up to (default: each partition's committed high-water mark).
        snapshot: a snapshot to start from: only the log after its marks is read (the result is
            the full rebuild's).
        progress: called with a line per step.

    Returns:
        The marks read up to, the rows written per table, and the wall time.

    Raises:
        CommittedReadError, RebuildError: as :func:`compute_views` and :func:`write_views`.
        sqlalchemy.exc.DBAPIError: the database refused (the old tables stay as they were).
    """
    started = time.monotonic()
    # Before the log is read; a database without the application's tables is left empty till then.
    prepared = check_target(app, db_url, create=False)
    computed = compute_views(
        spark, app, source, up_to=up_to, cluster_name=cluster_name, snapshot=snapshot, progress=progress
    )
    if not prepared:
        try:
            check_target(app, db_url)  # the log is planned: the tables are made
        except BaseException:
            computed.release()
            raise
    tables = dict(computed.tables)
    tables.update({name: own for name, (_, own) in computed.seeded.items()})
    try:
        rows = write_views(
            tables,
            app,
            db_url,
            computed.marks,
            idempotency_keys_df=computed.idempotency_keys,
            cluster_name=cluster_name,
            seeds={name: seed for name, (seed, _) in computed.seeded.items()},
            progress=progress,
        )
    finally:
        computed.release()
    return RebuildResult(computed.marks, rows, time.monotonic() - started)
