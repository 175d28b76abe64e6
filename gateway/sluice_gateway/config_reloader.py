"""Keeps gateway.yaml in force: a changed file is applied (revoked keys stop working within a reload
interval, no restart); a bad edit is rejected, counted and logged, and the last good config stays.

A config that cannot be used when the gateway starts leaves it without keys and not ready, watching
the file, instead of crash-looping: the pods of a bad rollout never become ready, the old ones serve on.
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from .config import ConfigError, GatewayConfig, load_config
from .file_watch import FileWatch

log = logging.getLogger("sluice_gateway.config")


class ConfigReloader:
    def __init__(
        self, path: Path, apply: Callable[[GatewayConfig], None], rejected: Callable[[], None]
    ) -> None:
        self._watch = FileWatch(path)
        self._apply = apply
        self._rejected = rejected
        self.in_force = False
        self.problem: str | None = None

    def check(self) -> None:
        if not self._watch.changed():
            return
        try:
            config = load_config(self._watch.path)
        except ConfigError as exc:
            self._rejected()
            self.problem = str(exc)
            kept = "keeping the previous one" if self.in_force else "serving nothing until it is fixed"
            log.error("%s; %s", exc, kept)
            return
        self.problem = None
        self._apply(config)
        self.in_force = True
