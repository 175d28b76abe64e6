"""How many replicas an InferenceModel wants, from its pods' load. Pure: no clock, no I/O.

Like the HorizontalPodAutoscaler: a recommendation per tick from the load against the targets, then
stabilization windows (scale up to the lowest recommendation of the up-window, down to the highest of the
down-window). On top, safety rails: a missing, stale or unparsable metric never lets the model shrink, and
pods the cluster cannot schedule stop further growth instead of piling up.

Load never takes a model below one replica. A model with scaleToZeroAfterSeconds goes to zero only once no
gateway has seen a request for it that long (the idle clock, demand.py) and its pods report none running or
waiting; at zero, a request held at a gateway brings it back to one.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

# Load within this fraction of the target counts as on target, so replicas do not flap.
TOLERANCE = 0.1
# A sample older than this is stale: the pod stopped answering between ticks.
MAX_SAMPLE_AGE_SECONDS = 60.0


@dataclass(frozen=True)
class Targets:
    min_replicas: int
    max_replicas: int
    kv_cache_usage: float
    waiting_per_replica: float
    scale_up_window_seconds: float
    scale_down_window_seconds: float
    scale_to_zero_after_seconds: float | None = None  # None: never below one replica


@dataclass(frozen=True)
class PodSample:
    pod: str
    kv_cache_usage: float
    waiting: float
    running: float
    age_seconds: float = 0.0


@dataclass(frozen=True)
class Observation:
    current_replicas: int
    samples: tuple[PodSample, ...] = ()
    # Ready pods whose metrics could not be used, with why (unreachable, unparsable, missing metric).
    failures: tuple[tuple[str, str], ...] = ()
    unschedulable_pods: int = 0
    unschedulable_message: str = ""
    held: int = 0  # requests the gateways hold for the model, which has no endpoint
    idle_seconds: float | None = None  # since the gateways last saw a request for it; None: not known


@dataclass(frozen=True)
class Decision:
    action: Literal["ScaleUp", "ScaleDown", "Hold"]
    current_replicas: int
    desired_replicas: int
    reason: str
    pods_scraped: int
    kv_cache_usage: float | None
    waiting: float | None
    running: float | None


@dataclass
class History:
    """Recommendations of recent ticks, oldest first; the windows look back over it."""

    entries: list[tuple[float, int]] = field(default_factory=list)

    def add(self, now: float, replicas: int, keep_seconds: float) -> None:
        self.entries.append((now, replicas))
        self.entries = [(t, r) for t, r in self.entries if t >= now - keep_seconds]

    def within(self, now: float, seconds: float) -> list[int]:
        """Recommendations younger than `seconds`; the latest always counts, so a 0 s window is just it."""
        return [r for t, r in self.entries[:-1] if t > now - seconds] + [r for _, r in self.entries[-1:]]


def _clamp(replicas: int, targets: Targets) -> int:
    return max(1, targets.min_replicas, min(targets.max_replicas, replicas))


def _wanted(load: float, target: float, current: int) -> int:
    """Replicas that bring `load` (summed over pods) to `target` per replica, within the tolerance."""
    wanted = load / target
    if abs(wanted / current - 1.0) <= TOLERANCE:
        return current
    return math.ceil(wanted - 1e-9)


def _by_load(targets: Targets, current: int, kv: float, waiting: float) -> int:
    by_kv = _wanted(kv, targets.kv_cache_usage, current)
    by_queue = _wanted(waiting, targets.waiting_per_replica, current) if waiting else 1
    return max(by_kv, by_queue)


def recommend(targets: Targets, observation: Observation) -> int:
    """Pods without a sample yet (starting up) count as idle when growing and as on target when shrinking,
    so a rollout in progress neither snowballs into more scale-ups nor looks like spare capacity."""
    samples = observation.samples
    current = max(1, observation.current_replicas)
    kv = sum(s.kv_cache_usage for s in samples)
    waiting = sum(s.waiting for s in samples)
    grow = _by_load(targets, current, kv, waiting)
    if grow > current:
        return _clamp(grow, targets)
    unsampled = max(0, current - len(samples))
    shrink = _by_load(
        targets, current, kv + unsampled * targets.kv_cache_usage, waiting + unsampled * targets.waiting_per_replica
    )
    return _clamp(min(shrink, current), targets)


def decide(targets: Targets, observation: Observation, history: History, now: float) -> Decision:
    current = observation.current_replicas
    samples = observation.samples
    fresh = tuple(s for s in samples if s.age_seconds <= MAX_SAMPLE_AGE_SECONDS)
    stale = [s.pod for s in samples if s.age_seconds > MAX_SAMPLE_AGE_SECONDS]
    problems = [f"{pod}: {why}" for pod, why in observation.failures] + [f"{pod}: metrics are stale" for pod in stale]
    kv_mean = sum(s.kv_cache_usage for s in fresh) / len(fresh) if fresh else None
    waiting = sum(s.waiting for s in fresh) if fresh else None
    running = sum(s.running for s in fresh) if fresh else None

    def verdict(desired: int, reason: str) -> Decision:
        action = "ScaleUp" if desired > current else "ScaleDown" if desired < current else "Hold"
        return Decision(action, current, desired, reason, len(fresh), kv_mean, waiting, running)

    if current == 0:
        if observation.held:
            return verdict(1, f"scale from zero: {observation.held} requests held")
        return verdict(0, "scaled to zero: no request held")
    idle = _idle(targets, observation, problems)
    if idle is not None:
        return verdict(0, idle)
    bounded = _clamp(current, targets)
    if bounded != current:
        return verdict(bounded, f"replicas {current} outside minReplicas {targets.min_replicas}..maxReplicas {targets.max_replicas}")
    if not fresh:
        why = "; ".join(problems) or "no ready pod to scrape"
        return verdict(current, f"holding: no usable metrics ({why})")

    recommendation = recommend(targets, Observation(current, fresh))
    keep = max(targets.scale_up_window_seconds, targets.scale_down_window_seconds)
    if not history.entries:
        # After a restart the down-window starts now: a fresh operator never shrinks a model at once.
        history.add(now, current, keep)
    history.add(now, recommendation, keep)
    load = f"KV-cache usage {kv_mean:.2f} (target {targets.kv_cache_usage:.2f}), {waiting:g} waiting (target {targets.waiting_per_replica:g}/replica)"

    if recommendation > current:
        desired = max(current, min(history.within(now, targets.scale_up_window_seconds)))
        if observation.unschedulable_pods:
            return verdict(
                current,
                f"holding at {current}: {observation.unschedulable_pods} pod(s) cannot be scheduled "
                f"({observation.unschedulable_message or 'no node fits'}); {load}",
            )
        if desired == current:
            return verdict(current, f"holding: {load} asks for {recommendation}, waiting out the scale-up window")
        return verdict(desired, f"{load} asks for {recommendation}")
    if recommendation < current:
        if problems:
            return verdict(current, f"holding: not scaling down while metrics are missing ({'; '.join(problems)})")
        desired = min(current, max(history.within(now, targets.scale_down_window_seconds)))
        if desired == current:
            return verdict(current, f"holding: {load} allows {recommendation}, waiting out the scale-down window")
        return verdict(desired, f"{load} allows {desired}")
    return verdict(current, f"on target: {load}")


def _idle(targets: Targets, observation: Observation, problems: list[str]) -> str | None:
    """Why the model may go to zero now, or None. Not while a pod's metrics are missing: it may be busy."""
    after, idle = targets.scale_to_zero_after_seconds, observation.idle_seconds
    if after is None or idle is None or idle < after or observation.held or problems:
        return None
    if any(s.running or s.waiting for s in observation.samples):
        return None
    return f"no request for {idle:.0f} s (scaleToZeroAfterSeconds {after:g}): scaling to zero"


def pick_victims(samples: tuple[PodSample, ...], count: int) -> list[str]:
    """The least busy pods go first: fewest running and waiting requests lose the fewest streams."""
    ordered = sorted(samples, key=lambda s: (s.running + s.waiting, s.kv_cache_usage, s.pod))
    return [s.pod for s in ordered[:count]]
