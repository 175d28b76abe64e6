"""The autoscaler: a pure decision function and the scrape of the runtime pods it decides from."""
from .decision import Decision, History, Observation, PodSample, Targets, decide, pick_victims
from .scrape import MetricsError, RuntimeLoad, parse_runtime_metrics, scrape

__all__ = [
    "Decision", "History", "MetricsError", "Observation", "PodSample", "RuntimeLoad", "Targets",
    "decide", "parse_runtime_metrics", "pick_victims", "scrape",
]
