"""gateway.yaml `priority` and tenants' `priority`/`share`: defaults that work and refusals that say what to fix."""
import hashlib

import pytest

from sluice_contracts import request_priority
from sluice_gateway.auth import KeyStore
from sluice_gateway.config import ConfigError, load_config

DIGEST = hashlib.sha256(b"sk-one").hexdigest()
TENANT = f"{{name: a, keys: [{{id: k, sha256: {DIGEST}}}]"


def _load(tmp_path, text: str):
    path = tmp_path / "gateway.yaml"
    path.write_text(text)
    return load_config(path)


def test_tenants_get_the_default_class_and_an_equal_share(tmp_path):
    config = _load(tmp_path, f"tenants: [{TENANT}}}]")
    rank = KeyStore(config).authenticate("Bearer sk-one").rank
    assert (rank.priority_class, rank.number, rank.share, rank.urgency) == ("standard", 0, 1.0, 0)
    assert config.priority.classes == request_priority.DEFAULT_CLASSES


@pytest.mark.parametrize("priority, urgency", [("critical", -1), ("batch", 1), ("standard", 0)])
def test_a_tenants_class_sets_its_number_and_urgency(tmp_path, priority, urgency):
    config = _load(tmp_path, f"tenants: [{TENANT}, priority: {priority}, share: 2.5}}]")
    rank = KeyStore(config).authenticate("Bearer sk-one").rank
    assert (rank.number, rank.share, rank.urgency) == (request_priority.DEFAULT_CLASSES[priority], 2.5, urgency)


def test_own_classes_and_default_class(tmp_path):
    config = _load(tmp_path, "priority: {classes: {gold: -5, bronze: 7}, default_class: bronze}\n"
                             f"tenants: [{TENANT}}}]")
    rank = KeyStore(config).authenticate("Bearer sk-one").rank
    assert (rank.priority_class, rank.number, rank.urgency) == ("bronze", 7, 0)


@pytest.mark.parametrize("text, fragment", [
    (f"tenants: [{TENANT}, priority: urgent}}]", "priority 'urgent' is not one of the classes"),
    (f"tenants: [{TENANT}, priority: 5}}]", "tenants.0.priority"),
    (f"tenants: [{TENANT}, priority: null, share: -1}}]", "tenants.0.share"),
    (f"tenants: [{TENANT}, share: 0}}]", "tenants.0.share"),
    (f"tenants: [{TENANT}, share: '2'}}]", "tenants.0.share"),
    (f"tenants: [{TENANT}, share: true}}]", "tenants.0.share"),
    (f"tenants: [{TENANT}, share: .nan}}]", "tenants.0.share"),
    (f"tenants: [{TENANT}, share: 1e9}}]", "tenants.0.share"),
    (f"tenants: [{TENANT}, priority_class: batch}}]", "tenants.0.priority_class"),
    (f"tenants: [{TENANT}, priority: batch, priority: critical}}]", "'priority' appears twice"),
    ("priority: {classes: {critical: true}, default_class: critical}", "priority.classes.critical"),
    ("priority: {classes: {critical: '1'}, default_class: critical}", "priority.classes.critical"),
    ("priority: {classes: {critical: 1.5}, default_class: critical}", "priority.classes.critical"),
    ("priority: {classes: {critical: 5000}, default_class: critical}", "priority.classes.critical"),
    ("priority: {classes: {Gold Tier: 1}, default_class: Gold Tier}", "class names are"),
    ("priority: {classes: {}}", "priority.classes"),
    ("priority: {classes: {gold: 1}}", "default_class 'standard' is not one of the classes"),
    ("priority: {hold_s: -1}", "priority.hold_s"),
    ("priority: {hold_s: .inf}", "priority.hold_s"),
    ("priority: {max_held: -1}", "priority.max_held"),
    ("priority: {hold: 1}", "priority.hold"),
])
def test_invalid_priority_settings_name_the_problem(tmp_path, text, fragment):
    with pytest.raises(ConfigError) as err:
        _load(tmp_path, text)
    assert fragment in str(err.value)
