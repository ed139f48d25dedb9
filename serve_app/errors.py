"""Every error the service answers with, each carrying its HTTP status and message.

Raised anywhere (core, stores, services) and mapped to a response by one handler
(`api/error_responses.py`), so no route builds an error response by hand. The body is always
`{"detail": <message>, ...extra}`; `Retry-After` goes out whenever the error says when to retry.
Pure: no I/O and no web framework, so the pure core can raise these too.
"""

from __future__ import annotations

from typing import Any


class ServiceError(Exception):
    """An answer the client can act on: `status_code`, a `detail` message, optional extra fields."""

    status_code: int = 500

    def __init__(self, detail: Any, *, retry_after_s: int | None = None, **extra: Any):
        super().__init__(detail if isinstance(detail, str) else repr(detail))
        self.detail = detail
        self.retry_after_s = retry_after_s
        self.extra = extra

    def body(self) -> dict[str, Any]:
        return {"detail": self.detail, **self.extra}

    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(self.retry_after_s)} if self.retry_after_s is not None else {}

    def __reduce__(self):
        # Errors cross process boundaries (a memorizer replica raises what the ingress answers
        # with): rebuild from the state, since subclasses take other constructor arguments.
        return _rebuild, (type(self), self.args, self.__dict__)


def _rebuild(cls: type[ServiceError], args: tuple, state: dict[str, Any]) -> ServiceError:
    error = cls.__new__(cls)
    error.args = args
    error.__dict__.update(state)
    return error


# 4xx: the request cannot succeed as it is.


class BadRequest(ServiceError):
    status_code = 400


class NoModel(BadRequest):
    """The chat endpoint was called on a service without an LLM."""

    def __init__(self) -> None:
        super().__init__(
            "this service has no LLM: llm_mode is none; set llm_mode to openai (with llm_base_url) or ray-serve-llm "
            "to use /v1/chat/completions",
            code="llm_not_configured",
        )


class ContextLengthExceeded(BadRequest):
    """A chat call's newest turn, system prompt and answer do not fit the model's window (OpenAI's
    `context_length_exceeded`); nothing of the call is stored."""

    def __init__(self, detail: str):
        super().__init__(detail, code="context_length_exceeded", param="messages")


class Unauthorized(ServiceError):
    status_code = 401

    def __init__(self, detail: str = "missing or invalid API key"):
        super().__init__(detail)

    def headers(self) -> dict[str, str]:
        return {"WWW-Authenticate": "Bearer"}


class CsrfRejected(ServiceError):
    status_code = 403

    def __init__(self) -> None:
        super().__init__(
            "missing or invalid CSRF token: a write signed in through the inspector carries its session's token "
            "(form field csrf_token or header X-CSRF-Token)",
            code="csrf_rejected",
        )


class HostNotAllowed(ServiceError):
    """With API keys off, a request addressed to a name other than loopback or `allowed_hosts`."""

    status_code = 421

    def __init__(self, host: str | None):
        named = f"host {host!r}" if host else "a request without a Host header"
        super().__init__(
            f"{named} is not served with API keys off: only loopback names and allowed_hosts are, so a page whose "
            "name resolves to this machine (DNS rebinding) cannot use it. Add the name to allowed_hosts "
            "(MEMSERVE_ALLOWED_HOSTS) or turn API keys on.",
            code="host_not_allowed",
        )


class OriginNotAllowed(ServiceError):
    """With API keys off, a call from a page of another site (a browser sends its Origin)."""

    status_code = 403

    def __init__(self, origin: str):
        super().__init__(
            f"origin {origin!r} is not allowed with API keys off: pages of other sites cannot call this service. "
            "Add its host name to allowed_hosts (MEMSERVE_ALLOWED_HOSTS) or turn API keys on.",
            code="origin_not_allowed",
        )


class NotFound(ServiceError, LookupError):
    status_code = 404


class SessionNotFound(NotFound):
    def __init__(self, session_id: str = ""):
        super().__init__("session not found")
        self.session_id = session_id


class FactNotFound(NotFound):
    def __init__(self) -> None:
        super().__init__("fact not found")


class MemoryNotFound(NotFound):
    def __init__(self) -> None:
        super().__init__("memory not found")


class SpaceNotFound(NotFound):
    """A space that does not exist and one the key holds no grant on answer alike: a key without a
    grant learns nothing of a space, not even that it exists."""

    def __init__(self, spaces: list[str]) -> None:
        super().__init__(f"memory space not found, or no grant on it: {', '.join(spaces)}", spaces=spaces)


class Forbidden(ServiceError):
    status_code = 403


class SpaceForbidden(Forbidden):
    def __init__(self, spaces: list[str], need: str) -> None:
        super().__init__(f"the {need} grant is needed on memory space {', '.join(spaces)}", spaces=spaces, needs=need)


class Conflict(ServiceError):
    status_code = 409


class SessionOwnerError(Conflict):
    """The session belongs to another user; the message does not name that user."""

    def __init__(self, owner: str):
        super().__init__("session belongs to another user")
        self.owner = owner


class CompactionConflict(Conflict):
    """Every attempt lost the compare-and-set to another compactor: retry shortly."""

    def __init__(self, detail: str):
        super().__init__(detail, retry_after_s=1)


class PayloadTooLarge(ServiceError):
    status_code = 413


class InvalidRequest(ServiceError, ValueError):
    status_code = 422


class BudgetError(InvalidRequest):
    """What must be in the prompt does not fit; carries the token counts."""

    def __init__(self, detail: str, counts: dict[str, int]):
        super().__init__(detail, token_counts=counts)
        self.counts = counts


class RateLimited(ServiceError):
    """A 429: what was refused and when to try again."""

    status_code = 429

    def __init__(self, detail: str, retry_after_s: int):
        super().__init__(detail, retry_after_s=retry_after_s)


class QuotaExceeded(RateLimited):
    RETRY_AFTER_S = 3600  # space comes back only when the tenant deletes something

    def __init__(self, quota: int, used: int):
        super().__init__(
            f"quota of {quota} stored memories reached ({used} stored); delete memories or sessions, or ask for a larger quota",
            self.RETRY_AFTER_S,
        )


# 503: a backing store did not answer; the same request may succeed later.

RETRY_UNAVAILABLE_S = 2


class Unavailable(ServiceError, ConnectionError):
    status_code = 503

    def __init__(self, cause: str):
        super().__init__(f"a backing store is unavailable ({cause}); retry later", retry_after_s=RETRY_UNAVAILABLE_S)


class ModelUnavailable(ServiceError):
    """The LLM did not answer (connection, timeout, busy): the same request may succeed later."""

    status_code = 503

    def __init__(self, cause: str, retry_after_s: int = RETRY_UNAVAILABLE_S):
        super().__init__(f"the model is unavailable ({cause}); retry later", retry_after_s=retry_after_s)


class ModelRefused(BadRequest):
    """The model refused what the request asked of it (its own 400: a parameter it does not take),
    passed on with its message."""

    def __init__(self, detail: str):
        super().__init__(detail, code="model_refused")


class UpstreamFailed(ServiceError):
    """The model endpoint failed the service (its credentials, its configuration, its own error): a
    502 that names the endpoint, never the tenant's fault and never with its key."""

    status_code = 502

    def __init__(self, detail: str, retry_after_s: int | None = RETRY_UNAVAILABLE_S):
        super().__init__(detail, retry_after_s=retry_after_s, code="upstream_error")


class RecallUnavailable(Unavailable):
    """Neither side of recall (dense or keyword) answered."""

    def __init__(self, sides: str = ""):
        super().__init__("RecallUnavailable")
        self.sides = sides


class ReplicasUnconfirmed(Unavailable):
    """Fewer replicas than `redis_confirm_replicas` confirmed a session-log write in time. The write
    may already be applied on the primary: a retry with the same client message ids stores each
    turn once."""

    def __init__(self, confirmed: int, wanted: int):
        super().__init__(f"{confirmed} of {wanted} Redis replicas confirmed the write in time")
        self.confirmed = confirmed
        self.wanted = wanted


# Start-up refusals: a replica whose settings the stores cannot meet does not start.


class ReplicaSettingError(ValueError):
    """`redis_confirm_replicas` asks for more replicas than a primary has connected: every write
    would time out, so the service refuses to start instead."""

    def __init__(self, wanted: int, short: dict[str, int]):
        having = ", ".join(f"{primary} has {count}" for primary, count in sorted(short.items()))
        super().__init__(
            f"redis_confirm_replicas is {wanted} but not every Redis primary has that many replicas connected ({having})"
        )
        self.wanted = wanted
        self.short = short
