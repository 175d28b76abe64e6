"""The gateway's word on a request's priority and tenant (sluice_contracts.request_priority), read from its headers.

The headers win over the body's `priority` field: the gateway always sets them from the tenant's class, and only the
gateway reaches a runtime that requires the runtime credential. A direct caller sends neither and is one tenant ("").
"""
from __future__ import annotations

from starlette.datastructures import Headers

from sluice_contracts import request_priority as contract

from .errors import invalid_request
from .normalize import GenerationRequest
from .request_budget import apply_budget


def apply_priority_headers(greq: GenerationRequest, headers: Headers) -> None:
    """Sets the request's priority, tenant and share from the headers present (400 for a malformed one), then its
    budget (request_budget), which a priority class may give but which never changes the priority."""
    try:
        if (value := headers.get(contract.PRIORITY_HEADER)) is not None:
            greq.priority = contract.parse_priority(value)
        if (value := headers.get(contract.TENANT_HEADER)) is not None:
            greq.tenant = contract.parse_tenant(value)
        if (value := headers.get(contract.SHARE_HEADER)) is not None:
            greq.share = contract.parse_share(value)
    except contract.InvalidPriorityHeader as exc:
        raise invalid_request(str(exc), code="invalid_priority_header") from None
    apply_budget(headers, greq.priority)
