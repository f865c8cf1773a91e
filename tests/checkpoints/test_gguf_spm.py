"""SentencePiece BPE vocabularies (``tokenizer.ggml.model == "llama"``): a small one written with
gguf's writer, and Gemma 3 270M's real 262,144-token one, against the ``sentencepiece`` library
loading a model built from the same metadata."""

from __future__ import annotations

import random
import re
from pathlib import Path

import gguf
import pytest
import sentencepiece
from sentencepiece import sentencepiece_model_pb2 as spm_pb

from snapstream.checkpoints.gguf_file import GGUFFile
from snapstream.checkpoints.gguf_spm import spm_merges
from snapstream.checkpoints.gguf_tokenizer import tokenizer_from_gguf
from snapstream.checkpoints.registry import MODELS, ModelNotInstalled
from snapstream.tokenizer import Tokenizer

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, BYTE = 1, 2, 3, 4, 6
SPACE = "\u2581"

# The small vocabulary: (piece, score, type). Merged pieces' ids do not follow their scores, so
# merging in file order (or longest match) segments differently from merging by score.
SPECIALS = [("<pad>", 0.0, CONTROL), ("<eos>", 0.0, CONTROL), ("<bos>", 0.0, CONTROL),
            ("<unk>", 0.0, UNKNOWN), ("<start_of_turn>", 0.0, CONTROL),
            ("<end_of_turn>", 0.0, CONTROL)]
BYTES = [(f"<0x{b:02X}>", 0.0, BYTE) for b in range(256)]
# llama.cpp's converter spells a user-defined piece's ▁ as a space
USER = [("\n", -1000.0, USER_DEFINED), ("  ", -1000.0, USER_DEFINED),
        ("<b>", -1000.0, USER_DEFINED)]
CHARS = [(c, -100.0 - i, NORMAL) for i, c in enumerate(SPACE + "abcdehlortwxy123")]
MERGED = [("ab", -2.0), ("cd", -3.0), ("bc", -1.0), ("abcd", -4.0), ("he", -11.0),
          ("▁t", -10.0), ("▁the", -12.0), ("aa", -20.0), ("23", -30.0), ("12", -31.0),
          ("▁w", -40.0), ("or", -41.0), ("ld", -42.0), ("▁wor", -43.0), ("▁world", -44.0),
          ("yx", -61.0), ("xy", -60.0)]
VOCAB = [*SPECIALS, *BYTES, *USER, *CHARS, *((p, s, NORMAL) for p, s in MERGED)]
BOS, EOS, UNK, END_OF_TURN = 2, 1, 3, 5

SEGMENTATIONS = {  # no space prefix (Gemma's setting)
    "abc": ["a", "bc"],
    "abcd": ["a", "bc", "d"],  # bc outscores ab, and abcd only splits as ab + cd
    "the": ["t", "he"],
    " the": ["▁the"],
    " world": ["▁world"],  # ld before ▁wor, then ▁wor + ld
    "aaaaa": ["aa", "aa", "a"],  # leftmost first among equal scores
    "123": ["1", "23"],
    "yxy": ["y", "xy"],
    "é🎉": ["<0xC3>", "<0xA9>", "<0xF0>", "<0x9F>", "<0x8E>", "<0x89>"],
    "a  b": ["a", "  ", "b"],
    "a   b": ["a", "  ", "▁", "b"],
    "a\n\nb": ["a", "\n", "\n", "b"],
    "x<b>y": ["x", "<b>", "y"],
    "<start_of_turn>the<end_of_turn>": ["<start_of_turn>", "t", "he", "<end_of_turn>"],
    "<eos><unk>": ["<eos>", "<0x3C>", "<0x75>", "<0x6E>", "<0x6B>", "<0x3E>"],  # not control
    "": [],
}
PREFIXED_SEGMENTATIONS = {  # add_space_prefix: one ▁ before each stretch of text
    "the": ["▁the"],
    " the": ["▁", "▁the"],
    "the world": ["▁the", "▁world"],
    "<start_of_turn>the": ["<start_of_turn>", "▁the"],  # as llama.cpp does after a token
    "": [],
}


def write_spm_gguf(path: Path, add_space_prefix: bool, model: str = "llama") -> Path:
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_tokenizer_model(model)
    writer.add_tokenizer_pre("default")
    writer.add_token_list([p for p, _, _ in VOCAB])
    writer.add_token_scores([s for _, s, _ in VOCAB])
    writer.add_token_types([t for _, _, t in VOCAB])
    writer.add_bos_token_id(BOS)
    writer.add_eos_token_id(EOS)
    writer.add_unk_token_id(UNK)
    writer.add_pad_token_id(0)
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)
    writer.add_add_space_prefix(add_space_prefix)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


class SentencePieceReference:
    """``sentencepiece`` on a BPE ``ModelProto`` built from a GGUF's tokenizer metadata (the
    types are SentencePiece's own numbers; user-defined pieces get their ``▁`` back). It does
    not parse control tokens, so text is cut at their texts first, as llama.cpp does."""

    def __init__(self, metadata: dict) -> None:
        tokens = metadata["tokenizer.ggml.tokens"]
        types = metadata["tokenizer.ggml.token_type"]
        unk = metadata["tokenizer.ggml.unknown_token_id"]
        model = spm_pb.ModelProto()
        model.trainer_spec.model_type = spm_pb.TrainerSpec.BPE
        model.trainer_spec.byte_fallback = True
        model.trainer_spec.unk_id = unk
        model.normalizer_spec.name = "identity"
        model.normalizer_spec.add_dummy_prefix = metadata["tokenizer.ggml.add_space_prefix"]
        model.normalizer_spec.remove_extra_whitespaces = False
        model.normalizer_spec.escape_whitespaces = True
        for i, (piece, score, kind) in enumerate(
                zip(tokens, metadata["tokenizer.ggml.scores"], types, strict=True)):
            model.pieces.add(piece=piece.replace(" ", SPACE) if kind == USER_DEFINED else piece,
                             score=score, type=UNKNOWN if i == unk else kind)
        self.processor = sentencepiece.SentencePieceProcessor()
        self.processor.LoadFromSerializedProto(model.SerializeToString())
        self.bos = metadata["tokenizer.ggml.bos_token_id"]
        self.control = {t: i for i, (t, kind) in enumerate(zip(tokens, types, strict=True))
                        if kind == CONTROL}
        by_length = sorted(self.control, key=len, reverse=True)
        self.split = re.compile("(" + "|".join(map(re.escape, by_length)) + ")")

    def encode(self, text: str) -> list[int]:
        ids = [self.bos]
        for i, part in enumerate(self.split.split(text)):
            if i % 2:
                ids.append(self.control[part])
            elif part:
                ids.extend(self.processor.encode(part))
        return ids


def _pieces(tokenizer: Tokenizer, text: str) -> list[str]:
    ids = tokenizer.encode(text)
    assert ids[0] == BOS
    return [VOCAB[i][0] for i in ids[1:]]


@pytest.fixture(scope="module", params=[False, True], ids=["no-prefix", "prefix"])
def synthetic(request, tmp_path_factory) -> tuple[Tokenizer, SentencePieceReference, bool]:
    path = write_spm_gguf(tmp_path_factory.mktemp("spm") / "spm.gguf", request.param)
    file = GGUFFile(path)
    return tokenizer_from_gguf(file), SentencePieceReference(file.metadata), request.param


def _random_texts(seed: int, alphabet: list[str], count: int) -> list[str]:
    rng = random.Random(seed)
    return ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 24)))
            for _ in range(count)]


def _comparable(texts: list[str], prefix: bool) -> list[str]:
    """With a space prefix, llama.cpp (and we) match user-defined tokens in the raw text and
    prefix the stretch after one anew; SentencePiece matches them in the prefixed, escaped text
    (where ``" x"`` begins with the user-defined ``"  "``) and does not prefix after them, and
    the decoder strips only the first prefix. Leave out the texts where that shows."""
    if not prefix:
        return texts
    control = re.compile("|".join(re.escape(p) for p, _, kind in VOCAB if kind == CONTROL))
    return [t for t in texts if not any(u in " " + part for part in control.split(t)
                                        for u, _, _ in USER)]


def test_synthetic_segmentations(synthetic):
    ours, _, prefix = synthetic
    expected = PREFIXED_SEGMENTATIONS if prefix else SEGMENTATIONS
    for text, pieces in expected.items():
        assert _pieces(ours, text) == pieces, text


def test_synthetic_matches_sentencepiece(synthetic):
    ours, reference, prefix = synthetic
    words = ["a", "b", "c", "d", "the", "he", "world", "123", "xy", "é", "🎉", "<end_of_turn>",
             "<start_of_turn>", "<eos>", " ", "  ", "\n", "<b>"]
    texts = [*SEGMENTATIONS, *_random_texts(0, words, 600), *_random_texts(1, list("abcd "), 600)]
    for text in _comparable(texts, prefix):
        assert ours.encode(text) == reference.encode(text), text


def test_synthetic_decode_round_trips(synthetic):
    ours, _, prefix = synthetic
    texts = [*_random_texts(2, ["a", "bc", "the", " ", "  ", "\n", "é", "🎉", "<b>"], 400),
             " leading", "trailing ", " ", ""]
    for text in _comparable(texts, prefix):
        assert ours.decode(ours.encode(text)) == text
    assert ours.decode(ours.encode("<start_of_turn>the<end_of_turn>")) == "the"


def test_synthetic_special_ids(synthetic):
    ours, _, _ = synthetic
    assert ours.bos_token_id == BOS
    assert ours.eos_token_ids == (EOS, END_OF_TURN)
    assert ours.vocab_size == len(VOCAB)


def test_merges_follow_scores_not_ids():
    tokens, scores, types = zip(*VOCAB, strict=True)
    merges = spm_merges(tokens, scores, types)
    assert merges[:4] == [("b", "c"), ("a", "b"), ("c", "d"), ("ab", "cd")]
    assert merges[merges.index(("▁t", "he")) - 1] == ("h", "e")
    assert len(merges) == len(set(merges)) == len(MERGED)  # one split each here


def test_unsupported_tokenizer_model_is_named(tmp_path):
    path = write_spm_gguf(tmp_path / "t5.gguf", add_space_prefix=False, model="t5")
    with pytest.raises(ValueError, match=r"tokenizer 't5' is not supported \(supported: "
                                         r"\['gpt2', 'llama'\]\)"):
        tokenizer_from_gguf(GGUFFile(path))


# Gemma 3 270M: where tokenizers most often differ.
GEMMA_TEXTS = [
    "Hello, world! The quick brown fox jumps over the lazy dog.",
    "digits 0 12 345 6789 3.14159 -42 1e10 2026-11-24 1,000,000 ٣٤٥ ①② ½",
    "def f(x):\n\tif x:\n\t\treturn x + 1\n    pass\n\n\n# done",
    "for (int i = 0; i < n; ++i) { sum += a[i] * b[i]; }  // C++",
    "日本語のテキスト、中文字符。한국어 텍스트 ภาษาไทย",
    "emoji 🎉🚀 👩‍👩‍👧 ok 🇫🇷 🏳️‍🌈 ❤️",
    "café naïve résumé Ångström Øresund façade Ελληνικά русский عربي עברית हिन्दी",
    "          ten spaces, then a tab\tand\t\t\ttabs",
    "\n\n\n\nnewlines\r\n\r\nand carriage returns\n",
    "  leading and trailing spaces   ",
    " ",
    "<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n",
    "text<eos>more<bos><pad> and <end_of_turn>",
    "<table><tr><td>1</td></tr></table> <b>bold</b><i>it</i>",
    "mixedスクリプトtext中文English한국어123",
    "https://example.com/path?q=1&r=2#frag user@example.com",
    "\u00a0non-breaking\u200bzero-width\u3000ideographic space",
    "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝟙𝟚𝟛 ﬁ ligature ㍿ 𠀀𠀁",
    "\x00\x01\x7f control characters",
    "▁already▁escaped ▁ ▁▁",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "it's they're we'll I'd CAN'T",
    "",
]


@pytest.fixture(scope="session")
def gemma3() -> tuple[Tokenizer, SentencePieceReference, dict]:
    try:
        path = MODELS["gemma3-270m"].path()
    except ModelNotInstalled as exc:
        pytest.fail(f"the real Gemma 3 file is part of the test setup: {exc}")
    file = GGUFFile(path)
    return tokenizer_from_gguf(file), SentencePieceReference(file.metadata), file.metadata


def _gemma_fuzz(metadata: dict, count: int) -> list[str]:
    """Strings of random vocabulary pieces and characters, with the control tokens' texts."""
    rng = random.Random(3)
    tokens, types = metadata["tokenizer.ggml.tokens"], metadata["tokenizer.ggml.token_type"]
    normal = [t.replace(SPACE, " ") for t, kind in zip(tokens, types, strict=True)
              if kind == NORMAL]
    parts = [*rng.sample(normal, 2000), "<end_of_turn>", "<start_of_turn>", "\n", "  ", "\t"]
    chars = sorted({c for piece in parts for c in piece})
    return [("".join(rng.choice(parts) for _ in range(rng.randint(1, 10))) if i % 2
             else "".join(rng.choice(chars) for _ in range(rng.randint(1, 30))))
            for i in range(count)]


def test_gemma3_matches_sentencepiece(gemma3):
    ours, reference, metadata = gemma3
    for text in [*GEMMA_TEXTS, *_gemma_fuzz(metadata, 2000)]:
        assert ours.encode(text) == reference.encode(text), text


def test_gemma3_decode_round_trips(gemma3):
    ours, _, _ = gemma3
    for text in GEMMA_TEXTS:
        if "<" not in text and SPACE not in text:  # control tokens are dropped, ▁ reads " "
            assert ours.decode(ours.encode(text)) == text
    assert ours.decode(ours.encode("<start_of_turn>user\nhi<end_of_turn>")) == "user\nhi"
    assert ours.decode(ours.encode("a▁b")) == "a b"


def test_gemma3_special_ids(gemma3):
    ours, _, _ = gemma3
    assert ours.bos_token_id == 2 and ours.encode("")[0] == 2
    assert ours.eos_token_ids == (1, 106)  # <eos>, <end_of_turn>
    assert ours.inner.id_to_token(106) == "<end_of_turn>"
    assert ours.encode("<start_of_turn>")[1:] == [105]
