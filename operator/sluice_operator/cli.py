"""`sluice-operator`: run the operator (default), or write the CRDs generated from the models."""
from __future__ import annotations

import argparse
import random
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from .crd import MANAGED_BY
from .crd.definitions import render_definitions

if TYPE_CHECKING:
    from .builders import ModelPolicy, Release
    from .builders.inference_pool import PoolDefaults
    from .gateway_demand import GatewaySource


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sluice-operator", description=__doc__)
    commands = parser.add_subparsers(dest="command")

    run = commands.add_parser("run", help="reconcile InferenceModels and ModelRoutes (the default)")
    _placement_flags(run)
    _network_policy_flags(run)
    _model_flags(run)
    _pool_flags(run)
    _scale_to_zero_flags(run)
    run.add_argument("--verbose", action="store_true", help="debug logging")

    crds = commands.add_parser("crds", help="write crds/*.yaml from the pydantic models")
    crds.add_argument("--out", type=Path, default=Path("crds"), help="directory to write into")
    crds.add_argument("--check", action="store_true", help="only report whether the files are up to date")
    return parser


def _placement_flags(run: argparse.ArgumentParser) -> None:
    """Where the operator watches, how its replicas share the work, and the release it serves."""
    run.add_argument(
        "--namespace", action="append", default=[],
        help="watch only this namespace (repeatable); all namespaces when omitted",
    )
    run.add_argument("--peering", default=MANAGED_BY, help="kopf peering object shared by the replicas")
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
    run.add_argument("--helm-release", type=_dns_label, default=None,
                     help="name of the helm release that renders the peering object, in --release-namespace: the "
                          "operator waits up to a minute for the release's instead of creating it, then creates it "
                          "owned by the release, for helm to adopt")
    run.add_argument("--release-namespace", type=_dns_label, default=None,
                     help="the namespace the release's operator and gateway run in (needed with --release)")


def _network_policy_flags(run: argparse.ArgumentParser) -> None:
    """The peers the runtime pods' NetworkPolicy admits."""
    policy = run.add_argument_group(
        "runtime NetworkPolicy", "with --release, the two peer flags together: NetworkPolicy RELEASE-runtime in every "
        "namespace served admits only these peers to runtime pods")
    policy.add_argument("--network-policy-gateway", type=_labels, metavar="K=V,...",
                        help="labels of the gateway's pods in --release-namespace")
    policy.add_argument("--network-policy-operator", type=_labels, metavar="K=V,...",
                        help="labels of the operator's pods in --release-namespace (its autoscaler scrapes them)")
    policy.add_argument("--network-policy-monitoring", type=_labels, metavar="K=V,...",
                        help="labels of the namespaces whose pods scrape runtime pods' /metrics (optional)")
    policy.add_argument("--network-policy-monitoring-pods", type=_labels, metavar="K=V,...",
                        help="labels of the scraper's pods in those namespaces (optional; any pod there without it)")


def _model_flags(run: argparse.ArgumentParser) -> None:
    """The images models run and may name."""
    run.add_argument("--engine-image", type=_engine_image, action="append", default=[], metavar="ENGINE=IMAGE",
                     help="the image of an engine (sluice, vllm, sglang) for models whose runtime.image is unset "
                          "(repeatable; default: the pinned images in the CRD's description)")
    models = run.add_argument_group("what models may use")
    models.add_argument("--allowed-image-prefix", type=_image_prefix, action="append", default=[], metavar="PREFIX",
                        help="a registry prefix (host first, e.g. ghcr.io/sluice-dev/) spec.runtime.image must be "
                             "under (repeatable); a model naming another image gets no Deployment; without any, "
                             "every image (local use)")
    models.add_argument("--guard-image", default=None, metavar="IMAGE",
                        help="the image holding sluice-engine-guard (the operator's own), put in front of vLLM and "
                             "SGLang pods that check the runtime credential (with --release)")


def _pool_flags(run: argparse.ArgumentParser) -> None:
    """InferencePools for the Gateway API Inference Extension."""
    pools = run.add_argument_group(
        "InferencePools", "Gateway API Inference Extension pools (inference.networking.k8s.io/v1) of runtime pods")
    pools.add_argument("--inference-pools", action="store_true",
                       help="give every model without spec.inferencePool an InferencePool")
    pools.add_argument("--endpoint-picker", type=_endpoint_picker, default=None, metavar="SERVICE[:PORT]",
                       help="the endpoint picker Service the pools name (port default 9002), where a spec names none")
    pools.add_argument("--endpoint-picker-failure-mode", choices=["FailOpen", "FailClose"], default="FailClose",
                       help="what a gateway does when that picker does not answer")


def _scale_to_zero_flags(run: argparse.ArgumentParser) -> None:
    """The gateway replicas whose demand wakes a model at zero."""
    zero = run.add_argument_group(
        "scale to zero", "with --release, the gateway replicas whose /metrics report each model's demand: held "
        "requests bring a model at zero back, and its idle clock starts from the last request any of them saw "
        "(models in --release-namespace only, the routing table those gateways serve)")
    zero.add_argument("--gateway-pods", type=_labels, metavar="K=V,...",
                      help="labels of the gateway's pods in --release-namespace; without it no model scales to zero")
    zero.add_argument("--gateway-metrics-port", type=_port, default=9090, help="the gateways' metrics port")
    zero.add_argument("--demand-interval", type=_interval, default=0.5,
                      help="seconds between readings of the gateways' demand (0.05 to 10)")


def _dns_label(value: str) -> str:
    if not re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", value) or len(value) > 63:
        raise argparse.ArgumentTypeError(f"{value!r} is not a DNS label (at most 63 lowercase letters, digits, '-')")
    return value


def _engine_image(value: str) -> tuple[str, str]:
    from sluice_contracts.engines import ENGINES

    engine, equals, image = value.partition("=")
    if not equals or engine not in ENGINES or not image.strip() or len(image) > 512:
        raise argparse.ArgumentTypeError(f"{value!r} is not ENGINE=IMAGE with ENGINE one of {', '.join(ENGINES)}")
    return engine, image


def _image_prefix(value: str) -> str:
    from .builders.model_policy import IMAGE_PREFIX

    if len(value) > 256 or not IMAGE_PREFIX.fullmatch(value):
        raise argparse.ArgumentTypeError(
            f"{value!r} is not a registry prefix: a registry host (with a dot or a port, or localhost), then "
            f"lowercase path segments, such as ghcr.io/sluice-dev/ or docker.io/vllm/vllm-openai")
    return value


def _endpoint_picker(value: str) -> tuple[str, int]:
    name, colon, port = value.partition(":")
    if not re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", name) or len(name) > 63 or (
            colon and not (port.isdigit() and 1 <= int(port) <= 65535)):
        raise argparse.ArgumentTypeError(f"{value!r} is not SERVICE[:PORT] (a DNS label, a port 1-65535)")
    return name, int(port) if colon else 9002


def _port(value: str) -> int:
    if not value.isdigit() or not 1 <= int(value) <= 65535:
        raise argparse.ArgumentTypeError(f"{value!r} is not a port number (1-65535)")
    return int(value)


def _interval(value: str) -> float:
    try:
        seconds = float(value)
    except ValueError:
        seconds = float("nan")
    if not 0.05 <= seconds <= 10:  # NaN fails too
        raise argparse.ArgumentTypeError(f"{value!r} is not a number of seconds from 0.05 to 10")
    return seconds


_LABEL_KEY = re.compile(r"([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
_LABEL_VALUE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?")


def _labels(value: str) -> dict[str, str]:
    labels = {}
    for item in value.split(","):
        key, equals, label = item.partition("=")
        if not equals or not _LABEL_KEY.fullmatch(key) or not _LABEL_VALUE.fullmatch(label) or len(label) > 63:
            raise argparse.ArgumentTypeError(f"{item!r} is not a label KEY=VALUE")
        if key in labels:
            raise argparse.ArgumentTypeError(f"label {key!r} given twice")
        labels[key] = label
    return labels


def _release(args: argparse.Namespace) -> "Release | None":
    from .builders import NetworkPeers, Release

    peers = (args.network_policy_gateway, args.network_policy_operator)
    if (args.release is None) != (args.release_namespace is None):
        _parser().error("--release and --release-namespace go together")
    if (peers[0] is None) != (peers[1] is None):
        _parser().error("--network-policy-gateway and --network-policy-operator go together")
    if args.release is None:
        if peers[0] is not None or args.network_policy_monitoring is not None \
                or args.network_policy_monitoring_pods is not None:
            _parser().error("the --network-policy-* flags need --release")
        return None
    if peers[0] is None and args.network_policy_monitoring is not None:
        _parser().error("--network-policy-monitoring needs --network-policy-gateway and --network-policy-operator")
    if args.network_policy_monitoring_pods is not None and args.network_policy_monitoring is None:
        _parser().error("--network-policy-monitoring-pods needs --network-policy-monitoring")
    network = (NetworkPeers(*peers, args.network_policy_monitoring, args.network_policy_monitoring_pods)
               if peers[0] is not None else None)
    return Release(args.release, args.release_namespace, network)


def _helm_release(args: argparse.Namespace) -> tuple[str, str] | None:
    if args.helm_release is None:
        return None
    if args.release_namespace is None:
        _parser().error("--helm-release needs --release-namespace")
    return args.helm_release, args.release_namespace


def _engine_images(pairs: list[tuple[str, str]]) -> dict[str, str]:
    images: dict[str, str] = {}
    for engine, image in pairs:
        if engine in images:
            _parser().error(f"--engine-image names {engine} twice")
        images[engine] = image
    return images


def _pool_defaults(args: argparse.Namespace) -> "PoolDefaults":
    from .builders.inference_pool import PoolDefaults
    from .crd.inference_model import EndpointPickerRef

    picker = None
    if args.endpoint_picker is not None:
        name, port = args.endpoint_picker
        picker = EndpointPickerRef(name=name, port=port, failure_mode=args.endpoint_picker_failure_mode)
    return PoolDefaults(enabled=args.inference_pools, picker=picker)


def _gateway(args: argparse.Namespace) -> "GatewaySource | None":
    from .gateway_demand import GatewaySource

    if args.gateway_pods is None:
        return None
    if args.release_namespace is None:
        _parser().error("--gateway-pods needs --release and --release-namespace (the gateways' namespace)")
    selector = ",".join(f"{key}={value}" for key, value in sorted(args.gateway_pods.items()))
    return GatewaySource(args.release_namespace, selector, args.gateway_metrics_port)


def _policy(args: argparse.Namespace) -> "ModelPolicy":
    from .builders import ModelPolicy

    if args.guard_image is not None and (not args.guard_image.strip() or len(args.guard_image) > 512):
        _parser().error(f"--guard-image {args.guard_image!r} is not an image reference")
    return ModelPolicy(image_prefixes=tuple(args.allowed_image_prefix), guard_image=args.guard_image)


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
    release = _release(args)
    gateway = _gateway(args)
    from .runner import OperatorOptions, run_operator

    return run_operator(
        OperatorOptions(
            namespaces=tuple(args.namespace),
            peering=None if args.standalone else args.peering,
            priority=args.priority if args.priority is not None else random.randint(1, 2**31 - 1),
            health_port=args.health_port,
            autoscale_interval=args.autoscale_interval,
            release=release,
            helm_release=_helm_release(args),
            gateway=gateway,
            demand_interval=args.demand_interval,
            verbose=args.verbose,
            engine_images=_engine_images(args.engine_image),
            pool_defaults=_pool_defaults(args),
            policy=_policy(args),
        )
    )


if __name__ == "__main__":
    sys.exit(main())
