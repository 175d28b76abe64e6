"""The container images, built here with buildah (`python -m images.build`): what each declares, read from the
image as `make images` last built it. Each image runs as a pod on the local cluster's real node
(tests/cluster/test_real_node.py and tests/e2e): there they serve, write only to their volumes and answer as this
machine's runtime does.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from images import build, buildah
from sluice_operator.builders.pod_security import RUN_AS_USER, WRITABLE_ENV

REPO = Path(__file__).resolve().parents[2]


def _config(name: str) -> dict:
    image = build.TARGETS[name].image
    try:
        if not buildah.image_exists(image):
            pytest.fail(f"{image} is not built: `make images` builds it", pytrace=False)
    except buildah.BuildahMissing as error:
        pytest.fail(str(error))
    return buildah.image_config(image)


@pytest.mark.integration
def test_the_runtime_image_serves_as_its_user_with_every_cache_on_a_writable_path():
    config = _config("runtime")
    assert config["Entrypoint"] == ["sluice-runtime", "serve"]
    assert config["User"] == f"{RUN_AS_USER}:{RUN_AS_USER}"
    # Without the operator's environment the image already points every cache at the writable paths.
    env = dict(entry.split("=", 1) for entry in config["Env"])
    assert {name: env.get(name) for name in WRITABLE_ENV} == WRITABLE_ENV


@pytest.mark.integration
def test_the_operator_image_runs_the_operator_as_its_user():
    config = _config("operator")
    assert config["User"] == f"{RUN_AS_USER}:{RUN_AS_USER}"
    assert config["Cmd"] == ["sluice-operator", "run"]


def test_the_chart_and_the_crd_default_to_the_images_the_build_makes():
    values = yaml.safe_load((REPO / "charts/sluice/values.yaml").read_text())
    chart = yaml.safe_load((REPO / "charts/sluice/Chart.yaml").read_text())
    tag = values["image"]["tag"] or chart["appVersion"]
    assert f"{values['image']['repository']}:{tag}" == build.TARGETS["operator"].image
    from sluice_operator.crd.inference_model import ENGINE_IMAGES

    # The sluice engine's image where neither the spec nor the chart names one.
    assert ENGINE_IMAGES["sluice"] == build.TARGETS["runtime"].image


def test_a_build_uses_the_local_base_and_reuses_the_hosts_pip_cache():
    command = build.bud_command(build.TARGETS["runtime"], "localhost/base")
    assert "--build-arg" in command and "BASE=localhost/base" in command and "BUILD_BASE=localhost/base" in command
    # pip caches into the mounted host cache, never into a layer.
    assert f"PIP_CACHE_OPTION=--cache-dir={build.PIP_CACHE_IN_BUILD}" in command
    assert f"{build.host_pip_cache()}:{build.PIP_CACHE_IN_BUILD}" in command
    # The operator's Dockerfile has no BUILD_BASE; passing it would be an unconsumed argument.
    assert not any(arg.startswith("BUILD_BASE=") for arg in build.bud_command(build.TARGETS["operator"], "b"))
