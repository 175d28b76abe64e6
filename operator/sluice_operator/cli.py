"""`sluice-operator`: run the operator (default), or write the CRDs generated from the models."""
from __future__ import annotations

import argparse
import random
import re
import sys
from pathlib import Path

from .crd.definitions import render_definitions


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sluice-operator", description=__doc__)
    commands = parser.add_subparsers(dest="command")

    run = commands.add_parser("run", help="reconcile InferenceModels and ModelRoutes (the default)")
    run.add_argument(
        "--namespace", action="append", default=[],
        help="watch only this namespace (repeatable); all namespaces when omitted",
    )
    run.add_argument("--peering", default="sluice-operator", help="kopf peering object shared by the replicas")
    run.add_argument(
        "--priority", type=int, default=None,
        help="peering priority; the highest acts, the others wait (default: random, so exactly one leads)",
    )
    run.add_argument("--standalone", action="store_true", help="no peering: for a single replica or local use")
    run.add_argument("--health-port", type=int, default=8081,
                     help="serves /healthz (liveness) and /metrics (sluice_operator_*); 0 disables both")
    run.add_argument("--autoscale-interval", type=float, default=15.0, help="seconds between autoscaler ticks")
    run.add_argument(
        "--release", type=_dns_label, default=None,
        help="the Sluice release served (the chart's fullname): runtime pods get the runtime credential, Secret "
             "RELEASE-runtime-credential of --release-namespace, copied into every namespace served; "
             "without it runtime pods check no credential (local use)",
    )
    run.add_argument("--release-namespace", type=_dns_label, default=None,
                     help="the namespace the release's operator and gateway run in (needed with --release)")
    run.add_argument("--verbose", action="store_true", help="debug logging")

    crds = commands.add_parser("crds", help="write crds/*.yaml from the pydantic models")
    crds.add_argument("--out", type=Path, default=Path("crds"), help="directory to write into")
    crds.add_argument("--check", action="store_true", help="only report whether the files are up to date")
    return parser


def _dns_label(value: str) -> str:
    if not re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", value) or len(value) > 63:
        raise argparse.ArgumentTypeError(f"{value!r} is not a DNS label (at most 63 lowercase letters, digits, '-')")
    return value


def _crds(out: Path, check: bool) -> int:
    rendered = render_definitions()
    stale = [name for name, text in rendered.items() if not (out / name).is_file() or (out / name).read_text() != text]
    if check:
        for name in stale:
            print(f"out of date: {out / name} (run `make crds`)", file=sys.stderr)
        return 1 if stale else 0
    out.mkdir(parents=True, exist_ok=True)
    for name, text in rendered.items():
        (out / name).write_text(text)
        print(out / name)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    if args.command == "crds":
        return _crds(args.out, args.check)
    if args.command is None:
        args = _parser().parse_args(["run"])
    if (args.release is None) != (args.release_namespace is None):
        _parser().error("--release and --release-namespace go together")
    from .builders import Release
    from .handlers.runner import OperatorOptions, run_operator

    return run_operator(
        OperatorOptions(
            namespaces=tuple(args.namespace),
            peering=None if args.standalone else args.peering,
            priority=args.priority if args.priority is not None else random.randint(1, 2**31 - 1),
            health_port=args.health_port,
            autoscale_interval=args.autoscale_interval,
            release=Release(args.release, args.release_namespace) if args.release else None,
            verbose=args.verbose,
        )
    )


if __name__ == "__main__":
    sys.exit(main())
