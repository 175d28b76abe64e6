"""The runtime credential the gateway presents upstream, re-read when its Secret is rotated.

Runtimes refuse inference calls without it (sluice_contracts.runtime_credential); the client's own key is
never forwarded. A rotated file that cannot be used leaves the last good credential in force.
"""
from __future__ import annotations

import logging
import re
from pathlib import Path

from sluice_contracts.runtime_credential import header_value

from .file_watch import FileWatch

log = logging.getLogger("sluice_gateway.credential")

# What can go into an HTTP header unchanged: visible ASCII, no spaces (a newline would split the request).
_TOKEN = re.compile(r"^[\x21-\x7e]{1,4096}$")


class CredentialError(ValueError):
    """The credential file is missing, unreadable or holds no usable credential."""


def read_credential(path: Path) -> str:
    try:
        text = path.read_text()
    except OSError as exc:
        raise CredentialError(f"cannot read the upstream credential file {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise CredentialError(f"the upstream credential file {path} is not text") from None
    credential = text.strip()
    if not _TOKEN.match(credential):
        raise CredentialError(
            f"the upstream credential file {path} must hold one token of visible ASCII characters "
            "(no spaces or line breaks inside, at most 4096)"
        )
    return credential


class UpstreamCredential:
    """`header` is the `Authorization` value to send upstream; None until a good file has been read."""

    def __init__(self, path: Path) -> None:
        self._watch = FileWatch(path)
        self.header: str | None = None
        self.problem: str | None = None  # why the file on disk is not in force, while it is not

    @property
    def in_force(self) -> bool:
        return self.header is not None

    def check(self) -> bool:
        """Re-read the file if it changed; False when a change was rejected."""
        if not self._watch.changed():
            return True
        try:
            credential = read_credential(self._watch.path)
        except CredentialError as exc:
            self.problem = str(exc)
            kept = "keeping the previous one" if self.header else "upstream requests carry none"
            log.error("%s; %s", exc, kept)
            return False
        if self.header is not None:
            log.info("upstream credential %s changed: the new one is in force", self._watch.path)
        self.header = header_value(credential)
        self.problem = None
        return True
