"""The credential that lets the gateway (and nothing else) call a runtime pod's inference endpoints.

The operator creates one Secret per release and copies it into every namespace it serves; the gateway and the
runtime pods mount it at `MOUNT_PATH`. The header is vLLM's `--api-key` convention (`Authorization: Bearer`),
so a vLLM or SGLang pod given the same key accepts the same gateway.
"""
from __future__ import annotations

import hmac

SECRET_SUFFIX = "runtime-credential"
SECRET_KEY = "api-key"
MOUNT_DIR = "/var/run/sluice/runtime-credential"
MOUNT_PATH = f"{MOUNT_DIR}/{SECRET_KEY}"
HEADER = "authorization"
# Probes and the operator's scraper read these without the credential; nothing else is open.
OPEN_PATHS = frozenset({"/health", "/ready", "/metrics", "/load"})


def secret_name(release: str) -> str:
    return f"{release}-{SECRET_SUFFIX}"


def header_value(credential: str) -> str:
    return f"Bearer {credential}"


def presented_matches(presented: str | None, credential: str) -> bool:
    """Constant-time comparison of an `Authorization` header against the credential."""
    expected = header_value(credential).encode()
    # Headers arrive as latin-1 text; anything that does not encode is simply not the credential.
    return hmac.compare_digest((presented or "").encode(errors="replace"), expected)
