"""The operator's health port: /healthz for the liveness probe and /metrics for Prometheus."""
from __future__ import annotations

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from .metrics import OperatorMetrics


async def serve(metrics: OperatorMetrics, host: str, port: int) -> web.AppRunner:
    async def healthz(_: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def prometheus(_: web.Request) -> web.Response:
        return web.Response(body=generate_latest(metrics.registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/metrics", prometheus)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner
