"""What differs between the engines' containers: command line, probes and how the runtime credential reaches
them. One module per engine builds it (sluice_args, vllm_args, sglang_args)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sluice_contracts import engine_guard

from ..crd import RUNTIME_PORT


@dataclass
class EngineCommand:
    command: list[str]
    args: list[str]
    ready_path: str  # the startup and readiness probes'
    live_path: str = "/health"
    env: list[dict[str, Any]] = field(default_factory=list)
    # The engine reads the runtime credential from its file on a Secret volume (rotations reach the running
    # server): Sluice's runtime.
    credential_file: bool = False
    # The engine listens on loopback and the engine guard, which checks the credential, on the serving port.
    guarded: bool = False


def listen_address(guarded: bool) -> tuple[str, int]:
    """Where the engine listens: behind the guard, loopback only; else the pod's own address (downward API),
    where probes and the gateway reach it."""
    return (engine_guard.ENGINE_HOST, engine_guard.ENGINE_PORT) if guarded else ("$(POD_IP)", RUNTIME_PORT)
