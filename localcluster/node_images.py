"""Images on the real node: built with buildah (`images/`, or here from one of the cluster's own binaries), then
streamed to the node's containerd as an OCI layout with zstd layers, once per image id. No registry is reachable, so a pod's
image must be on the node before the pod starts, and pods name them with `imagePullPolicy: Never` or
`IfNotPresent`.
"""
from __future__ import annotations

import hashlib
import io
import json
import subprocess
import tarfile
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from images import buildah

if TYPE_CHECKING:
    from localcluster.real_node import RealNode

# User and group of the images made from a single binary: not root, numeric so `runAsNonRoot` can check it.
BINARY_IMAGE_USER = "65532:65532"


def _loaded_file(node: RealNode) -> Path:
    return node.home / "images.json"


def _on_node(node: RealNode, name: str) -> bool:
    return node.ctr("images", "check", f"name=={name}", check=False).stdout.count(name) > 0


def load(node: RealNode, name: str) -> str:
    """Puts the image `name` (in buildah's storage) into the node's containerd unless it is there already;
    returns its id."""
    image_id = json.loads(buildah.output("inspect", "--type", "image", name))["FromImageID"]
    record_file = _loaded_file(node)
    record = json.loads(record_file.read_text()) if record_file.exists() else {}
    if record.get(name) == image_id and _on_node(node, name):
        return image_id
    with tempfile.TemporaryDirectory(dir=node.home) as scratch:
        layout = Path(scratch) / "layout"
        # zstd: the layers cross at under half their size and decompress at disk speed, so the node's content
        # store and this copy together stay smaller than one uncompressed image (an image is gigabytes, and a
        # CI machine's disk is not much more than a few of them).
        buildah.buildah("push", "--quiet", "--compression-format", "zstd", name, f"oci:{layout}:{name}", capture=True)
        # Streamed: an archive file would be one more copy on disk.
        tar = subprocess.Popen(["tar", "-C", str(layout), "-cf", "-", "oci-layout", "index.json", "blobs"],
                               stdout=subprocess.PIPE)
        try:
            node.ctr("images", "import", "-", stdin=tar.stdout, timeout=1800)
        finally:
            tar.stdout.close()
            if tar.wait() != 0:
                raise subprocess.CalledProcessError(tar.returncode, tar.args)
    record[name] = image_id
    record_file.write_text(json.dumps(record, indent=1))
    return image_id


def binary_image(binary: Path, name: str) -> str:
    """An image holding only `binary` as its entrypoint, rebuilt when the binary changes."""
    digest = hashlib.sha256(binary.read_bytes()).hexdigest()
    if buildah.image_exists(name) and buildah.image_config(name).get("Labels", {}).get("sluice.dev/source") == digest:
        return name
    container = buildah.output("from", "scratch")
    try:
        buildah.buildah("copy", container, str(binary), f"/{binary.name}", capture=True)
        buildah.buildah("config", "--entrypoint", json.dumps([f"/{binary.name}"]), "--user", BINARY_IMAGE_USER,
                        "--label", f"sluice.dev/source={digest}", container, capture=True)
        previous = json.loads(buildah.output("inspect", "--type", "image", name))["FromImageID"] \
            if buildah.image_exists(name) else None
        buildah.buildah("commit", "--quiet", container, name, capture=True)
        if previous:
            buildah.buildah("rmi", previous, capture=True, check=False)
    finally:
        buildah.buildah("rm", container, capture=True, check=False)
    return name



def derived(node: RealNode, base: str, name: str, files: dict[str, bytes], entrypoint: list[str]) -> str:
    """The image `name` made on the node from `base` (already there) with `files` (path in the image → content,
    executable) added as one more layer and a new entrypoint, as `FROM base` + `COPY` + `ENTRYPOINT` would. The
    base's layers are the node's own, referenced rather than copied: seconds, where a buildah build would copy
    the gigabytes of the base and send them again."""
    manifest = _manifest(node, base)
    config = json.loads(node.ctr("content", "get", manifest["config"]["digest"]).stdout)
    layer = _tar(files)
    layer_digest = f"sha256:{hashlib.sha256(layer).hexdigest()}"
    config["rootfs"]["diff_ids"].append(layer_digest)
    config["config"]["Entrypoint"] = entrypoint
    config["config"]["Cmd"] = []
    config["config"].setdefault("Labels", {})["sluice.dev/derived-from"] = base
    config_bytes = json.dumps(config).encode()
    new_manifest = {**manifest, "config": _descriptor("application/vnd.oci.image.config.v1+json", config_bytes),
                    "layers": [*manifest["layers"],
                               _descriptor("application/vnd.oci.image.layer.v1.tar", layer)]}
    new_manifest["mediaType"] = "application/vnd.oci.image.manifest.v1+json"
    manifest_bytes = json.dumps(new_manifest).encode()
    index = {"schemaVersion": 2, "manifests": [{
        **_descriptor("application/vnd.oci.image.manifest.v1+json", manifest_bytes),
        "annotations": {"io.containerd.image.name": name, "org.opencontainers.image.ref.name": name}}]}
    archive = _tar({"oci-layout": json.dumps({"imageLayoutVersion": "1.0.0"}).encode(),
                    "index.json": json.dumps(index).encode(),
                    **{f"blobs/sha256/{hashlib.sha256(blob).hexdigest()}": blob
                       for blob in (layer, config_bytes, manifest_bytes)}})
    node.ctr("images", "import", "-", input=archive, timeout=300, text=False)
    return name


def _manifest(node: RealNode, name: str) -> dict:
    """The image's manifest in the node's content store (`load` gives each image one, for this machine)."""
    rows = node.ctr("images", "ls", f"name=={name}").stdout.splitlines()[1:]
    if not rows:
        raise LookupError(f"{name} is not on the node")
    return json.loads(node.ctr("content", "get", rows[0].split()[2]).stdout)


def _descriptor(media_type: str, blob: bytes) -> dict:
    return {"mediaType": media_type, "digest": f"sha256:{hashlib.sha256(blob).hexdigest()}", "size": len(blob)}


def _tar(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for path, content in files.items():
            info = tarfile.TarInfo(path)
            info.size, info.mode, info.mtime = len(content), 0o755, 0
            archive.addfile(info, io.BytesIO(content))
    return buffer.getvalue()
