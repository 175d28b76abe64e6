"""Where one request's outputs wait for their reader: at most one, however far behind the reader is.

The engine steps whether or not a reader keeps up (a client that stopped reading leaves its stream parked
on a full socket). Each new output is folded into the unread one, so an unread request holds its new
tokens once, bounded by its context length, instead of a growing queue of outputs.
"""
from __future__ import annotations

import asyncio

from .outputs import RequestOutput


class OutputMailbox:
    """Filled on the reader's event loop (the engine thread hands outputs over with call_soon_threadsafe)."""

    def __init__(self) -> None:
        self._unread: RequestOutput | None = None
        self._error: BaseException | None = None
        self._ready = asyncio.Event()

    def put(self, output: RequestOutput) -> None:
        if self._unread is None:
            self._unread = output
        else:
            self._unread.absorb(output)
        self._ready.set()

    def fail(self, error: BaseException) -> None:
        """The request cannot go on; the reader gets what is unread first, then `error`."""
        self._error = error
        self._ready.set()

    async def get(self) -> RequestOutput:
        await self._ready.wait()
        output, self._unread = self._unread, None
        if output is not None:
            if self._error is None:
                self._ready.clear()
            return output
        raise self._error
