"""engine: vllm | sglang: the pods run that engine's server, with its documented flags, probes and credential.

vLLM and SGLang cannot run here (no GPU, no image registry): their command lines are checked against the flags
their own argument parsers define (cited in builders/vllm_args.py and builders/sglang_args.py), and the CRD's
refusals of fields an engine lacks are also tried at the real API server (tests/operator/test_operator_cluster.py).
"""
import pytest
from pydantic import ValidationError

from sluice_contracts import runtime_credential
from sluice_operator.builders import Owner, Release, build_all
from sluice_operator.crd import ENGINE_IMAGES, InferenceModelSpec

OWNER = Owner(name="chat", namespace="demo", uid="0b7e4c1e-1111-2222-3333-444455556666")
RELEASE = Release("sluice", "sluice-system")


def _spec(engine, model=None, **runtime):
    return InferenceModelSpec.model_validate(
        {"model": model or {"source": "smollm2"}, "runtime": {"engine": engine, **runtime}})


def _container(spec, release=None, images=None):
    deployment = next(o for o in build_all(OWNER, spec, release, images) if o["kind"] == "Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return container


def _flag(args, name):
    assert args.count(name) == 1, f"{name} given {args.count(name)} times in {args}"
    return args[args.index(name) + 1]


def test_vllm_gets_its_own_flags_for_every_field():
    spec = _spec("vllm", {"source": "hf:Qwen/Qwen3-0.6B", "revision": "c1899de"}, maxModelLen=8192, maxNumSeqs=128,
                 dtype="bfloat16", kvCacheMemory="6Gi", gpuMemoryUtilization=0.85, blockSize=32,
                 prefixCaching=False, args=["--enforce-eager"])
    spec = spec.model_copy(update={"tensor_parallel_size": 2, "resources": spec.resources.model_copy(update={"gpus": 2})})
    container = _container(spec)
    args = container["args"]
    assert container["command"] == ["vllm", "serve"] and container["image"] == ENGINE_IMAGES["vllm"]
    assert args[0] == "Qwen/Qwen3-0.6B" and _flag(args, "--revision") == "c1899de"
    assert _flag(args, "--served-model-name") == "chat" and _flag(args, "--port") == "8000"
    assert _flag(args, "--host") == "$(POD_IP)"
    assert _flag(args, "--max-model-len") == "8192" and _flag(args, "--max-num-seqs") == "128"
    assert _flag(args, "--dtype") == "bfloat16" and _flag(args, "--block-size") == "32"
    assert _flag(args, "--kv-cache-memory-bytes") == str(6 * 2**30)
    assert _flag(args, "--gpu-memory-utilization") == "0.85" and _flag(args, "--tensor-parallel-size") == "2"
    assert "--no-enable-prefix-caching" in args and args[-1] == "--enforce-eager"
    # Sluice's own flags never reach vLLM, whose parser would refuse them.
    assert not {"--kv-cache-memory", "--device", "--shutdown-timeout", "--model", "--no-prefix-caching"} & set(args)


def test_sglang_gets_its_own_flags_for_every_field():
    spec = _spec("sglang", {"source": "pvc://weights/qwen"}, maxModelLen=4096, maxNumSeqs=32, dtype="float16",
                 gpuMemoryUtilization=0.8, blockSize=64, prefixCaching=False)
    container = _container(spec)
    args = container["args"]
    assert container["command"] == ["python3", "-m", "sglang.launch_server"]
    assert container["image"] == ENGINE_IMAGES["sglang"]
    assert _flag(args, "--model-path") == "/model/qwen" and _flag(args, "--context-length") == "4096"
    assert _flag(args, "--max-running-requests") == "32" and _flag(args, "--page-size") == "64"
    assert _flag(args, "--mem-fraction-static") == "0.8" and _flag(args, "--dtype") == "float16"
    assert "--disable-radix-cache" in args and "--enable-metrics" in args and _flag(args, "--port") == "8000"
    assert any(m["mountPath"] == "/model" and m["readOnly"] for m in container["volumeMounts"])


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_unset_fields_are_left_to_the_engine(engine):
    args = _container(_spec(engine))["args"]
    for flag in ("--dtype", "--kv-cache-memory-bytes", "--gpu-memory-utilization", "--mem-fraction-static",
                 "--revision", "--tensor-parallel-size", "--tp-size"):
        assert flag not in args
    # The embedded model is SmolLM2-135M-Instruct, which the other engines load from its Hub repository.
    assert "HuggingFaceTB/SmolLM2-135M-Instruct" in args


def test_sluice_keeps_its_defaults_when_fields_are_unset():
    args = _container(_spec("sluice"))["args"]
    assert _flag(args, "--dtype") == "float32" and _flag(args, "--kv-cache-memory") == "1GiB"
    assert "--gpu-memory-utilization" not in args
    assert _flag(_container(_spec("sluice", gpuMemoryUtilization=0.5))["args"], "--gpu-memory-utilization") == "0.5"
    assert "--quantization" not in args


@pytest.mark.parametrize("engine", ["sluice", "vllm"])
def test_speculative_decoding_reaches_the_engine_in_vllms_flag(engine):
    import json

    from sluice_runtime.engine.speculation import parse_speculative_config

    model = {"source": "hf:org/model"} if engine == "vllm" else None
    spec = _spec(engine, model, speculative={"numSpeculativeTokens": 5, "promptLookupMax": 4})
    value = _flag(_container(spec)["args"], "--speculative-config")
    # vLLM's keys, only those the spec sets; the sluice runtime reads the same object.
    assert json.loads(value) == {"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 4}
    assert parse_speculative_config(value).prompt_lookup_min == 4
    assert "--speculative-config" not in _container(_spec(engine, model))["args"]


def test_sluice_quantizes_its_weights_when_asked():
    args = _container(_spec("sluice", quantization="int8"))["args"]
    assert _flag(args, "--quantization") == "int8"


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_probes_use_the_engines_health_endpoint(engine):
    container = _container(_spec(engine))
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"] == {"path": "/health", "port": 8000}
    assert container["ports"][0]["containerPort"] == 8000


GUARD_IMAGE = "ghcr.io/sluice-dev/sluice-operator:0.1.0"


def _pod(spec, release=RELEASE, guard_image=GUARD_IMAGE):
    deployment = next(o for o in build_all(OWNER, spec, release, guard_image=guard_image) if o["kind"] == "Deployment")
    return deployment["spec"]["template"]["spec"]


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_a_guarded_engine_listens_on_loopback_behind_the_engine_guard(engine):
    from sluice_contracts import engine_guard

    pod = _pod(_spec(engine))
    runtime, guard = pod["containers"]
    assert guard["name"] == engine_guard.CONTAINER_NAME and guard["image"] == GUARD_IMAGE
    assert guard["command"] == [engine_guard.COMMAND, "--host", "$(POD_IP)", "--port", "8000", "--upstream",
                                f"http://{engine_guard.ENGINE_HOST}:{engine_guard.ENGINE_PORT}",
                                "--credential-file", runtime_credential.MOUNT_PATH]
    assert guard["env"] == [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}]
    # The serving port (the Service's named targetPort) is the guard's; the engine has none and only loopback.
    assert guard["ports"] == [{"name": "http", "containerPort": 8000, "protocol": "TCP"}] and "ports" not in runtime
    assert _flag(runtime["args"], "--host") == engine_guard.ENGINE_HOST
    assert _flag(runtime["args"], "--port") == str(engine_guard.ENGINE_PORT)
    # Only the guard holds the credential: the engine gets neither the file, a variable nor a flag.
    (mount,) = guard["volumeMounts"]
    assert mount["mountPath"] == runtime_credential.MOUNT_DIR and mount["readOnly"]
    assert all(m["name"] != mount["name"] for m in runtime["volumeMounts"])
    assert "--api-key" not in runtime["args"] and not any("valueFrom" in e and "secretKeyRef" in e["valueFrom"]
                                                          for e in runtime["env"])
    # Probes reach the engine through the guard's open paths on the serving port.
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert runtime[probe]["httpGet"] == {"path": "/health", "port": 8000}
        assert probe not in guard
    assert guard["securityContext"] == runtime["securityContext"]
    assert guard["securityContext"]["readOnlyRootFilesystem"] and guard["securityContext"]["runAsNonRoot"]


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_a_guarded_engine_needs_the_guards_image(engine):
    from sluice_operator.builders import NoGuardImage

    with pytest.raises(NoGuardImage, match="--guard-image"):
        _pod(_spec(engine), guard_image=None)


def test_engines_without_a_credential_or_of_our_own_have_no_guard():
    for engine in ("vllm", "sglang"):
        (plain,) = _pod(_spec(engine), release=None)["containers"]
        assert _flag(plain["args"], "--host") == "$(POD_IP)" and _flag(plain["args"], "--port") == "8000"
        assert "--api-key" not in plain["args"] and not any("API_KEY" in e["name"] for e in plain["env"])
    (sluice,) = _pod(_spec("sluice"))["containers"]
    assert _flag(sluice["args"], "--api-key-file") == runtime_credential.MOUNT_PATH


def test_image_comes_from_the_spec_then_the_release_then_the_pin():
    images = {"vllm": "registry.local/vllm-openai:v0.11.0-patched"}
    assert _container(_spec("vllm"), images=images)["image"] == images["vllm"]
    assert _container(_spec("vllm", image="mine/vllm:1"), images=images)["image"] == "mine/vllm:1"
    assert _container(_spec("sglang"), images=images)["image"] == ENGINE_IMAGES["sglang"]
    assert _container(_spec("sluice"))["image"] == ENGINE_IMAGES["sluice"]


def test_hf_token_reaches_every_engine():
    model = {"source": "hf:meta-llama/Llama-3.2-1B-Instruct", "tokenSecret": {"name": "hf"}}
    for engine in ("sluice", "vllm", "sglang"):
        env = _container(_spec(engine, model))["env"]
        assert any(e["name"] == "HF_TOKEN" and e["valueFrom"]["secretKeyRef"]["name"] == "hf" for e in env)


@pytest.mark.parametrize("spelling", ["kvCacheMemory", "kv_cache_memory"])
def test_a_field_sglang_lacks_is_refused_naming_engine_and_field(spelling):
    with pytest.raises(ValidationError, match="runtime.kvCacheMemory is not supported by engine sglang"):
        _spec("sglang", **{spelling: "1Gi"})
    assert _spec("vllm", kvCacheMemory="1Gi")


@pytest.mark.parametrize("engine", ["tgi", "VLLM", "", None, 1, ["vllm"]])
def test_an_unknown_engine_is_refused(engine):
    with pytest.raises(ValidationError, match="engine"):
        _spec(engine)


@pytest.mark.parametrize("args", [["--api-key", "x"], ["--api-key=x"], ["--ap", "x"]])
@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_args_cannot_replace_the_credential_on_any_engine(engine, args):
    with pytest.raises(ValidationError, match=f"runtime.args: '{args[0]}' is not allowed with engine {engine}"):
        _spec(engine, args=args)


def test_the_crd_refuses_what_sglang_lacks_with_the_same_message():
    from sluice_operator.crd.definitions import all_definitions

    crd = all_definitions()["sluice.dev_inferencemodels.yaml"]
    runtime = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["runtime"]
    rule = runtime["x-kubernetes-validations"][0]
    assert rule == {"rule": "self.engine != 'sglang' || !has(self.kvCacheMemory)",
                    "message": "runtime.kvCacheMemory is not supported by engine sglang: SGLang sizes its KV cache "
                               "from runtime.gpuMemoryUtilization (--mem-fraction-static)"}
    assert "default" not in runtime["properties"]["image"] and "default" not in runtime["properties"]["dtype"]


def test_the_guard_runs_as_built_and_refuses_a_request_without_the_credential(tmp_path):
    """The guard container's command, as the builder writes it (the pod's address and the credential's mount
    made local), starts the real `sluice-engine-guard`: inference paths want the credential, probes pass."""
    import os
    import socket
    import subprocess
    import sys
    import threading
    import time
    import urllib.error
    import urllib.request
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    from pathlib import Path

    class Engine(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *args):
            pass

    engine = ThreadingHTTPServer(("127.0.0.1", 0), Engine)
    threading.Thread(target=engine.serve_forever, daemon=True).start()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    credential = tmp_path / "api-key"
    credential.write_text("sk-runtime\n")
    (_, guard) = _pod(_spec("vllm"))["containers"]
    local = {"$(POD_IP)": "127.0.0.1", "8000": str(port), runtime_credential.MOUNT_PATH: str(credential),
             guard["command"][guard["command"].index("--upstream") + 1]: f"http://127.0.0.1:{engine.server_port}"}
    command = [local.get(part, part) for part in guard["command"]]
    command[0] = str(Path(sys.executable).parent / command[0])
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=dict(os.environ))
    try:
        def get(path, headers=None):
            request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers=headers or {})
            try:
                return urllib.request.urlopen(request, timeout=5).status
            except urllib.error.HTTPError as exc:
                return exc.code

        deadline = time.monotonic() + 30
        while True:
            assert process.poll() is None, process.stderr.read().decode()
            try:
                status = get("/health")
                break
            except OSError:
                assert time.monotonic() < deadline, "the guard did not start listening"
                time.sleep(0.2)
        assert status == 200
        for path in ("/v1/models", "/invocations", "/tokenize", "/v2/rerank"):
            assert get(path) == 401, path
        assert get("/v1/models", {"Authorization": "Bearer sk-runtime"}) == 200
    finally:
        process.terminate()
        process.wait(timeout=10)
        engine.shutdown()
