"""``waltz rebuild`` pointed at a log its application did not write: the record it cannot decode
is named, with a hint a user of the command can act on (docs/spark.md, the `waltz rebuild`
section)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import support
from typer.testing import CliRunner

from tests.client.client_helpers import Append, MemoryStore
from waltz import WaltzClient, WaltzClientConfig
from waltz.cli.main import app as waltz_app
from waltz.local.cluster import LocalCluster

pytestmark = pytest.mark.timeout(600)


def test_a_log_of_another_application_is_named_with_a_hint(
    spark: Any, zookeeper: object, tmp_path: Path
) -> None:
    with LocalCluster(
        security=support.PLAINTEXT,
        storages=1,
        servers=1,
        partitions=1,
        zookeeper=zookeeper.connect_string,  # type: ignore[attr-defined]
        work_dir=tmp_path / "cluster",
        delete_root=True,
    ) as cluster:
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
