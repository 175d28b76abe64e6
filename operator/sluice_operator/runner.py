"""Start kopf with Sluice's handlers and settings."""
from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any

import kopf

from . import health
from .builders import ModelPolicy, Release
from .builders.inference_pool import PoolDefaults
from .builders.peering import build_peering
from .crd import GROUP
from .gateway_demand import GatewayDemandReader, GatewaySource
from .handlers.credential import follow_source
from .handlers.registration import register
from .kube import Kube, load_config
from .state import OperatorState

# How long an operator of a helm release waits for the release's peering object before creating it.
PEERING_WAIT_S = 60.0


@dataclass(frozen=True)
class OperatorOptions:
    """`sluice-operator run`'s flags, parsed (their defaults are the CLI's)."""

    namespaces: tuple[str, ...]  # empty: every namespace
    peering: str | None  # None: standalone
    priority: int
    health_port: int  # 0: no health port
    autoscale_interval: float
    release: Release | None  # None: runtime pods check no credential
    helm_release: tuple[str, str] | None  # (name, namespace) of the helm release that renders the peering
    gateway: GatewaySource | None  # None: no gateway's demand to read, so no model scales to zero
    demand_interval: float
    verbose: bool
    engine_images: dict[str, str] = field(default_factory=dict)  # engine → image, where a spec names none
    pool_defaults: PoolDefaults = field(default_factory=PoolDefaults)
    policy: ModelPolicy = field(default_factory=ModelPolicy)  # the images and guard models get


async def _ensure_peering(kube: Kube, body: dict[str, Any], wait: bool) -> None:
    """Creates the peering object where it is missing; with `wait` (a helm release renders it in the
    same install), first waits up to PEERING_WAIT_S for the release's: created here in between, it
    made helm's own create fail."""
    deadline = asyncio.get_running_loop().time() + PEERING_WAIT_S
    while wait and asyncio.get_running_loop().time() < deadline:
        if await kube.peering_exists(body):
            return
        await asyncio.sleep(0.5)
    await kube.ensure_peering(body)


def _configure(settings: kopf.OperatorSettings, options: OperatorOptions) -> None:
    # Progress and the last-handled spec live in annotations: the status belongs to our schema.
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=GROUP, key="last-handled-configuration"
    )
    # Events are written on purpose (kopf.info/warn); log lines stay in the log.
    settings.posting.loggers = False
    settings.watching.server_timeout = 300
    if options.namespaces:
        # The namespaces are named, and the CRDs come with the chart: listing either cluster-wide would
        # need a ClusterRole, which a namespaced install does without.
        settings.scanning.disabled = True


def run_operator(options: OperatorOptions) -> int:
    logging.basicConfig(
        level=logging.DEBUG if options.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    load_config()
    kube = Kube()
    state = OperatorState(kube=kube, autoscale_interval=options.autoscale_interval, release=options.release,
                          engine_images=dict(options.engine_images), pool_defaults=options.pool_defaults,
                          demand_interval=options.demand_interval, policy=options.policy)
    if options.gateway is not None:
        # Read a little more often than the models ask, so each tick sees a fresh reading.
        state.gateway_demand = GatewayDemandReader(kube, options.gateway, options.demand_interval * 0.8)
    registry = kopf.OperatorRegistry()
    register(registry, state)

    @kopf.on.login(registry=registry)
    def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        # The same credentials as the kubernetes client: in-cluster service account or $KUBECONFIG.
        return kopf.login_via_client(**kwargs)

    server: list[Any] = []
    background: list[asyncio.Task] = []

    @kopf.on.startup(registry=registry)
    async def start(settings: kopf.OperatorSettings, **_: Any) -> None:
        if options.health_port:
            # Every replica answers, the standby ones too: kopf's own liveness endpoint has no /metrics.
            server.append(await health.serve(state.metrics, "0.0.0.0", options.health_port))
        _configure(settings, options)
        if options.release is not None:
            background.append(asyncio.create_task(follow_source(state), name="runtime-credential"))
        if options.peering:
            for namespace in options.namespaces or (None,):
                await _ensure_peering(state.kube, build_peering(options.peering, namespace, options.helm_release),
                                      wait=options.helm_release is not None)

    @kopf.on.cleanup(registry=registry)
    async def stop_server(**_: Any) -> None:
        for task in background:
            task.cancel()
        for runner in server:
            await runner.cleanup()

    kopf.run(
        registry=registry,
        clusterwide=not options.namespaces,
        namespaces=list(options.namespaces),
        standalone=options.peering is None,
        peering_name=options.peering or "default",
        priority=options.priority,
    )
    return 0
