"""How deeply a request body may nest arrays and objects, for the gateway and the runtime alike.

Parsers, validators and templates recurse once per level, so a body nested thousands deep would exhaust the
stack. Both components refuse a body past this depth with 400, so a body the gateway admits is never one the
runtime refuses for its nesting (nothing in the OpenAI API nests anywhere near this deep).
"""
from __future__ import annotations

# Levels of arrays and objects, the top-level object counting as the first.
MAX_JSON_DEPTH = 64
