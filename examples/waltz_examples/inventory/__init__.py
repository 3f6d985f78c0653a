"""The inventory example: reservations of stock on a few hot SKUs, each request under an
idempotency key (docs/sql.md, "Idempotency keys").

- :mod:`waltz_examples.inventory.models`: the ``Sku`` and ``Reservation`` entities, the
  ``SetStock`` and ``Reserve`` contexts (no oversell; a retried request applied once).
- :mod:`waltz_examples.inventory.service`: ``InventoryService`` (one instance), and
  ``INVENTORY``, what ``waltz perf inventory`` drives.

It needs the ``sql`` extra.
"""
