"""Where a node may serve without mutual TLS (docs/operations.md, "Roles"; docs/design/overview.md,
"Roles").

A storage node or server serves with mutual TLS (certificate, key and CA file: every peer then
presents a certificate naming its roles), or refuses to start, unless the node's ``insecure``
setting says, on purpose, that it serves without; that node then logs so at every start. A node
bound to a loopback address is reachable from this host only, but by every user of it: without
client certificates any of them could delete its partitions, fence or truncate the log, so
loopback is no exception (docs/decisions/0098-plaintext-on-loopback-is-an-explicit-opt-out.md).
"""

from __future__ import annotations

import ipaddress

__all__ = ["is_loopback", "plaintext_refusal"]


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address, ``[v6]`` form included, or ``localhost``) is loopback only.

    Host names other than ``localhost`` count as not loopback: what they resolve to can change.
    """
    name = host.strip().strip("[]")
    if name.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def plaintext_refusal(
    prefix: str, env_prefix: str, host: str, *, mutual_tls: bool, insecure: bool
) -> str | None:
    """Why a node bound to ``host`` may not start as configured, or None when it may.

    Args:
        prefix: the settings' key prefix (``storage``, ``server``).
        env_prefix: the environment variables' prefix (``WALTZ_STORAGE_``, ``WALTZ_SERVER_``).
        host: the address the node's ports bind to.
        mutual_tls: certificate, key and CA file are all set.
        insecure: the ``<prefix>.insecure`` setting.

    Returns:
        The refusal's message, naming the settings that lift it; None when mutual TLS is on or
        ``insecure`` is set.
    """
    if mutual_tls or insecure:
        return None
    settings = f"{prefix}.ssl.certFile, {prefix}.ssl.keyFile and {prefix}.ssl.caFile"
    if is_loopback(host):
        reach = (
            f"{prefix}.host {host!r} is a loopback address, reachable by every user of this host, and "
            "mutual TLS is not configured: without client certificates any of them could delete "
            "the node's partitions, fence or truncate the log."
        )
    else:
        reach = (
            f"{prefix}.host {host!r} is not a loopback address, and mutual TLS is not configured: a "
            "node other hosts can reach serves only with client certificates and roles."
        )
    return (
        f"{reach} Set {settings} "
        '(docs/operations.md, "Roles"), '
        f"or {prefix}.insecure=true ({env_prefix}INSECURE=true, --insecure) to serve without them "
        "on purpose (a trial on a machine of your own)"
    )
