"""waltz-py: a Python implementation of Waltz, the quorum-replicated, partitioned write-ahead log.

The public client API (``WaltzClient``, ``TransactionContext``, ...) is re-exported here once it
exists; see ``../shared/DESIGN.md`` for the package layout.
"""

from waltz.errors import WaltzError

__all__ = ["WaltzError", "__version__"]

__version__ = "0.1.0"
