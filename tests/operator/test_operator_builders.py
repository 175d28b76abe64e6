"""InferenceModel spec → Deployment, Service and PodDisruptionBudget."""
import pytest

from sluice_contracts import runtime_credential
from sluice_operator.builders import Owner, build_all, build_deployment, selector_string
from sluice_operator.crd import InferenceModelSpec

OWNER = Owner(name="smollm2", namespace="demo", uid="0b7e4c1e-1111-2222-3333-444455556666")


def _spec(**fields):
    return InferenceModelSpec.model_validate({"model": {"source": "smollm2"}, **fields})


def _container(deployment):
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return container


def _flag(args, name):
    return args[args.index(name) + 1]


def test_every_object_is_owned_and_selects_the_same_pods():
    objects = build_all(OWNER, _spec())
    assert [o["kind"] for o in objects] == ["Service", "PodDisruptionBudget", "Deployment"]
    for obj in objects:
        (ref,) = obj["metadata"]["ownerReferences"]
        assert ref["uid"] == OWNER.uid and ref["controller"] is True and ref["kind"] == "InferenceModel"
        assert obj["metadata"]["namespace"] == "demo" and obj["metadata"]["name"] == "smollm2"
    service, pdb, deployment = objects
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    for selector in (service["spec"]["selector"], pdb["spec"]["selector"]["matchLabels"],
                     deployment["spec"]["selector"]["matchLabels"]):
        assert selector.items() <= pod_labels.items()
    assert selector_string("smollm2") == ",".join(f"{k}={v}" for k, v in sorted(service["spec"]["selector"].items()))


def test_runtime_args_follow_the_spec():
    spec = _spec(
        servedModelName="tiny",
        runtime={"maxModelLen": 4096, "maxNumSeqs": 8, "dtype": "bfloat16", "kvCacheMemory": "512Mi",
                 "blockSize": 32, "prefixCaching": False, "args": ["--seed", "7"]},
    )
    container = _container(build_deployment(OWNER, spec))
    args = container["args"]
    assert container["command"] == ["sluice-runtime"] and args[0] == "serve"
    assert _flag(args, "--model") == "smollm2"
    assert _flag(args, "--port") == "8000" and _flag(args, "--host") == "$(POD_IP)"
    pod_ip = next(e for e in container["env"] if e["name"] == "POD_IP")
    assert pod_ip["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    assert _flag(args, "--served-model-name") == "tiny"
    assert _flag(args, "--max-model-len") == "4096" and _flag(args, "--max-num-seqs") == "8"
    assert _flag(args, "--dtype") == "bfloat16" and _flag(args, "--kv-cache-memory") == "512MiB"
    assert _flag(args, "--block-size") == "32" and "--no-prefix-caching" in args
    assert args[-2:] == ["--seed", "7"]


@pytest.mark.parametrize("dtype", ["auto", "float32"])
def test_dtype_reaches_the_runtime(dtype):
    args = _container(build_deployment(OWNER, _spec(runtime={"dtype": dtype})))["args"]
    assert _flag(args, "--dtype") == dtype


def test_served_name_defaults_to_the_resource_name():
    args = _container(build_deployment(OWNER, _spec()))["args"]
    assert _flag(args, "--served-model-name") == "smollm2" and "--no-prefix-caching" not in args


def test_probes_cover_loading_liveness_and_readiness():
    container = _container(build_deployment(OWNER, _spec(runtime={"startupTimeoutSeconds": 900})))
    startup = container["startupProbe"]
    assert startup["httpGet"]["path"] == "/ready"
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 900
    assert container["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert container["livenessProbe"]["httpGet"]["path"] == "/health"
    assert "sleep" in container["lifecycle"]["preStop"]


def test_pvc_source_mounts_the_claim_read_only():
    deployment = build_deployment(OWNER, _spec(model={"source": "pvc://weights/llama/8b"}))
    pod = deployment["spec"]["template"]["spec"]
    volume = next(v for v in pod["volumes"] if "persistentVolumeClaim" in v)
    assert volume["persistentVolumeClaim"] == {"claimName": "weights", "readOnly": True}
    mount = next(m for m in _container(deployment)["volumeMounts"] if m["name"] == volume["name"])
    assert mount["readOnly"] and _flag(_container(deployment)["args"], "--model") == f"{mount['mountPath']}/llama/8b"


def test_hf_source_gets_cache_token_and_revision():
    spec = _spec(model={"source": "hf:org/model", "revision": "v2", "tokenSecret": {"name": "hf"}})
    container = _container(build_deployment(OWNER, spec))
    env = {e["name"]: e for e in container["env"]}
    assert env["HF_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": "hf", "key": "HF_TOKEN"}
    assert env["HF_HOME"]["value"].startswith(next(m["mountPath"] for m in container["volumeMounts"] if m["name"] == "cache"))
    assert _flag(container["args"], "--model") == "hf:org/model@v2" and _flag(container["args"], "--device") == "cpu"


def test_gpus_placement_and_rollout():
    spec = _spec(
        model={"source": "hf:org/model"},
        tensorParallelSize=2,
        resources={"gpus": 2, "cpu": 8, "memory": "64Gi", "nodeSelector": {"gpu": "h100"},
                   "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]},
        rollout={"maxSurge": 0, "maxUnavailable": 1, "terminationGracePeriodSeconds": 300},
        replicas=3,
    )
    deployment = build_deployment(OWNER, spec)
    pod = deployment["spec"]["template"]["spec"]
    resources = _container(deployment)["resources"]
    assert resources["limits"]["nvidia.com/gpu"] == 2 and resources["requests"]["cpu"] == "8"
    assert pod["nodeSelector"] == {"gpu": "h100"}
    assert pod["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert pod["terminationGracePeriodSeconds"] == 300
    drain = int(_flag(_container(deployment)["args"], "--shutdown-timeout"))
    assert 0 < drain < 300, "in-flight streams drain within the grace period, before SIGKILL"
    assert _flag(_container(deployment)["args"], "--device") == "cuda"
    assert any(v.get("emptyDir", {}).get("medium") == "Memory" for v in pod["volumes"])
    assert _flag(_container(deployment)["args"], "--tensor-parallel-size") == "2"
    assert deployment["spec"]["replicas"] == 3
    assert deployment["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}


def test_cpu_pods_request_no_gpu_and_are_scraped():
    deployment = build_deployment(OWNER, _spec())
    assert "nvidia.com/gpu" not in _container(deployment)["resources"]["limits"]
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true" and annotations["prometheus.io/port"] == "8000"


@pytest.mark.parametrize("change", [{"runtime": {"maxNumSeqs": 16}}, {"model": {"source": "hf:org/other"}}])
def test_a_spec_change_changes_the_pod_template(change):
    before = build_deployment(OWNER, _spec())["spec"]["template"]
    after = build_deployment(OWNER, _spec(**change))["spec"]["template"]
    assert before != after
    assert build_deployment(OWNER, _spec())["spec"]["template"] == before


def test_pod_labels_and_annotations_cannot_break_the_selector():
    spec = _spec(podLabels={"team": "search", "sluice.dev/inference-model": "hijack"},
                 podAnnotations={"sidecar.istio.io/inject": "false"})
    template = build_deployment(OWNER, spec)["spec"]["template"]["metadata"]
    assert template["labels"]["team"] == "search" and template["labels"]["sluice.dev/inference-model"] == "smollm2"
    assert template["annotations"]["sidecar.istio.io/inject"] == "false"


@pytest.mark.parametrize("cpu, threads", [("2", 2), ("500m", 1), ("2500m", 2), ("1.5", 1), ("8", 8)])
def test_torch_threads_follow_the_cpu_limit_not_the_node(cpu, threads):
    env = _container(build_deployment(OWNER, _spec(resources={"cpu": cpu})))["env"]
    assert {"name": "OMP_NUM_THREADS", "value": str(threads)} in env


def test_a_cpu_limit_above_the_request_makes_a_burstable_pod_with_threads_for_the_limit():
    container = _container(build_deployment(OWNER, _spec(resources={"cpu": "250m", "cpuLimit": 2, "memory": "3Gi"})))
    assert container["resources"] == {"requests": {"cpu": "250m", "memory": "3Gi"},
                                      "limits": {"cpu": "2", "memory": "3Gi"}}
    assert {"name": "OMP_NUM_THREADS", "value": "2"} in container["env"]
    # Unset, the limit is the request.
    plain = _container(build_deployment(OWNER, _spec(resources={"cpu": "250m"})))["resources"]
    assert plain["limits"]["cpu"] == plain["requests"]["cpu"] == "250m"


def test_opentelemetry_settings_reach_the_engines_environment():
    otel = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector.observability:4318", "OTEL_TRACES_SAMPLER_ARG": "0.1"}
    env = _container(build_deployment(OWNER, _spec(runtime={"otelEnv": otel})))["env"]
    assert [e for e in env if e["name"].startswith("OTEL_")] == [{"name": k, "value": v} for k, v in sorted(otel.items())]


def test_a_cache_claim_holds_the_runtimes_cache_and_nothing_else():
    pod = build_deployment(OWNER, _spec(runtime={"cacheClaim": "model-cache"}))["spec"]["template"]["spec"]
    claimed = [v for v in pod["volumes"] if "persistentVolumeClaim" in v]
    assert claimed == [{"name": "cache", "persistentVolumeClaim": {"claimName": "model-cache"}}]
    (mount,) = [m for m in _container({"spec": {"template": {"spec": pod}}})["volumeMounts"] if m["name"] == "cache"]
    env = {e["name"]: e.get("value") for e in _container({"spec": {"template": {"spec": pod}}})["env"]}
    assert env["SLUICE_CACHE_DIR"].startswith(mount["mountPath"] + "/") and not mount.get("readOnly")


def _restricted_violations(pod: dict) -> list[str]:
    """The `restricted` Pod Security Standard's checks, as the API server's PodSecurity admission makes them."""
    found = []
    context = pod.get("securityContext") or {}
    if context.get("seccompProfile", {}).get("type") not in ("RuntimeDefault", "Localhost"):
        found.append("pod seccompProfile")
    allowed_volumes = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
                       "projected", "secret"}
    found += [f"volume {v['name']}" for v in pod["volumes"] if not set(v) - {"name"} <= allowed_volumes]
    for container in pod["containers"]:
        own = container.get("securityContext") or {}
        if own.get("allowPrivilegeEscalation") is not False:
            found.append("allowPrivilegeEscalation")
        if own.get("capabilities", {}).get("drop") != ["ALL"] or own.get("capabilities", {}).get("add"):
            found.append("capabilities")
        if own.get("runAsNonRoot", context.get("runAsNonRoot")) is not True:
            found.append("runAsNonRoot")
        if own.get("runAsUser", context.get("runAsUser")) == 0:
            found.append("runAsUser 0")
    return found


@pytest.mark.parametrize("fields", [{}, {"model": {"source": "pvc://weights/llama"}},
                                    {"model": {"source": "hf:org/m"}, "tensorParallelSize": 2, "resources": {"gpus": 2}},
                                    {"runtime": {"cacheClaim": "model-cache"}}],
                         ids=["embedded", "pvc", "tensor-parallel", "cache-claim"])
def test_runtime_pods_pass_the_restricted_profile_with_a_read_only_root(fields):
    pod = build_deployment(OWNER, _spec(**fields))["spec"]["template"]["spec"]
    assert _restricted_violations(pod) == []
    assert pod["automountServiceAccountToken"] is False, "the runtime never calls the API server"
    container = _container({"spec": {"template": {"spec": pod}}})
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    # Every place the runtime and its libraries write lies on a writable emptyDir (or the cache claim).
    writable = [m["mountPath"] for m in container["volumeMounts"] if not m.get("readOnly")
                and {"emptyDir", "persistentVolumeClaim"} & next(v for v in pod["volumes"] if v["name"] == m["name"]).keys()]
    env = {e["name"]: e.get("value") for e in container["env"]}
    for name in ("SLUICE_CACHE_DIR", "TMPDIR", "HOME", "HF_HOME", "XDG_CACHE_HOME"):
        assert any(env[name] == path or env[name].startswith(path + "/") for path in writable), name


def test_runtime_user_is_the_images_own():
    """runAsNonRoot needs a numeric user to check; it must be the one Dockerfile.runtime creates and runs as."""
    from pathlib import Path

    dockerfile = (Path(__file__).resolve().parents[2] / "Dockerfile.runtime").read_text()
    uid = build_deployment(OWNER, _spec())["spec"]["template"]["spec"]["securityContext"]["runAsUser"]
    assert f"useradd --uid {uid} " in dockerfile and f"USER {uid}:{uid}" in dockerfile


def test_runtime_pods_get_the_release_credential_as_a_whole_secret_volume():
    from sluice_contracts import runtime_credential
    from sluice_operator.builders import Release

    release = Release("sluice", "sluice-system")
    deployment = next(o for o in build_all(OWNER, _spec(), release) if o["kind"] == "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    container = _container(deployment)
    assert _flag(container["args"], "--api-key-file") == runtime_credential.MOUNT_PATH
    volume = next(v for v in pod["volumes"] if v.get("secret", {}).get("secretName") == "sluice-runtime-credential")
    mount = next(m for m in container["volumeMounts"] if m["name"] == volume["name"])
    # No subPath: the kubelet updates a whole Secret volume in place, so a rotated credential reaches the pod.
    assert mount["mountPath"] == runtime_credential.MOUNT_DIR and "subPath" not in mount and mount["readOnly"]
    assert volume["secret"]["items"] == [{"key": runtime_credential.SECRET_KEY, "path": runtime_credential.SECRET_KEY}]
    # Without a release (local use) the runtime checks nothing and mounts nothing.
    plain = _container(build_deployment(OWNER, _spec()))
    assert "--api-key-file" not in plain["args"] and all("credential" not in m["name"] for m in plain["volumeMounts"])


@pytest.mark.parametrize("args", [["--api-key-file", "/dev/null"], ["--api-key-file=/tmp/k"], ["--api-key", "/x"],
                                  ["--seed", "1", "--ap", "/x"], ["--log-prompts"], ["--print-examples"],
                                  ["--chat-template", runtime_credential.MOUNT_PATH], ["--host", "0.0.0.0"],
                                  ["--enforce-eager", runtime_credential.MOUNT_PATH], ["--seed", "--log-prompts"],
                                  ["--lora", "x=/var/run/sluice/runtime-credential"], ["--enforce-eager=1"]])
def test_runtime_args_take_only_the_engines_allowed_flags(args):
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="runtime.args: "):
        _spec(runtime={"args": args})


def test_allowed_runtime_args_follow_the_operators_own():
    args = ["--seed", "7", "--attention-backend=torch", "--enforce-eager", "--target-itl-ms", "off"]
    rendered = _container(build_deployment(OWNER, _spec(runtime={"args": args})))["args"]
    assert rendered[-len(args):] == args and rendered[0] == "serve"


@pytest.mark.parametrize("data, expected", [
    ({"api-key": "c2VjcmV0"}, "secret"), ({"api-key": "c2VjcmV0Cg=="}, "secret"), ({"api-key": ""}, None),
    ({}, None), (None, None), ({"api-key": "not base64!"}, None), ({"api-key": "/w=="}, None),
])
def test_a_credential_is_read_only_from_usable_secret_data(data, expected):
    from sluice_operator.builders import read_credential

    assert read_credential({"data": data}) == expected


GATEWAY = {"app.kubernetes.io/name": "sluice-gateway", "app.kubernetes.io/instance": "prod",
           "app.kubernetes.io/component": "gateway"}
OPERATOR = {**GATEWAY, "app.kubernetes.io/name": "sluice-operator", "app.kubernetes.io/component": "operator"}


def _policy_release():
    from sluice_operator.builders import NetworkPeers, Release

    return Release("prod", "sluice", NetworkPeers(GATEWAY, OPERATOR, {"kubernetes.io/metadata.name": "monitoring"}))


@pytest.mark.parametrize("source, admitted", [
    (("sluice", GATEWAY), True),
    (("sluice", OPERATOR), True),
    (("monitoring", {}), True),
    # Labels are anyone's to set in a namespace of their own: forged ones come from the wrong namespace.
    (("team-b", GATEWAY), False),
    (("team-b", OPERATOR), False),
    (("demo", GATEWAY), False),
    # The release namespace alone is not enough either.
    (("sluice", {}), False),
    (("sluice", {**GATEWAY, "app.kubernetes.io/component": "redis"}), False),
    (("sluice", {"app.kubernetes.io/name": "sluice-runtime", "app.kubernetes.io/managed-by": "sluice-operator"}), False),
], ids=["gateway", "operator", "monitoring", "forged-gateway", "forged-operator", "gateway-labels-in-models-namespace",
        "release-namespace-only", "wrong-component", "another-runtime"])
def test_runtime_network_policy_admits_peers_by_namespace_and_labels_together(source, admitted):
    from fixtures.network_policy import Pod, admits
    from sluice_operator.builders import build_runtime_network_policy

    models = [{"metadata": {"name": "smollm2", "uid": OWNER.uid}}]
    policy = build_runtime_network_policy(_policy_release(), "demo", models)
    deployment = build_deployment(OWNER, _spec())
    target = Pod("demo", deployment["spec"]["template"]["metadata"]["labels"], ports={"http": 8000})
    namespace, labels = source
    assert admits([policy], Pod(namespace, labels), target, 8000) is admitted
    assert not admits([policy], Pod("sluice", GATEWAY), target, 9000), "only the runtime's port"
    (ref,) = policy["metadata"]["ownerReferences"]
    assert ref["uid"] == OWNER.uid and policy["metadata"]["name"] == "prod-runtime"


def test_runtime_network_policy_without_monitoring_admits_only_the_release():
    from fixtures.network_policy import Pod, admits
    from sluice_operator.builders import NetworkPeers, Release, build_runtime_network_policy

    policy = build_runtime_network_policy(Release("prod", "sluice", NetworkPeers(GATEWAY, OPERATOR)), "demo", [])
    target = Pod("demo", build_deployment(OWNER, _spec())["spec"]["template"]["metadata"]["labels"])
    assert not admits([policy], Pod("monitoring", {}), target, 8000)
    assert admits([policy], Pod("sluice", GATEWAY), target, 8000)


@pytest.mark.parametrize("references, ours", [
    ([], False),
    ([{"uid": OWNER.uid, "controller": False}], False),  # named as an owner, but not as the controller
    ([{"uid": "another-model", "controller": True}], False),
    ([{"uid": "x", "controller": False}, {"uid": OWNER.uid, "controller": True}], True),
], ids=["no-owner", "non-controller-reference", "another-controller", "ours"])
def test_only_objects_the_model_controls_are_its_to_change(references, ours):
    from sluice_operator.builders import conflict_message, foreign

    built = build_all(OWNER, _spec())
    existing = [None, None, {"metadata": {"name": "smollm2", "ownerReferences": references}}]
    in_the_way = foreign(built, existing, OWNER.uid)
    assert in_the_way == ([] if ours else ["Deployment smollm2"])
    if in_the_way:
        assert conflict_message(in_the_way).startswith("Deployment smollm2 already exists and does not belong")


def test_routing_table_config_map_is_owned_by_every_model_and_names_its_generation():
    from sluice_operator.builders import ROUTING_TABLE, ROUTING_TABLE_KEY, build_routing_table

    models = [{"metadata": {"name": name, "uid": f"uid-{name}"}} for name in ("a", "b")]
    cm = build_routing_table("demo", 7, '{"version": 1}', models)
    assert cm["kind"] == "ConfigMap" and cm["metadata"]["name"] == ROUTING_TABLE
    assert cm["metadata"]["namespace"] == "demo"
    assert cm["data"] == {ROUTING_TABLE_KEY: '{"version": 1}'}
    assert cm["metadata"]["annotations"] == {"sluice.dev/generation": "7"}
    # Owned by all, controlled by none: the table goes with the last model, and no model takes it over.
    refs = cm["metadata"]["ownerReferences"]
    assert [r["uid"] for r in refs] == ["uid-a", "uid-b"] and not any(r.get("controller") for r in refs)
    assert cm["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "sluice-operator"


# A valid value of each valued flag the sluice engine takes from runtime.args.
_SLUICE_SAMPLES = {"--max-num-batched-tokens": "256", "--target-itl-ms": "off", "--attention-backend": "torch", "--pooling": "last",
                   "--max-body-bytes": "4MiB", "--request-timeout": "30.5", "--stream-idle-timeout": "20"}


def test_every_allowed_sluice_flag_is_one_the_runtime_parses():
    """The allow-list names the runtime's own flags: a command line with each of them, as the operator builds
    it, is taken by the runtime's parser and configs."""
    from sluice_contracts.engine_args import ALLOWED_ARGS
    from sluice_runtime.cli import _parser
    from sluice_runtime.engine_config import EngineConfig
    from sluice_runtime.server.settings import ServerSettings

    args = []
    for flag in ALLOWED_ARGS["sluice"]:
        args += [flag.name] if flag.value is None else [flag.name, _SLUICE_SAMPLES.get(flag.name, "8")]
    container = _container(build_deployment(OWNER, _spec(runtime={"args": args})))
    parsed = _parser()[0].parse_args([a.replace("$(POD_IP)", "127.0.0.1") for a in container["args"]])
    engine, server = EngineConfig.from_cli_args(parsed), ServerSettings.from_cli_args(parsed)
    assert engine.enforce_eager and engine.pooling == "last" and engine.max_num_batched_tokens == 256
    assert server.request_timeout == 30.5 and not server.log_prompts and server.chat_template is None


@pytest.mark.parametrize("source, admitted", [
    (("monitoring", {"app.kubernetes.io/name": "prometheus"}), True),
    (("monitoring", {}), False),
    (("monitoring", {"app.kubernetes.io/name": "grafana"}), False),
    # The scraper's labels in a namespace that is not a monitoring one.
    (("team-b", {"app.kubernetes.io/name": "prometheus"}), False),
])
def test_runtime_network_policy_admits_the_scraper_by_namespace_and_labels(source, admitted):
    from fixtures.network_policy import Pod, admits
    from sluice_operator.builders import NetworkPeers, Release, build_runtime_network_policy

    peers = NetworkPeers(GATEWAY, OPERATOR, {"kubernetes.io/metadata.name": "monitoring"},
                         {"app.kubernetes.io/name": "prometheus"})
    policy = build_runtime_network_policy(Release("prod", "sluice", peers), "demo", [])
    target = Pod("demo", build_deployment(OWNER, _spec())["spec"]["template"]["metadata"]["labels"])
    assert admits([policy], Pod(*source), target, 8000) is admitted


def test_the_scraper_pod_flag_reaches_the_policy_and_needs_its_namespaces(capsys):
    from sluice_operator.cli import _parser, _release

    base = ["run", "--release", "r", "--release-namespace", "s", "--network-policy-gateway", "a=b",
            "--network-policy-operator", "c=d"]
    release = _release(_parser().parse_args([*base, "--network-policy-monitoring", "kubernetes.io/metadata.name=m",
                                             "--network-policy-monitoring-pods", "app=prometheus"]))
    assert release.peers.monitoring_pods == {"app": "prometheus"}
    with pytest.raises(SystemExit):
        _release(_parser().parse_args([*base, "--network-policy-monitoring-pods", "app=prometheus"]))
    assert "--network-policy-monitoring-pods needs --network-policy-monitoring" in capsys.readouterr().err
