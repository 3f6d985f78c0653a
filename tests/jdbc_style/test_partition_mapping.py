"""An entity's partition (``partition_of``, ``default_partition``) and the check that contexts keep
their entities in one partition (``check_partition_mapping``); docs/design/sql.md "Entity
transactions", and what a split of the log would break (docs/design/splits.md, "The routing
rule"). Nothing is submitted or read: the callbacks only lend their registry."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from waltz.errors import CrossPartitionError
from waltz.jdbc_style import (
    ChangeSetCallbacks,
    EntityRegistry,
    EntityTransaction,
    EntityTransactionContext,
    SplitEntity,
    SplitFinding,
    SplitFindingKind,
    UnknownEntityError,
    WaltzEntity,
    check_partition_mapping,
    create_framework_engine,
    default_partition,
    partition_of,
)


def with_customer(key: tuple[Any, ...], num_partitions: int) -> int:
    """Where the customer of the key's first value is."""
    return default_partition(key[:1], num_partitions)


def customer_mod(key: tuple[Any, ...], num_partitions: int) -> int:
    """A mapping of its own, not the customers': it splits some customers from their rows."""
    return int(key[0]) % num_partitions


ACCOUNTS = 1000


def account_range(key: tuple[Any, ...], num_partitions: int) -> int:
    """A range table: accounts 0..999 in equal runs, one run per partition. Not divisible: at 2
    partitions account 250 is in partition 0, at 4 in partition 1."""
    return int(key[0]) * num_partitions // ACCOUNTS


class Base(DeclarativeBase):
    pass


class Customer(Base):
    __tablename__ = "pm_customers"
    __waltz__ = WaltzEntity("pm.customer")
    customer_id: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
    credit: Mapped[int] = mapped_column(default=0)


class Order(Base):
    __tablename__ = "pm_orders"
    __waltz__ = WaltzEntity("pm.order", key=("customer_id", "order_id"), partition_by=with_customer)
    order_id: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
    customer_id: Mapped[int]


class StrayOrder(Base):
    __tablename__ = "pm_stray_orders"
    __waltz__ = WaltzEntity("pm.stray_order", key=("customer_id", "order_id"), partition_by=customer_mod)
    order_id: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
    customer_id: Mapped[int]


class Wallet(Base):
    __tablename__ = "pm_wallets"
    __waltz__ = WaltzEntity("pm.wallet", partition_by=customer_mod)
    customer_id: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)


class Overflowing(Base):
    __tablename__ = "pm_overflowing"
    __waltz__ = WaltzEntity("pm.overflowing", partition_by=lambda key, n: n)  # one past the last
    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)


class RangedAccount(Base):
    __tablename__ = "pm_ranged_accounts"
    __waltz__ = WaltzEntity("pm.ranged_account", partition_by=account_range)
    account_id: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)


class Plain(Base):
    __tablename__ = "pm_plain"
    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)


class PlaceOrder(EntityTransactionContext):
    order_model: type[Any] = Order

    def __init__(self, callbacks: ChangeSetCallbacks, customer_id: int, order_id: int) -> None:
        super().__init__(callbacks, (Customer, customer_id), (self.order_model, (customer_id, order_id)))

    def run(self, tx: EntityTransaction) -> bool:
        return False


class PlaceStrayOrder(PlaceOrder):
    order_model = StrayOrder


class Pay(EntityTransactionContext):
    expected_models = (Wallet,)

    def __init__(self, callbacks: ChangeSetCallbacks, customer_id: Any) -> None:
        super().__init__(callbacks, (Customer, customer_id))

    def run(self, tx: EntityTransaction) -> bool:
        return False


class Deposit(EntityTransactionContext):
    def __init__(self, callbacks: ChangeSetCallbacks, account_id: int) -> None:
        super().__init__(callbacks, (RangedAccount, account_id))

    def run(self, tx: EntityTransaction) -> bool:
        return False


@pytest.fixture(scope="module")
def callbacks(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ChangeSetCallbacks]:
    """Callbacks on a SQLite file without the framework's tables: contexts only use the registry."""
    engine = create_framework_engine(f"sqlite:///{tmp_path_factory.mktemp('partitions') / 'app.db'}")
    try:
        yield ChangeSetCallbacks(
            engine,
            cluster_name="partitions",
            registry=EntityRegistry([Customer, Order, StrayOrder, Wallet, RangedAccount]),
            check_schema=False,
        )
    finally:
        engine.dispose()


def test_partition_of_gives_an_entity_s_partition_by_its_model_s_mapping(
    callbacks: ChangeSetCallbacks,
) -> None:
    # The default mapping (docs/sql.md gives these values).
    assert [partition_of(Customer, c, 4) for c in range(8)] == [1, 3, 1, 3, 0, 2, 0, 2]
    assert [default_partition((c,), 4) for c in range(8)] == [1, 3, 1, 3, 0, 2, 0, 2]
    # A key as tx.get takes it: a scalar, a tuple or a mapping; partition_by where the model has one.
    for customer in range(20):
        assert partition_of(Order, (customer, 7), 5) == partition_of(Customer, customer, 5)
        assert partition_of(Order, {"order_id": 7, "customer_id": customer}, 5) == partition_of(
            Customer, (customer,), 5
        )
        assert partition_of(StrayOrder, (customer, 7), 5) == customer % 5
    # As a submitted context's partition is chosen.
    assert PlaceOrder(callbacks, 5, 9).partition_id(4) == partition_of(Customer, 5, 4)


def test_partition_of_refuses_what_names_no_partition() -> None:
    with pytest.raises(ValueError, match="expected 1 value"):
        partition_of(Customer, (1, 2), 4)
    with pytest.raises(ValueError, match="num_partitions must be at least 1"):
        partition_of(Customer, 1, 0)
    with pytest.raises(ValueError, match="num_partitions must be at least 1"):
        default_partition((1,), 0)
    with pytest.raises(ValueError, match=r"outside 0\.\.3"):
        partition_of(Overflowing, 1, 4)
    with pytest.raises(UnknownEntityError, match="Plain has no __waltz__"):
        partition_of(Plain, 1, 4)


def test_a_mapping_that_keeps_each_transaction_together_passes(callbacks: ChangeSetCallbacks) -> None:
    samples = [(customer, order) for customer in range(100) for order in (1, 77)]
    checked = check_partition_mapping(
        lambda sample: PlaceOrder(callbacks, *sample), samples, num_partitions=range(1, 33)
    )
    assert checked.checked == len(samples) * 32
    assert check_partition_mapping(lambda c: Pay(callbacks, c), [1], num_partitions=1).checked == 1


def test_a_mapping_that_splits_a_transaction_is_named_by_its_first_counter_example(
    callbacks: ChangeSetCallbacks,
) -> None:
    samples = [(customer, 1) for customer in range(50)]
    counts = range(1, 9)
    # The first (sample, partition count) whose customer and order land apart, computed here.
    customer, count = next(
        (sample[0], n)
        for sample in samples
        for n in counts
        if default_partition(sample[:1], n) != sample[0] % n
    )
    # A smoke test of one request on a count where they happen to agree would pass.
    agreeing = next(c for c in range(50) if default_partition((c,), 4) == c % 4)

    def make(sample: tuple[int, int]) -> PlaceStrayOrder:
        return PlaceStrayOrder(callbacks, *sample)

    assert check_partition_mapping(make, [(agreeing, 1)], num_partitions=4).checked == 1

    with pytest.raises(CrossPartitionError) as caught:
        check_partition_mapping(make, samples, num_partitions=counts)
    message = str(caught.value)
    assert f"PlaceStrayOrder from the sample {(customer, 1)!r} spans 2 of {count} partitions" in message
    assert f"Customer({customer},) (declared) -> partition {default_partition((customer,), count)}" in message
    assert f"StrayOrder({customer}, 1) (declared) -> partition {customer % count}" in message


def test_an_expected_entity_of_another_partition_is_caught(callbacks: ChangeSetCallbacks) -> None:
    """A context declared by the customer whose run reads the customer's wallet (expected_models)
    would fail reading it where the two mappings disagree."""
    customer = next(c for c in range(50) if default_partition((c,), 3) != c % 3)
    with pytest.raises(
        CrossPartitionError, match=rf"Wallet\({customer},\) \(expected\) -> partition {customer % 3}"
    ):
        check_partition_mapping(lambda c: Pay(callbacks, c), [customer], num_partitions=3)


def test_a_sample_that_does_not_make_a_context_is_raised_with_the_sample_named(
    callbacks: ChangeSetCallbacks,
) -> None:
    with pytest.raises(ValueError, match="expected 1 value") as caught:
        check_partition_mapping(lambda c: Pay(callbacks, c), [3, (4, 5)], num_partitions=2)
    assert caught.value.__notes__ == ["check_partition_mapping: while checking the sample (4, 5)"]


def test_a_check_of_nothing_is_refused(callbacks: ChangeSetCallbacks) -> None:
    def make(sample: tuple[int, int]) -> PlaceOrder:
        return PlaceOrder(callbacks, *sample)

    with pytest.raises(ValueError, match="no samples"):
        check_partition_mapping(make, [], num_partitions=4)
    with pytest.raises(ValueError, match="partition counts of at least 1"):
        check_partition_mapping(make, [(1, 1)], num_partitions=[])
    with pytest.raises(ValueError, match="partition counts of at least 1"):
        check_partition_mapping(make, [(1, 1)], num_partitions=range(0, 4))


@given(
    st.integers(min_value=-(1 << 63), max_value=(1 << 63) - 1),
    st.integers(min_value=0, max_value=(1 << 31)),
    st.integers(min_value=1, max_value=256),
)
def test_orders_stay_with_their_customers_for_any_keys(
    callbacks: ChangeSetCallbacks, customer: int, order: int, num_partitions: int
) -> None:
    checked = check_partition_mapping(
        lambda sample: PlaceOrder(callbacks, *sample),
        [(customer, order)],
        num_partitions=num_partitions,
        split_factors=(2, 3, 4),
    )
    assert checked.checked == 1
    # The default mapping, alone or applied to part of the key, is divisible: any split keeps
    # an order with its customer (docs/design/splits.md, "The routing rule").
    assert checked.split_findings == ()
    assert checked.splittable


def test_the_default_mapping_survives_a_split(callbacks: ChangeSetCallbacks) -> None:
    """Orders mapped by the default mapping of their customer stay with the customer, and in
    their partition's children, at twice and three times every count."""
    samples = [(customer, order) for customer in range(100) for order in (1, 77)]
    checked = check_partition_mapping(
        lambda sample: PlaceOrder(callbacks, *sample),
        samples,
        num_partitions=range(1, 17),
        split_factors=(2, 3),
    )
    assert (checked.checked, checked.split_factors, checked.split_findings) == (len(samples) * 16, (2, 3), ())
    # A split to twice the count is checked unless asked otherwise.
    assert check_partition_mapping(lambda c: Pay(callbacks, c), [1], num_partitions=1).split_factors == (2,)


def test_a_mapping_that_is_not_divisible_is_named_by_its_first_key(
    callbacks: ChangeSetCallbacks, caplog: pytest.LogCaptureFixture
) -> None:
    """A range table keeps each transaction in one partition at every count, but a split moves
    keys to partitions that are not their partition's children."""
    samples = range(ACCOUNTS)
    counts = range(1, 5)
    # The first (account, count) whose partition at twice the count is not a child of its
    # partition at the count, computed here.
    account, count = next(
        (a, n) for a in samples for n in counts if account_range((a,), 2 * n) % n != account_range((a,), n)
    )
    before, after = account_range((account,), count), account_range((account,), 2 * count)

    with caplog.at_level("WARNING", logger="waltz.jdbc_style.partition_check"):
        checked = check_partition_mapping(lambda a: Deposit(callbacks, a), samples, num_partitions=counts)

    assert checked.checked == ACCOUNTS * len(counts)
    assert not checked.splittable
    assert checked.split_findings == (
        SplitFinding(
            SplitFindingKind.NOT_DIVISIBLE,
            "Deposit",
            account,
            count,
            2 * count,
            (SplitEntity("RangedAccount", (account,), "declared", before, after),),
        ),
    )
    message = str(checked.split_findings[0])
    assert (
        f"Deposit from the sample {account}: RangedAccount({account},) is in partition {before} of {count} "
        f"but in partition {after} of {2 * count}, not one of partition {before}'s children"
    ) in message
    assert (
        f"not divisible, so a log that uses it cannot be split from {count} to {2 * count} partitions"
        in message
    )
    assert [record.getMessage() for record in caplog.records] == [f"check_partition_mapping: {message}"]


def test_a_context_whose_entities_part_after_a_split_is_reported_not_raised(
    callbacks: ChangeSetCallbacks,
) -> None:
    """With one partition every context is whole; a customer and its wallet, each mapped
    divisibly but by different mappings, part at two or four."""
    samples = list(range(50))

    def first_parting(factor: int) -> int:
        return next(c for c in samples if partition_of(Customer, c, factor) != c % factor)

    checked = check_partition_mapping(
        lambda c: Pay(callbacks, c), samples, num_partitions=1, split_factors=(2, 4)
    )
    assert checked.checked == len(samples)
    assert {finding.split_to: finding.kind for finding in checked.split_findings} == {
        2: SplitFindingKind.CONTEXT_PARTS,
        4: SplitFindingKind.CONTEXT_PARTS,
    }
    for finding in checked.split_findings:
        customer, split_to = first_parting(finding.split_to), finding.split_to
        assert (finding.context, finding.sample, finding.num_partitions) == ("Pay", customer, 1)
        assert finding.entities == (
            SplitEntity("Customer", (customer,), "declared", 0, partition_of(Customer, customer, split_to)),
            SplitEntity("Wallet", (customer,), "expected", 0, customer % split_to),
        )
        assert str(finding) == (
            f"Pay from the sample {customer} would be refused after a split from 1 to {split_to} "
            f"partitions: its entities span 2 of {split_to} partitions: Customer({customer},) (declared) "
            f"-> partition {partition_of(Customer, customer, split_to)} (0 of 1); Wallet({customer},) "
            f"(expected) -> partition {customer % split_to} (0 of 1). Map them together (e.g. a "
            "partition_by that gives default_partition of the shared part of their keys) before "
            "splitting, or split the transaction"
        )
    # What the finding foretells: at the count after the split, the context is refused.
    customer = first_parting(2)
    with pytest.raises(CrossPartitionError, match=rf"Pay from the sample {customer} spans 2 of 2"):
        check_partition_mapping(lambda c: Pay(callbacks, c), [customer], num_partitions=2)
    # Without a split factor, nothing is checked beyond the counts given.
    unsplit = check_partition_mapping(
        lambda c: Pay(callbacks, c), samples, num_partitions=1, split_factors=()
    )
    assert (unsplit.split_factors, unsplit.split_findings) == ((), ())


def test_a_split_factor_below_two_is_refused(callbacks: ChangeSetCallbacks) -> None:
    for factors in (1, (2, 1), (0,)):
        with pytest.raises(ValueError, match="split_factors must be whole factors of at least 2"):
            check_partition_mapping(lambda c: Pay(callbacks, c), [1], num_partitions=4, split_factors=factors)
