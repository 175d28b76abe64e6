"""The gateway's HTTP/1.1 client against real loopback servers: reuse, stale connections, bounded buffers."""
import asyncio

import pytest

from sluice_gateway.connection_pool import ConnectionPool, ResponseTooLarge, UpstreamError


class Server:
    """A loopback HTTP server whose behaviour each test scripts through `respond`."""

    def __init__(self, respond):
        self.respond = respond
        self.connections = 0
        self.closed = asyncio.Event()
        self.writers: list[asyncio.StreamWriter] = []

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.writers.append(writer)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length"))
                await reader.readexactly(length)
                if await self.respond(reader, writer) is False:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()
            self.closed.set()

    async def __aenter__(self):
        self.server = await asyncio.start_server(self.handle, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(self, *exc):
        self.server.close()
        for writer in self.writers:
            writer.close()


def ok(body: bytes = b'{"ok":true}') -> bytes:
    return b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)


async def test_keep_alive_connections_are_reused():
    async def respond(reader, writer):
        writer.write(ok())
        await writer.drain()

    async with Server(respond) as server:
        pool = ConnectionPool(connect_timeout_s=2)
        for _ in range(5):
            response = await pool.request("POST", server.url, "/v1/x", b"{}", {"content-type": "application/json"})
            assert response.status == 200 and await response.read(1024) == b'{"ok":true}'
            response.release()
        assert server.connections == 1
        pool.close()


async def test_a_connection_the_server_closed_while_idle_is_replaced_transparently():
    async def respond(reader, writer):
        writer.write(ok())
        await writer.drain()
        return False  # close after each response, without saying so in the headers

    async with Server(respond) as server:
        pool = ConnectionPool(connect_timeout_s=2)
        for _ in range(3):
            response = await pool.request("POST", server.url, "/", b"{}")
            assert await response.read(1024) == b'{"ok":true}'
            response.release()
            await asyncio.sleep(0.05)
        assert server.connections == 3
        pool.close()


async def test_refused_connection_is_a_connect_error():
    pool = ConnectionPool(connect_timeout_s=2)
    async with Server(None) as server:
        url = server.url
    with pytest.raises(UpstreamError) as err:
        await pool.request("POST", url, "/", b"{}")
    assert err.value.connect


async def test_a_slow_reader_pauses_the_upstream_instead_of_buffering_it():
    sent = 0

    async def respond(reader, writer):
        nonlocal sent
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
        chunk = b"x" * 65536
        for _ in range(400):  # 25 MiB offered, far more than any buffer on the way
            writer.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            sent += len(chunk)
            await writer.drain()
        writer.write(b"0\r\n\r\n")
        await writer.drain()

    async with Server(respond) as server:
        pool = ConnectionPool(connect_timeout_s=2)
        response = await pool.request("POST", server.url, "/", b"{}")
        await asyncio.sleep(0.5)  # the client reads nothing for a while
        assert response._buffered <= 512 * 1024
        assert sent < 400 * 65536, "the server could send everything: nothing pushed back"
        received = 0
        async for data in response.iter_chunks():
            received += len(data)
        assert received == 400 * 65536
        response.release()
        pool.close()


async def test_closing_an_unfinished_response_drops_the_connection():
    async def respond(reader, writer):
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
        writer.write(b"5\r\nhello\r\n")
        await writer.drain()
        assert await asyncio.wait_for(reader.read(), 30) == b"", "the client should have hung up"
        return False

    async with Server(respond) as server:
        pool = ConnectionPool(connect_timeout_s=2)
        response = await pool.request("POST", server.url, "/", b"{}")
        async for data in response.iter_chunks():
            assert data == b"hello"
            break
        response.close()
        await asyncio.wait_for(server.closed.wait(), 5)
        pool.close()


@pytest.mark.parametrize("declared", [True, False], ids=["content-length", "chunked"])
async def test_a_body_past_the_read_limit_is_refused_before_it_is_held(declared):
    async def respond(reader, writer):
        if declared:
            writer.write(ok(b"x" * 10_000_000))
        else:
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n")
            for _ in range(100):
                writer.write(b"%x\r\n%s\r\n" % (100_000, b"x" * 100_000))
            writer.write(b"0\r\n\r\n")
        await writer.drain()

    async with Server(respond) as server:
        pool = ConnectionPool(connect_timeout_s=2)
        response = await pool.request("POST", server.url, "/", b"{}")
        with pytest.raises(ResponseTooLarge):
            await response.read(1_000_000)
        response.close()
        pool.close()


async def test_a_connection_paused_by_a_large_answer_reads_the_next_one():
    """The last bytes of an answer can pass the buffer's bound: the connection pauses reading, the answer is
    complete, and the pooled connection must still read the next response instead of hanging on it."""
    async def respond(reader, writer):
        writer.write(ok(b"x" * 400_000))  # one write: its end lands in the feed that passes the bound
        await writer.drain()

    async with Server(respond) as server:
        pool = ConnectionPool(connect_timeout_s=2)
        for _ in range(3):
            response = await asyncio.wait_for(pool.request("POST", server.url, "/", b"{}"), 10)
            await asyncio.sleep(0.2)  # the whole answer arrives before it is read
            assert len(await asyncio.wait_for(response.read(1_000_000), 10)) == 400_000
            response.release()
        assert server.connections == 1
        pool.close()
