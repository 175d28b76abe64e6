"""The autoscaler: pure decision functions and the scrapes they decide from."""
from .decision import Decision, History, Observation, PodSample, Targets, decide, pick_victims
from .demand import DemandClock, GatewayDemand
from .gateway_scrape import parse_gateway_demand, scrape_gateway
from .scrape import MetricsError, RuntimeLoad, parse_runtime_metrics, scrape

__all__ = [
    "Decision", "DemandClock", "GatewayDemand", "History", "MetricsError", "Observation", "PodSample",
    "RuntimeLoad", "Targets", "decide", "parse_gateway_demand", "parse_runtime_metrics", "pick_victims", "scrape",
    "scrape_gateway",
]
