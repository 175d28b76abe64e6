"""The files a gateway runs from, kept in force while it runs: gateway.yaml, the routing table and the
upstream credential. Each is checked every reload interval; each keeps its last good version on a bad edit.

Where the routing table and the credential file live is itself configuration, so their watchers are set
up when the first usable config arrives (at start, or later if the gateway started without one).
"""
from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

from .config import GatewayConfig
from .config_reloader import ConfigReloader
from .metrics import GatewayMetrics
from .reloader import RoutesReloader
from .routing_table import RoutingTable
from .upstream_credential import UpstreamCredential


class WatchedFiles:
    def __init__(
        self, config_path: Path, routes_path: Path | None, metrics: GatewayMetrics,
        apply_config: Callable[[GatewayConfig], None], apply_table: Callable[[RoutingTable], None],
    ) -> None:
        self._routes_override = routes_path
        self._metrics = metrics
        self._apply_config = apply_config
        self._apply_table = apply_table
        self.config = ConfigReloader(config_path, self._on_config, metrics.config_rejections.inc)
        self.routes: RoutesReloader | None = None
        self.credential: UpstreamCredential | None = None

    def _on_config(self, config: GatewayConfig) -> None:
        if not self.config.in_force:  # the first usable config says where the other files are
            routes = self._routes_override or config.routes_file
            if routes is not None:
                self.routes = RoutesReloader(routes, self._apply_table, self._metrics.table_rejections.inc)
            if config.upstream_credential_file is not None:
                self.credential = UpstreamCredential(config.upstream_credential_file)
        self._apply_config(config)

    @property
    def credential_header(self) -> str | None:
        return self.credential.header if self.credential is not None else None

    def check(self) -> None:
        self.config.check()
        if self.routes is not None:
            self.routes.check()
        if self.credential is not None:
            self.credential.check()
        for name, source in self._sources():
            self._metrics.file_rejected.labels(name).set(1 if source.problem else 0)

    def _sources(self) -> list[tuple[str, ConfigReloader | RoutesReloader | UpstreamCredential]]:
        sources = [("config", self.config), ("routes", self.routes), ("credential", self.credential)]
        return [(name, source) for name, source in sources if source is not None]

    def missing(self) -> str | None:
        """Why the gateway cannot serve for lack of a good file (the first that has none in force), or None."""
        for name, source in self._sources():
            if not source.in_force:
                return f"no valid {name} file yet"
        return None

    async def run(self, interval_s: Callable[[], float]) -> None:
        while True:
            await asyncio.sleep(interval_s())
            self.check()
