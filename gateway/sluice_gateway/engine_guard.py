"""`sluice-engine-guard`: the runtime credential in front of every path of an engine we did not write.

Why and where it runs: sluice_contracts.engine_guard. Each request is passed on as it comes (method, path,
query, headers, the body streamed), over a connection of its own to the engine, and the engine's answer comes
back as it arrives, SSE included: nothing is held beyond one read, and a client that reads slowly slows the
engine's side down instead of filling memory. A client that leaves closes the engine's connection, which is how
vLLM and SGLang learn to abort the request.

Open without the credential: a GET or HEAD whose path, byte for byte as it goes to the engine, is one of
`runtime_credential.OPEN_PATHS`. The check is on the exact bytes the engine will route on, not on a decoding of
them, so no spelling of a path (`/v1/../invocations`, `//invocations`, `%2e`, an absolute URI, a Host header)
can mean one thing here and another there: whatever is not literally an open path needs the credential. The
engine's Host header is its own address, never the client's.

The credential file is the mounted Secret; it is read at start (a missing or unusable one stops the start) and
again whenever it changes, and the credential a rotation replaced stays valid for `--credential-grace-s`, as on
Sluice's own runtime.
"""
from __future__ import annotations

import argparse
import asyncio
import functools
import logging
import sys
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httptools
import uvicorn

from sluice_contracts.engine_guard import COMMAND, ENGINE_HOST, ENGINE_PORT
from sluice_contracts.runtime_credential import (
    MOUNT_PATH,
    OPEN_PATHS,
    ROTATION_GRACE_S,
    CredentialFileError,
    FollowedCredential,
    header_value,
)

from .client_protocol import ClientProtocol
from .errors import error_body

log = logging.getLogger("sluice_gateway.engine_guard")

# Bodies the gateway forwards (up to its own max_body_bytes) must pass; this leaves room above its default.
DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024
_CONNECT_TIMEOUT_S = 10.0
_READ_BYTES = 64 * 1024
_OPEN_METHODS = frozenset({"GET", "HEAD"})
_OPEN_RAW_PATHS = frozenset(path.encode() for path in OPEN_PATHS)
# Hop-by-hop fields (RFC 9110 7.6.1) and those the guard sets itself on each side. `expect` too: the client's
# 100-continue is answered here, and an engine's interim response would only confuse the relay.
_NOT_FORWARDED = frozenset({
    b"connection", b"keep-alive", b"proxy-connection", b"te", b"trailer", b"transfer-encoding", b"upgrade",
    b"host", b"content-length", b"expect",
})
_NOT_RETURNED = frozenset({
    b"connection", b"keep-alive", b"proxy-connection", b"te", b"trailer", b"transfer-encoding", b"upgrade",
})


_MISSING = (f"This engine needs the runtime credential: send '{header_value('<credential>')}' "
            "(clients call the gateway, not the engine).")


@dataclass
class _Exchange:
    """One request's state, shared by the task that sends its body and the one that relays the answer."""

    too_large: bool = False
    client_gone: bool = False
    status: int = 0
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    head_done: bool = False
    body: list[bytes] = field(default_factory=list)
    complete: bool = False

    # httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        self.head_done = True

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        self.complete = True

    def take_body(self) -> bytes:
        data = b"".join(self.body)
        self.body.clear()
        return data

    def ends_at_close(self) -> bool:
        """The answer has neither a length nor chunks, so its end is the connection's."""
        return not any(name in (b"content-length", b"transfer-encoding") for name, _ in self.headers)


class EngineGuard:
    """The ASGI application."""

    def __init__(self, upstream: str, credential: FollowedCredential, max_body_bytes: int) -> None:
        parts = urlsplit(upstream)
        self.upstream = upstream
        self._host, self._port = parts.hostname, parts.port
        self._netloc = parts.netloc.encode()
        self._credential = credential
        self._max_body = max_body_bytes

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        headers = scope["headers"]
        if not (scope["method"] in _OPEN_METHODS and scope["raw_path"] in _OPEN_RAW_PATHS):
            refusal = self._credential.refusal(headers, _MISSING)
            if refusal is not None:
                # Closed after: whatever body the client still sends is not worth reading and dropping.
                await _answer(send, 401, refusal, "invalid_api_key",
                              [(b"www-authenticate", b"Bearer"), (b"connection", b"close")])
                return
        declared = _declared_length(headers)
        if declared is not None and declared > self._max_body:
            await _answer(send, 413, self._too_large_message(), "request_too_large", [(b"connection", b"close")])
            return
        await self._forward(scope, receive, send, declared)

    def _too_large_message(self) -> str:
        return f"The request body is larger than the engine guard's limit of {self._max_body} bytes."

    async def _forward(self, scope: dict, receive: Any, send: Any, declared: int | None) -> None:
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(self._host, self._port), _CONNECT_TIMEOUT_S)
        except (OSError, TimeoutError) as exc:
            reason = "timed out" if isinstance(exc, TimeoutError) else (exc.strerror or str(exc))
            await _answer(send, 502, f"The engine at {self.upstream} cannot be reached: {reason}.",
                          "engine_unreachable")
            return
        exchange = _Exchange()
        chunked = declared is None and any(name == b"transfer-encoding" for name, _ in scope["headers"])
        writer.write(self._request_head(scope, declared, chunked))
        body = asyncio.create_task(self._send_body(receive, writer, exchange, chunked))
        try:
            await self._relay(scope, reader, send, exchange)
        finally:
            body.cancel()
            writer.transport.abort()

    def _request_head(self, scope: dict, declared: int | None, chunked: bool) -> bytes:
        target = scope["raw_path"] + (b"?" + scope["query_string"] if scope["query_string"] else b"")
        lines = [b"%s %s HTTP/1.1" % (scope["method"].encode(), target), b"host: " + self._netloc,
                 b"connection: close"]
        if declared is not None:
            lines.append(b"content-length: %d" % declared)
        elif chunked:
            lines.append(b"transfer-encoding: chunked")
        lines += [name + b": " + value for name, value in scope["headers"] if name not in _NOT_FORWARDED]
        return b"\r\n".join(lines) + b"\r\n\r\n"

    async def _send_body(self, receive: Any, writer: asyncio.StreamWriter, exchange: _Exchange, chunked: bool) -> None:
        """The client's body to the engine as it arrives; then wait for the client to leave, and tell the engine."""
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                break
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self._max_body:
                exchange.too_large = True
                writer.transport.abort()
                return
            if chunk:
                writer.write(b"%x\r\n%s\r\n" % (len(chunk), chunk) if chunked else chunk)
                await writer.drain()
            if not message.get("more_body", False):
                if chunked:
                    writer.write(b"0\r\n\r\n")
                await writer.drain()
                message = await receive()  # the next message can only be the client leaving
                break
        exchange.client_gone = True
        writer.transport.abort()

    async def _relay(self, scope: dict, reader: asyncio.StreamReader, send: Any, exchange: _Exchange) -> None:
        parser = httptools.HttpResponseParser(exchange)
        started = False
        while not exchange.complete:
            try:
                data = await reader.read(_READ_BYTES)
            except OSError:
                data = b""
            if not data:
                if exchange.head_done and not exchange.complete and exchange.ends_at_close():
                    exchange.complete = True
                    break
                await self._cut_short(send, exchange, started)
                return
            try:
                parser.feed_data(data)
            except httptools.HttpParserError as exc:
                if not started:
                    await _answer(send, 502, f"The engine sent a malformed response: {exc}.", "engine_error")
                else:
                    log.warning("%s %s: the engine sent a malformed response mid-body (%s); closing the client's "
                                "connection", scope["method"], scope["path"], exc)
                return
            if exchange.head_done and not started:
                started = True
                headers = [(name, value) for name, value in exchange.headers if name not in _NOT_RETURNED]
                await send({"type": "http.response.start", "status": parser.get_status_code(), "headers": headers})
                if scope["method"] == "HEAD":
                    break
            if exchange.body and not exchange.complete:
                await send({"type": "http.response.body", "body": exchange.take_body(), "more_body": True})
        await send({"type": "http.response.body", "body": exchange.take_body()})

    async def _cut_short(self, send: Any, exchange: _Exchange, started: bool) -> None:
        """The engine's connection ended before its answer did: say why where the client can still be told."""
        if exchange.client_gone:
            return
        if exchange.too_large:
            if not started:
                await _answer(send, 413, self._too_large_message(), "request_too_large", [(b"connection", b"close")])
            return
        if not started:
            await _answer(send, 502, "The engine closed the connection without answering.", "engine_error")
            return
        # Headers are out and the answer is incomplete: returning without its end makes uvicorn close the
        # connection, so the client sees a cut, never a complete-looking truncated answer.
        log.warning("the engine closed the connection mid-response; closing the client's connection")


async def _lifespan(receive: Any, send: Any) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


async def _answer(send: Any, status: int, message: str, code: str,
                  headers: list[tuple[bytes, bytes]] | None = None) -> None:
    body = error_body(status, message, code=code)
    await send({"type": "http.response.start", "status": status, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), *(headers or []),
    ]})
    await send({"type": "http.response.body", "body": body})


def _declared_length(headers: list[tuple[bytes, bytes]]) -> int | None:
    """The Content-Length the client sent (httptools has refused a malformed or conflicting one)."""
    for name, value in headers:
        if name == b"content-length":
            return int(value)
    return None


def _upstream(value: str) -> str:
    parts = urlsplit(value)
    if parts.scheme != "http" or not parts.hostname or parts.path not in ("", "/") or parts.query:
        raise argparse.ArgumentTypeError(f"must look like http://HOST:PORT (no path), got {value!r}")
    try:
        port = parts.port
    except ValueError:
        port = None
    if port is None:
        raise argparse.ArgumentTypeError(f"must name the engine's port, as in http://HOST:PORT, got {value!r}")
    return f"http://{parts.netloc}"


def _positive(kind: type) -> Any:
    def parse(value: str) -> Any:
        try:
            number = kind(value)
        except ValueError:
            number = None
        if number is None or not number > 0:
            raise argparse.ArgumentTypeError(f"must be a positive {kind.__name__}, got {value!r}")
        return number
    return parse


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=COMMAND, description="Forwards requests to an engine only when they carry the runtime credential "
        f"(the probe and scrape paths {', '.join(sorted(OPEN_PATHS))} pass without it).")
    parser.add_argument("--port", required=True, type=int, help="the pod's serving port, where clients connect")
    parser.add_argument("--host", default="0.0.0.0", help="listen address (default: %(default)s)")
    parser.add_argument("--upstream", default=f"http://{ENGINE_HOST}:{ENGINE_PORT}", type=_upstream,
                        help="the engine, on loopback (default: %(default)s)")
    parser.add_argument("--credential-file", default=MOUNT_PATH,
                        help="the runtime credential, re-read when it changes (default: %(default)s)")
    parser.add_argument("--credential-grace-s", default=ROTATION_GRACE_S, type=_positive(float),
                        help="seconds the credential a rotation replaced is still accepted (default: %(default)s)")
    parser.add_argument("--max-body-bytes", default=DEFAULT_MAX_BODY_BYTES, type=_positive(int),
                        help="largest request body passed on; larger ones get 413 (default: %(default)s)")
    parser.add_argument("--request-read-s", default=30.0, type=_positive(float),
                        help="a client's request headers must arrive within this (default: %(default)s)")
    parser.add_argument("--keep-alive-s", default=5.0, type=_positive(float),
                        help="an idle client connection is closed after this (default: %(default)s)")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    args = parser.parse_args(argv)
    if not 0 <= args.port <= 65535:
        parser.error(f"--port must be a port number (0-65535), got {args.port}")

    logging.basicConfig(level=args.log_level.upper(), format="%(message)s", stream=sys.stdout)
    try:
        credential = FollowedCredential(args.credential_file, args.credential_grace_s)
    except CredentialFileError as exc:
        print(f"{COMMAND}: {exc}", file=sys.stderr)
        return 2
    app = EngineGuard(args.upstream, credential, args.max_body_bytes)
    server = uvicorn.Server(uvicorn.Config(
        app, host=args.host, port=args.port, loop="auto", ws="none", lifespan="on", access_log=False,
        http=functools.partial(ClientProtocol, request_read_s=args.request_read_s), proxy_headers=False,
        server_header=False, date_header=False, log_level=args.log_level, timeout_keep_alive=args.keep_alive_s,
    ))
    log.info("%s: guarding %s on %s:%d", COMMAND, args.upstream, args.host, args.port)
    server.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
