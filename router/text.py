"""Token ids -> text deltas: UTF-8 safe, and stop strings cut without ever being sent."""

from __future__ import annotations

from snapstream.tokenizer import IncrementalDetokenizer, Tokenizer


class TextStream:
    def __init__(self, tokenizer: Tokenizer, stop: tuple[str, ...]) -> None:
        self.detok = IncrementalDetokenizer(tokenizer)
        self.stop = stop
        self.pending = ""  # text held back: it may be the start of a stop string
        self.stopped = False

    def push(self, token_ids: list[int]) -> str:
        """Text safe to send now; sets ``stopped`` when a stop string appeared."""
        return self._release(self.detok.feed(token_ids))

    def finish(self) -> str:
        return self._release(self.detok.flush(), final=True)

    def _release(self, delta: str, final: bool = False) -> str:
        if self.stopped:
            return ""
        text = self.pending + delta
        hits = [i for i in (text.find(s) for s in self.stop) if i >= 0]
        if hits:
            self.stopped, self.pending = True, ""
            return text[: min(hits)]
        hold = 0 if final else _longest_stop_prefix_suffix(text, self.stop)
        self.pending = text[len(text) - hold :] if hold else ""
        return text[: len(text) - hold]


def _longest_stop_prefix_suffix(text: str, stop: tuple[str, ...]) -> int:
    """Length of the longest end of ``text`` that begins some stop string."""
    best = 0
    for s in stop:
        for n in range(min(len(s) - 1, len(text)), best, -1):
            if s.startswith(text[-n:]):
                best = n
                break
    return best
