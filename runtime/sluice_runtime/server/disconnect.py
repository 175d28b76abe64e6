"""Noticing that the client went away while we wait on the engine, so its request is aborted at once."""
from __future__ import annotations

import asyncio
import contextlib


class ClientDisconnected(Exception):
    pass


class ClientStalled(ClientDisconnected):
    """The client stopped reading: one write to it waited longer than the stream idle timeout."""


async def _wait_for_disconnect(receive) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


async def until_disconnected(receive, awaitable):
    """Await `awaitable`; if the client disconnects first, cancel it (closing engine streams aborts
    their requests) and raise ClientDisconnected. Only valid once the request body has been read."""
    task = asyncio.ensure_future(awaitable)
    watcher = asyncio.ensure_future(_wait_for_disconnect(receive))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
    if task.cancelled():
        raise ClientDisconnected()
    return task.result()
