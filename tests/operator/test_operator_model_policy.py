"""What an InferenceModel's author may choose: images under the release's registry prefixes, token Secrets the
platform team opened to models. The operator's side; the admission side is in tests/chart and
tests/operator/test_operator_cluster.py."""
import base64

import pytest

from sluice_operator.builders.model_policy import (
    TOKEN_SECRET_LABEL,
    image_allowed,
    image_refusal,
    normalized_image,
    token_secret_refusal,
)
from sluice_operator.cli import _parser, _policy
from sluice_operator.crd import ENGINE_IMAGES

PREFIXES = ("ghcr.io/sluice-dev/", "docker.io/vllm/vllm-openai", "registry.example:5000/team")


@pytest.mark.parametrize("image", [
    "ghcr.io/sluice-dev/sluice-runtime:0.1.0", "ghcr.io/sluice-dev/sluice-runtime@sha256:" + "a" * 64,
    "vllm/vllm-openai:v0.24.0", "docker.io/vllm/vllm-openai", "docker.io/vllm/vllm-openai@sha256:" + "b" * 64,
    "registry.example:5000/team/model:1", "registry.example:5000/team:2",
])
def test_images_under_a_prefix_are_allowed(image):
    assert image_allowed(image, PREFIXES)


@pytest.mark.parametrize("image", [
    # A longer name that only starts like the prefix is another repository, someone else's.
    "docker.io/vllm/vllm-openai-evil:1", "vllm/vllm-openai-evil", "registry.example:5000/teammate/x:1",
    # Docker Hub without a host is docker.io; these hosts are other registries.
    "ghcr.io.evil.example/sluice-dev/x:1", "evil.example/ghcr.io/sluice-dev/x:1", "ghcr.io/sluice-devs/x:1",
    "busybox", "library/busybox:1", "localhost/sluice-dev/x", "",
])
def test_images_elsewhere_are_refused(image):
    assert not image_allowed(image, PREFIXES)
    assert not image_allowed(image, ())


def test_docker_hubs_short_names_are_made_explicit():
    assert normalized_image("busybox") == "docker.io/library/busybox"
    assert normalized_image("vllm/vllm-openai:v1") == "docker.io/vllm/vllm-openai:v1"
    assert normalized_image("localhost:5000/x") == "localhost:5000/x"
    assert normalized_image("localhost/x") == "localhost/x"


def test_the_refusal_names_the_image_and_the_prefixes():
    message = image_refusal("evil.example/x:1", PREFIXES)
    assert "'evil.example/x:1'" in message and all(p in message for p in PREFIXES)


def test_the_pinned_engine_images_are_under_the_charts_default_prefixes():
    from pathlib import Path

    import yaml

    values = yaml.safe_load((Path(__file__).resolve().parents[2] / "charts/sluice/values.yaml").read_text())
    prefixes = tuple(values["operator"]["allowedImagePrefixes"])
    for image in ENGINE_IMAGES.values():
        assert image_allowed(image, prefixes), image


@pytest.mark.parametrize("bad", ["vllm/vllm-openai", "ghcr.io/Sluice", "", "ghcr.io//x", "ghcr.io/x y", "http://ghcr.io/x",
                                 "a" * 300 + ".io/"])
def test_prefix_flags_name_a_registry(bad, capsys):
    with pytest.raises(SystemExit):
        _parser().parse_args(["run", "--allowed-image-prefix", bad])
    assert "is not a registry prefix" in capsys.readouterr().err


def test_prefix_and_guard_flags_reach_the_policy():
    args = _parser().parse_args(["run", "--allowed-image-prefix", "ghcr.io/sluice-dev/",
                                 "--allowed-image-prefix", "localhost:5000/m", "--guard-image", "ghcr.io/sluice-dev/op:1"])
    policy = _policy(args)
    assert policy.image_prefixes == ("ghcr.io/sluice-dev/", "localhost:5000/m")
    assert policy.guard_image == "ghcr.io/sluice-dev/op:1"
    assert _policy(_parser().parse_args(["run"])).image_prefixes == ()


def _secret(labels=None, data=None):
    return {"metadata": {"name": "hf", "labels": labels}, "data": data}


TOKEN = {"HF_TOKEN": base64.b64encode(b"hf_x").decode()}


@pytest.mark.parametrize("secret, fragment", [
    (None, "does not exist"),
    (_secret(None, TOKEN), f"{TOKEN_SECRET_LABEL}=true"),
    (_secret({TOKEN_SECRET_LABEL: "True"}, TOKEN), "is not open to models"),
    (_secret({TOKEN_SECRET_LABEL: "yes"}, TOKEN), "is not open to models"),
    (_secret({"other": "true"}, TOKEN), "is not open to models"),
    # The label as an annotation does not open it: annotations are not what the platform team sets.
    ({"metadata": {"annotations": {TOKEN_SECRET_LABEL: "true"}}, "data": TOKEN}, "is not open to models"),
    (_secret({TOKEN_SECRET_LABEL: "true"}, {"token": "eA=="}), "has no key 'HF_TOKEN'"),
    (_secret({TOKEN_SECRET_LABEL: "true"}, None), "has no key 'HF_TOKEN'"),
])
def test_a_token_secret_must_opt_in_and_hold_the_key(secret, fragment):
    message = token_secret_refusal(secret, "hf", "HF_TOKEN")
    assert message is not None and fragment in message and message.startswith("model.tokenSecret: Secret 'hf'")


def test_an_opted_in_token_secret_is_taken():
    assert token_secret_refusal(_secret({TOKEN_SECRET_LABEL: "true"}, TOKEN), "hf", "HF_TOKEN") is None


@pytest.mark.parametrize("source", ["file:///devices/sql", "file:///opt/adapters/sql", "file:///process/x",
                                    "file:///srv/run/sql", "file:///var/lib/adapters/sql", "file:///system/a"])
def test_adapter_paths_that_only_look_like_a_refused_root_are_taken(source):
    from sluice_operator.crd.adapters import Adapter

    assert Adapter.model_validate({"name": "sql", "source": source}).parsed().path == source[len("file://"):]
