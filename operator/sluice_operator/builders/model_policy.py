"""What the platform team lets an InferenceModel's author choose: which images, which token Secrets.

Writing an InferenceModel makes pods; these checks keep that from meaning "any image" and "any Secret of the
namespace". They run in the operator before anything is built; the chart's ValidatingAdmissionPolicy applies
the same image rule at admission.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from ..crd.inference_model import TOKEN_SECRET_LABEL, TOKEN_SECRET_OPT_IN

# A prefix names its registry host (a dot or a port in it, or localhost) and ends at a path boundary.
IMAGE_PREFIX = re.compile(r"^(localhost|[a-z0-9-]+([.][a-z0-9-]+)+|[a-z0-9.-]+:[0-9]+)(/[a-z0-9._-]+)*/?$")


@dataclass(frozen=True)
class ModelPolicy:
    # Registry prefixes spec.runtime.image must be under; empty: any image (local use, no chart).
    image_prefixes: tuple[str, ...] = ()
    # The engine guard's image, put in front of vLLM and SGLang pods that check the runtime credential.
    guard_image: str | None = None


def normalized_image(image: str) -> str:
    """The reference as the kubelet pulls it: Docker Hub's host (and `library/`) made explicit."""
    first, slash, _ = image.partition("/")
    if not slash:
        return f"docker.io/library/{image}"
    if "." in first or ":" in first or first == "localhost":
        return image
    return f"docker.io/{image}"


def image_allowed(image: str, prefixes: tuple[str, ...]) -> bool:
    """`image` is under one of `prefixes`, at a boundary: `registry.example/team` admits
    `registry.example/team/x:1` and `registry.example/team:1`, not `registry.example/team-other/x`."""
    full = normalized_image(image)
    for prefix in prefixes:
        if prefix.endswith("/") and full.startswith(prefix):
            return True
        if full == prefix or any(full.startswith(prefix + mark) for mark in "/:@"):
            return True
    return False


def image_refusal(image: str, prefixes: tuple[str, ...]) -> str:
    return (f"runtime.image {image!r} is not under a registry prefix this release allows "
            f"({', '.join(prefixes)}); unset it to run the release's image for the engine")


def token_secret_refusal(secret: dict[str, Any] | None, name: str, key: str) -> str | None:
    """Why the Secret `name` cannot be a model's token, or None when it opts in and holds `key`."""
    if secret is None:
        return f"model.tokenSecret: Secret {name!r} does not exist in the model's namespace"
    labels = (secret.get("metadata") or {}).get("labels") or {}
    if labels.get(TOKEN_SECRET_LABEL) != TOKEN_SECRET_OPT_IN:
        return (f"model.tokenSecret: Secret {name!r} is not open to models: the platform team labels the Secrets "
                f"models may use {TOKEN_SECRET_LABEL}={TOKEN_SECRET_OPT_IN}")
    if key not in (secret.get("data") or {}):
        return f"model.tokenSecret: Secret {name!r} has no key {key!r}"
    return None
