"""Qwen2.5-Coder (the 0.5B: the 1.5B's tokenizer, template and layers at a third of the cost)
served end to end from its GGUF's blocks, on both stores: a code question asked through the SDK
and through the OpenAI API gets the in-process engine's greedy answer, and that answer is the
code asked for."""

from __future__ import annotations

import pytest
from openai import OpenAI

from cluster import ClusterSpec, LocalCluster
from snapstream import Engine, SamplingParams
from snapstream.chat import ChatMessage
from snapstream.checkpoints.registry import model_path
from snapstream.client import SnapstreamClient

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]
MODEL = "qwen2.5-coder-0.5b"
QUESTION = "Write a Python function square(x) that returns x squared. Reply with the code only."
NEW_TOKENS = 24


@pytest.fixture(scope="module")
def expected() -> str:
    engine = Engine.from_pretrained(MODEL)
    prompt = engine.tokenizer.render_chat([ChatMessage("user", QUESTION)])
    answer = engine.generate(prompt, max_new_tokens=NEW_TOKENS, policy=engine.default_policy,
                             sampling=SamplingParams(temperature=0)).text
    assert "def square(x):" in answer and "return x" in answer, answer  # the code asked for
    return answer


@pytest.fixture(scope="module", params=["redis", "nats"])
def cluster(request, tmp_path_factory):
    spec = ClusterSpec(store=request.param, model=model_path(MODEL), router_port=0,
                       decode_workers=1, rows=2, drain_timeout_s=5.0, start_timeout_s=900.0,
                       log_dir=tmp_path_factory.mktemp(f"qwen-{request.param}"))
    with LocalCluster(spec) as running:
        yield running
        assert running.exited() == {}, "a member crashed"


def test_the_sdk_and_the_openai_api_answer_a_code_question(cluster, expected):
    messages = [{"role": "user", "content": QUESTION}]
    with SnapstreamClient(cluster.endpoints["router"], timeout_s=900) as client:
        info = client.info()
        done = client.chat(messages, max_new_tokens=NEW_TOKENS, temperature=0.0)
    assert info.has_chat_template
    assert done.text == expected
    openai = OpenAI(base_url=cluster.openai_url, api_key="unused", timeout=900)
    model = openai.models.list().data[0].id
    reply = openai.chat.completions.create(model=model, messages=messages,
                                           max_tokens=NEW_TOKENS, temperature=0)
    assert reply.choices[0].message.content == expected
