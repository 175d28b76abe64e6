"""The credential that lets the gateway (and nothing else) call a runtime pod's inference endpoints.

Each namespace a release serves has a credential of its own (`for_namespace`), so one that leaks opens that
namespace's runtimes and no other's. The operator keeps the release's key in one Secret of the release's
namespace, beside that namespace's own credential, and writes each other namespace's into a Secret of the
same name there; a namespace's gateway and runtime pods mount its Secret at `MOUNT_PATH`. The header is vLLM's
`--api-key` convention (`Authorization: Bearer`), so a vLLM or SGLang pod given the same key accepts the same
gateway.
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import os
import threading
import time

SECRET_SUFFIX = "runtime-credential"
SECRET_KEY = "api-key"
# The release's key, in its own namespace's Secret only: whoever holds it can make every namespace's credential.
RELEASE_KEY = "release-key"
MOUNT_DIR = "/var/run/sluice/runtime-credential"
MOUNT_PATH = f"{MOUNT_DIR}/{SECRET_KEY}"
HEADER = "authorization"
# Probes and the operator's scraper read these without the credential; nothing else is open.
OPEN_PATHS = frozenset({"/health", "/ready", "/metrics", "/load"})
_MAX_CREDENTIAL_BYTES = 4096
# Seconds a runtime still accepts the credential a rotation replaced. The kubelet refreshes a mounted Secret in
# each pod on its own sync (about a minute, more under load), so the gateway may present the old one for that long.
ROTATION_GRACE_S = 300.0


def secret_name(release: str) -> str:
    return f"{release}-{SECRET_SUFFIX}"


def for_namespace(release_key: str, namespace: str) -> str:
    """The credential of the runtimes in `namespace`: an HMAC-SHA256 of its name under the release's key, so
    knowing one namespace's reveals neither the key nor another namespace's, and a new key renews them all."""
    digest = hmac.new(release_key.encode(), namespace.encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


def header_value(credential: str) -> str:
    return f"Bearer {credential}"


def presented_matches(presented: str | None, credential: str) -> bool:
    """Constant-time comparison of an `Authorization` header against the credential."""
    expected = header_value(credential).encode()
    # Headers arrive as latin-1 text; anything that does not encode is simply not the credential.
    return hmac.compare_digest((presented or "").encode(errors="replace"), expected)


class RotatedCredential:
    """The credential in use and, for `grace_s` after a rotation, the one it replaced. The gateway and each
    runtime keep one, since the kubelet updates their copies of the Secret at different times."""

    def __init__(self, current: str, grace_s: float = ROTATION_GRACE_S) -> None:
        self.current = current
        self.grace_s = grace_s
        self._replaced: str | None = None
        self._replaced_until = 0.0  # time.monotonic() after which the replaced credential is no longer valid

    def rotate(self, credential: str) -> bool:
        """Make `credential` the one in use; False when it already was."""
        if credential == self.current:
            return False
        self._replaced, self._replaced_until = self.current, time.monotonic() + self.grace_s
        self.current = credential
        return True

    @property
    def replaced(self) -> str | None:
        """The credential the last rotation replaced, while its grace lasts; else None."""
        return self._replaced if time.monotonic() < self._replaced_until else None


class CredentialFileError(ValueError):
    """The credential file is missing, unreadable or holds no usable credential."""


def read_credential_file(path: str | os.PathLike, what: str = "credential file") -> str:
    """The credential in a mounted Secret file, its surrounding whitespace (a trailing newline) removed.

    It goes into an HTTP header as is, so only visible ASCII is accepted: a line break inside would split
    the request. `what` names the file in messages as its reader's users know it.
    """
    try:
        with open(path, "rb") as file:
            raw = file.read(_MAX_CREDENTIAL_BYTES + 64)
    except OSError as exc:
        raise CredentialFileError(f"cannot read the {what} {path}: {exc.strerror or exc}") from None
    credential = raw.strip()
    if not credential:
        raise CredentialFileError(f"the {what} {path} is empty")
    if len(credential) > _MAX_CREDENTIAL_BYTES or not all(0x21 <= byte <= 0x7E for byte in credential):
        raise CredentialFileError(
            f"the {what} {path} must hold one token of printable ASCII without spaces or control characters "
            f"(at most {_MAX_CREDENTIAL_BYTES} of them)"
        )
    return credential.decode("ascii")


_log = logging.getLogger("sluice.credential")
_HEADER = HEADER.encode()


class FollowedCredential:
    """The credential of a mounted Secret file, checked against a request's headers and read again whenever the
    file has changed (one stat per check), so a rotated Secret takes effect without a restart; the credential it
    replaced stays valid for `grace_s` (RotatedCredential). A file that cannot be read at start raises
    CredentialFileError; one caught empty or bad later keeps the credential in force."""

    def __init__(self, path: str | os.PathLike, grace_s: float = ROTATION_GRACE_S,
                 what: str = "credential file") -> None:
        self.path = os.fspath(path)
        self._what = what
        self._identity = _identity(self.path)
        self._credentials = RotatedCredential(read_credential_file(self.path, what), grace_s)
        self._lock = threading.Lock()

    def refusal(self, headers: list[tuple[bytes, bytes]], missing: str) -> str | None:
        """None when `headers` carry the credential exactly once; else the 401's message (`missing` when none)."""
        presented = [value for name, value in headers if name.lower() == _HEADER]
        if len(presented) > 1:
            return "Send exactly one Authorization header."
        if not presented:
            return missing
        self._reload_if_changed()
        value = presented[0].decode("latin-1")
        replaced = self._credentials.replaced
        # Both comparisons always run, so the time taken does not tell which credential nearly matched.
        current = presented_matches(value, self._credentials.current)
        previous = presented_matches(value, replaced or self._credentials.current)
        if current or (previous and replaced is not None):
            return None
        return "Incorrect runtime credential provided."

    def _reload_if_changed(self) -> None:
        identity = _identity(self.path)
        if identity is None or identity == self._identity:
            return
        with self._lock:
            try:
                credential = read_credential_file(self.path, self._what)
            except CredentialFileError as exc:
                # A Secret being rewritten can be briefly empty; the credential in force stays until it is good.
                _log.warning("keeping the runtime credential in force: %s", exc)
                return
            self._identity = identity
            if self._credentials.rotate(credential):
                _log.info("runtime credential reloaded from %s; the one it replaced is accepted for %g s more",
                          self.path, self._credentials.grace_s)


def _identity(path: str) -> tuple[int, int, int] | None:
    # The inode too: the kubelet swaps a symlink to a new file, whose mtime may equal the old one's.
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino)
