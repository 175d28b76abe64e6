"""Engine token logprobs in the two OpenAI shapes: chat (`content` entries) and legacy completions."""
from __future__ import annotations

from functools import lru_cache

from sluice_runtime.engine.outputs import TokenLogprob

# JSON has no -Infinity; OpenAI reports impossible tokens with a large negative number too.
_FLOOR = -9999.0


class LogprobFormatter:
    def __init__(self, tokenizer):
        self._text = lru_cache(maxsize=1 << 16)(lambda token_id: tokenizer.decode([token_id]))

    def chat(self, entries: list[TokenLogprob], top: int) -> list[dict]:
        return [{**self._entry(e.token_id, e.logprob),
                 "top_logprobs": [self._entry(t, lp) for t, lp in e.top[:top]]} for e in entries]

    def completion(self, entries: list[TokenLogprob], top: int, offset: int) -> dict:
        """`offset` is the text position of the first token, for text_offset."""
        tokens, values, tops, offsets = [], [], [], []
        for e in entries:
            text = self._text(e.token_id)
            tokens.append(text)
            values.append(max(e.logprob, _FLOOR))
            tops.append({self._text(t): max(lp, _FLOOR) for t, lp in e.top[:top]} if top else None)
            offsets.append(offset)
            offset += len(text)
        return {"tokens": tokens, "token_logprobs": values, "top_logprobs": tops, "text_offset": offsets}

    def _entry(self, token_id: int, logprob: float) -> dict:
        text = self._text(token_id)
        return {"token": text, "logprob": max(logprob, _FLOOR), "bytes": list(text.encode())}
