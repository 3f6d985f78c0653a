"""The wallet example: an asyncio service (FastAPI) on the SQL framework (docs/asyncio-service.md).

Deposits, withdrawals that never take a balance below zero, and balances, over HTTP; a retried
request (the same request ID) is applied once.

- :mod:`waltz_examples.wallet.models`: the ``Wallet`` entity, the ``Deposit`` and ``Withdraw``
  contexts.
- :mod:`waltz_examples.wallet.app`: the FastAPI app (``create_app``) on ``AsyncWaltzClient``.

It needs the ``sql`` and ``asgi`` extras.
"""
