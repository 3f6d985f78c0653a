"""Certificate dates, checked by whatever presents a certificate before it connects.

Source: docs/operations.md "Certificates". A peer refuses an expired certificate with a TLS error
that says nothing of dates ("Socket closed", "no ZooKeeper server answered", a connection that
is never accepted), so the clients, the tools and the nodes read the dates themselves and say it.
A TLS file that cannot be read fails only when a connection is tried, again and again, so a client
reads its files once before it connects too.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from pathlib import Path

from waltz.errors import ConfigurationError, ExpiredCertificateError

__all__ = [
    "certificate_not_after",
    "expired_certificates",
    "refuse_expired_certificates",
    "refuse_unreadable_tls_files",
]


def certificate_not_after(path: Path) -> datetime.datetime:
    """The expiry (``notAfter``, UTC) of the first certificate of a PEM file.

    Raises:
        OSError: the file cannot be read.
        ValueError: it holds no PEM certificate.
    """
    from cryptography import x509

    certificate = x509.load_pem_x509_certificate(path.read_bytes())
    return certificate.not_valid_after_utc


def expired_certificates(
    files: Mapping[str, Path | None], *, now: datetime.datetime | None = None
) -> list[str]:
    """Each of the certificates given that has expired, as a sentence naming the setting, the
    file and the date. A file that cannot be read is left to the TLS set-up to report.

    Args:
        files: the setting (``client.ssl.certFile``) -> its PEM file, or None.
        now: the current time (UTC; ``datetime.now``).
    """
    now = now or datetime.datetime.now(datetime.UTC)
    found = []
    for setting, path in files.items():
        if path is None:
            continue
        try:
            expiry = certificate_not_after(path)
        except (OSError, ValueError):
            continue
        if expiry <= now:
            found.append(f"{setting} {path} expired on {expiry.isoformat(timespec='seconds')}")
    return found


def refuse_expired_certificates(
    files: Mapping[str, Path | None], *, peers: str, holder: str, now: datetime.datetime | None = None
) -> None:
    """Refuse to connect with an expired certificate, before any peer is tried.

    Args:
        files: the setting (``client.ssl.certFile``) -> its PEM file, or None.
        peers: who refuses it, for the message (``the servers and ZooKeeper``).
        holder: who should get a current one (``the client``).
        now: the current time (UTC; ``datetime.now``).

    Raises:
        ExpiredCertificateError: one of them has expired; the message names each setting, file
            and date.
    """
    expired = expired_certificates(files, now=now)
    if expired:
        raise ExpiredCertificateError(
            f"{'; '.join(expired)}: {peers} refuse an expired certificate; give {holder} a current "
            'one (docs/operations.md, "Certificates")'
        )


def refuse_unreadable_tls_files(
    files: Mapping[str, Path | None], *, holder: str, variables: Mapping[str, str] | None = None
) -> None:
    """Refuse TLS files that cannot be used, before any peer is tried: each must be a readable
    file, and a certificate or CA file (a setting ending in ``certFile`` or ``caFile``) must hold
    a PEM certificate.

    Args:
        files: the setting (``client.ssl.certFile``) -> its file, or None where unset.
        holder: whose settings they are, for the message (``the client``).
        variables: the setting -> its environment variable, named in the message after the
            setting (``client.ssl.certFile (WALTZ_CLIENT_TLS_CERT_FILE)``); None: the settings
            alone.

    Raises:
        ConfigurationError: one of them cannot be used; the message names each setting, file and
            why.
    """
    from cryptography import x509

    wrong = []
    for setting, path in files.items():
        if path is None:
            continue
        variable = None if variables is None else variables.get(setting)
        named = setting if variable is None else f"{setting} ({variable})"
        try:
            content = Path(path).read_bytes()
        except OSError as exc:
            wrong.append(f"{named} {path} cannot be read ({exc.strerror or exc})")
            continue
        if setting.endswith(("certFile", "caFile")):
            try:
                x509.load_pem_x509_certificate(content)
            except ValueError:
                wrong.append(f"{named} {path} holds no PEM certificate")
    if wrong:
        raise ConfigurationError(f"{'; '.join(wrong)}: fix {holder}'s TLS settings")
