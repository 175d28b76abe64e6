"""Keeps the routing table file in force: reloads it when it changes, keeps the last good one on errors.

Polling the file's identity (works for a ConfigMap volume too, whose kubelet swaps a symlink) avoids
an inotify dependency; swapping the table is one reference assignment, so in-flight requests keep the
table they started with and none is dropped.

A missing file is an empty table, not an error: in the cluster the table is an optional ConfigMap volume
that the operator creates with the first InferenceModel of the namespace and deletes with the last one,
so the gateway starts before any model exists and stops routing to models that are gone.
"""
from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from pathlib import Path

from .routing_table import RoutingTable, RoutingTableError, load_routing_table

log = logging.getLogger("sluice_gateway.routes")


class RoutesReloader:
    def __init__(
        self, path: Path, interval_s: float, apply: Callable[[RoutingTable], None], rejected: Callable[[], None]
    ) -> None:
        self._path = path
        self._interval = interval_s
        self._apply = apply
        self._rejected = rejected
        self._seen: tuple[int, int, int] | None = None

    def _identity(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(self._path)
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_size, st.st_ino)

    def load_now(self) -> RoutingTable:
        """The first load: an invalid table here stops the gateway with the reason."""
        self._seen = self._identity()
        if self._seen is None:
            log.warning("routing table %s does not exist (yet): every model answers 404 until it does", self._path)
            return RoutingTable()
        return load_routing_table(self._path)

    def check(self) -> None:
        identity = self._identity()
        if identity == self._seen:
            return
        self._seen = identity
        if identity is None:
            log.warning("routing table %s is gone: every model answers 404 until it is back", self._path)
            self._apply(RoutingTable())
            return
        try:
            table = load_routing_table(self._path)
        except RoutingTableError as exc:
            self._rejected()
            log.error("routing table %s rejected, keeping the previous one: %s", self._path, exc)
            return
        log.info("routing table %s reloaded: generation %d, %d routes", self._path, table.generation, len(table.routes))
        self._apply(table)

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            self.check()
