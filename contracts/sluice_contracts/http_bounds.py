"""How much of a request's head (request line and header fields) any Sluice listener reads before it answers.

Header lines arrive before authentication, so whoever can reach a port can make a parser hold them. Every
listener (the gateway's API and metrics ports, the runtime's serving port, the engine guard) stops reading at
these bounds and answers 431 (414 for the request line) and closes the connection. The body has its own,
per-component limits (`max_body_bytes`).

The figures leave room for what real clients send (browsers stay near 8 KiB of headers, OpenAI's SDKs under
2 KiB) and are far below what a pod's memory notices per connection.
"""
from __future__ import annotations

# Bytes of the request line (method, target, version).
MAX_REQUEST_LINE_BYTES = 8 * 1024
# Header fields in one request, and their bytes together (names and values).
MAX_HEADER_COUNT = 100
MAX_HEADER_BYTES = 32 * 1024
