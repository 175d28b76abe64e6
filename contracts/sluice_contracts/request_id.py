"""The request id a client may send, which the gateway and the runtime both echo and log.

A client's `x-request-id` is kept when it is short and plain (`PATTERN`); anything else is dropped, and the
component's own id stands alone. Either way the client's id never names the request inside a component, so two
requests sending one id never touch each other.
"""
from __future__ import annotations

import re

HEADER = "x-request-id"
PATTERN = r"^[A-Za-z0-9._:/+=-]{1,128}$"
TEXT = re.compile(PATTERN)
BYTES = re.compile(PATTERN.encode())  # the gateway reads raw header bytes
