"""What a prompt capture keeps of the text it is given: every match of a redaction pattern replaced by
`[redacted]`, and at most a budget of characters, the rest cut and said to be.

Text is redacted before it is cut, over a margin past the cut, so a secret that straddles the cut is not left
half visible; only its part past the margin (of a secret longer than `MARGIN`) could escape the patterns.
"""
from __future__ import annotations

import re
from typing import Any

MARKER = "[redacted]"
# Built in, as the README names them. Each starts where a match can only start (a lookbehind, a literal), so a
# long run of letters or digits that is no secret costs one pass, not one per character. A digit run may be
# grouped by spaces or dashes, as card numbers are written; shorter runs are dates, amounts and token ids, which a
# capture is meant to keep.
BUILT_IN = (
    r"(?<![A-Za-z0-9._%+-])[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}",  # e-mail addresses
    r"(?i)\bbearer\s+[A-Za-z0-9._~+/=-]+",  # an Authorization header's credential
    r"\b(?:sk|pk|rk)-[A-Za-z0-9_-]{8,}",  # OpenAI-style and other vendors' API keys
    r"\b(?:gh[pousr]_[A-Za-z0-9]{20,}|AKIA[0-9A-Z]{16}|xox[abprs]-[A-Za-z0-9-]{10,})",  # GitHub, AWS, Slack
    r"(?<!\d)\d(?:[ -]?\d){11,}",  # card and account numbers
)
# Longer than any secret the built-in patterns are written for.
MARGIN = 256


class Budget:
    """Characters left to keep of one text (a prompt, an answer), and whether any was cut."""

    def __init__(self, chars: int) -> None:
        self.left = chars
        self.truncated = False

    def take(self, text: str, redactor: Redactor) -> str:
        if self.left <= 0:
            self.truncated = self.truncated or bool(text)
            return ""
        kept = redactor.redact(text[:self.left + MARGIN])
        if len(kept) > self.left or len(text) > self.left + MARGIN:
            kept = kept[:self.left]
            self.truncated = True
        self.left -= len(kept)
        return kept


class Redactor:
    def __init__(self, configured: tuple[str, ...]) -> None:
        # Each compiled on its own: a configured pattern may carry its own inline flags.
        self._patterns = tuple(re.compile(pattern) for pattern in (*BUILT_IN, *configured))

    def redact(self, text: str) -> str:
        for pattern in self._patterns:
            text = pattern.sub(MARKER, text)
        return text

    def value(self, value: Any, budget: Budget) -> Any:
        """A JSON value as parsed (a string, number, boolean, null, list or object), its strings (keys too)
        redacted and all of them together within `budget`; the elements and members past it are left out.
        Numbers count as their digits, so that a card number sent as one is redacted too."""
        if isinstance(value, str):
            return budget.take(value, self)
        if isinstance(value, bool) or value is None:
            return value
        if isinstance(value, (int, float)):
            text = budget.take(str(value), self)
            return value if text == str(value) else text
        if isinstance(value, list):
            kept = []
            for item in value:
                if budget.left <= 0:
                    budget.truncated = True
                    break
                kept.append(self.value(item, budget))
            return kept
        members = {}
        for key, item in value.items():
            if budget.left <= 0:
                budget.truncated = True
                break
            name = budget.take(key, self)
            members[name] = self.value(item, budget)
        return members
