"""``waltz rebuild`` pointed at a log its application did not write: the record it cannot decode
is named, with a hint a user of the command can act on (docs/spark.md, the `waltz rebuild`
section)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import support
from typer.testing import CliRunner

from tests.client.client_helpers import Append, MemoryStore
from waltz import WaltzClient, WaltzClientConfig
from waltz.cli.main import app as waltz_app
from waltz.jdbc_style.changeset import CHANGE_SET_HEADER
from waltz.local.cluster import LocalCluster

pytestmark = pytest.mark.timeout(600)


def _one_partition_cluster(zookeeper: object, tmp_path: Path) -> LocalCluster:
    """A plaintext cluster of one storage node, one server and one partition, for one record."""
    return LocalCluster(
        security=support.PLAINTEXT,
        storages=1,
        servers=1,
        partitions=1,
        zookeeper=zookeeper.connect_string,  # type: ignore[attr-defined]
        work_dir=tmp_path / "cluster",
        delete_root=True,
    )


def test_a_log_of_another_application_is_named_with_a_hint(
    spark: Any, zookeeper: object, tmp_path: Path
) -> None:
    with _one_partition_cluster(zookeeper, tmp_path) as cluster:
        store = MemoryStore({0: -1})
        with WaltzClient(store, WaltzClientConfig(**cluster.client_settings())) as client:
            # A record of another application: header 7, which the ledger's views do not decode.
            assert client.submit(Append(0, b"not a change-set", header=7)).result(60).transaction_id == 0
        outcome = CliRunner().invoke(
            waltz_app,
            ["rebuild", "--app", "waltz_examples.ledger", "--db", f"sqlite:///{tmp_path / 'ledger.db'}"],
            env={**cluster.admin_env(), "COLUMNS": "300"},
        )
    assert outcome.exit_code == 2, outcome.output
    assert "no decoder for transaction header 7" in outcome.output, outcome.output
    assert (
        "hint: the log holds a transaction that waltz_examples.ledger's views cannot decode: check that "
        "--root names the cluster waltz_examples.ledger writes to"
    ) in outcome.output, outcome.output


def test_a_change_set_of_a_newer_form_is_named_as_a_newer_waltz_py_s(
    spark: Any, zookeeper: object, tmp_path: Path
) -> None:
    """A change-set of a form this waltz-py does not read yet was written by a newer release of
    waltz-py (docs/design/sql.md "Schema versions and upcasting"): the rebuild says so and to run
    it with that release, not to check ``--root``."""
    with _one_partition_cluster(zookeeper, tmp_path) as cluster:
        store = MemoryStore({0: -1})
        newer = json.dumps({"v": 9, "ops": []}, sort_keys=True, separators=(",", ":")).encode()
        with WaltzClient(store, WaltzClientConfig(**cluster.client_settings())) as client:
            appended = client.submit(Append(0, newer, header=CHANGE_SET_HEADER)).result(60)
            assert appended.transaction_id == 0
        outcome = CliRunner().invoke(
            waltz_app,
            ["rebuild", "--app", "waltz_examples.ledger", "--db", f"sqlite:///{tmp_path / 'ledger.db'}"],
            env={**cluster.admin_env(), "COLUMNS": "300"},
        )
    assert outcome.exit_code == 2, outcome.output
    assert (
        "error: the log holds a record a newer waltz-py wrote: partition 0 transaction 0: change-set form 9 "
        "is newer than this waltz-py reads (forms 1, 2, 3)"
    ) in outcome.output, outcome.output
    assert "run the rebuild with the waltz-py the application's instances run" in outcome.output
    assert "--root" not in outcome.output, outcome.output
