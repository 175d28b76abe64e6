"""What differs between the engines' containers: command line, probes and how the runtime credential reaches
them. One module per engine builds it (sluice_args, vllm_args, sglang_args)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sluice_contracts import runtime_credential

# The container variable holding the credential, for engines that take it as a value rather than a file.
CREDENTIAL_ENV = "SLUICE_RUNTIME_CREDENTIAL"


@dataclass
class EngineCommand:
    command: list[str]
    args: list[str]
    ready_path: str  # the startup and readiness probes'
    live_path: str = "/health"
    env: list[dict[str, Any]] = field(default_factory=list)
    # The credential as a file on a Secret volume (rotations reach the running server) rather than a variable.
    credential_file: bool = False


def credential_env(secret: str, name: str = CREDENTIAL_ENV) -> dict[str, Any]:
    """The credential as a variable: read at start, so a rotation reaches these pods with their next restart."""
    return {"name": name,
            "valueFrom": {"secretKeyRef": {"name": secret, "key": runtime_credential.SECRET_KEY}}}
