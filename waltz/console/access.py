"""Who may read the console and run its operator actions, and who asked for each action.

Design: docs/design/console.md "Access". The console knows who asks in one of two ways:

- **browser certificates** (``console.ssl.caFile``, ``--tls-ca``): the certificate the browser
  presented, read from the ASGI TLS extension of the request (``scope["extensions"]["tls"]``);
  its roles are the ``urn:waltz:role:<role>`` names of :mod:`waltz.protocol.roles`. The pages need
  ``operator`` or ``admin``; every action needs ``admin``, as the same ``waltz cluster storage``
  command does on the storage nodes (docs/operations.md "Roles").
- **a start token** (any console without browser certificates, which serves actions on loopback
  only): a random token printed once in the start line, as the URL's ``token`` query parameter.
  Every action request carries it, in the ``X-Console-Token`` header (what the page's script
  sends) or the ``console_token`` form field. The pages stay readable without it.
"""

from __future__ import annotations

import enum
import functools
import hmac
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from waltz.console.actions import ActionKind
from waltz.protocol.roles import ADMIN_ROLES, OPERATOR_ROLES, Role, denial, roles_of_certificate

__all__ = [
    "ACTION_ROLES",
    "READ_ROLES",
    "TOKEN_FIELD",
    "TOKEN_HEADER",
    "AccessMode",
    "ConsoleAccess",
    "Requester",
    "client_certificate",
]

#: Roles that may read the console's pages, fragments and JSON (as the read-only admin requests).
READ_ROLES = OPERATOR_ROLES
#: Roles that may run each action: ``admin``, as for the ``waltz cluster storage`` command of the
#: same name, whose requests the storage nodes refuse to any other role (``operator`` reads only).
ACTION_ROLES: dict[ActionKind, frozenset[Role]] = {
    ActionKind.ADD_REPLICA: ADMIN_ROLES,
    ActionKind.REMOVE_REPLICA: ADMIN_ROLES,
    ActionKind.RECOVER_PARTITION: ADMIN_ROLES,
}
#: The request header that carries the start token.
TOKEN_HEADER = "X-Console-Token"
#: The form field that carries the start token (when a header cannot be sent).
TOKEN_FIELD = "console_token"
#: Bytes of randomness of a start token (``secrets.token_urlsafe``: 43 characters).
TOKEN_BYTES = 32


class AccessMode(enum.Enum):
    """How the console knows who asks."""

    CERTIFICATES = "certificates"
    TOKEN = "token"


@dataclass(frozen=True, slots=True)
class Requester:
    """Who made a request.

    Attributes:
        address: the peer's ``host:port`` as the socket saw it (``unknown`` when not given).
        subject: the browser certificate's subject (RFC 4514), or None without one.
        roles: the certificate's roles, or None without a certificate.
        token_holder: the request carried the console's start token.
    """

    address: str
    subject: str | None = None
    roles: frozenset[Role] | None = None
    token_holder: bool = False

    def describe(self) -> str:
        """Who asked, for the log and the page (never the token itself)."""
        if self.subject is not None:
            held = ", ".join(sorted(role.value for role in self.roles or ())) or "none"
            return f"certificate {self.subject!r} (roles: {held}) from {self.address}"
        if self.token_holder:
            return f"loopback token holder from {self.address}"
        return f"a request without the token from {self.address}"

    @property
    def identity(self) -> str:
        """What a confirmation is bound to: the certificate's subject, or the token's holder."""
        if self.subject is not None:
            return "certificate:" + self.subject
        return "token" if self.token_holder else "anonymous"


def client_certificate(scope: Mapping[str, Any]) -> str | None:
    """The PEM certificate the peer presented, from the ASGI TLS extension, or None."""
    tls = scope.get("extensions", {}).get("tls") or {}
    chain = tls.get("client_cert_chain") or ()
    for pem in chain:
        return str(pem)
    return None


@functools.lru_cache(maxsize=256)
def _subject(pem: str) -> str:
    from cryptography import x509

    return x509.load_pem_x509_certificate(pem.encode()).subject.rfc4514_string() or "(empty subject)"


class ConsoleAccess:
    """The console's access rule: browser certificates with roles, or the start token.

    Args:
        mode: how requesters are known.
        token: the start token (token mode); a new random one when None.
    """

    def __init__(self, mode: AccessMode, token: str | None = None) -> None:
        self.mode = mode
        self._token = (token or secrets.token_urlsafe(TOKEN_BYTES)) if mode is AccessMode.TOKEN else None

    @classmethod
    def for_browser_ca(cls, browser_ca: bool) -> ConsoleAccess:
        """Certificates when browsers must present one (``console.ssl.caFile``), else a start token."""
        return cls(AccessMode.CERTIFICATES if browser_ca else AccessMode.TOKEN)

    def start_url(self, url: str) -> str:
        """The URL to open: ``url`` with the start token as its ``token`` parameter (token mode)."""
        if self._token is None:
            return url
        return f"{url}?{urlencode({'token': self._token})}"

    def requester(
        self, scope: Mapping[str, Any], headers: Mapping[str, str], form: Mapping[str, str]
    ) -> Requester:
        """Who made the request of ``scope``.

        Args:
            scope: the ASGI scope (its ``client`` and its TLS extension).
            headers: the request's headers (case-insensitive mapping).
            form: the posted form's fields (empty for a GET).
        """
        client = scope.get("client")
        address = f"{client[0]}:{client[1]}" if client else "unknown"
        if self.mode is AccessMode.CERTIFICATES:
            pem = client_certificate(scope)
            if pem is None:
                return Requester(address)
            return Requester(address, _subject(pem), roles_of_certificate(pem.encode()))
        assert self._token is not None
        offered = headers.get(TOKEN_HEADER) or form.get(TOKEN_FIELD) or ""
        holder = hmac.compare_digest(offered.encode(), self._token.encode())
        return Requester(address, token_holder=holder)

    def read_denial(self, requester: Requester) -> str | None:
        """Why ``requester`` may not read the pages (None: it may)."""
        if self.mode is AccessMode.TOKEN:
            return None
        return self._role_denial(requester, READ_ROLES, "reading the console")

    def action_denial(self, requester: Requester, kind: ActionKind) -> str | None:
        """Why ``requester`` may not ask for or run an action of ``kind`` (None: it may)."""
        if self.mode is AccessMode.TOKEN:
            if requester.token_holder:
                return None
            return (
                "operator actions need the token this console printed when it started: open the URL "
                "of its start line (it ends with ?token=...), then act from that page"
            )
        return self._role_denial(requester, ACTION_ROLES[kind], f"the action {kind.value}")

    def acting_denial(self, requester: Requester) -> str | None:
        """Why ``requester`` may run no action at all (None: it may run at least one)."""
        if self.mode is AccessMode.TOKEN:
            return self.action_denial(requester, ActionKind.ADD_REPLICA)
        return self._role_denial(requester, frozenset().union(*ACTION_ROLES.values()), "operator actions")

    def allowed_actions(self, requester: Requester) -> list[ActionKind]:
        """The actions ``requester`` may run, in the page's order (token mode: all of them)."""
        if self.mode is AccessMode.TOKEN:
            return list(ActionKind)
        return [kind for kind in ActionKind if self.action_denial(requester, kind) is None]

    @staticmethod
    def _role_denial(requester: Requester, allowed: frozenset[Role], what: str) -> str | None:
        if requester.roles is None:
            return f"{what} needs a browser certificate signed by the console's CA"
        return denial(requester.roles, allowed, what)
