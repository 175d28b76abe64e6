"""The chart's batch store (gateway.batchStore): where the gateway's batches, files and leases live, what it mounts
for them, and the combinations the chart refuses because some replica would answer 404 for another's batches."""
from __future__ import annotations

import json

import pytest
import yaml
from chart.helm_tool import CHART, by_kind, gateway_config, one, pod_spec

pytestmark = pytest.mark.integration

STORE_DIR = "/var/lib/sluice/batch"
# Several replicas sharing batches: what the chart asks of them.
SHARED = ["--set", "gateway.replicaCount=3", "--set", "gateway.batchStore.databaseSecret.name=pg-app",
          "--set", "gateway.batchStore.databaseSecret.key=uri", "--set", "gateway.batchStore.volume.create=true",
          "--set", "gateway.batchStore.volume.size=20Gi", "--set", "gateway.batchStore.volume.storageClass=nfs",
          "--set-json", 'gateway.batchStore.volume.accessModes=["ReadWriteMany"]']


def _volume(spec: dict, name: str) -> dict:
    return next(v for v in spec["volumes"] if v["name"] == name)


def _mount(spec: dict, name: str) -> dict:
    return next(m for m in spec["containers"][0]["volumeMounts"] if m["name"] == name)


def test_by_default_one_replica_keeps_its_batches_in_sqlite_on_its_own_volume(helm, tmp_path):
    objects = helm.template()
    deployment = one(objects, "Deployment", "-gateway")
    spec = pod_spec(deployment)
    assert _volume(spec, "batch-store") == {"name": "batch-store", "emptyDir": {}}
    assert _mount(spec, "batch-store")["mountPath"] == STORE_DIR
    assert not [v for v in spec["volumes"] if v["name"] == "batch-database"]
    assert not by_kind(objects, "PersistentVolumeClaim")
    assert deployment["spec"]["strategy"]["rollingUpdate"] == {"maxUnavailable": 0, "maxSurge": 1}
    batch = gateway_config(objects, tmp_path).batch
    assert (batch.database, str(batch.files_dir), batch.database_file) == (
        f"{STORE_DIR}/batch.db", f"{STORE_DIR}/files", None)
    egress = one(objects, "NetworkPolicy", "-gateway")["spec"]["egress"]
    assert not [rule for rule in egress if {"port": 5432, "protocol": "TCP"} in rule.get("ports", [])]


def test_several_replicas_share_postgres_from_a_secret_and_one_claim(helm, tmp_path):
    shared_text = helm.template_text(*SHARED)
    objects = [doc for doc in yaml.safe_load_all(shared_text) if doc]
    deployment = one(objects, "Deployment", "-gateway")
    spec = pod_spec(deployment)
    assert deployment["spec"]["replicas"] == 3
    assert deployment["spec"]["strategy"]["rollingUpdate"] == {"maxUnavailable": 0, "maxSurge": 1}
    # The URL's Secret: read-only, a whole volume (rotations reach the file), its key at a fixed file name.
    secret = _volume(spec, "batch-database")["secret"]
    assert (secret["secretName"], secret["items"]) == ("pg-app", [{"key": "uri", "path": "url"}])
    mount = _mount(spec, "batch-database")
    assert mount["readOnly"] is True and "subPath" not in mount
    claim = one(objects, "PersistentVolumeClaim", "-batch")
    assert _volume(spec, "batch-store")["persistentVolumeClaim"] == {"claimName": claim["metadata"]["name"]}
    assert claim["spec"] == {"accessModes": ["ReadWriteMany"], "storageClassName": "nfs",
                             "resources": {"requests": {"storage": "20Gi"}}}
    assert claim["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep", \
        "the files must outlive `helm uninstall` as the database they belong to does"
    config = gateway_config(objects, tmp_path)
    # The file gateway.yaml names is the one the kubelet writes the Secret's key to; the files are on the claim.
    assert str(config.batch.database_file) == f"{mount['mountPath']}/{secret['items'][0]['path']}"
    assert config.batch.files_dir.parent.as_posix() == _mount(spec, "batch-store")["mountPath"]
    assert "database" not in config.batch.model_fields_set
    # The chart only ever holds the Secret's name: no URL, password or scheme in anything it renders.
    assert "postgresql" not in shared_text and "postgres://" not in shared_text
    egress = one(objects, "NetworkPolicy", "-gateway")["spec"]["egress"]
    assert {"ports": [{"port": 5432, "protocol": "TCP"}]} in egress
    moved = helm.template(*SHARED, "--set", "gateway.batchStore.databasePort=6432")
    assert {"ports": [{"port": 6432, "protocol": "TCP"}]} in one(moved, "NetworkPolicy", "-gateway")["spec"]["egress"]


@pytest.mark.parametrize(("modes", "strategy"), [('["ReadWriteOnce"]', "Recreate"), ('["ReadWriteMany"]', None)])
def test_one_replica_on_an_existing_claim_keeps_sqlite_there(helm, tmp_path, modes, strategy):
    """A claim only one node may attach: the next pod can start only once the old one has let go of it."""
    objects = helm.template("--set", "gateway.batchStore.volume.existingClaim=batches",
                            "--set-json", f"gateway.batchStore.volume.accessModes={modes}")
    deployment = one(objects, "Deployment", "-gateway")
    assert _volume(pod_spec(deployment), "batch-store")["persistentVolumeClaim"] == {"claimName": "batches"}
    assert not by_kind(objects, "PersistentVolumeClaim"), "an existing claim is the user's"
    assert deployment["spec"]["strategy"].get("type") == strategy
    assert gateway_config(objects, tmp_path).batch.database == f"{STORE_DIR}/batch.db"


def test_every_batch_setting_of_the_gateway_passes_the_schema_with_the_gateways_bounds(helm, tmp_path):
    from sluice_gateway.config import Batch, Limits

    schema = json.loads((CHART / "values.schema.json").read_text())["properties"]["gateway"]["properties"]
    chart = schema["config"]["properties"]["batch"]["properties"]
    gateway = Batch.model_json_schema()["properties"]
    store = {"database", "database_file", "files_dir"}  # gateway.batchStore's, never set directly
    assert set(chart) == set(gateway) - store
    bounds = ("type", "minimum", "maximum", "exclusiveMinimum")
    for name, field in gateway.items():
        if name in chart and "type" in field:
            assert {k: chart[name].get(k) for k in bounds} == {k: field.get(k) for k in bounds}, name
    tenant_limits = schema["config"]["properties"]["tenants"]["items"]["properties"]["limits"]["properties"]
    assert set(Limits.model_fields) == set(tenant_limits)  # every tenant limit the gateway knows, no other
    settings = {"max_file_bytes": 1024, "max_file_lines": 10, "concurrency": 2, "lease_s": 5, "max_attempts": 3,
                "retry_backoff_s": 0.5, "priority_class": "standard"}
    batch = gateway_config(helm.template("--set-json", f"gateway.config.batch={json.dumps(settings)}"), tmp_path).batch
    assert {name: getattr(batch, name) for name in settings} == settings


@pytest.mark.parametrize(("args", "message"), [
    (["--set", "gateway.replicaCount=2"], "needs gateway.batchStore.databaseSecret (PostgreSQL)"),
    (["--set", "gateway.autoscaling.enabled=true", "--set", "gateway.batchStore.databaseSecret.name=pg"],
     "needs the batch files on one ReadWriteMany claim"),
    ([*SHARED, "--set-json", 'gateway.batchStore.volume.accessModes=["ReadWriteOnce"]'],
     "needs the batch files on one ReadWriteMany claim"),
    (["--set", "gateway.batchStore.volume.existingClaim=mine", "--set", "gateway.batchStore.volume.create=true"],
     "name an existingClaim or set create, not both"),
    (["--set", "gateway.batchStore.databaseSecret.name=pg", "--set", "gateway.batchStore.databaseSecret.key="],
     "/gateway/batchStore/databaseSecret/key"),
    (["--set", "gateway.batchStore.databaseSecret.name=pg", "--set", "gateway.batchStore.databaseSecret.key=null"],
     "missing property 'key'"),
    (["--set", "gateway.config.batch.database=postgresql://u:p@db/batches"],
     "additional properties 'database' not allowed"),
    (["--set", "gateway.config.batch.files_dir=/tmp/files"], "additional properties 'files_dir' not allowed"),
    (["--set", "gateway.config.batch.retry_backoff_s=601"], "/gateway/config/batch/retry_backoff_s"),
    (["--set", "gateway.config.batch.lease_s=0.5"], "/gateway/config/batch/lease_s"),
    (["--set-json", 'gateway.batchStore.volume.accessModes=["ReadOnlyMany"]'], "/gateway/batchStore/volume/accessModes"),
    (["--set", "gateway.batchStore.volume.size=lots"], "/gateway/batchStore/volume/size"),
    (["--set", "gateway.batchStore.databasePort=0"], "/gateway/batchStore/databasePort"),
], ids=["replicas-on-sqlite", "autoscaled-on-emptydir", "replicas-on-one-node-claim", "two-claims", "empty-key",
        "no-key", "url-in-values", "files-dir", "backoff-bound", "lease-bound", "read-only-claim", "size", "port"])
def test_a_store_that_cannot_work_is_refused_at_install_time(helm, args, message):
    result = helm.run("template", "sluice", str(CHART), *args, check=False)
    assert result.returncode != 0 and message in result.stderr, result.stderr
