"""Gemma 3 270M served end to end, on both stores: the cluster's greedy answers equal the
in-process engine's, through the SDK and the OpenAI API, streaming or not, for a prompt
shorter and one longer than the sliding layers' window."""

from __future__ import annotations

import pytest
from openai import OpenAI

from cli.demo import documentation
from cluster import ClusterSpec, LocalCluster
from snapstream import CachePolicy, Engine, SamplingParams
from snapstream.checkpoints.registry import model_path
from snapstream.client import SnapstreamClient

pytestmark = pytest.mark.slow
PROMPT = "The capital of France is"
# longer than the sliding layers' 512-token window; the global layers' budget (256) is shorter
# than the window: the sliding layers keep their whole window beside it (layer groups)
LONG_PROMPT = "\n\n".join(documentation("statistics").split("\n\n")[:24])
POLICY = CachePolicy(kind="snapstream", n_sink=4, n_topk=124, n_recent=128, observation=16,
                     kernel=7)


@pytest.fixture(scope="module")
def engine() -> Engine:
    return Engine.from_pretrained("gemma3-270m")


@pytest.fixture(scope="module", params=["redis", "nats"])
def cluster(request, tmp_path_factory):
    spec = ClusterSpec(store=request.param, model=model_path("gemma3-270m"), router_port=0,
                       decode_workers=1, rows=2, drain_timeout_s=5.0, start_timeout_s=600.0,
                       log_dir=tmp_path_factory.mktemp(f"gemma3-{request.param}"))
    with LocalCluster(spec) as running:
        yield running
        assert running.exited() == {}, "a member crashed"


def _policy_args() -> dict:
    return {"policy": POLICY.kind, "n_sink": POLICY.n_sink, "n_topk": POLICY.n_topk,
            "n_recent": POLICY.n_recent, "observation": POLICY.observation, "kernel": POLICY.kernel}


@pytest.mark.parametrize("prompt", [PROMPT, LONG_PROMPT], ids=["short", "past-the-window"])
def test_the_cluster_decodes_as_the_engine(cluster, engine, prompt):
    expected = engine.generate(prompt, max_new_tokens=12, policy=POLICY,
                               sampling=SamplingParams(temperature=0))
    with SnapstreamClient(cluster.endpoints["router"], timeout_s=300) as client:
        info = client.info()
        done = client.generate(prompt, max_new_tokens=12, temperature=0.0, **_policy_args())
    assert info.model_name.startswith("gemma-3-270m") and not info.has_chat_template
    assert (done.text, done.finish_reason) == (expected.text, expected.finish_reason)
    assert done.kv_cache_slots == POLICY.n_sink + POLICY.n_topk + POLICY.n_recent
    if prompt is LONG_PROMPT:  # compressed, and longer than the window
        assert done.prompt_tokens > max(done.kv_cache_slots, engine.config.sliding_window)


def test_the_openai_api_streams_what_it_answers(cluster, engine):
    expected = engine.generate(PROMPT, max_new_tokens=12, policy=engine.default_policy,
                               sampling=SamplingParams(temperature=0)).text
    client = OpenAI(base_url=cluster.openai_url, api_key="unused")
    model = client.models.list().data[0].id
    whole = client.completions.create(model=model, prompt=PROMPT, max_tokens=12, temperature=0)
    streamed = "".join(chunk.choices[0].text for chunk in client.completions.create(
        model=model, prompt=PROMPT, max_tokens=12, temperature=0, stream=True))
    assert whole.choices[0].text == streamed == expected
