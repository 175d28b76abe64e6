"""What a batch line may cost, read as an online request's reservation is read (cost.py, through the request-cost
contract), so that the tenant's quota of enqueued batch tokens counts a line as the token limits would count it
online: its prompts at their upper bound and its max_tokens per choice, or to the end of the context when it
sets none (the gateway's default_max_tokens for a route whose context is not known)."""
from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from sluice_contracts.model_tasks import Task
from sluice_contracts.routing_table import RoutingTable

from ..cost import check_context, reserve
from ..errors import GatewayError
from ..request import parse_request
from ..routing_table import max_model_len, permitted_routes


def line_tokens(body: dict[str, Any], kind: Task, path: str, table: RoutingTable, may_use: Callable[[str], bool],
                default_max_tokens: int) -> int:
    try:
        parsed = parse_request(json.dumps(body).encode(), kind=kind, prefix_chars=1)
    except GatewayError:
        return 0  # refused the same way when it runs, before generating anything
    try:
        context = max_model_len(permitted_routes(table, parsed.model, may_use, kind, path))
    except GatewayError:
        context = None  # not served now: counted as on a route whose context is not known
    try:
        check_context(parsed, context)
    except GatewayError:
        return 0  # can never fit: refused when it runs, before generating anything
    return reserve(parsed, context, default_max_tokens).tokens
