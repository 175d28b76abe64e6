"""A minimal, fast fake OpenAI server for the gateway benchmark (a fake on purpose: it measures proxies).

It answers `/v1/chat/completions` at once, streaming (8 chunks, a usage chunk when asked, [DONE]) or not,
and `/load` like a Sluice runtime, over keep-alive HTTP/1.1 on a bare asyncio protocol so it costs far less
CPU per request than any proxy in front of it. Run: `python bench/fake_openai_backend.py --port N`.
"""
from __future__ import annotations

import argparse
import asyncio
import json

_CHUNKS = 8
_DELTA = {"id": "chatcmpl-bench", "object": "chat.completion.chunk", "created": 0, "model": "bench"}


def _chunk(i: int) -> bytes:
    choice = {"index": 0, "delta": {"content": "tok "}, "finish_reason": "stop" if i == _CHUNKS - 1 else None}
    return b"data: " + json.dumps({**_DELTA, "choices": [choice]}).encode() + b"\n\n"


_STREAM = b"".join(_chunk(i) for i in range(_CHUNKS))
_USAGE = {"prompt_tokens": 12, "completion_tokens": _CHUNKS, "total_tokens": 12 + _CHUNKS}
_USAGE_EVENT = b"data: " + json.dumps({**_DELTA, "choices": [], "usage": _USAGE}).encode() + b"\n\n"
_DONE = b"data: [DONE]\n\n"
_COMPLETION = json.dumps({
    "id": "chatcmpl-bench", "object": "chat.completion", "created": 0, "model": "bench",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "tok " * _CHUNKS},
                 "finish_reason": "stop"}],
    "usage": _USAGE,
}).encode()
_LOAD = b'{"waiting":0,"running":0,"kv_cache_usage":0.0,"block_size":16}'


def _response(status: bytes, content_type: bytes, body: bytes) -> bytes:
    return (b"HTTP/1.1 " + status + b"\r\ncontent-type: " + content_type + b"\r\ncontent-length: "
            + str(len(body)).encode() + b"\r\n\r\n" + body)


def _chunked(part: bytes) -> bytes:
    return f"{len(part):x}\r\n".encode() + part + b"\r\n"


class _Protocol(asyncio.Protocol):
    def __init__(self) -> None:
        self.buffer = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while True:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buffer[:end].decode("latin-1").split("\r\n")
            length = 0
            for line in head[1:]:
                name, _, value = line.partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value)
            if len(self.buffer) < end + 4 + length:
                return
            body = self.buffer[end + 4 : end + 4 + length]
            self.buffer = self.buffer[end + 4 + length :]
            self.respond(head[0].split(" ")[1], body)

    def respond(self, path: str, body: bytes) -> None:
        if path == "/load":
            self.transport.write(_response(b"200 OK", b"application/json", _LOAD))
        elif path in ("/v1/chat/completions", "/chat/completions"):
            request = json.loads(body)
            if not request.get("stream"):
                self.transport.write(_response(b"200 OK", b"application/json", _COMPLETION))
                return
            usage = (request.get("stream_options") or {}).get("include_usage")
            events = _STREAM + (_USAGE_EVENT if usage else b"") + _DONE
            self.transport.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
                + _chunked(events) + b"0\r\n\r\n"
            )
        elif path in ("/v1/models", "/models"):
            models = json.dumps({"object": "list", "data": [{"id": "bench", "object": "model"}]}).encode()
            self.transport.write(_response(b"200 OK", b"application/json", models))
        else:
            self.transport.write(_response(b"404 Not Found", b"application/json", b'{"error":{"message":"no"}}'))


async def serve(host: str, port: int) -> None:
    server = await asyncio.get_running_loop().create_server(_Protocol, host, port, backlog=1024)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    try:
        import uvloop
        uvloop.install()
    except ImportError:
        pass
    asyncio.run(serve(args.host, args.port))


if __name__ == "__main__":
    main()
