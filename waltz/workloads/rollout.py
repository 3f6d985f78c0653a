"""A deploy of an application's later releases while the SmallBank mix runs (the demo's).

Source: docs/sql.md, "Changing a model" ("Rolling it out"); docs/design/overview.md, "Workloads".
The instances start on the first release of an :class:`~waltz.workloads.application.EvolvingApplication`;
each later release goes out as the guide says:

- a release that **rolls** starts at its point of the mix, on a thread of its own while the mix
  goes on: its migration runs first (it leaves the previous release working), then each instance
  in turn leaves the workload's rotation (:meth:`SmallBankWorkload.retire`: its requests resolved
  and applied), is closed, and is replaced by an instance of the new release;
- a release that does **not roll** (its migration breaks the previous release, e.g. a column
  renamed for good) waits for the end of the mix: every instance stops, the migration runs, and
  they start again on it (:meth:`Rollout.finish`).

Once every instance runs a release, a few new customers open accounts on it, so that the log holds
row changes of the release's schema versions, and a mix that ends holds changes of them all.

The mix writes accounts (closings) at its halfway point only. An instance of an older release that
meets a change of a newer schema version waits for an upgrade (its partition pauses, as it should),
so a roll under way there is finished first: the halfway draw waits for it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

import tenacity
from sqlalchemy import Engine

from waltz.jdbc_style import is_transient
from waltz.workloads.application import EvolvingApplication, Release, SmallBankInstance
from waltz.workloads.smallbank import SmallBankWorkload

__all__ = ["Rollout"]

log = logging.getLogger(__name__)

#: New customers who open accounts on each release once every instance runs it.
NEW_CUSTOMERS_PER_RELEASE = 2

#: Seconds one step (a retire, an opening) may take.
STEP_TIMEOUT = 90.0

StartInstance = Callable[[int], SmallBankInstance]


class Rollout:
    """Moves the instances of an evolving application from its first release to its last.

    Args:
        app: the application.
        engine: its database (the migrations run on it).
        start: starts an instance of a release number (``app.release_instance`` with the run's
            database and cluster).
        instances: how many instances run at a time.
        total: the mix's draws (the rolling releases start at even points of it).
        first_customer: the first customer ID the new customers take (above the mix's).
        say: prints a line.

    Call :meth:`prepare_first` and :meth:`start_first` before the mix, :meth:`progress` with the
    mix's progress, :meth:`join` after the mix, :meth:`finish` once it is quiet, and
    :meth:`close` at the end.
    """

    def __init__(
        self,
        app: EvolvingApplication,
        engine: Engine,
        start: StartInstance,
        *,
        instances: int,
        total: int,
        first_customer: int,
        say: Callable[[str], None],
    ) -> None:
        releases = list(app.releases())
        if not releases:
            raise ValueError("an evolving application needs at least one release")
        self.app = app
        self.engine = engine
        self.say = say
        self._start = start
        self._count = instances
        self._first = releases[0]
        self._rolling = [r for r in releases[1:] if r.rolls]
        self._offline = [r for r in releases[1:] if not r.rolls]
        rolls = len(self._rolling)
        self._points = [max(1, int(total * (i + 0.25) / rolls)) for i in range(rolls)]
        self._halfway = total // 2
        self._done = 0
        self._next_customer = first_customer
        self.instances: list[SmallBankInstance] = []
        self.workload: SmallBankWorkload | None = None
        self.retired_uncaught = 0
        """``uncaught_exception`` calls of the instances closed so far."""
        self.events: list[str] = []
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rollout")
        self._rolls: list[Future[None]] = []

    def prepare_first(self) -> None:
        """Create or upgrade the database's tables to what the first release runs on."""
        self.app.prepare_release(self.engine, self._first.number)

    def start_first(self) -> list[SmallBankInstance]:
        """Start the instances on the first release (after :meth:`prepare_first`)."""
        self.instances = []
        for _ in range(self._count):  # one by one: interrupted, :meth:`close` closes those started
            self.instances.append(self._start(self._first.number))
        self._note(f"{self._count} instances start on release {self._first.number}")
        return list(self.instances)

    def progress(self, n: int) -> None:
        """The mix drew ``n`` more: start the releases whose point it passed; at the halfway
        point, wait for a roll under way (see the module docstring)."""
        before, self._done = self._done, self._done + n
        for index, point in enumerate(self._points):
            if before < point <= self._done:
                self._rolls.append(self._executor.submit(self._roll, self._rolling[index]))
        if before < self._halfway <= self._done:
            self.join()

    def join(self) -> None:
        """Wait for the rolls started so far (a failed roll raises here)."""
        for roll in self._rolls:
            roll.result(len(self.instances) * 2 * STEP_TIMEOUT + STEP_TIMEOUT)

    def finish(self) -> None:
        """Go out with the releases that do not roll: every instance stops, the migration runs,
        the instances start on the release. Call it once the mix is over and quiet."""
        self.join()
        for release in self._offline:
            self._note(f"release {release.number}: {release.change}: every instance stops for its migration")
            for instance in self.instances:
                self._retire(instance)
            self.instances = []
            self._migrate(release)
            self.instances = [self._start(release.number) for _ in range(self._count)]
            self._note(f"release {release.number}: migrated; {self._count} instances run it")
            self._new_customers(release)

    def close(self) -> None:
        """Close every instance still running and stop the roll thread. Idempotent."""
        self._executor.shutdown(wait=True, cancel_futures=True)
        for instance in self.instances:
            instance.close()

    def _roll(self, release: Release) -> None:
        self._note(f"release {release.number}: {release.change}: migrating, then one instance at a time")
        self._migrate(release)
        workload = self.workload
        for index, old in enumerate(list(self.instances)):
            new = self._start(release.number)
            try:
                if workload is not None:
                    workload.add(new)  # before the old one leaves: the rotation is never empty
                    workload.retire(old, STEP_TIMEOUT)
            except BaseException:
                new.close()  # not yet among self.instances, which close() closes
                raise
            self._retire(old)
            self.instances[index] = new
        self._note(f"release {release.number}: every instance runs it")
        self._new_customers(release)

    def _migrate(self, release: Release) -> None:
        """The release's migrations, retried while the running instances' writes keep the
        database busy (a SQLite writer, a lock wait)."""
        for attempt in tenacity.Retrying(
            retry=tenacity.retry_if_exception(is_transient),
            stop=tenacity.stop_after_delay(STEP_TIMEOUT),
            wait=tenacity.wait_exponential(multiplier=0.05, max=1.0),
            reraise=True,
        ):
            with attempt:
                self.app.prepare_release(self.engine, release.number)

    def _retire(self, instance: SmallBankInstance) -> None:
        self.retired_uncaught += instance.callbacks.uncaught_count
        instance.close()

    def _new_customers(self, release: Release) -> None:
        instance = self.instances[0]
        for _ in range(NEW_CUSTOMERS_PER_RELEASE):
            custid, self._next_customer = self._next_customer, self._next_customer + 1
            operation = instance.open_account(custid, f"customer-{custid}", 10_000, 10_000)
            if not instance.submit(operation).result(STEP_TIMEOUT):
                raise RuntimeError(
                    f"release {release.number}: opening customer {custid}'s account was dropped: "
                    f"{operation.reason}"
                )
        self._note(f"release {release.number}: {NEW_CUSTOMERS_PER_RELEASE} new customers opened accounts")

    def _note(self, event: str) -> None:
        self.events.append(event)
        self.say(f"  deploy: {event}")
