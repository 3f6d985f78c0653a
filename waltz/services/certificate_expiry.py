"""When a node's TLS certificates expire: a gauge on ``/metrics`` and a warning in its log.

Source: docs/operations.md "Certificates" (what to alert on). A certificate that expires stops the
node's peers from connecting with a TLS error that names nothing about dates, on every port at
once; the gauge lets an alert fire weeks before, and the start-up line says it at once.
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Mapping
from pathlib import Path

from prometheus_client import CollectorRegistry, Gauge

from waltz.protocol.certificates import certificate_not_after

__all__ = ["EXPIRY_WARNING_DAYS", "watch_certificates"]

log = logging.getLogger(__name__)

#: A certificate that expires within this many days is warned about at start-up.
EXPIRY_WARNING_DAYS = 14


def watch_certificates(
    registry: CollectorRegistry,
    files: Mapping[str, Path | None],
    *,
    now: datetime.datetime | None = None,
) -> dict[str, datetime.datetime]:
    """Set ``waltz_tls_certificate_expiry_timestamp_seconds{certificate=<name>}`` for each
    certificate given, and log its expiry: a warning within :data:`EXPIRY_WARNING_DAYS`, an
    error once expired (the node's peers refuse it).

    Args:
        registry: the node's metrics registry.
        files: a name for each certificate (``server``, ``storage client``) -> its PEM file, or
            None (no TLS there: nothing is set).
        now: the current time (UTC; ``datetime.now``).

    Returns:
        Name -> expiry, for the certificates that could be read (one that cannot is logged: the
        node's TLS set-up reports it).
    """
    gauge = Gauge(
        "waltz_tls_certificate_expiry_timestamp_seconds",
        "When the node's TLS certificate expires (its notAfter, Unix time), by certificate: alert "
        "well before it (docs/operations.md).",
        ["certificate"],
        registry=registry,
    )
    now = now or datetime.datetime.now(datetime.UTC)
    expiries: dict[str, datetime.datetime] = {}
    for name, path in files.items():
        if path is None:
            continue
        try:
            expiry = certificate_not_after(path)
        except (OSError, ValueError) as exc:
            log.warning("the %s certificate %s: cannot read its expiry: %s", name, path, exc)
            continue
        expiries[name] = expiry
        gauge.labels(name).set(expiry.timestamp())
        left = expiry - now
        if left <= datetime.timedelta(0):
            log.error(
                "the %s certificate %s EXPIRED on %s: peers refuse it; make its replacement "
                '(docs/deploy.md, "Certificates and roles")',
                name,
                path,
                expiry.isoformat(timespec="seconds"),
            )
        elif left <= datetime.timedelta(days=EXPIRY_WARNING_DAYS):
            log.warning(
                "the %s certificate %s expires on %s, in %d day(s): make its replacement "
                '(docs/deploy.md, "Certificates and roles")',
                name,
                path,
                expiry.isoformat(timespec="seconds"),
                left.days,
            )
        else:
            log.info("the %s certificate %s expires on %s", name, path, expiry.isoformat(timespec="seconds"))
    return expiries
