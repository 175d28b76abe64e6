"""The runtime's adapter API, vLLM's shapes (which Sluice's runtime serves too): `GET /v1/models` lists each adapter
with its `parent` and `root` (where it was loaded from), `POST /v1/load_lora_adapter {"lora_name","lora_path"}`
and `POST /v1/unload_lora_adapter {"lora_name"}`, all behind the runtime credential."""
from __future__ import annotations

import asyncio
import json

import aiohttp

from sluice_contracts import runtime_credential

TIMEOUT_SECONDS = 30.0  # a load reads the adapter's weights from disk
_MAX_BODY = 1 << 20


class RuntimeApiError(Exception):
    """The runtime refused, or could not be reached; the message says why, for the model's status."""


def _headers(credential: str | None) -> dict[str, str]:
    return {runtime_credential.HEADER: runtime_credential.header_value(credential)} if credential else {}


def _message(body: bytes, status: int) -> str:
    """The error's message in OpenAI's format (`{"error": {"message"}}`) or vLLM's older one (`{"message"}`)."""
    try:
        data = json.loads(body)
        error = data.get("error") if isinstance(data.get("error"), dict) else data
        if isinstance(error.get("message"), str):
            return error["message"][:1000]
    except (ValueError, AttributeError):
        pass
    return f"the runtime answered HTTP {status}"


async def _call(session: aiohttp.ClientSession, method: str, url: str, credential: str | None,
                payload: dict | None = None) -> bytes:
    try:
        async with session.request(method, url, json=payload, headers=_headers(credential),
                                   timeout=aiohttp.ClientTimeout(total=TIMEOUT_SECONDS)) as response:
            body = await response.content.read(_MAX_BODY)
            if response.status != 200:
                raise RuntimeApiError(_message(body, response.status))
            return body
    except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
        raise RuntimeApiError(f"the runtime could not be reached: {type(exc).__name__}") from None


async def adapters_loaded(session: aiohttp.ClientSession, base_url: str, credential: str | None) -> dict[str, str | None]:
    """Adapter name → the path it was loaded from (None where the runtime does not say)."""
    body = await _call(session, "GET", f"{base_url}/v1/models", credential)
    try:
        cards = json.loads(body)["data"]
        return {card["id"]: card.get("root") if isinstance(card.get("root"), str) else None
                for card in cards if isinstance(card, dict) and card.get("parent") and isinstance(card.get("id"), str)}
    except (ValueError, KeyError, TypeError):
        raise RuntimeApiError("the runtime's /v1/models is not a model list") from None


async def load_adapter(session: aiohttp.ClientSession, base_url: str, credential: str | None, name: str,
                       path: str) -> None:
    await _call(session, "POST", f"{base_url}/v1/load_lora_adapter", credential,
                {"lora_name": name, "lora_path": path})


async def unload_adapter(session: aiohttp.ClientSession, base_url: str, credential: str | None, name: str) -> None:
    await _call(session, "POST", f"{base_url}/v1/unload_lora_adapter", credential, {"lora_name": name})
