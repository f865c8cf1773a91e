"""The tiny test tokenizer, raw and with SmolLM2's ChatML template, as the data layer sees it."""

from evaldata import PromptSpec
from snapstream.chat import ChatTemplate
from snapstream.tokenizer import Tokenizer
from tests.tiny_models import CHATML, ENDOFTEXT_ID, EOS_ID, tiny_tokenizer


def tiny_chat_tokenizer() -> Tokenizer:
    return Tokenizer(inner=tiny_tokenizer(), bos_token_id=None,
                     eos_token_ids=(EOS_ID, ENDOFTEXT_ID), chat_template=ChatTemplate(CHATML))


def spec(prompt_format: str = "raw") -> PromptSpec:
    return PromptSpec(tiny_chat_tokenizer(), prompt_format)
