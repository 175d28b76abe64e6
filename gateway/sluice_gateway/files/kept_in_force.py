"""One file the gateway runs from, kept in force while it runs: re-read when it changes, the last good
version kept (and the rejection counted and logged) when an edit cannot be used.

A file that cannot be used when the gateway starts is not in force, and `problem` says why; the gateway
is not ready until it is fixed, instead of stopping the process.
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Generic, TypeVar

from .identity_poll import FileWatch

log = logging.getLogger("sluice_gateway.files")

T = TypeVar("T")


class FollowedFile(Generic[T]):
    def __init__(
        self, name: str, path: Path, load: Callable[[Path], T], apply: Callable[[T], None], *,
        errors: tuple[type[Exception], ...], without_it: str, rejected: Callable[[], None] = lambda: None,
        when_missing: Callable[[], T] | None = None,
    ) -> None:
        """`without_it`: what the gateway does while no version is in force, for the log;
        `when_missing`: what a file that does not exist means, where that is not an error."""
        self.name = name
        self._watch = FileWatch(path)
        self._load = load
        self._apply = apply
        self._errors = errors
        self._rejected = rejected
        self._when_missing = when_missing
        self._without_it = without_it
        self.in_force = False  # some version of this file (or its absence) is being served
        self.problem: str | None = None  # why the file on disk is not in force, while it is not

    @property
    def path(self) -> Path:
        return self._watch.path

    def check(self) -> None:
        """Apply the file if it changed since the last check (the first check always reads it)."""
        if not self._watch.changed():
            return
        if not self._watch.exists and self._when_missing is not None:
            log.warning("%s file %s does not exist: serving without it until it does", self.name, self.path)
            self._use(self._when_missing())
            return
        try:
            value = self._load(self.path)
        except self._errors as exc:
            self._rejected()
            self.problem = str(exc)
            kept = "keeping the previous one" if self.in_force else self._without_it
            log.error("%s file %s rejected, %s: %s", self.name, self.path, kept, exc)
            return
        log.info("%s file %s loaded", self.name, self.path)
        self._use(value)

    def _use(self, value: T) -> None:
        self._apply(value)
        self.in_force = True
        self.problem = None
