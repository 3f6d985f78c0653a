"""A ledger instance that debits a cross-partition transfer, reports it, and waits to be killed.

Run by test_ledger.py beside it: it has no sweeper, so the transfer's credit can only come from
another instance after this one is killed with SIGKILL. The cluster's credential, if any, comes
from the ``WALTZ_ZOOKEEPER_*`` variables.

Usage: python debit_then_hang.py DB_URL ZOOKEEPER ROOT FROM_CUSTID TO_CUSTID AMOUNT
"""

from __future__ import annotations

import os
import sys
import time

from waltz_examples.ledger.service import LedgerService


def main() -> None:
    db_url, zookeeper, root, source, target, amount = sys.argv[1:7]
    service = LedgerService(
        db_url,
        zookeeper=zookeeper,
        cluster_root=root,
        cluster_name=os.environ["LEDGER_CLUSTER_NAME"],
        sweep_interval=None,
        prepare=False,
    )
    # Ready to serve: the accounts the test opened through another instance are applied to the
    # shared database before this one reads them (a read before would find no account and drop).
    service.client.ready(30)
    outcome = service.transfer(int(source), int(target), int(amount))
    assert outcome.committed and outcome.transaction_id is not None, outcome
    assert service.callbacks.wait_for(outcome.partition_id, outcome.transaction_id, 30)
    print(f"DEBITED {outcome.transfer_id}", flush=True)
    time.sleep(120)  # the test kills this process long before


if __name__ == "__main__":
    main()
