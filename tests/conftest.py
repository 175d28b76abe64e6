"""Shared fixtures live in tests/fixtures/, one module per thing they bring up; register new ones here."""
import os

# Tests run several torch processes (pytest itself, runtime servers) on two cores. OpenMP threads
# that spin while waiting steal the core from the other processes; sleeping ones do not. Measured
# under load: a 32-sequence decode step took 2.6x longer with the default spin policy. Set before
# torch is imported; runtime subprocesses inherit it.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# fixtures.model first: other fixture modules import its builders, and pytest rewrites asserts only in a
# module it imports itself.
pytest_plugins = [
    "fixtures.model",
    "fixtures.lora",
    "fixtures.cluster",
    "fixtures.real_node",
    "fixtures.gateway",
    "fixtures.redis",
    "fixtures.runtime_server",
    "fixtures.sluice_stack",
]
