"""One prompt's selection: budgets, the always-kept spans, chat prompts, short prompts."""

from __future__ import annotations

import pytest

from snapstream.chat import ChatMessage
from snapstream.checkpoints import open_checkpoint
from snapstream.checkpoints.registry import model_path
from snapstream.config import FULL
from snapstream.specprefill.pieces import Request, render_served
from snapstream.specprefill.selector import DraftSelector, pick
from snapstream.specprefill.settings import SpeculativeSettings
from tests.engine.helpers import engine_for
from tests.tiny_models import random_model, tiny_config, tiny_gemma3_config

DOCUMENT = " ".join(f"Line {i}: the value of item {i} is {i * 37 % 1000}." for i in range(60))


def select_text(selector, text, target, settings):
    """A text prompt: the tiny draft (no chat template) reads it as it is, as the target does."""
    request = Request.completion(text)
    return selector.select(request, render_served(target, request), target, settings)


@pytest.fixture(scope="module")
def selector() -> DraftSelector:
    return DraftSelector(engine_for(random_model(tiny_config(), seed=11)))


@pytest.fixture(scope="module")
def target():
    return open_checkpoint(model_path("smollm2-135m")).tokenizer()


@pytest.mark.parametrize("keep", [0.1, 0.25, 0.5])
def test_a_share_keeps_about_that_share_with_the_first_and_last_tokens(selector, target, keep):
    out = select_text(selector, DOCUMENT, target, SpeculativeSettings(keep=keep, chunk_size=16))
    ids = target.encode(DOCUMENT)
    assert out.num_prompt_tokens == len(ids) and not out.skipped
    assert out.ids == [ids[i] for i in out.positions]
    assert out.positions[0] == 0 and out.positions[-1] == len(ids) - 1
    # the ranked chunks fill the budget; the first and last chunks may add to it
    assert round(keep * len(ids)) - 40 <= len(out.ids) <= round(keep * len(ids)) + 40
    assert out.draft_s > 0


def test_a_token_count_is_a_ceiling_and_compact_positions_renumber(selector, target):
    settings = SpeculativeSettings(keep=None, keep_tokens=300, chunk_size=8, positions="compact")
    out = select_text(selector, DOCUMENT, target, settings)
    assert 250 < len(out.ids) <= 300 and out.positions is None
    whole = select_text(selector, DOCUMENT, target, SpeculativeSettings(keep=1.0, chunk_size=8))
    assert whole.ids == target.encode(DOCUMENT) and whole.kept_share == 1.0


def test_chat_prompts_keep_the_template_tokens_and_the_final_user_turn(selector, target):
    question = "Which item has the value 111? Answer with its number only."
    messages = [ChatMessage("user", DOCUMENT), ChatMessage("assistant", "Ready."),
                ChatMessage("user", question)]
    text = target.render_chat(messages)
    ids, offsets = target.encode_with_offsets(text)
    request = Request(tuple(messages), is_chat=True)
    view = render_served(target, request)
    assert view.text == text
    out = selector.select(request, view, target, SpeculativeSettings(keep=0.1, chunk_size=16),
                          keep_from_char=text.rindex(question))
    kept = set(out.positions)
    special = {i for i, t in target.inner.get_added_tokens_decoder().items() if t.special}
    assert {i for i, token in enumerate(ids) if token in special} <= kept
    turn = {i for i, (start, _) in enumerate(offsets) if start >= text.rindex(question)}
    assert turn <= kept
    assert len(kept) < 0.3 * len(ids)


def test_a_prompt_shorter_than_a_chunk_is_prefilled_whole(selector, target):
    out = select_text(selector, "A short prompt.", target, SpeculativeSettings(keep=0.1))
    assert out.ids == target.encode("A short prompt.") and out.positions is None
    assert "shorter than one chunk" in out.skipped


@pytest.mark.parametrize(("fields", "message"), [
    ({"keep": 0.0}, "keep must be in"), ({"keep": 1.5}, "keep must be in"),
    ({"keep": None}, "exactly one"), ({"keep_tokens": 10}, "exactly one"),
    ({"chunk_size": 0}, "chunk_size"), ({"positions": "shifted"}, "positions"),
    ({"kernel": 4}, "kernel"), ({"look_ahead": -1}, "look_ahead"),
])
def test_bad_settings_name_the_field(fields, message):
    with pytest.raises(ValueError, match=message):
        SpeculativeSettings(**fields)


def test_a_target_with_sliding_window_layers_defaults_to_compact_positions():
    """The rule is the config's (its sliding layers), not the model's name; only the
    positions differ from the plain defaults."""
    assert SpeculativeSettings.defaults_for(tiny_gemma3_config()) == SpeculativeSettings(
        positions="compact")
    assert SpeculativeSettings.defaults_for(tiny_config()) == SpeculativeSettings(
        positions="original")
    assert SpeculativeSettings.defaults_for(
        tiny_gemma3_config(layer_types=(FULL,) * 5)).positions == "original"


def test_the_selection_says_which_position_mode_gave_its_positions(selector, target):
    for mode in ("original", "compact"):
        settings = SpeculativeSettings(keep=0.25, chunk_size=16, positions=mode)
        assert select_text(selector, DOCUMENT, target, settings).position_mode == mode
        short = select_text(selector, "Too short.", target, settings)
        assert short.skipped and short.position_mode == mode


def test_one_ranking_serves_every_budget(selector, target):
    request = Request.completion(DOCUMENT)
    ranking = selector.rank(request, SpeculativeSettings(chunk_size=16))
    for keep in (0.1, 0.5):
        settings = SpeculativeSettings(keep=keep, chunk_size=16)
        assert pick(ranking, render_served(target, request), target, settings).ids == \
            select_text(selector, DOCUMENT, target, settings).ids
