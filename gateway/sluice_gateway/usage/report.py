"""The answer of `GET /v1/usage`: the counts of every hour that overlaps the asked range, summed by the asked
dimensions. Without `kind` among them a row carries every kind as a column (and their `total_tokens`); with
it, a row per kind and its `value` (line items, as a billing import takes them)."""
from __future__ import annotations

import csv
import io
import json
from collections import defaultdict

from ..errors import GatewayError
from .counts import BUCKET_S, KINDS, Cell
from .query import UsageQuery
from .store import UsageStore, UsageUnavailable

Answer = tuple[int, bytes, bytes]


async def usage_answer(store: UsageStore, query: UsageQuery) -> Answer:
    first = query.start // BUCKET_S * BUCKET_S
    last = (query.end - 1) // BUCKET_S * BUCKET_S
    try:
        cells = await store.read(first, last)
    except UsageUnavailable as exc:
        raise GatewayError(503, f"{exc}; try again shortly", code="usage_unavailable",
                           headers=[(b"retry-after", b"1")]) from None
    rows = _rows(cells, query.group_by)
    if query.format == "csv":
        return 200, _csv(rows, query.group_by), b"text/csv; charset=utf-8"
    body = {"object": "list", "start": first, "end": last + BUCKET_S, "bucket_s": BUCKET_S,
            "group_by": list(query.group_by), "counted_by": "every replica" if store.shared else "this replica",
            "data": rows}
    return 200, json.dumps(body).encode(), b"application/json"


def _rows(cells: dict[Cell, int], group_by: tuple[str, ...]) -> list[dict]:
    dims = [name for name in group_by if name != "kind"]
    sums: dict[tuple[str, ...], dict[str, int]] = defaultdict(lambda: dict.fromkeys(KINDS, 0))
    for cell, count in cells.items():
        sums[tuple(getattr(cell, name) for name in dims)][cell.kind] += count
    rows = []
    for key in sorted(sums):
        named = dict(zip(dims, key))
        kinds = sums[key]
        if "kind" in group_by:
            rows += [{**named, "kind": kind, "value": kinds[kind]} for kind in KINDS]
        else:
            rows.append({**named, **kinds, "total_tokens": kinds["prompt_tokens"] + kinds["completion_tokens"]})
    return rows


def _csv(rows: list[dict], group_by: tuple[str, ...]) -> bytes:
    dims = [name for name in group_by if name != "kind"]
    columns = [*dims, "kind", "value"] if "kind" in group_by else [*dims, *KINDS, "total_tokens"]
    out = io.StringIO()
    writer = csv.DictWriter(out, columns, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue().encode()
