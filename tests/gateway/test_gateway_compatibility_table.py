"""The README's compatibility table lists exactly the endpoints the gateway and the runtime serve."""
import re
from pathlib import Path

from sluice_gateway.app import API_ROUTES
from sluice_runtime.server.app import _generation_routes, _model_routes

README = Path(__file__).resolve().parents[2] / "gateway" / "README.md"
_ROW = re.compile(r"^\| `(GET|POST|DELETE) ([^`]+)` \| (yes|no) \| (yes|no) \|")


def table() -> dict[tuple[str, str], tuple[bool, bool]]:
    text = README.read_text()
    section = text[text.index("## Compatibility"):]
    section = section[: section.find("\n## ", 1) if "\n## " in section[1:] else len(section)]
    rows = {}
    for line in section.splitlines():
        if match := _ROW.match(line):
            method, path, gateway, runtime = match.groups()
            rows[(method, path)] = (gateway == "yes", runtime == "yes")
    return rows


def _plain(path: str) -> str:
    # The runtime's path parameters carry a converter (`{model:path}`); the table names the parameter only.
    return re.sub(r"\{(\w+):\w+\}", r"{\1}", path)


def test_the_table_is_the_route_tables():
    # The route builders only define their handlers: nothing of a runtime runs to list them.
    runtime = {(r.method, _plain(r.path)) for r in (*_generation_routes(None), *_model_routes(None))}
    gateway = set(API_ROUTES)
    rows = table()
    assert set(rows) == gateway | runtime
    for endpoint, (at_gateway, at_runtime) in rows.items():
        assert (at_gateway, at_runtime) == (endpoint in gateway, endpoint in runtime), endpoint
