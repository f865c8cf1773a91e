"""A SentencePiece BPE vocabulary (``tokenizer.ggml.model == "llama"``, llama.cpp's SPM) rebuilt
as a ``tokenizers`` BPE that segments exactly as SentencePiece does.

SentencePiece's BPE starts from single characters and repeatedly merges the adjacent pair whose
concatenation is a piece with the highest score (leftmost first among equals); a character
that no piece covers falls back to its UTF-8 bytes (``<0x00>``..``<0xFF>``). ``tokenizers``
merges by rank instead, so every split of a piece into two pieces becomes a merge, ranked by
the merged piece's score: the same merges fire in the same order. A piece with several splits
gets them adjacent, longest left part first; only if two different splits of one piece were
mergeable at once could the order differ from SentencePiece's leftmost rule.

Only normal and user-defined pieces take part in merges, as in SentencePiece: control and
byte pieces are never built from text, and unused ones (which SentencePiece re-splits after
merging) are left out. Spaces become ``▁``. Control tokens match whole in the raw text (as
llama.cpp parses them); user-defined ones in the escaped text, as SentencePiece matches them.
With ``add_space_prefix`` one ``▁`` is prepended to every stretch of text between control and
user-defined tokens, as llama.cpp does (user-defined ones then match in the raw text), and the
decoder drops the first one.
"""

from __future__ import annotations

from collections.abc import Sequence

from tokenizers import Tokenizer as RawTokenizer
from tokenizers import decoders, models, normalizers

from snapstream.checkpoints.gguf_file import GGUFFile

NORMAL, USER_DEFINED = 1, 4  # llama.cpp token types that SentencePiece merges into
SPACE = "\u2581"  # ▁, SentencePiece's escaped space


def spm_tokenizer(file: GGUFFile) -> RawTokenizer:
    """The BPE with byte fallback for a ``llama`` vocabulary; the caller adds special tokens."""
    tokens = file.get("tokenizer.ggml.tokens")
    merges = spm_merges(tokens, file.get("tokenizer.ggml.scores"),
                        file.get("tokenizer.ggml.token_type"))
    vocab = {token: i for i, token in enumerate(tokens)}
    inner = RawTokenizer(models.BPE(vocab=vocab, merges=merges, byte_fallback=True))
    prefix = add_space_prefix(file)
    replace = normalizers.Replace(" ", SPACE)
    inner.normalizer = (normalizers.Sequence([normalizers.Prepend(SPACE), replace])
                        if prefix else replace)
    steps = [decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    inner.decoder = decoders.Sequence([*steps, decoders.Strip(" ", 1, 0)] if prefix else steps)
    return inner


def add_space_prefix(file: GGUFFile) -> bool:
    """Whether text gets a leading ``▁`` (llama.cpp's default for SPM files is yes)."""
    return file.get("tokenizer.ggml.add_space_prefix", True)


def user_defined_normalized(file: GGUFFile) -> bool:
    """SentencePiece matches user-defined pieces in the space-escaped text; the file spells their
    ``▁`` as spaces, and ``tokenizers`` escapes a normalized token's text as it escapes the
    input, so they match alike. With a space prefix the normalizer would prefix the token's text
    too: there they match in the raw text, as llama.cpp matches them."""
    return not add_space_prefix(file)


def spm_merges(tokens: Sequence[str], scores: Sequence[float],
               types: Sequence[int]) -> list[tuple[str, str]]:
    """Every split of a mergeable piece into two mergeable pieces, best merged score first
    (ties in file order); a piece's splits are adjacent, longest left part first."""
    score = {t: s for t, s, kind in zip(tokens, scores, types, strict=True)
             if kind in (NORMAL, USER_DEFINED)}
    ranked = sorted(score, key=score.__getitem__, reverse=True)  # stable: file order on ties
    return [(left, right) for piece in ranked for k in range(len(piece) - 1, 0, -1)
            if (right := piece[k:]) in score and (left := piece[:k]) in score]
