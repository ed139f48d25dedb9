"""The inspector's sign-in: an API key exchanged for a signed session cookie, and its CSRF token.

The cookie carries the tenant, the key's SHA-256 (never the key) and a random nonce, signed with
a secret every Ingress replica shares (`ui_secret`), so any replica accepts any replica's cookie.
The CSRF token is an HMAC of the nonce: a page of this origin can read it from its forms, a
forged cross-site request cannot. Pure: no I/O.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass

from itsdangerous import BadSignature, URLSafeTimedSerializer

COOKIE = "memserve_inspector"
CSRF_HEADER = "X-CSRF-Token"
CSRF_FIELD = "csrf_token"


@dataclass(frozen=True)
class InspectorSession:
    tenant: str
    key_digest: str
    nonce: str


class SessionSigner:
    def __init__(self, secret: str, max_age_s: int):
        self._secret = secret.encode("utf-8")
        self._serializer = URLSafeTimedSerializer(secret, salt="memserve-inspector-session")
        self.max_age_s = max_age_s

    def issue(self, tenant: str, key_digest: str) -> str:
        return self._serializer.dumps({"t": tenant, "k": key_digest, "n": secrets.token_urlsafe(16)})

    def read(self, cookie: str | None) -> InspectorSession | None:
        """The session a cookie holds, or None when it is missing, forged or older than max_age_s."""
        if not cookie:
            return None
        try:
            data = self._serializer.loads(cookie, max_age=self.max_age_s)
        except BadSignature:  # SignatureExpired is one
            return None
        if not isinstance(data, dict) or not all(isinstance(data.get(k), str) for k in ("t", "k", "n")):
            return None
        return InspectorSession(data["t"], data["k"], data["n"])

    def csrf_token(self, session: InspectorSession) -> str:
        return hmac.new(self._secret, b"csrf\x1f" + session.nonce.encode(), hashlib.sha256).hexdigest()

    def csrf_ok(self, session: InspectorSession, token: str | None) -> bool:
        return bool(token) and hmac.compare_digest(self.csrf_token(session), token or "")
