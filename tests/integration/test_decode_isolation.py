"""One bad row never takes its neighbours down: the step loop over a real engine, and the
decode worker's entry checks over real gRPC and a real store."""

from __future__ import annotations

import asyncio
from collections import deque

import grpc
import pytest

from decode_svc.backends import BackendConfig, make_backend
from decode_svc.loop import DecodeLoop
from decode_svc.sequence import Sequence, StreamSink
from snapstream.engine import Engine
from snapstream.sampling_params import SamplingParams
from snapstream.v1 import common_pb2, decode_pb2, generation_pb2, prefill_pb2
from tests.integration.test_services import ENGINE_POLICY, POLICY, collect, serving_stack, wait_idle

PROMPTS = ["one two three " * 6, "four five " * 9, "six " * 20]


async def decode_in_loop(loop: DecodeLoop, engine: Engine, prompt: str,
                         sampling: SamplingParams, new_tokens: int) -> list[int] | Exception:
    """``prompt`` prefilled by ``engine`` and decoded by ``loop`` -> its tokens (the first one
    included), or the error that ended it."""
    ids = engine.encode(prompt)
    result = engine.prefill(ids, ENGINE_POLICY, new_tokens, capacity=engine.context_len)
    first = int(result.logits.argmax())
    sink = StreamSink.here()
    seq = Sequence(request_id=prompt, prompt_len=len(ids), next_position=len(ids),
                   replay=deque([first]), max_new_tokens=new_tokens, emitted=1,
                   sampling=sampling, stop_ids=frozenset(), sink=sink)
    loop.submit(seq, result.cache)
    tokens = [first]
    while True:
        event = await sink.queue.get()
        if event.error is not None:
            return event.error
        tokens.append(event.token_id)
        if event.finish_reason is not None:
            return tokens


async def test_a_row_whose_sampling_fails_ends_alone(tiny_model_dir):
    engine = Engine.from_pretrained(tiny_model_dir)
    loop = DecodeLoop(engine, make_backend(BackendConfig(), engine.config), rows=4,
                      max_queue=8)
    loop.start()
    try:
        unseeded = SamplingParams(temperature=1.0)  # sample_row refuses it: no seed
        results = await asyncio.gather(
            *(decode_in_loop(loop, engine, p, SamplingParams(), 12) for p in PROMPTS),
            decode_in_loop(loop, engine, "poison " * 10, unseeded, 12))
    finally:
        loop.stop()
    *normal, poisoned = results
    assert isinstance(poisoned, ValueError) and "seed" in str(poisoned)
    for prompt, tokens in zip(PROMPTS, normal, strict=True):
        assert tokens == engine.generate(prompt, 12, policy=ENGINE_POLICY).token_ids
    assert loop.stats().running == 0


@pytest.mark.parametrize("temperature", [2.17e-38, 1e-38, 1e-45])
async def test_a_tiny_temperature_samples_and_spares_its_batch(tiny_model_dir, redis_url,
                                                               temperature):
    async with serving_stack(tiny_model_dir, redis_url) as stack:
        requests = [generation_pb2.GenerateRequest(prompt=p, max_new_tokens=12, policy=POLICY)
                    for p in PROMPTS]
        tiny = generation_pb2.GenerateRequest(
            prompt="tiny " * 10, max_new_tokens=12, policy=POLICY,
            sampling=common_pb2.SamplingParams(temperature=temperature))
        *results, (tiny_ids, _, tiny_complete) = await asyncio.gather(
            *(collect(stack.generation, r) for r in [*requests, tiny]))
        for prompt, (ids, _, _) in zip(PROMPTS, results, strict=True):
            assert ids == stack.engine.generate(prompt, 12, policy=ENGINE_POLICY).token_ids
        # near-greedy: the sampled tokens are the argmax ones
        assert tiny_ids == stack.engine.generate("tiny " * 10, 12, policy=ENGINE_POLICY).token_ids
        assert tiny_complete.completion_tokens == len(tiny_ids)
        await wait_idle(stack)


async def _prefilled(stack, prompt: str) -> prefill_pb2.PrefillResponse:
    return await stack.prefill.Prefill(prefill_pb2.PrefillRequest(
        request_id=prompt, prompt_token_ids=stack.engine.encode(prompt), policy=POLICY,
        max_new_tokens=8))


@pytest.mark.parametrize("field", ["first_token_id", "generated_token_ids",
                                   "sampling.stop_token_ids"])
async def test_an_out_of_vocabulary_token_is_invalid_argument(tiny_model_dir, redis_url, field):
    async with serving_stack(tiny_model_dir, redis_url) as stack:
        prefilled = await _prefilled(stack, "vocabulary " * 8)
        vocab = stack.engine.config.vocab_size
        request = decode_pb2.DecodeRequest(request_id="oov", blob_key=prefilled.blob_key,
                                           first_token_id=prefilled.first_token_id,
                                           max_new_tokens=8)
        if field == "first_token_id":
            request.first_token_id = vocab
        elif field == "generated_token_ids":
            request.generated_token_ids.append(vocab + 7)
        else:
            request.sampling.stop_token_ids.append(2**32 - 1)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            async for _ in stack.decode.Decode(request):
                pass
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert field in err.value.details() and f"[0, {vocab})" in err.value.details()
        assert prefilled.blob_key in await stack.store.keys()  # left for a valid request
        await stack.store.delete(prefilled.blob_key)


async def test_a_worker_that_refuses_a_sequence_leaves_its_blob(tiny_model_dir, redis_url):
    """RESOURCE_EXHAUSTED must not delete the blob: the next worker needs it."""
    async with serving_stack(tiny_model_dir, redis_url, max_queue=0) as stack:
        prefilled = await _prefilled(stack, "refused " * 8)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            async for _ in stack.decode.Decode(decode_pb2.DecodeRequest(
                    request_id="full", blob_key=prefilled.blob_key,
                    first_token_id=prefilled.first_token_id, max_new_tokens=8)):
                pass
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert stack.store.janitor.pending == 0  # no delete was asked for
        assert prefilled.blob_key in await stack.store.keys()
        await stack.store.delete(prefilled.blob_key)

