"""``waltz rebuild --check``: prove that every record of the log upcasts to the current models.

Source: docs/design/sql.md "Schema versions and upcasting" (one decoding step, shared by every
reader), docs/design/spark.md "Computing views" (a change the live apply would refuse, or one the
replay cannot rebuild, fails the rebuild). The check reads the committed log as the rebuild does,
decodes and upcasts each transaction with the live apply's own code, holds each row change against
its model, and reports: how many row changes of each entity were written at each schema version,
and the first record in log order that does not upcast or fit, if any. It writes nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from waltz.jdbc_style.changeset import ChangeSetFormatError, RowChange
from waltz.jdbc_style.upcasting import SchemaVersionAheadError, UpcastError
from waltz.spark.decoders import DecoderRegistry
from waltz.spark.target import marks_text
from waltz.spark.views import AppViews, change_check

__all__ = ["LogCheck", "check_log"]

Progress = Callable[[str], None]

#: The rows the check's decoder gives per row change (or per transaction that fails).
_CHECK_STRUCT = "entity STRING, written_version INT, problem STRING"


@dataclass(frozen=True, slots=True)
class LogCheck:
    """What ``waltz rebuild --check`` found.

    Attributes:
        marks: partition -> the committed mark read up to (-1: empty).
        transactions: transactions read.
        versions: ``{entity: {schema version as written: row changes}}``.
        current: ``{entity: current schema version}`` of the application's models.
        first_problem: the first record in (partition, transaction) order that does not upcast
            to the current models or does not fit them, as a sentence naming it; None when all do.
        problems: how many transactions have a problem.
        lines: the report, a line each (what ``waltz rebuild --check`` prints).
    """

    marks: Mapping[int, int]
    transactions: int
    versions: Mapping[str, Mapping[int, int]]
    current: Mapping[str, int]
    first_problem: str | None = None
    problems: int = 0
    lines: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when every record upcasts to the current models and fits them."""
        return self.first_problem is None


def newer_than_the_models(error: SchemaVersionAheadError) -> str:
    """What a record of a newer schema version means to a rebuild or its check (not to a live
    instance, which waits for its upgrade): the log was written by a newer release."""
    where = "" if error.where is None else f" ({error.where})"
    return (
        f"a {error.entity} row change of schema version {error.version}{where}, newer than the models here "
        f"(version {error.known}): a newer release of the application wrote it; run the rebuild with "
        "that release's code"
    )


def _check_one(
    decoders: DecoderRegistry,
    chains: Any,
    check: Callable[[RowChange], str | None],
    header: int,
    data: bytes,
) -> list[tuple[str | None, int | None, str | None]]:
    """One transaction's rows: ``(entity, written version, problem)`` per row change, or one row
    with the problem when it does not decode or upcast; ``check`` is the rebuild's own check of a
    row change (:func:`waltz.spark.views.change_check`)."""
    try:
        members = decoders.decode_members(header, bytes(data))
        pairs = [(written, chains.upcast(written)) for written in members]
    except SchemaVersionAheadError as exc:
        return [(exc.entity, exc.version, newer_than_the_models(exc))]
    except (ChangeSetFormatError, UpcastError) as exc:
        return [(None, None, str(exc))]
    rows: list[tuple[str | None, int | None, str | None]] = []
    retired = chains.retired
    for written, upcast in pairs:
        # A retired entity's changes are counted, and every reader passes over them (upcast drops them).
        rows.extend((c.entity, c.schema_version, None) for c in written.changes if c.entity in retired)
        kept = [c for c in written.changes if c.entity not in retired]
        for before, change in zip(kept, upcast.changes, strict=True):
            problem = check(change)
            if problem is not None and before.schema_version != change.schema_version:
                problem += (
                    f" (written at schema version {before.schema_version}, upcast to {change.schema_version})"
                )
            rows.append((change.entity, before.schema_version, problem))
    return rows


def check_log(spark: Any, app: AppViews, source: Any, progress: Progress | None = None) -> LogCheck:
    """Read the committed log and check that every record upcasts to the application's models.

    Args:
        spark: the Spark session (``waltz`` data source registered).
        app: the application's views; its ``entities`` name the models to check against.
        source: where to read the log (:class:`waltz.spark.rebuild.LogSource`).
        progress: called with a line per step.

    Returns:
        What was found (:class:`LogCheck`); nothing is written anywhere.

    Raises:
        RebuildError: the application names no entities (``AppViews.entities``).
        CommittedReadError: the log cannot be proven committed.
    """
    from pyspark.sql import functions as F  # noqa: N812 - the PySpark convention

    from waltz.spark.errors import RebuildError

    say = progress or (lambda _: None)
    if app.entities is None:
        raise RebuildError(
            "the application's VIEWS name no entities (AppViews.entities): nothing to check against"
        )
    plans = source.plan_for(None, say)  # a plan made before (LogSource.planned) was said then
    marks = {p.partition_id: p.high_water_mark for p in plans}
    chains = app.entities.schema_chains()
    current = {info.spec.lock_name: info.schema_version for info in app.entities}
    decoders = app.decoders
    row_check = change_check(app.entities)

    def check(header: int, data: bytes) -> list[tuple[str | None, int | None, str | None]]:
        return _check_one(decoders, chains, row_check, header, data)

    udf = F.udf(check, f"ARRAY<STRUCT<{_CHECK_STRUCT}>>", useArrow=False)
    log_df = spark.read.format("waltz").options(**source.options()).option("up_to", marks_text(marks)).load()
    if not marks or all(m < 0 for m in marks.values()):
        log_df = log_df.limit(0)
    rows = (
        log_df.select("partition_id", "transaction_id", F.explode_outer(udf("header", "data")).alias("c"))
        .select("partition_id", "transaction_id", "c.*")
        .cache()
    )
    try:
        transactions = rows.select("partition_id", "transaction_id").distinct().count()
        versions: dict[str, dict[int, int]] = {}
        for r in (
            rows.where(F.col("entity").isNotNull()).groupBy("entity", "written_version").count().collect()
        ):
            versions.setdefault(r.entity, {})[int(r.written_version)] = int(r["count"])
        failing = rows.where(F.col("problem").isNotNull()).select("partition_id", "transaction_id", "problem")
        problems = failing.select("partition_id", "transaction_id").distinct().count()
        first = failing.orderBy("partition_id", "transaction_id").limit(1).collect()
    finally:
        rows.unpersist()
    first_problem = (
        f"partition {first[0].partition_id} transaction {first[0].transaction_id}: {first[0].problem}"
        if first
        else None
    )
    lines = [f"read {transactions} transactions up to the committed marks {marks_text(marks) or '(none)'}"]
    for entity in sorted(set(versions) | set(current)):
        written = versions.get(entity, {})
        counted = ", ".join(f"{n} at version {v}" for v, n in sorted(written.items())) or "no row changes"
        if entity in current:
            model = f"model version {current[entity]}"
        elif entity in chains.retired:
            model = "retired (every reader passes over it)"
        else:
            model = (
                "no model: left to the views here, but the live apply refuses it (its partition waits); "
                "retire it in the EntityRegistry if the application dropped it"
            )
        lines.append(f"{entity}: {counted}; {model}")
    if first_problem is None:
        lines.append("every record upcasts to the current models and fits them")
    else:
        lines.append(f"{problems} transaction(s) do not; the first: {first_problem}")
    return LogCheck(marks, transactions, versions, current, first_problem, problems, lines)
