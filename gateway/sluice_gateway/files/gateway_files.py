"""The files a gateway runs from: gateway.yaml, the routing table and the upstream credential, each a
FollowedFile checked every reload interval.

Where the routing table and the credential file live is itself configuration, so they are followed from
the first usable config on (at start, or later if the gateway started without one).

A missing routing table is an empty table, not an error: in the cluster it is an optional ConfigMap volume
that the operator creates with the first InferenceModel and deletes with the last one. Runtimes refuse
inference calls without the credential (sluice_contracts.runtime_credential); the client's own key is never
forwarded upstream.
"""
from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

from sluice_contracts.routing_table import RoutingTable, RoutingTableError
from sluice_contracts.runtime_credential import CredentialFileError, read_credential_file

from ..config import ConfigError, GatewayConfig, load_config
from ..metrics import GatewayMetrics
from ..routing_table import load_routing_table
from ..upstream_credential import UpstreamCredential
from .kept_in_force import FollowedFile


class WatchedFiles:
    def __init__(
        self, config_path: Path, routes_path: Path | None, metrics: GatewayMetrics,
        apply_config: Callable[[GatewayConfig], None], apply_table: Callable[[RoutingTable], None],
    ) -> None:
        self._routes_override = routes_path
        self._metrics = metrics
        self._apply_config = apply_config
        self._apply_table = apply_table
        self.config = FollowedFile("config", config_path, load_config, self._on_config, errors=(ConfigError,),
                                   without_it="serving nothing until it is fixed",
                                   rejected=metrics.config_rejections.inc)
        self.routes: FollowedFile[RoutingTable] | None = None
        self.credential: FollowedFile[str] | None = None
        self.upstream_credential = UpstreamCredential(recheck=self._recheck_credential)

    def _on_config(self, config: GatewayConfig) -> None:
        if not self.config.in_force:
            routes = self._routes_override or config.routes_file
            if routes is not None:
                self.routes = FollowedFile(
                    "routing table", routes, load_routing_table, self._apply_table, errors=(RoutingTableError,),
                    without_it="not ready until a valid table arrives", rejected=self._metrics.table_rejections.inc, when_missing=RoutingTable)
            if config.upstream_credential_file is not None:
                self.credential = FollowedFile(
                    "upstream credential", config.upstream_credential_file,
                    lambda path: read_credential_file(path, "upstream credential file"), self.upstream_credential.use,
                    errors=(CredentialFileError,), without_it="upstream requests carry none")
        self._apply_config(config)

    def _recheck_credential(self) -> None:
        if self.credential is not None:
            self.credential.check()

    def check(self) -> None:
        self.config.check()  # first: the first usable config says which other files to follow
        for follower in (self.routes, self.credential):
            if follower is not None:
                follower.check()
        for name, source in self._sources():
            self._metrics.file_rejected.labels(name).set(1 if source.problem else 0)

    def _sources(self) -> list[tuple[str, FollowedFile]]:
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
