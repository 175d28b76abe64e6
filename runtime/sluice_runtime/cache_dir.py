"""Where Sluice keeps what it builds once per machine."""
from __future__ import annotations

import os
from pathlib import Path


def sluice_cache_dir() -> Path:
    """Where Sluice keeps what it builds once per machine: converted models, compiled kernels."""
    return Path(os.environ.get("SLUICE_CACHE_DIR", Path.home() / ".cache" / "sluice"))
