"""Chat messages through the router: the model's template, end-of-turn, bad conversations."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from snapstream.chat import ChatMessage
from snapstream.v1 import generation_pb2
from tests.integration.test_services import POLICY, collect, serving_stack, wait_idle


@pytest.fixture(scope="module")
def model_dir(tiny_model_dir) -> Path:
    return tiny_model_dir


def _chat(*messages: tuple[str, str], **fields) -> generation_pb2.GenerateRequest:
    chat = generation_pb2.ChatMessages(
        messages=[generation_pb2.ChatMessage(role=r, content=c) for r, c in messages])
    return generation_pb2.GenerateRequest(messages=chat, **fields)


async def test_messages_generate_as_their_rendered_template(model_dir, redis_url):
    conversation = (("system", "Be brief."), ("user", "Say hello"))
    async with serving_stack(model_dir, redis_url) as stack:
        rendered = stack.engine.tokenizer.render_chat([ChatMessage(*m) for m in conversation])
        assert rendered.endswith("<|im_start|>assistant\n")
        by_chat = await collect(stack.generation, _chat(*conversation, max_new_tokens=12,
                                                        policy=POLICY))
        by_text = await collect(stack.generation, generation_pb2.GenerateRequest(
            prompt=rendered, max_new_tokens=12, policy=POLICY))
        assert by_chat[:2] == by_text[:2]
        assert by_chat[2].prompt_tokens == len(stack.engine.encode(rendered))
        info = await stack.generation.Info(generation_pb2.InfoRequest())
        assert info.has_chat_template
        await wait_idle(stack)


async def test_completion_reports_the_fixed_kv_cache(model_dir, redis_url):
    budget = POLICY.n_sink + POLICY.n_topk + POLICY.n_recent
    async with serving_stack(model_dir, redis_url) as stack:
        completes = [(await collect(stack.generation, generation_pb2.GenerateRequest(
            prompt="lorem ipsum " * words, max_new_tokens=2, policy=POLICY)))[2]
            for words in (20, 80)]  # 240 and 960 bytes: both compressed into the budget
        assert completes[0].prompt_tokens < completes[1].prompt_tokens
        assert [c.kv_cache_slots for c in completes] == [budget, budget]
        assert completes[0].kv_cache_bytes == completes[1].kv_cache_bytes > 0
        await wait_idle(stack)


def test_a_chat_request_stops_at_the_end_of_turn_token(model_dir):
    from router.main import load_served_model
    from router.request import resolve

    model = load_served_model(model_dir, "snapstream", 16)
    im_end = model.tokenizer.inner.token_to_id("<|im_end|>")
    resolved = resolve(_chat(("user", "hi")), model, "r1", "default")
    assert im_end in resolved.sampling.stop_token_ids
    assert model.tokenizer.decode(list(resolved.prompt_ids)).endswith("user\nhi\nassistant\n")


@pytest.mark.parametrize(("messages", "message"), [
    ((), "messages is empty"),
    ((("robot", "hi"),), "messages[0].role: unknown 'robot'"),
    ((("user", "hi"), ("narrator", "x")), "messages[1].role"),
    ((("user", "word " * 3000),), "messages has"),
])
async def test_bad_messages_are_invalid_argument(model_dir, redis_url, messages, message):
    async with serving_stack(model_dir, redis_url) as stack:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await collect(stack.generation, _chat(*messages, max_new_tokens=4))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert message in err.value.details()
        await wait_idle(stack)
