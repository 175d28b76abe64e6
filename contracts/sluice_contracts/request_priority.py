"""How the gateway tells a runtime whose request it forwards and how urgent it is.

The gateway resolves the tenant's priority class (gateway.yaml) to a number and sends it, with the tenant and its
fairness share, in the headers below, always replacing whatever the client sent (a client's `priority` body field
is removed too). The runtime takes the headers over the body's `priority` field, which remains for direct callers
as in vLLM.

Meaning of the number, vLLM's convention: lower is more urgent. The runtime admits waiting requests in priority
order, and within one priority in turn across tenants, in proportion to their shares; when the KV cache or the
batch is full it preempts the least urgent running request (then the most recent); when its queue is full it sheds
the least urgent waiting request that has not started (503 with Retry-After). A request in the batch class (`batch`'s
number or less urgent, `in_batch_class`) runs on what the others leave: a runtime's step that prefills a more urgent
prompt carries none of it, a step of it alone is abandoned between layers when a more urgent chat or completion
arrives, and while more urgent requests are about its steps stay short; a gateway whose classes are its own numbers
its batch class at 10 or more for this to hold.
"""
from __future__ import annotations

import math
import re
from urllib.parse import quote

PRIORITY_HEADER = "x-sluice-priority"
TENANT_HEADER = "x-sluice-tenant"
SHARE_HEADER = "x-sluice-tenant-share"

# Bounds of the number (header and body field alike): wide enough for any class scheme, small enough to print.
MIN_PRIORITY = -1000
MAX_PRIORITY = 1000
# A share is a weight against other tenants of the same priority; 1 each is an equal split.
DEFAULT_SHARE = 1.0
MIN_SHARE = 0.001
MAX_SHARE = 1000.0
MAX_TENANT_CHARS = 256

# The classes a gateway has when gateway.yaml names none; `standard` is the number a direct caller gets by default.
DEFAULT_CLASSES = {"critical": -10, "standard": 0, "batch": 10}
DEFAULT_CLASS = "standard"


def in_batch_class(priority: int) -> bool:
    """Whether a request of `priority` is batch work: the batch class's number or less urgent."""
    return priority >= DEFAULT_CLASSES["batch"]


_TENANT = re.compile(r"^[A-Za-z0-9._~%-]+$")
_INTEGER = re.compile(r"^[+-]?[0-9]{1,6}$")
_NUMBER = re.compile(r"^[0-9]{1,6}(\.[0-9]{1,9})?$")


class InvalidPriorityHeader(ValueError):
    """A header of this contract that is not what it must be; the message names it."""

    def __init__(self, header: str, message: str):
        super().__init__(f"the {header} header {message}")


def tenant_value(name: str) -> str:
    """A tenant name as the header carries it: percent-encoded, so any name is one plain header token."""
    return quote(name, safe="")[:MAX_TENANT_CHARS]


def share_value(share: float) -> str:
    return f"{share:.6f}"


def parse_priority(value: str) -> int:
    if not _INTEGER.match(value) or not MIN_PRIORITY <= int(value) <= MAX_PRIORITY:
        raise InvalidPriorityHeader(
            PRIORITY_HEADER, f"must be an integer from {MIN_PRIORITY} to {MAX_PRIORITY}, got {value[:32]!r}")
    return int(value)


def parse_tenant(value: str) -> str:
    if not 0 < len(value) <= MAX_TENANT_CHARS or not _TENANT.match(value):
        raise InvalidPriorityHeader(
            TENANT_HEADER, f"must be 1 to {MAX_TENANT_CHARS} characters of a percent-encoded name")
    return value


def parse_share(value: str) -> float:
    share = float(value) if _NUMBER.match(value) else math.nan
    if not MIN_SHARE <= share <= MAX_SHARE:
        raise InvalidPriorityHeader(SHARE_HEADER, f"must be a number from {MIN_SHARE:g} to {MAX_SHARE:g}, "
                                                  f"got {value[:32]!r}")
    return share
