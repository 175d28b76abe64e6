"""Errors the engine raises at submit time; the server maps them to HTTP statuses."""
from sluice_contracts.request_deadline import DEADLINE_PASSED, DEADLINE_UNATTAINABLE


class EngineError(Exception):
    """Base class; `code` is a stable machine-readable reason."""

    code = "engine_error"


class RequestRejected(EngineError):
    """The request can never be served as asked (too long for the context or the KV cache)."""

    code = "request_too_large"


class EngineOverloaded(EngineError):
    """The waiting queue is full; retry later."""

    code = "overloaded"

    def __init__(self, message: str, retry_after_s: float = 1.0):
        super().__init__(message)
        self.retry_after_s = retry_after_s


class DeadlineUnattainable(EngineOverloaded):
    """The request's first byte is not expected within its budget (sluice_contracts.request_deadline)."""

    code = DEADLINE_UNATTAINABLE


class DeadlinePassed(EngineOverloaded):
    """The request's budget passed while it was still queued; it was ended before it started."""

    code = DEADLINE_PASSED


class EngineDead(EngineError):
    """The engine loop stopped (a bug or shutdown); no request can make progress."""

    code = "engine_dead"
