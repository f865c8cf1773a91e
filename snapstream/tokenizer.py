"""The model's tokenizer (a ``tokenizers.Tokenizer``, from tokenizer.json or built from GGUF
metadata), its special ids and chat template, and a UTF-8-safe incremental detokenizer."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import tokenizers

from snapstream.chat import ChatMessage, ChatTemplate

# Texts of control tokens that end a turn or a document (llama.cpp treats the same ones as
# end-of-generation): a chat model's template closes every turn with one of them.
END_OF_TURN_TEXTS = frozenset({
    "<|endoftext|>", "<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|end|>", "<end_of_turn>",
    "<|end_of_text|>", "</s>", "<EOT>", "<｜end▁of▁sentence｜>",
})

TURN_ROLES = frozenset({"system", "developer", "user", "assistant", "model", "tool"})
ROLE_LINE_TOKENS = 8  # a role name and its newline take at most this many tokens


@dataclass(frozen=True)
class Tokenizer:
    """``encode`` parses special-token texts (a rendered chat prompt contains them) and adds BOS
    when the model asks for it; ``decode`` drops special tokens."""

    inner: tokenizers.Tokenizer
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]
    chat_template: ChatTemplate | None = None

    @property
    def vocab_size(self) -> int:
        return self.inner.get_vocab_size()

    def encode(self, text: str) -> list[int]:
        return self.inner.encode(text, add_special_tokens=True).ids

    def encode_prefixed(self, prefix: str, rest: str) -> tuple[list[int], int]:
        """``prefix + rest`` as ids whose first ``n`` (returned) are ``prefix``'s alone: the two
        are tokenized apart, so a reusable prefix has the same ids whatever follows it."""
        head = self.encode(prefix)
        return head + self.inner.encode(rest, add_special_tokens=False).ids, len(head)

    def encode_with_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        """:meth:`encode` with each token's [start, end) character span in ``text`` (tokens the
        text does not spell, like BOS, get an empty span; bytes of one character share its
        span)."""
        encoding = self.inner.encode(text, add_special_tokens=True)
        return encoding.ids, encoding.offsets

    def decode(self, ids: Sequence[int]) -> str:
        return self.inner.decode(list(ids), skip_special_tokens=True)

    def turn_opening(self, ids: Sequence[int], limit: int) -> list[int]:
        """The opening paragraph (at most ``limit`` tokens, up to its first blank line) of the
        last turn's content in ``ids``: after the last special token followed by a role line
        (``<|im_start|>user\n``, ``<start_of_turn>user\n``); from the start, BOS skipped,
        when ``ids`` open no turn (a raw prompt). Where a question or an instruction precedes
        a document in one message, this is it."""
        special = self._special_ids()
        start = self._turn_start(ids, special)
        end = start
        while (end < min(start + limit, len(ids)) and ids[end] not in special
               and "\n\n" not in self.decode(ids[start : end + 1])):
            end += 1
        return list(ids[start:end])

    def turn_probe(self, ids: Sequence[int], limit: int) -> list[int]:
        """What a probe reads again after the prompt ``ids`` (``CachePolicy.observe="opening"``):
        the opening paragraphs of the last closed turn's content that fit whole in ``limit``
        tokens (an instruction, then the question, may open a message before its document; the
        first ``limit`` tokens when its first paragraph is longer), then the prompt's closing
        from that turn's end-of-turn token on (the template's opening of the answer), so that
        the closing's queries come after the question again. A prompt with no end-of-turn
        token (a raw one): its opening paragraphs alone, BOS skipped."""
        special = self._special_ids()
        end = next((at for at in range(len(ids) - 1, -1, -1) if ids[at] in self.eos_token_ids),
                   len(ids))
        start = self._turn_start(ids[:end], special)
        stop = start
        while stop < min(start + limit, end) and ids[stop] not in special:
            stop += 1
        if stop < end:  # cut inside a paragraph: back to the last blank line, if any
            stop = next((cut for cut in range(stop, start, -1)
                         if self.decode(ids[start:cut]).endswith("\n\n")), stop)
        return [*ids[start:stop], *ids[end:]]

    def _special_ids(self) -> set[int]:
        return {i for i, t in self.inner.get_added_tokens_decoder().items() if t.special}

    def _turn_start(self, ids: Sequence[int], special: set[int]) -> int:
        """Where the last turn's content begins in ``ids``: past its role line; the first
        ordinary token when no turn is opened."""
        start = next((at for at, token in enumerate(ids) if token not in special), len(ids))
        for at in (at for at in range(len(ids) - 1, -1, -1) if ids[at] in special):
            line = self.decode(ids[at + 1 : at + 1 + ROLE_LINE_TOKENS])
            if "\n" in line and line.split("\n")[0] in TURN_ROLES:
                start = at + 1
                while "\n" not in self.decode(ids[at + 1 : start]):  # past the role line
                    start += 1
                break
        return start

    def render_chat(self, messages: Sequence[ChatMessage]) -> str:
        """The prompt for ``messages`` with the assistant's turn opened."""
        if self.chat_template is None:
            raise ValueError("messages: this model has no chat template; send a prompt instead")
        return self.chat_template.render(messages, add_generation_prompt=True)

    def render_chat_split(self, messages: Sequence[ChatMessage], count: int) -> tuple[str, str]:
        """:meth:`render_chat` split after its first ``count`` messages (their turns closed)."""
        whole = self.render_chat(messages)
        head = self.chat_template.render(messages[:count], add_generation_prompt=False)
        if not whole.startswith(head):
            raise ValueError(f"cache_prefix: the model's chat template does not render the first "
                             f"{count} message(s) as the start of the conversation")
        return head, whole[len(head):]


def end_of_turn_ids(inner: tokenizers.Tokenizer, declared: Sequence[int]) -> tuple[int, ...]:
    """The declared EOS ids, then every special token whose text ends a turn, in id order."""
    special = [(i, t.content) for i, t in inner.get_added_tokens_decoder().items() if t.special]
    named = [i for i, text in sorted(special) if text in END_OF_TURN_TEXTS]
    return tuple(dict.fromkeys((*declared, *named)))


class IncrementalDetokenizer:
    """Turns a growing list of ids into text deltas that never split a UTF-8 character."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.prefix_offset = 0  # start of the ids decoded for context
        self.read_offset = 0  # ids up to here have been emitted

    def feed(self, new_ids: Sequence[int]) -> str:
        self.ids.extend(new_ids)
        return self._delta(final=False)

    def flush(self) -> str:
        return self._delta(final=True)

    def _delta(self, final: bool) -> str:
        decode = self.tokenizer.decode
        emitted = decode(self.ids[self.prefix_offset : self.read_offset])
        text = decode(self.ids[self.prefix_offset :])
        if len(text) <= len(emitted) or (text.endswith("\ufffd") and not final):
            return ""
        self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
        return text[len(emitted) :]
