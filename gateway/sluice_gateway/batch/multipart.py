"""A `multipart/form-data` upload (what `client.files.create` sends), read with the standard library's MIME
parser."""
from __future__ import annotations

from email import policy
from email.parser import BytesParser

from ..errors import GatewayError


def form_fields(content_type: bytes, body: bytes) -> dict[str, tuple[str | None, bytes]]:
    """Each field's name -> (its filename, if a file; its bytes); 400 for a body that is not a form."""
    if not content_type.lower().startswith(b"multipart/form-data"):
        raise GatewayError(400, "upload the file as multipart/form-data with the fields 'file' and 'purpose'",
                           code="invalid_request")
    message = BytesParser(policy=policy.HTTP).parsebytes(b"Content-Type: " + content_type + b"\r\n\r\n" + body)
    if not message.is_multipart():
        raise GatewayError(400, "the multipart/form-data body could not be read", code="invalid_request")
    fields: dict[str, tuple[str | None, bytes]] = {}
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        if isinstance(name, str):
            payload = part.get_payload(decode=True)
            fields[name] = (part.get_filename(), payload if isinstance(payload, bytes) else b"")
    return fields
