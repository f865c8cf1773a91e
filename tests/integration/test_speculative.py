"""Speculative prefill through real gRPC servers and a real Redis: the router validates the
settings once, the prefill worker's draft picks the chunks, the target prefills them, the rest
of the path (SnapKV, blob, decode) is unchanged, and the completion reports what happened."""

from __future__ import annotations

import functools
from pathlib import Path

import grpc
import pytest
from prometheus_client import REGISTRY

from prefill_svc.service import PrefillServicer
from serving.errors import RequestError
from snapstream.chat import ChatMessage, render_plain
from snapstream.engine import Engine
from snapstream.specprefill.pieces import Request, render_served
from snapstream.specprefill.selector import DraftSelector, pick
from snapstream.specprefill.settings import SpeculativeSettings
from snapstream.v1 import common_pb2, generation_pb2
from tests.integration.test_services import ENGINE_POLICY, POLICY, collect, serving_stack, wait_idle
from tests.tiny_models import (
    random_model,
    tiny_config,
    tiny_gemma3_config,
    write_hf_dir,
    write_tiny_model,
)

DOCUMENT = " ".join(f"Item {i} costs {i * 37 % 1000} coins." for i in range(40))


@pytest.fixture(scope="module")
def model_dir(tiny_model_dir) -> Path:
    return tiny_model_dir


@pytest.fixture(scope="module")
def draft_dir(tmp_path_factory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("draft"), seed=9)


@pytest.fixture(scope="module")
def draft(draft_dir) -> Engine:
    return Engine.from_pretrained(draft_dir)


def _with_draft(draft: Engine, path: Path | None = None):
    return functools.partial(PrefillServicer, selector=DraftSelector(draft, path))


def _request(prompt: str, **speculative) -> generation_pb2.GenerateRequest:
    return generation_pb2.GenerateRequest(
        prompt=prompt, max_new_tokens=6, policy=POLICY,
        speculative=common_pb2.SpeculativeSettings(**speculative))


def _sample(name: str) -> float:
    return REGISTRY.get_sample_value(name) or 0.0


@pytest.mark.parametrize("positions", ["original", "compact"])
async def test_the_target_decodes_what_it_prefilled_of_the_drafts_pick(
        model_dir, redis_url, draft, positions):
    mode = {"original": common_pb2.POSITION_MODE_ORIGINAL,
            "compact": common_pb2.POSITION_MODE_COMPACT}[positions]
    drafted = _sample("snapstream_speculative_draft_seconds_count")
    async with serving_stack(model_dir, redis_url, prefill_cls=_with_draft(draft)) as stack:
        ids, _, complete = await collect(stack.generation, _request(
            DOCUMENT, keep=0.25, chunk_size=16, positions=mode))
        report = complete.speculative
        prompt_len = len(stack.engine.encode(DOCUMENT))
        assert report.prompt_tokens == complete.prompt_tokens == prompt_len
        assert abs(report.kept_tokens - 0.25 * prompt_len) <= 32 and not report.skipped
        assert report.draft_time.ToNanoseconds() > 0
        assert report.target_prefill_time.ToNanoseconds() > 0
        # the same selection in process, then the same greedy tokens
        request = Request.completion(DOCUMENT)
        selection = DraftSelector(draft).select(
            request, render_served(stack.engine.tokenizer, request), stack.engine.tokenizer,
            SpeculativeSettings(keep=0.25, chunk_size=16, positions=positions))
        assert len(selection.ids) == report.kept_tokens
        expected = stack.engine.generate(selection.ids, max_new_tokens=6, policy=ENGINE_POLICY,
                                         positions=selection.positions)
        assert ids == expected.token_ids
        await wait_idle(stack)
    assert _sample("snapstream_speculative_draft_seconds_count") == drafted + 1


async def test_unset_settings_take_the_workers_defaults_and_short_prompts_are_whole(
        model_dir, redis_url, draft):
    async with serving_stack(model_dir, redis_url, prefill_cls=_with_draft(draft)) as stack:
        _, _, defaulted = await collect(stack.generation, _request(DOCUMENT))
        kept = round(SpeculativeSettings().keep * defaulted.prompt_tokens)
        assert abs(defaulted.speculative.kept_tokens - kept) <= 2 * 32
        # no sliding-window layers in this target: its kept tokens keep their positions
        assert defaulted.speculative.positions == common_pb2.POSITION_MODE_ORIGINAL
        short = "A short prompt."
        ids, _, complete = await collect(stack.generation, _request(short, keep=0.1))
        assert "shorter than one chunk" in complete.speculative.skipped
        assert complete.speculative.kept_tokens == complete.prompt_tokens
        plain = await collect(stack.generation, generation_pb2.GenerateRequest(
            prompt=short, max_new_tokens=6, policy=POLICY))
        assert ids == plain[0] and not plain[2].HasField("speculative")
        await wait_idle(stack)


async def test_a_worker_without_a_draft_refuses_naming_the_flag(model_dir, redis_url):
    async with serving_stack(model_dir, redis_url) as stack:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await collect(stack.generation, _request(DOCUMENT, keep=0.5))
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "--draft-model" in err.value.details()
        await wait_idle(stack)


@pytest.mark.parametrize(("request_", "message"), [
    (_request(DOCUMENT, keep=1.5), "speculative.keep must be in (0, 1]"),
    (_request(DOCUMENT, keep=0.0), "speculative.keep must be in (0, 1]"),
    (_request(DOCUMENT, chunk_size=0), "speculative.chunk_size"),
    (generation_pb2.GenerateRequest(
        prompt_token_ids=common_pb2.TokenIds(ids=[1, 2, 3]),
        speculative=common_pb2.SpeculativeSettings()), "not prompt_token_ids"),
])
async def test_bad_settings_are_invalid_argument(model_dir, redis_url, draft, request_, message):
    async with serving_stack(model_dir, redis_url, prefill_cls=_with_draft(draft)) as stack:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await collect(stack.generation, request_)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert message in err.value.details()
        await wait_idle(stack)


async def test_the_openai_api_asks_through_its_extension_object(model_dir, redis_url, draft):
    import openai

    from tests.integration.test_openai_api import EXTENSION, http_api

    async with serving_stack(model_dir, redis_url, prefill_cls=_with_draft(draft)) as stack, \
            http_api(stack.router) as base_url:
        async with openai.AsyncOpenAI(base_url=base_url, api_key="unused",
                                      max_retries=0) as client:
            extension = {**EXTENSION, "speculative": {"keep": 0.25, "chunk_size": 16,
                                                      "draft_model": "auto"}}
            text = await client.completions.create(
                model=stack.router.model.name, prompt=DOCUMENT, max_tokens=6, temperature=0,
                extra_body={"snapstream": extension})
            with pytest.raises(openai.BadRequestError, match="keep must be in"):
                await client.completions.create(
                    model=stack.router.model.name, prompt=DOCUMENT, max_tokens=6,
                    extra_body={"snapstream": {"speculative": {"keep": 2.0}}})
        _, native_text, done = await collect(stack.generation, _request(
            DOCUMENT, keep=0.25, chunk_size=16))
        assert text.choices[0].text == native_text
        report = text.model_extra["snapstream"]["speculative"]
        assert report["kept_tokens"] == done.speculative.kept_tokens
        assert report["prompt_tokens"] == done.prompt_tokens and report["skipped"] == ""
        assert report["positions"] == "original"
        await wait_idle(stack)


@pytest.mark.parametrize("named", ["draft_dir", "gemma3-270m", "not-a-model"])
async def test_a_request_naming_a_draft_names_the_workers(model_dir, redis_url, draft,
                                                          draft_dir, named):
    """The worker runs the one draft it was started with: naming it (by path) is as 'auto';
    naming another is FAILED_PRECONDITION, with the name of the one it runs."""
    asked = str(draft_dir) if named == "draft_dir" else named
    async with serving_stack(model_dir, redis_url,
                             prefill_cls=_with_draft(draft, draft_dir)) as stack:
        request = _request(DOCUMENT, keep=0.25, chunk_size=16, draft_model=asked)
        if named == "draft_dir":
            ids, _, done = await collect(stack.generation, request)
            auto, _, _ = await collect(stack.generation, _request(
                DOCUMENT, keep=0.25, chunk_size=16, draft_model="auto"))
            assert ids == auto and done.speculative.kept_tokens < done.prompt_tokens
        else:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await collect(stack.generation, request)
            assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert f"drafts with {draft.name}" in err.value.details()
            assert "'auto'" in err.value.details()
        await wait_idle(stack)


async def test_compact_positions_read_a_prompt_longer_than_the_targets_context(
        model_dir, redis_url, draft):
    long_prompt = " ".join(f"Item {i} costs {i * 37 % 1000} coins." for i in range(120))
    async with serving_stack(model_dir, redis_url, prefill_cls=_with_draft(draft)) as stack:
        assert stack.engine.context_len < len(stack.engine.tokenizer.encode(long_prompt))
        assert len(draft.tokenizer.encode(long_prompt)) <= draft.context_len
        _, _, complete = await collect(stack.generation, _request(
            long_prompt, keep_tokens=1000, positions=common_pb2.POSITION_MODE_COMPACT))
        assert complete.speculative.kept_tokens <= 1000 + 2 * 32
        assert complete.prompt_tokens > stack.engine.context_len
        # kept more than the target reads: refused, nothing left behind
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await collect(stack.generation, _request(
                long_prompt, keep=1.0, positions=common_pb2.POSITION_MODE_COMPACT))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "context" in err.value.details()
        # original positions cannot go past the context: the router refuses the prompt
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await collect(stack.generation, _request(long_prompt, keep=0.25))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        await wait_idle(stack)


async def test_a_sliding_window_target_renumbers_by_default_and_says_so(
        tmp_path_factory, redis_url, draft):
    """Gemma 3 in miniature, its context shorter than the prompt: unset positions are compact
    (the router lets the prompt past the context as the worker renumbers it), the tokens are
    the in-process engine's on the compact selection; a request's own mode wins."""
    target_dir = write_hf_dir(tmp_path_factory.mktemp("tiny-gemma3"), random_model(
        tiny_gemma3_config(max_position_embeddings=512), seed=4))
    async with serving_stack(target_dir, redis_url, prefill_cls=_with_draft(draft)) as stack:
        assert len(stack.engine.tokenizer.encode(DOCUMENT)) > stack.engine.context_len
        ids, _, complete = await collect(stack.generation, _request(
            DOCUMENT, keep_tokens=200, chunk_size=16))
        assert complete.speculative.positions == common_pb2.POSITION_MODE_COMPACT
        request = Request.completion(DOCUMENT)
        selection = DraftSelector(draft).select(
            request, render_served(stack.engine.tokenizer, request), stack.engine.tokenizer,
            SpeculativeSettings(keep=None, keep_tokens=200, chunk_size=16,
                                positions="compact"))
        assert selection.positions is None and len(selection.ids) == (
            complete.speculative.kept_tokens)
        expected = stack.engine.generate(selection.ids, max_new_tokens=6, policy=ENGINE_POLICY)
        assert ids == expected.token_ids
        # asked for original positions: the prompt is past the context, refused
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await collect(stack.generation, _request(
                DOCUMENT, keep_tokens=200, positions=common_pb2.POSITION_MODE_ORIGINAL))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        short = " ".join(DOCUMENT.split()[:60])
        _, _, original = await collect(stack.generation, _request(
            short, keep=0.5, chunk_size=16, positions=common_pb2.POSITION_MODE_ORIGINAL))
        assert original.speculative.positions == common_pb2.POSITION_MODE_ORIGINAL
        await wait_idle(stack)


def test_the_router_marks_a_chat_prompts_final_user_turn(model_dir):
    from router.main import load_served_model
    from router.request import resolve

    model = load_served_model(model_dir, "snapstream", 16)
    chat = generation_pb2.ChatMessages(messages=[
        generation_pb2.ChatMessage(role="user", content=DOCUMENT),
        generation_pb2.ChatMessage(role="assistant", content="Noted."),
        generation_pb2.ChatMessage(role="user", content="What does item 7 cost?")])
    resolved = resolve(generation_pb2.GenerateRequest(
        messages=chat, speculative=common_pb2.SpeculativeSettings(keep=0.3)), model, "r1",
        "default")
    text = resolved.speculative_prompt.text
    assert text[resolved.speculative_prompt.keep_from_char:].startswith("What does item 7 cost?")
    pieces = resolved.speculative_prompt.pieces
    assert [(p.role, p.content) for p in pieces] == [(m.role, m.content) for m in chat.messages]
    assert all(text[p.offset:p.offset + len(p.content)] == p.content for p in pieces)
    assert model.tokenizer.encode(text) == list(resolved.prompt_ids)
    assert resolved.speculative.keep == pytest.approx(0.3)
    plain = resolve(generation_pb2.GenerateRequest(messages=chat), model, "r1", "default")
    assert plain.speculative is None and plain.speculative_prompt is None


async def test_a_base_draft_reads_a_chat_request_as_plain_text(model_dir, redis_url,
                                                               tmp_path_factory):
    """The router sends the messages' pieces; the worker's draft (no chat template) reads them
    in its own plain format and its chunks land on the target's chat rendering."""
    base = Engine.from_pretrained(write_hf_dir(
        tmp_path_factory.mktemp("base-draft"),
        random_model(tiny_config(max_position_embeddings=4096), seed=9), chat_template=None))
    messages = (ChatMessage("user", DOCUMENT), ChatMessage("assistant", "Noted."),
                ChatMessage("user", "What does item 7 cost?"))
    chat = generation_pb2.ChatMessages(messages=[
        generation_pb2.ChatMessage(role=m.role, content=m.content) for m in messages])
    settings = SpeculativeSettings(keep=0.25, chunk_size=16)
    async with serving_stack(model_dir, redis_url, prefill_cls=_with_draft(base)) as stack:
        ids, _, complete = await collect(stack.generation, generation_pb2.GenerateRequest(
            messages=chat, max_new_tokens=6, policy=POLICY,
            speculative=common_pb2.SpeculativeSettings(keep=0.25, chunk_size=16)))
        request = Request(messages, is_chat=True)
        view = render_served(stack.engine.tokenizer, request)
        ranking = DraftSelector(base).rank(request, settings)
        assert ranking.draft_view.text == render_plain([m.content for m in messages])
        selection = pick(ranking, view, stack.engine.tokenizer, settings,
                         view.text.rindex("What does item 7 cost?"))
        assert complete.speculative.kept_tokens == len(selection.ids) < complete.prompt_tokens
        expected = stack.engine.generate(selection.ids, max_new_tokens=6, policy=ENGINE_POLICY,
                                         positions=selection.positions)
        assert ids == expected.token_ids
        await wait_idle(stack)


def test_the_worker_refuses_pieces_that_are_not_where_they_say():
    from prefill_svc.speculative import job_from_request
    from snapstream.v1 import prefill_pb2

    prompt = prefill_pb2.SpeculativePrompt(text="<u>hello</u>", pieces=[
        prefill_pb2.SpeculativePiece(role="user", content="hello", offset=4)])
    request = prefill_pb2.PrefillRequest(speculative=common_pb2.SpeculativeSettings(),
                                         speculative_prompt=prompt)
    with pytest.raises(RequestError, match=r"pieces\[0\]: its content is not at offset 4"):
        job_from_request(request, DraftSelector.__new__(DraftSelector), SpeculativeSettings())
    request.speculative_prompt.pieces[0].offset = 3
    job = job_from_request(request, DraftSelector.__new__(DraftSelector), SpeculativeSettings())
    assert job.request.is_chat and job.target_view.pieces[0].text_start == 3
