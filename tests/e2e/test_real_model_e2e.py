"""The cluster as processes on the real default model (SmolLM2-135M-Instruct): a chat answer,
and a passkey in real prose found with the cache at a quarter of the prompt."""

from __future__ import annotations

import pytest

from cli.demo import documentation
from cluster import ClusterSpec, LocalCluster
from snapstream.client import SnapstreamClient

pytestmark = pytest.mark.slow
PASSKEY = "71432"


@pytest.fixture(scope="module")
def router(tmp_path_factory) -> str:
    spec = ClusterSpec(store="redis", router_port=0, decode_workers=1, rows=2,
                       log_dir=tmp_path_factory.mktemp("cluster-logs"), drain_timeout_s=5.0)
    with LocalCluster(spec) as cluster:  # model None: the default model
        yield cluster.endpoints["router"]
        assert cluster.exited() == {}, "a member crashed"


def test_chat_answers_a_question(router):
    with SnapstreamClient(router, timeout_s=300) as client:
        info = client.info()
        # (asked the capital of France, the served int4 model and llama.cpp on the same GGUF
        # both start "L'Étoile, ...": a near-tie that only float32 activations tip to "The")
        completion = client.chat([{"role": "user", "content": "Name three primary colors."}],
                                 max_new_tokens=24, temperature=0.0)
    assert info.model_name.startswith("SmolLM2-135M-Instruct") and info.has_chat_template
    assert all(color in completion.text for color in ("Red", "Blue", "Yellow"))
    assert completion.finish_reason == "stop_token"  # <|im_end|> ends the turn


def test_passkey_in_real_prose_under_a_quarter_of_the_prompt(router):
    paragraphs = documentation("statistics").split("\n\n")[:40]  # ~1k tokens of real prose
    needle = f"The pass key is {PASSKEY}. Remember it. {PASSKEY} is the pass key."
    middle = len(paragraphs) // 2
    prompt = "\n\n".join([*paragraphs[:middle], needle, *paragraphs[middle:],
                          "What is the pass key? The pass key is"])
    with SnapstreamClient(router, timeout_s=300) as client:
        completion = client.generate(prompt, max_new_tokens=8, temperature=0.0,
                                     policy="snapstream", n_sink=4, n_topk=96, n_recent=128)
    assert completion.kv_cache_slots == 4 + 96 + 128 <= completion.prompt_tokens / 4
    assert completion.text.strip().startswith(PASSKEY)
