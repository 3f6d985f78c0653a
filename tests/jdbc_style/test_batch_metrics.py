"""The entity batchers' counters in a client's Prometheus registry (docs/design/sql.md "Batched
entity transactions"). A batcher's counting through a running client is tested in
``test_sql_entities_cluster.py``; here, the counts themselves."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from waltz.jdbc_style.batch_metrics import batcher_counts, counts_in


def sample(registry: CollectorRegistry, name: str, partition: int) -> float | None:
    return registry.get_sample_value(f"waltz_client_entity_{name}_total", {"partition": str(partition)})


def test_the_batchers_of_one_client_add_to_one_set_of_counts_by_partition() -> None:
    registry = CollectorRegistry()
    first = batcher_counts(registry)
    second = batcher_counts(registry)  # a second batcher of the same client
    assert second is first
    first.committed(0, 5)
    second.committed(0, 3)
    second.lingered(0)
    first.committed(2, 2)
    assert sample(registry, "batches", 0) == 2
    assert sample(registry, "batch_members", 0) == 8
    assert sample(registry, "batches_lingered", 0) == 1
    assert (sample(registry, "batches", 2), sample(registry, "batch_members", 2)) == (1, 2)
    assert sample(registry, "batches_lingered", 2) == 0
    assert sample(registry, "batches", 1) is None, "a partition without batches has no sample"
    assert first.totals() == (3, 10, 1)
    text = generate_latest(registry).decode()
    assert "# TYPE waltz_client_entity_batches_lingered_total counter" in text
    assert 'waltz_client_entity_batch_members_total{partition="0"} 8.0' in text


def test_each_client_s_registry_has_its_own_counts() -> None:
    one, other = CollectorRegistry(), CollectorRegistry()
    batcher_counts(one).committed(1, 4)
    assert sample(one, "batches", 1) == 1
    assert sample(other, "batches", 1) is None
    assert batcher_counts(other).totals() == (0, 0, 0)


def test_reading_a_client_s_counts_registers_nothing() -> None:
    registry = CollectorRegistry()
    assert counts_in(registry) is None
    assert generate_latest(registry) == b"", "a client without batchers exports no batch counters"
    counts = batcher_counts(registry)
    assert counts_in(registry) is counts
