"""BatchedHistogram exposes what prometheus_client's own Histogram exposes for the same values."""

from __future__ import annotations

import threading

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from waltz.batched_histogram import BatchedHistogram

BUCKETS = (0.001, 0.0025, 0.01, 0.5, 1.0, 10.0)


def exposition(registry: CollectorRegistry) -> list[str]:
    """The registry's text exposition, without the ``_created`` sample (only Histogram has one)."""
    return [line for line in generate_latest(registry).decode().splitlines() if "_created" not in line]


@given(
    values=st.lists(
        st.one_of(
            st.sampled_from(BUCKETS),  # on a bound: counted in that bucket (le is inclusive)
            st.floats(min_value=0.0, max_value=100.0, allow_nan=False),
        ),
        max_size=50,
    ),
    split=st.integers(min_value=0, max_value=50),
)
def test_same_samples_as_prometheus_histogram(values: list[float], split: int) -> None:
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    histogram = BatchedHistogram("waltz_test_seconds", "A test histogram.", BUCKETS, registry=ours)
    reference = Histogram("waltz_test_seconds", "A test histogram.", buckets=BUCKETS, registry=theirs)
    histogram.observe_all(values[:split])
    for value in values[split:]:
        histogram.observe(value)
    for value in values:
        reference.observe(value)
    assert exposition(ours) == exposition(theirs)


def test_batches_from_threads_add_up() -> None:
    registry = CollectorRegistry()
    histogram = BatchedHistogram("waltz_test_seconds", "A test histogram.", BUCKETS, registry=registry)

    def observe() -> None:
        for _ in range(200):
            histogram.observe_all([0.002, 0.7, 50.0])

    threads = [threading.Thread(target=observe) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert registry.get_sample_value("waltz_test_seconds_count") == 2400
    assert registry.get_sample_value("waltz_test_seconds_bucket", {"le": "0.0025"}) == 800
    assert registry.get_sample_value("waltz_test_seconds_bucket", {"le": "1.0"}) == 1600
    assert registry.get_sample_value("waltz_test_seconds_sum") == pytest.approx(800 * 50.702)


@pytest.mark.parametrize("buckets", [(), (1.0, 1.0), (2.0, 1.0), (float("inf"),)])
def test_buckets_must_increase(buckets: tuple[float, ...]) -> None:
    with pytest.raises(ValueError, match="strictly increasing"):
        BatchedHistogram("waltz_test_seconds", "A test histogram.", buckets)


def test_an_infinite_last_bound_is_the_implicit_one() -> None:
    registry = CollectorRegistry()
    BatchedHistogram("waltz_test_seconds", "A test.", (1.0, float("inf")), registry=registry).observe(5.0)
    assert registry.get_sample_value("waltz_test_seconds_bucket", {"le": "1.0"}) == 0
    assert registry.get_sample_value("waltz_test_seconds_bucket", {"le": "+Inf"}) == 1
