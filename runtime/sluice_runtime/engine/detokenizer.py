"""Incremental detokenization and stop strings, one sequence at a time.

Text is released only once it is final: never half of a multi-byte character (the tokenizer
yields U+FFFD until the rest arrives) and never the start of what may become a stop string.
"""
from __future__ import annotations

from .sequence import Sequence

# Prompt tokens decoded with the first output tokens, so tokenizers that drop a leading space
# at the start of a decode still place spaces right.
_CONTEXT_TOKENS = 5


class Detokenizer:
    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def start(self, seq: Sequence) -> None:
        seq.detok_prefix_offset = max(0, seq.num_prompt_tokens - _CONTEXT_TOKENS)
        seq.detok_read_offset = seq.num_prompt_tokens

    def append(self, seq: Sequence) -> str | None:
        """Decode the newest token into seq.text; returns the stop string that ended the text, if any."""
        skip = seq.group.params.skip_special_tokens
        ids = seq.token_ids
        prefix = self.tokenizer.decode(ids[seq.detok_prefix_offset:seq.detok_read_offset], skip_special_tokens=skip)
        full = self.tokenizer.decode(ids[seq.detok_prefix_offset:], skip_special_tokens=skip)
        if len(full) <= len(prefix) or full.endswith("\ufffd"):
            return None
        delta = full[len(prefix):]
        seq.detok_prefix_offset, seq.detok_read_offset = seq.detok_read_offset, len(ids)
        old_len = len(seq.text)
        seq.text += delta
        return self._find_stop(seq, old_len)

    @staticmethod
    def _find_stop(seq: Sequence, old_len: int) -> str | None:
        params = seq.group.params
        if not params.stop:
            return None
        longest = max(len(s) for s in params.stop)
        window_start = max(0, old_len - longest + 1)
        best: tuple[int, str] | None = None
        for stop in params.stop:
            idx = seq.text.find(stop, window_start)
            if idx != -1 and (best is None or idx < best[0]):
                best = (idx, stop)
        if best is None:
            return None
        idx, stop = best
        seq.text = seq.text[: idx + len(stop)] if params.include_stop_str_in_output else seq.text[:idx]
        return stop

    @staticmethod
    def releasable_len(seq: Sequence) -> int:
        """Length of seq.text that may be shown: all of it once finished, else minus a possible stop prefix."""
        stops = seq.group.params.stop
        if seq.finished or not stops:
            return len(seq.text)
        text = seq.text
        hold = 0
        for stop in stops:
            for k in range(min(len(stop) - 1, len(text)), hold, -1):
                if text.endswith(stop[:k]):
                    hold = k
                    break
        return len(text) - hold
