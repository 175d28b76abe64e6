"""The values table of charts/sluice/README.md, generated from the `# --` comments in values.yaml.

`python tests/chart/values_table.py --write` rewrites the table; the chart tests fail when it is stale.
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import yaml

CHART = Path(__file__).resolve().parents[2] / "charts" / "sluice"
START, END = "<!-- values-table:start -->", "<!-- values-table:end -->"
_KEY = re.compile(r"^(\s*)([A-Za-z0-9_.-]+):")


def documented_values(values_text: str) -> list[tuple[str, object, str]]:
    """(dotted path, default, description) of every key preceded by a `# --` comment, in file order."""
    values = yaml.safe_load(values_text)
    rows, stack, pending = [], [], None
    for line in values_text.splitlines():
        stripped = line.strip()
        if stripped.startswith("# --"):
            pending = stripped[4:].strip()
            continue
        match = _KEY.match(line)
        if not match or stripped.startswith("#"):
            continue
        indent, key = len(match.group(1)), match.group(2)
        while stack and stack[-1][0] >= indent:
            stack.pop()
        stack.append((indent, key))
        if pending is not None:
            path = [k for _, k in stack]
            default = values
            for part in path:
                default = default[part]
            rows.append((".".join(path), default, pending))
            pending = None
    return rows


def render_table(values_text: str) -> str:
    lines = ["| Key | Default | Description |", "|-----|---------|-------------|"]
    for path, default, description in documented_values(values_text):
        shown = json.dumps(default, separators=(", ", ": ")).replace("|", "\\|")
        lines.append(f"| `{path}` | `{shown}` | {description.replace('|', chr(92) + '|')} |")
    return "\n".join(lines)


def readme_with_table(readme: str, values_text: str) -> str:
    head, rest = readme.split(START, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{START}\n{render_table(values_text)}\n{END}{tail}"


def main(argv: list[str]) -> int:
    readme = CHART / "README.md"
    updated = readme_with_table(readme.read_text(), (CHART / "values.yaml").read_text())
    if "--write" in argv:
        readme.write_text(updated)
        return 0
    if updated != readme.read_text():
        print(f"{readme} is out of date: python tests/chart/values_table.py --write", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
