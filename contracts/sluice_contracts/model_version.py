"""Which model version answered: what the operator names, the runtime and the gateway report in every answer.

A version is the InferenceModel's weights (its `model.source`, with `@REVISION` when `model.revision` names
one: `weights_version`) and, as the operator writes it into the routing table, the InferenceModel's generation
after a `+g` (`model_version`). The runtime is given the weights part (`--model-version`, the flag's default
being its `--model`): the generation changes with every edit of the InferenceModel, a scaling bound too, and
in the pods' arguments it would replace them all for an edit that changes nothing they serve.

Answers name the version in `HEADER`, and chat and completion bodies (and their stream chunks) carry
`fingerprint(version)` as OpenAI's `system_fingerprint`: the same version, the same fingerprint, whichever
component computes it.
"""
from __future__ import annotations

import hashlib
import re

HEADER = "x-sluice-model-version"
# Printable ASCII without spaces: a header value as it is, and a log field nobody has to escape.
PATTERN = r"^[\x21-\x7e]{1,1024}$"
_VERSION = re.compile(PATTERN)
_NOT_IN_A_VERSION = re.compile(r"[^\x21-\x7e]")


def weights_version(source: str, revision: str | None) -> str:
    """The weights' version, any character a version may not hold (a space in a path) as `_`."""
    return _NOT_IN_A_VERSION.sub("_", f"{source}@{revision}" if revision else source)[:1000]


def model_version(weights: str, generation: int) -> str:
    return f"{weights}+g{generation}"


def fingerprint(version: str) -> str:
    return "fp_" + hashlib.sha256(version.encode()).hexdigest()[:12]


def check(version: str) -> str:
    """`version`, or ValueError saying what a version may hold."""
    if not _VERSION.match(version):
        raise ValueError(f"a model version is 1 to 1024 printable ASCII characters without spaces, got {version!r}")
    return version
