"""A forward abandoned between layers, so the engine can give the cores to more urgent work at once."""
from __future__ import annotations

import threading


class ForwardInterrupted(Exception):
    """Raised by a model's forward when its interrupt event was set before a layer began: nothing of the step
    may be used (the KV cache holds some layers' keys and values of its positions, which the step that
    recomputes them overwrites)."""


def check(interrupt: threading.Event | None) -> None:
    if interrupt is not None and interrupt.is_set():
        raise ForwardInterrupted
