"""`sluice-gateway --config FILE [--routes FILE] [--host HOST] [--port 8080] [--metrics-port 9090]`."""
from __future__ import annotations

import argparse
import functools
import logging
import sys
from pathlib import Path

import uvicorn

from .app import GatewayApp
from .client_protocol import ClientProtocol
from .drain import DrainingServer
from .metrics import serve_metrics


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="sluice-gateway", description="OpenAI-compatible routing gateway in front of Sluice runtimes."
    )
    parser.add_argument("--config", required=True, type=Path,
                        help="gateway.yaml: tenants, limits, timeouts (reloaded when it changes)")
    parser.add_argument("--routes", type=Path,
                        help="routing table (JSON, reloaded when it changes; default: the config's routes_file)")
    parser.add_argument("--host", help="listen address of the API and /metrics (default: the config's listen.host)")
    parser.add_argument("--port", type=int, help="API port (default: the config's listen.port, 8080)")
    parser.add_argument("--metrics-port", type=int,
                        help="/metrics port, 0 for none (default: the config's metrics_port, 9090)")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    args = parser.parse_args(argv)

    logging.basicConfig(level=args.log_level.upper(), format="%(message)s", stream=sys.stdout)
    # A config or routing table that cannot be used does not stop the process: it starts not ready and
    # keeps watching the files (see files/gateway_files.py); only the command line itself can be wrong here.
    app = GatewayApp(args.config, args.routes)
    config = app.config
    host = args.host or config.listen.host
    port = args.port if args.port is not None else config.listen.port
    metrics_port = args.metrics_port if args.metrics_port is not None else config.metrics_port
    for name, value in (("--port", port), ("--metrics-port", metrics_port)):
        if not 0 <= value <= 65535:
            parser.error(f"{name} must be a port number (0-65535), got {value}")
    if metrics_port and metrics_port == port:
        parser.error(f"the metrics port ({metrics_port}) must differ from the API port, or be 0 for none")
    if app.files.routes is None and app.files.config.in_force:
        logging.getLogger("sluice_gateway").warning("no --routes given: every model answers 404")
    if metrics_port:
        try:
            serve_metrics(app.metrics.registry, host, metrics_port, read_timeout_s=config.timeouts.request_read_s)
        except OSError as exc:
            print(f"sluice-gateway: cannot serve /metrics on {host}:{metrics_port}: {exc.strerror}", file=sys.stderr)
            return 2
    server = DrainingServer(
        uvicorn.Config(
            app,
            host=host,
            port=port,
            loop="auto",
            http=functools.partial(ClientProtocol, request_read_s=config.timeouts.request_read_s),
            lifespan="on",
            access_log=False,
            proxy_headers=False,
            server_header=False,
            log_level=args.log_level,
            timeout_keep_alive=config.timeouts.keep_alive_s,
        ),
        on_terminating=app.begin_termination,
        grace_s=lambda: app.config.shutdown.ready_grace_s,
        drain_s=lambda: app.config.drain_s,
    )
    server.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
