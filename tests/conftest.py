"""Shared fixtures live in tests/fixtures/, one module per thing they bring up; register new ones here."""
pytest_plugins = [
    "fixtures.cluster",
    "fixtures.gateway",
    "fixtures.model",
    "fixtures.redis",
    "fixtures.runtime_server",
]
