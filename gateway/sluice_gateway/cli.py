"""`sluice-gateway --config FILE [--routes FILE] [--host HOST] [--port 8080]`."""
from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

import uvicorn

from .app import GatewayApp
from .config import ConfigError, load_config
from .routing_table import RoutingTableError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="sluice-gateway", description="OpenAI-compatible routing gateway in front of Sluice runtimes."
    )
    parser.add_argument("--config", required=True, type=Path, help="gateway.yaml: tenants, limits, timeouts")
    parser.add_argument("--routes", type=Path, help="routing table (JSON, reloaded when it changes; default: the config's routes_file)")
    parser.add_argument("--host", help="listen address (default: the config's listen.host)")
    parser.add_argument("--port", type=int, help="listen port (default: the config's listen.port, 8080)")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    args = parser.parse_args(argv)

    logging.basicConfig(level=args.log_level.upper(), format="%(message)s", stream=sys.stdout)
    try:
        config = load_config(args.config)
        routes = args.routes or config.routes_file
        app = GatewayApp(config, routes)
    except (ConfigError, RoutingTableError) as exc:
        print(f"sluice-gateway: {exc}", file=sys.stderr)
        return 2
    if routes is None:
        logging.getLogger("sluice_gateway").warning("no --routes given: every model answers 404")
    uvicorn.run(
        app,
        host=args.host or config.listen.host,
        port=args.port if args.port is not None else config.listen.port,
        loop="auto",
        http="auto",
        lifespan="on",
        access_log=False,
        proxy_headers=False,
        server_header=False,
        log_level=args.log_level,
        timeout_graceful_shutdown=30,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
