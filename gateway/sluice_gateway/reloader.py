"""Keeps the routing table file in force: reloads it when it changes, keeps the last good one on errors.

Swapping the table is one reference assignment, so in-flight requests keep the table they started with
and none is dropped. A table that is malformed when the gateway starts leaves it not ready (there is no
good one to serve) until the file is fixed, instead of stopping the process.

A missing file is an empty table, not an error: in the cluster the table is an optional ConfigMap volume
that the operator creates with the first InferenceModel of the namespace and deletes with the last one,
so the gateway starts before any model exists and stops routing to models that are gone.
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from .file_watch import FileWatch
from .routing_table import RoutingTable, RoutingTableError, load_routing_table

log = logging.getLogger("sluice_gateway.routes")


class RoutesReloader:
    def __init__(self, path: Path, apply: Callable[[RoutingTable], None], rejected: Callable[[], None]) -> None:
        self._watch = FileWatch(path)
        self._apply = apply
        self._rejected = rejected
        self.in_force = False  # some table from this file (or its absence) is being served
        self.problem: str | None = None  # why the file on disk is not in force, while it is not

    def check(self) -> None:
        """Apply the file if it changed since the last check (the first check always applies it)."""
        if not self._watch.changed():
            return
        path = self._watch.path
        if not self._watch.exists:
            log.warning("routing table %s does not exist: every model answers 404 until it does", path)
            self._use(RoutingTable())
            return
        try:
            table = load_routing_table(path)
        except RoutingTableError as exc:
            self._rejected()
            self.problem = str(exc)
            kept = "keeping the previous one" if self.in_force else "not ready until a valid table arrives"
            log.error("routing table %s rejected, %s: %s", path, kept, exc)
            return
        log.info("routing table %s loaded: generation %d, %d routes", path, table.generation, len(table.routes))
        self._use(table)

    def _use(self, table: RoutingTable) -> None:
        self.in_force = True
        self.problem = None
        self._apply(table)
