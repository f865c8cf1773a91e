"""The draft reads a request in its own format: the request's pieces located in each rendering,
and draft characters carried to the target's text through them (template text to nothing,
unless both renderings share it)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from snapstream.chat import ChatMessage, ChatTemplate, render_plain
from snapstream.checkpoints import open_checkpoint
from snapstream.checkpoints.registry import model_path
from snapstream.engine import Engine
from snapstream.specprefill.mapping import carry_spans, char_mask
from snapstream.specprefill.pieces import (
    Piece,
    Rendering,
    Request,
    links,
    locate,
    render_own,
    render_served,
)
from snapstream.specprefill.selector import DraftRanking, DraftSelector, pick
from snapstream.specprefill.settings import SpeculativeSettings
from snapstream.tokenizer import Tokenizer
from tests.tiny_models import CHATML, random_model, tiny_config, tiny_snapstream_tokenizer

NEEDLE = "The secret pass key is 748291. Remember it."
DOCUMENT = " ".join(f"Item {i} costs {i * 37 % 1000} coins." for i in range(30))
CHAT = Request((ChatMessage("user", f"{DOCUMENT} {NEEDLE} {DOCUMENT}"),
                ChatMessage("assistant", "Noted."),
                ChatMessage("user", "What is the pass key?")), is_chat=True)


def _tiny(chat_template: str | None) -> Tokenizer:
    tokenizer = tiny_snapstream_tokenizer()
    template = chat_template and ChatTemplate(chat_template)
    return Tokenizer(tokenizer.inner, tokenizer.bos_token_id, tokenizer.eos_token_ids, template)


@pytest.fixture(scope="module")
def real():
    return {name: open_checkpoint(model_path(name)).tokenizer()
            for name in ("smollm2-135m", "gemma3-270m")}


def _chars(view: Rendering, spans: torch.Tensor) -> set[int]:
    return set(char_mask(spans.view(-1, 2), len(view.text)).nonzero()[:, 0].tolist())


def test_locate_finds_each_content_in_order_and_a_trimmed_one():
    text = "<u>ab</u><a>ab</a><u>cd</u>"
    assert locate(text, ["ab", "ab", "  cd\n"], "draft") == (
        Piece(3, 0, 2), Piece(12, 0, 2), Piece(21, 2, 2))
    with pytest.raises(ValueError, match="does not render message 1's content"):
        locate(text, ["ab", "zz"], "draft model")


def test_each_model_reads_a_request_in_its_own_format():
    chat, base = _tiny(CHATML), _tiny(None)
    contents = [m.content for m in CHAT.messages]
    assert render_own(chat, CHAT).text == chat.render_chat(CHAT.messages)
    assert render_own(base, CHAT).text == render_plain(contents)
    text = Request.completion(DOCUMENT)
    assert render_own(base, text).text == DOCUMENT  # a base model reads a text prompt as is
    assert render_own(chat, text).text == chat.render_chat([ChatMessage("user", DOCUMENT)])
    for tokenizer, request in ((chat, CHAT), (base, CHAT), (chat, text), (base, text)):
        view = render_own(tokenizer, request)
        for message, piece in zip(request.messages, view.pieces, strict=True):
            assert view.text[piece.text_start:piece.text_start + piece.length] == \
                message.content[piece.content_start:piece.content_start + piece.length]


def test_chat_template_text_maps_to_nothing_and_contents_to_themselves():
    draft = render_own(_tiny(CHATML), CHAT)  # ChatML, with a system turn the request lacks
    target = render_own(_tiny(None), CHAT)  # plain: contents, blank lines, "Answer:"
    whole = torch.tensor([[0, len(draft.text)]])
    spans, origin = carry_spans(whole, links(draft, target))
    content_chars = {p.text_start + i for p in target.pieces for i in range(p.length)}
    assert _chars(target, spans) == content_chars and set(origin.tolist()) == {0}
    start = draft.text.index(NEEDLE)
    spans, _ = carry_spans(torch.tensor([[start, start + len(NEEDLE)]]), links(draft, target))
    assert [target.text[a:b] for a, b in spans.tolist()] == [NEEDLE]


@settings(max_examples=40, deadline=None)
@given(bounds=st.lists(st.tuples(st.integers(0, 2000), st.integers(0, 200)), min_size=1,
                       max_size=12))
def test_the_same_format_maps_every_character_to_itself(bounds):
    view = render_own(_tiny(CHATML), CHAT)  # a draft of the target's family: today's mapping
    spans = torch.tensor([[min(a, len(view.text)), min(a + n, len(view.text))]
                          for a, n in bounds])
    carried, origin = carry_spans(spans, links(view, view))
    assert _chars(view, carried) == _chars(view, spans)
    assert origin.tolist() == sorted(origin.tolist())


def _by_hand(tokenizer: Tokenizer, view: Rendering, hot: str) -> DraftRanking:
    """A draft's ranking of ``view`` with every token of ``hot`` scored 1, the rest 0."""
    _, spans = tokenizer.encode_with_offsets(view.text)
    offsets = torch.tensor(spans, dtype=torch.int64).view(-1, 2)  # (N, 2)
    at = view.text.index(hot)
    scores = ((offsets[:, 1] > at) & (offsets[:, 0] < at + len(hot))).float()  # (N,)
    return DraftRanking(view, offsets, scores, chunk_size=32, draft_s=0.0)


def _kept_text(tokenizer: Tokenizer, view: Rendering, positions: list[int]) -> str:
    _, offsets = tokenizer.encode_with_offsets(view.text)
    return "".join(view.text[offsets[i][0]:offsets[i][1]] for i in positions)


def test_smollm2s_chat_reading_keeps_the_needle_of_gemma3s_plain_prompt(real):
    """A ranking by hand over SmolLM2's ChatML rendering (the needle scored highest) lands on
    Gemma 3's plain prompt: the text's first and last chunks (not SmolLM2's system turn and
    template) always, then the needle's tokens."""
    draft, target = real["smollm2-135m"], real["gemma3-270m"]
    draft_view, target_view = render_own(draft, CHAT), render_own(target, CHAT)
    assert draft_view.text.startswith("<|im_start|>system")
    assert target_view.text.endswith("\n\nAnswer:")
    ranking = _by_hand(draft, draft_view, NEEDLE)
    least = pick(ranking, target_view, target, SpeculativeSettings(keep=None, keep_tokens=1))
    text = _kept_text(target, target_view, least.positions)
    assert least.positions[0] == 0  # BOS
    assert text.startswith(DOCUMENT[:60]) and text.endswith("What is the pass key?")
    assert NEEDLE not in text and "You are" not in text and "Answer" not in text
    more = pick(ranking, target_view, target,
                SpeculativeSettings(keep=None, keep_tokens=len(least.ids) + 80))
    text = _kept_text(target, target_view, more.positions)
    assert NEEDLE in text and "You are" not in text
    assert len(more.ids) < 0.3 * len(target.encode(target_view.text))


@pytest.mark.parametrize("keep", [0.1, 0.25, 0.5])
def test_a_chat_draft_ranks_its_own_rendering_for_a_base_target(keep):
    draft = DraftSelector(Engine(random_model(tiny_config(), seed=3), _tiny(CHATML)))
    target = _tiny(None)
    request = Request.completion(f"{DOCUMENT} {NEEDLE} {DOCUMENT}")
    settings_ = SpeculativeSettings(keep=keep, chunk_size=16)
    ranking = draft.rank(request, settings_)
    assert ranking.draft_view.text == _tiny(CHATML).render_chat(request.messages)
    view = render_served(target, request)
    selection = pick(ranking, view, target, settings_)
    ids = target.encode(view.text)
    assert abs(len(selection.ids) - keep * len(ids)) <= 16 and not selection.skipped
    # the text's first chunk (16 draft tokens; the same tokenizer: 16 target tokens) and its
    # last (what is left of the text, its end) are kept, not the template's around them
    assert set(range(16)) | {len(ids) - 1} <= set(selection.positions)


@pytest.mark.parametrize("chat_template", [CHATML, None])
def test_a_draft_of_the_targets_family_keeps_what_the_whole_prompts_chunks_keep(chat_template):
    """Same format, same tokenizer: every character is shared, so the chunks tile the whole
    rendering from its first token and the first and last lead, as before pieces existed."""
    from snapstream.specprefill.chunks import chunk_bounds, rank_chunks
    from snapstream.specprefill.mapping import chunk_spans
    from snapstream.specprefill.selector import _fill, _forced_tokens

    tokenizer = _tiny(chat_template)
    draft = DraftSelector(Engine(random_model(tiny_config(), seed=5), tokenizer))
    request = CHAT if chat_template else Request.completion(DOCUMENT)
    settings_ = SpeculativeSettings(keep=0.25, chunk_size=16)
    ranking = draft.rank(request, settings_)
    view = render_served(tokenizer, request)
    assert ranking.draft_view == view
    bounds = chunk_bounds(len(ranking.offsets), 16)
    hulls = chunk_spans(ranking.offsets, bounds)[
        rank_chunks(ranking.scores, bounds, (0, len(bounds) - 1))]
    ids, offsets = tokenizer.encode_with_offsets(view.text)
    offsets = torch.tensor(offsets, dtype=torch.int64)
    forced = _forced_tokens(tokenizer, ids, offsets)
    expected = _fill(hulls, torch.arange(len(hulls)), len(hulls), offsets, forced,
                     len(view.text), round(0.25 * len(ids)))
    assert pick(ranking, view, tokenizer, settings_).positions == \
        expected.nonzero()[:, 0].tolist()
