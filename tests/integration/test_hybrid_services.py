"""A hybrid model (Gemma 3 in miniature: sliding-window + global layers) through the services,
over real sockets and real stores: rows join and leave the decode pool, a stream resumes from
its blob, prefill reports the global layers' slots, and the SN40L simulation back end serves it.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from decode_svc.backends import BackendConfig
from kvstore.codec import decode_blob, encode_blob
from kvstore.seal import Seal
from serving.convert import sampling_to_pb
from serving.worker import blob_spec
from snapstream.policy import CachePolicy
from snapstream.sampling_params import SamplingParams
from snapstream.v1 import common_pb2, decode_pb2, generation_pb2, prefill_pb2
from tests.integration.test_services import (
    ENGINE_POLICY,
    POLICY,
    SECRET,
    collect,
    serving_stack,
    wait_idle,
)
from tests.tiny_models import random_model, tiny_gemma3_config, write_hf_dir

# shorter than the window (16), between it and the global budget (68), past both
PROMPTS = ["hi there", "0123456789" * 4, "The quick brown fox " * 12, "naïve café — 東京 " * 9]
FULL = common_pb2.CachePolicy(kind=common_pb2.POLICY_KIND_FULL)
NEW_TOKENS = 40  # each generation crosses the window at least twice


@pytest.fixture(scope="module")
def gemma_dir(tmp_path_factory) -> Path:
    return write_hf_dir(tmp_path_factory.mktemp("tiny-gemma3"),
                        random_model(tiny_gemma3_config(), seed=4))


async def test_rows_join_and_leave_and_every_stream_equals_the_engine(gemma_dir, url):
    """Eight streams through two decode rows (a pool per layout: snapstream and full): each
    joins as a row frees, and each answer equals the in-process engine's."""
    async with serving_stack(gemma_dir, url, rows=2) as stack:
        requests = [generation_pb2.GenerateRequest(prompt=p, max_new_tokens=NEW_TOKENS,
                                                   policy=policy)
                    for p in PROMPTS for policy in (POLICY, FULL)]
        results = await asyncio.gather(*(collect(stack.generation, r) for r in requests))
        engine = stack.engine
        assert engine.config.sliding_layers == (0, 1, 3, 4)
        for request, (ids, text, _) in zip(requests, results, strict=True):
            policy = ENGINE_POLICY if request.policy == POLICY else CachePolicy(kind="full")
            expected = engine.generate(request.prompt, NEW_TOKENS, policy=policy)
            assert (ids, text) == (expected.token_ids, expected.text)
        await wait_idle(stack)


async def test_prefill_reports_the_global_layers_slots_and_a_two_group_blob(gemma_dir,
                                                                            redis_url):
    async with serving_stack(gemma_dir, redis_url) as stack:
        engine, spec = stack.engine, blob_spec(stack.engine)
        ids = engine.encode(PROMPTS[2])
        reply = await stack.prefill.Prefill(prefill_pb2.PrefillRequest(
            request_id="p", prompt_token_ids=ids, policy=POLICY, max_new_tokens=8))
        assert reply.cache_slots == ENGINE_POLICY.budget  # the global layers' budget
        cache = decode_blob(await stack.store.get(reply.blob_key), spec,
                            Seal(SECRET, reply.blob_key, None))
        global_part, sliding = cache.groups
        assert (global_part.group.layers, sliding.group.layers) == ((2,), (0, 1, 3, 4))
        assert sliding.k.shape[2] == engine.config.sliding_window  # the window, whole
        assert reply.blob_size == spec.blob_size(cache.layout)
        await stack.prefill.Release(prefill_pb2.ReleaseRequest(blob_key=reply.blob_key))
        await wait_idle(stack)


@pytest.mark.parametrize("sampling", [SamplingParams(), SamplingParams(temperature=0.9, seed=5)])
async def test_a_stream_resumes_from_its_blob_plus_the_streamed_tokens(gemma_dir, redis_url,
                                                                       sampling):
    """Failover on a hybrid model: the blob (both layer groups at the end of the prompt) plus
    the tokens already streamed, replayed through both rings, continue token-identically."""
    prompt = PROMPTS[2]
    async with serving_stack(gemma_dir, redis_url) as stack:
        whole, _, _ = await collect(stack.generation, generation_pb2.GenerateRequest(
            prompt=prompt, max_new_tokens=NEW_TOKENS, policy=POLICY,
            sampling=sampling_to_pb(sampling)))
        engine = stack.engine
        result = engine.prefill(engine.encode(prompt), ENGINE_POLICY, NEW_TOKENS,
                                capacity=engine.context_len)
        await stack.store.put("resume-key", encode_blob(result.cache, blob_spec(engine),
                                                        Seal(SECRET, "resume-key")), ttl_s=60)
        streamed = 25  # past the sliding window: the replay wraps its ring
        resumed = []
        async for message in stack.decode.Decode(decode_pb2.DecodeRequest(
                request_id="r", blob_key="resume-key", first_token_id=whole[0],
                generated_token_ids=whole[1:streamed], sampling=sampling_to_pb(sampling),
                max_new_tokens=NEW_TOKENS)):
            resumed += list(message.chunk.token_ids)
        assert whole[:streamed] + resumed == whole
        await wait_idle(stack)


async def test_the_sn40l_simulation_back_end_serves_a_hybrid_model(gemma_dir, redis_url):
    async with serving_stack(gemma_dir, redis_url, BackendConfig("sn40l-sim")) as stack:
        ids, _, complete = await collect(stack.generation, generation_pb2.GenerateRequest(
            prompt=PROMPTS[3], max_new_tokens=12, policy=POLICY))
        assert ids == stack.engine.generate(PROMPTS[3], 12, policy=ENGINE_POLICY).token_ids
        assert complete.simulated_decode_time.ToNanoseconds() > 0
        await wait_idle(stack)
