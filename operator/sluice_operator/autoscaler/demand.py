"""The idle clock of a model that scales to zero, from what the gateway replicas report. Pure: no clock, no I/O.

Each gateway replica reports per model the requests it holds (the model has no endpoint), those in flight and a
counter of those answered (sluice_contracts.demand). A model has demand while any replica holds or forwards a
request for it, or when a counter moved since the last reading; the clock counts from the last moment it had.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class GatewayDemand:
    """One gateway replica's figures for one model."""

    held: float = 0.0
    in_flight: float = 0.0
    answered: float = 0.0


@dataclass
class DemandClock:
    """Starts at the operator's first look: a restarted operator never takes a model to zero at once."""

    last_demand: float
    held: int = 0
    answered: dict[str, float] = field(default_factory=dict)  # by gateway replica, as last read

    def observe(self, now: float, replicas: Mapping[str, GatewayDemand]) -> None:
        """The figures of every gateway replica there is now (one gone is simply not listed)."""
        answered = {replica: figures.answered for replica, figures in replicas.items()}
        moved = any(count != self.answered.get(replica, 0.0) for replica, count in answered.items())
        self.answered = answered
        self.held = int(sum(figures.held for figures in replicas.values()))
        if moved or self.held or any(figures.in_flight for figures in replicas.values()):
            self.last_demand = now

    def touch(self, now: float) -> None:
        """Demand seen elsewhere (a runtime pod with requests running or waiting)."""
        self.last_demand = now

    def idle_seconds(self, now: float) -> float:
        return max(0.0, now - self.last_demand)
