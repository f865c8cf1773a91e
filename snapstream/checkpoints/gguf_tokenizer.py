"""The tokenizer a GGUF file describes, rebuilt with ``tokenizers``: byte-level BPE (``gpt2``)
or SentencePiece BPE (``llama``, see :mod:`snapstream.checkpoints.gguf_spm`), chosen by
``tokenizer.ggml.model`` from :data:`TOKENIZER_MODELS`.

For ``gpt2``, text is split the way llama.cpp splits it for the file's ``tokenizer.ggml.pre``:
each regex in turn cuts the pieces further (``Split`` with ``isolated``), then bytes map to the
byte-level alphabet. SmolLM's ``smollm`` first isolates every digit, as its original
``tokenizer.json`` did.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers, processors
from tokenizers import Tokenizer as RawTokenizer

from snapstream.chat import ChatTemplate
from snapstream.checkpoints.gguf_file import GGUFFile
from snapstream.checkpoints.gguf_spm import spm_tokenizer, user_defined_normalized
from snapstream.tokenizer import Tokenizer, end_of_turn_ids

_GPT2 = (r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)",)
_DIGITS_THEN_GPT2 = (r"\p{N}", *_GPT2)
_LLAMA3 = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+"
           r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",)
_QWEN2 = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+"
          r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",)

# tokenizer.ggml.pre -> the regexes llama.cpp splits with (llama-vocab.cpp), in order.
PRE_TOKENIZER_SPLITS: dict[str, tuple[str, ...]] = {
    "default": _GPT2, "gpt-2": _GPT2, "gpt2": _GPT2, "mpt": _GPT2, "olmo": _GPT2,
    "smollm": _DIGITS_THEN_GPT2, "starcoder": _DIGITS_THEN_GPT2, "refact": _DIGITS_THEN_GPT2,
    "command-r": _DIGITS_THEN_GPT2, "codeshell": _DIGITS_THEN_GPT2,
    "llama3": _LLAMA3, "llama-v3": _LLAMA3, "llama-bpe": _LLAMA3, "falcon3": _LLAMA3,
    "smaug-bpe": _LLAMA3,
    "qwen2": _QWEN2, "deepseek-r1-qwen": _QWEN2,
}
# Pre-tokenizers whose vocabulary was built tiktoken-style: a piece that is itself a token is
# taken whole, without applying merges (llama.cpp's ignore_merges).
IGNORE_MERGES = frozenset({"llama3", "llama-v3", "llama-bpe", "falcon3", "smaug-bpe"})

CONTROL, USER_DEFINED = 3, 4  # llama.cpp token types


@dataclass(frozen=True)
class TokenizerModel:
    """How to build the model part of one ``tokenizer.ggml.model``: ``build`` returns the
    ``tokenizers`` model with its normalizer, pre-tokenizer and decoder, no special tokens."""

    build: Callable[[GGUFFile], RawTokenizer]
    adds_bos: bool  # when the file has no tokenizer.ggml.add_bos_token (llama: llama.cpp's)
    # whether user-defined tokens are matched in the normalized text rather than the raw text
    user_defined_normalized: Callable[[GGUFFile], bool] = lambda file: False


def tokenizer_from_gguf(file: GGUFFile) -> Tokenizer:
    name = file.get("tokenizer.ggml.model")
    if name not in TOKENIZER_MODELS:
        raise ValueError(f"{file.path}: tokenizer {name!r} is not supported "
                         f"(supported: {sorted(TOKENIZER_MODELS)})")
    model = TOKENIZER_MODELS[name]
    inner = model.build(file)
    tokens = file.get("tokenizer.ggml.tokens")
    _add_special_tokens(inner, tokens, file.get("tokenizer.ggml.token_type"),
                        model.user_defined_normalized(file))
    bos = file.get("tokenizer.ggml.bos_token_id", None)
    eos = file.get("tokenizer.ggml.eos_token_id", None)
    bos_text = tokens[bos] if bos is not None else None
    if file.get("tokenizer.ggml.add_bos_token", model.adds_bos) and bos is not None:
        inner.post_processor = processors.TemplateProcessing(
            single=f"{bos_text} $A", special_tokens=[(bos_text, bos)])
    declared = [i for i in (eos, file.get("tokenizer.ggml.eot_token_id", None)) if i is not None]
    template = file.get("tokenizer.chat_template", None)
    specials = tuple((name, tokens[i]) for name, i in (("bos_token", bos), ("eos_token", eos))
                     if i is not None)
    return Tokenizer(inner=inner, bos_token_id=bos,
                     eos_token_ids=end_of_turn_ids(inner, declared),
                     chat_template=ChatTemplate(template, specials) if template else None)


def _byte_level_bpe(file: GGUFFile) -> RawTokenizer:
    pre = file.get("tokenizer.ggml.pre", "default")
    if pre not in PRE_TOKENIZER_SPLITS:
        raise ValueError(f"{file.path}: pre-tokenizer {pre!r} is not supported "
                         f"(supported: {sorted(PRE_TOKENIZER_SPLITS)})")
    vocab = {token: i for i, token in enumerate(file.get("tokenizer.ggml.tokens"))}
    pairs = [tuple(merge.split(" ", 1)) for merge in file.get("tokenizer.ggml.merges")]
    inner = RawTokenizer(models.BPE(vocab=vocab, merges=pairs, ignore_merges=pre in IGNORE_MERGES))
    splits = [pre_tokenizers.Split(Regex(r), behavior="isolated")
              for r in PRE_TOKENIZER_SPLITS[pre]]
    inner.pre_tokenizer = pre_tokenizers.Sequence(
        [*splits, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    inner.decoder = decoders.ByteLevel()
    return inner


# tokenizer.ggml.model -> its builder
TOKENIZER_MODELS: dict[str, TokenizerModel] = {
    "gpt2": TokenizerModel(build=_byte_level_bpe, adds_bos=False),
    "llama": TokenizerModel(build=spm_tokenizer, adds_bos=True,
                            user_defined_normalized=user_defined_normalized),
}


def _add_special_tokens(inner: RawTokenizer, tokens: list[str], types: list[int],
                        user_defined_normalized: bool) -> None:
    """Control tokens match whole in the raw text and are special; user-defined ones match
    whole, in the normalized text if ``user_defined_normalized``."""
    inner.add_special_tokens([AddedToken(t, special=True, normalized=False)
                              for t, kind in zip(tokens, types, strict=True) if kind == CONTROL])
    inner.add_tokens([AddedToken(t, special=False, normalized=user_defined_normalized)
                      for t, kind in zip(tokens, types, strict=True) if kind == USER_DEFINED])
