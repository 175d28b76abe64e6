"""End-to-end scenarios run in order, each on what the previous ones left; a timing table closes the run.

A scenario that fails skips the ones after it (their premise is gone), except those marked
`e2e_always` (cleanup); each scenario's figures (`record_property`) go into the table.
"""
from __future__ import annotations

import pytest

_rows: list[tuple[str, str, float, list[tuple[str, object]]]] = []
_failed: dict[str, str] = {}


def pytest_configure(config):
    config.addinivalue_line("markers", "e2e_always: an e2e scenario that runs even after an earlier one failed")


def pytest_runtest_setup(item):
    module = item.module.__name__
    if module in _failed and item.get_closest_marker("e2e_always") is None:
        pytest.skip(f"an earlier scenario failed: {_failed[module]}")


def pytest_runtest_makereport(item, call):
    if call.when == "call" and call.excinfo is not None and not call.excinfo.errisinstance(pytest.skip.Exception):
        _failed.setdefault(item.module.__name__, item.name)


def pytest_runtest_logreport(report):
    if "tests/e2e/" not in report.nodeid.replace("\\", "/"):
        return
    name = report.nodeid.rsplit("::", 1)[-1]
    if report.when == "setup" and report.duration >= 1.0:
        _rows.append((f"(setup) {name}", report.outcome, report.duration, []))
    elif report.when == "call":
        _rows.append((name, report.outcome, report.duration, list(report.user_properties)))
    elif report.when == "teardown" and report.duration >= 1.0:
        _rows.append((f"(teardown) {name}", report.outcome, report.duration, []))


def pytest_terminal_summary(terminalreporter):
    if not _rows:
        return
    write = terminalreporter.write_line
    terminalreporter.section("e2e timing summary")
    width = max(len(name) for name, *_ in _rows)
    write(f"{'scenario':<{width}}  {'result':<7}  {'seconds':>7}  figures")
    for name, outcome, seconds, figures in _rows:
        shown = ", ".join(f"{key}={value}" for key, value in figures)
        write(f"{name:<{width}}  {outcome:<7}  {seconds:7.1f}  {shown}")
    write(f"{'total':<{width}}  {'':<7}  {sum(row[2] for row in _rows):7.1f}")
