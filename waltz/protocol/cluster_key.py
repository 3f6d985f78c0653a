"""The cluster key's fingerprint: what messages, logs and manifests show instead of the key.

Design: docs/design/overview.md, "The cluster key". The cluster key (a UUID) is what every open
request to a storage node carries and what its control file holds: whoever knows it may open the
node's partitions with a certificate of the right role, or initialise a node for the cluster. It is
therefore never printed or logged: ``sha256:<hex>`` of its text tells two clusters apart, and a
person compares the fingerprints that the tools print, while ``waltz cluster list --show-key``
prints the key itself when it is needed.
"""

from __future__ import annotations

import hashlib
import uuid

__all__ = ["cluster_key_fingerprint"]


def cluster_key_fingerprint(cluster_key: str | uuid.UUID) -> str:
    """``sha256:<hex>`` of a cluster key's text (its canonical UUID form, lower-case, with hyphens).

    Args:
        cluster_key: the key, as a UUID or its text.

    Returns:
        ``"sha256:"`` and 64 hex digits; the same key always gives the same fingerprint.
    """
    return "sha256:" + hashlib.sha256(str(cluster_key).encode("utf-8")).hexdigest()
