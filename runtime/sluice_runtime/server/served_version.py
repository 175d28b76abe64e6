"""What this replica serves, as its answers and its start-up line name it: the model version (--model-version,
sluice_contracts.model_version) with its system_fingerprint, and the versions of the tokenizer and the chat
template, which change what a prompt becomes without changing the weights."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from sluice_contracts import model_version

# The files a Hugging Face tokenizer is read from; whichever of them the model directory has make its version.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "merges.txt", "tokenizer_config.json",
                   "special_tokens_map.json", "added_tokens.json")


@dataclass(frozen=True)
class ServedVersion:
    version: str
    fingerprint: str
    tokenizer: str | None  # a digest of its files; None: the directory holds none of them
    chat_template: str | None

    @classmethod
    def of(cls, given: str | None, model: str, model_dir: Path, chat_template: str | None) -> "ServedVersion":
        """`given`: --model-version; without it the --model argument stands in."""
        version = given or model_version.weights_version(model, None)
        return cls(version, model_version.fingerprint(version), tokenizer_version(model_dir), chat_template)

    def describe(self) -> str:
        return (f"model version {self.version} (system_fingerprint {self.fingerprint}); tokenizer version "
                f"{self.tokenizer or 'none'}; chat template version {self.chat_template or 'none'}")


def tokenizer_version(model_dir: Path) -> str | None:
    digest, found = hashlib.sha256(), False
    for name in TOKENIZER_FILES:
        path = model_dir / name
        if path.is_file():
            digest.update(name.encode() + b"\0" + path.read_bytes() + b"\0")
            found = True
    return digest.hexdigest()[:12] if found else None
