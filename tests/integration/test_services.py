"""Servicers in process, over real sockets and a real store: router -> prefill -> decode."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
import torch

from decode_svc.backends import BackendConfig, make_backend
from decode_svc.loop import DecodeLoop
from decode_svc.service import DecodeServicer
from kvstore import BlobStore, open_store
from kvstore.codec import BlobSpec
from kvstore.seal import ClusterSecret, Seal
from prefill_svc.prefix_store import PrefixStore, PrefixStoreConfig
from prefill_svc.service import PrefillServicer
from router.flow import RequestFlow
from router.main import load_served_model
from router.request import RequestLimits
from router.service import GenerationServicer
from router.tenants import TenantLimits
from router.workers import WorkerPool, poll_decode_stats
from serving.auth import ApiKeyInterceptor, ApiKeys
from serving.errors import StatusInterceptor
from serving.worker import blob_spec
from snapstream.engine import Engine
from snapstream.fingerprint import model_fingerprint
from snapstream.policy import CachePolicy
from snapstream.sampling_params import SamplingParams
from snapstream.v1 import (
    common_pb2,
    decode_pb2,
    decode_pb2_grpc,
    generation_pb2,
    generation_pb2_grpc,
    prefill_pb2,
    prefill_pb2_grpc,
)
from tests.tiny_models import random_model, tiny_config, write_hf_dir

SECRET = ClusterSecret(b"the test cluster's secret")  # every stack's workers share it
POLICY = common_pb2.CachePolicy(kind=common_pb2.POLICY_KIND_SNAPSTREAM, n_sink=4, n_topk=40,
                                n_recent=24, observation=8)
ENGINE_POLICY = CachePolicy(n_sink=4, n_topk=40, n_recent=24, observation=8)
TORCH = BackendConfig()


@pytest.fixture(scope="module")
def model_dir(tiny_model_dir) -> Path:
    return tiny_model_dir


@dataclass
class Stack:
    generation: generation_pb2_grpc.GenerationStub
    prefill: prefill_pb2_grpc.PrefillStub
    decode: decode_pb2_grpc.DecodeStub
    store: BlobStore
    loop: DecodeLoop
    engine: Engine
    decode_servicer: DecodeServicer
    channel: grpc.aio.Channel  # to the stack's one server
    router: RequestFlow  # the router's generation path, which the servicer serves


class RouterKeys(ApiKeyInterceptor):
    """The router's API keys on the stack's one server: its internal services ask for none."""

    async def intercept_service(self, continuation, handler_call_details):
        if not handler_call_details.method.startswith("/snapstream.v1.Generation/"):
            return await continuation(handler_call_details)
        return await super().intercept_service(continuation, handler_call_details)


@contextlib.asynccontextmanager
async def serving_stack(model_dir: Path, store_url: str,
                        backend: BackendConfig = TORCH, rows: int = 4, max_queue: int = 16,
                        prefill_queue: int = 8,
                        prefill_cls: type[PrefillServicer] = PrefillServicer,
                        kv_dtype: str | None = None, store_options: dict | None = None,
                        prefix_config: PrefixStoreConfig | None = None,
                        limits: RequestLimits | None = None,
                        tenant_limits: TenantLimits | None = None,
                        api_keys: ApiKeys | None = None) -> AsyncIterator[Stack]:
    """Router, prefill and decode servicers on one server; the router asks for ``api_keys``
    (a key's name is its tenant) when given."""
    engine = Engine.from_pretrained(model_dir, kv_dtype=kv_dtype)
    spec = blob_spec(engine)
    store = await open_store(store_url, **(store_options or {}))
    loop = DecodeLoop(engine, make_backend(backend, engine.config), rows=rows,
                      max_queue=max_queue)
    auth = [] if api_keys is None else [RouterKeys(api_keys)]
    server = grpc.aio.server(interceptors=[*auth, StatusInterceptor()])
    port = server.add_insecure_port("127.0.0.1:0")
    address = f"127.0.0.1:{port}"
    prefill = WorkerPool("prefill", (address,), prefill_pb2_grpc.PrefillStub, "least_outstanding")
    decode = WorkerPool("decode", (address,), decode_pb2_grpc.DecodeStub, "most_free_rows")
    model = load_served_model(model_dir, "snapstream", 16, limits)
    prefixes = PrefixStore(store, spec, SECRET, prefix_config or PrefixStoreConfig())
    prefill_pb2_grpc.add_PrefillServicer_to_server(
        prefill_cls(engine, store, spec, SECRET, blob_ttl_s=60, max_queue=prefill_queue,
                    prefixes=prefixes), server)
    decode_servicer = DecodeServicer(loop, store, spec, SECRET)
    decode_pb2_grpc.add_DecodeServicer_to_server(decode_servicer, server)
    router = RequestFlow(model, prefill, decode, tenant_limits)
    generation_pb2_grpc.add_GenerationServicer_to_server(GenerationServicer(router, api_keys),
                                                         server)
    await server.start()
    loop.start()
    await prefill.refresh()
    await decode.refresh()
    poller = asyncio.create_task(poll_decode_stats(decode, 0.05, 60))
    channel = grpc.aio.insecure_channel(address)
    try:
        yield Stack(generation_pb2_grpc.GenerationStub(channel),
                    prefill_pb2_grpc.PrefillStub(channel), decode_pb2_grpc.DecodeStub(channel),
                    store, loop, engine, decode_servicer, channel, router)
    finally:
        poller.cancel()
        await channel.close()
        await server.stop(grace=None)
        loop.stop()
        await prefill.close()
        await decode.close()
        await store.close()


async def collect(stub, request, timeout: float | None = None
                  ) -> tuple[list[int], str, generation_pb2.GenerateComplete]:
    ids, text, complete = [], "", None
    async for response in stub.Generate(request, timeout=timeout):
        if response.HasField("complete"):
            complete = response.complete
        else:
            ids += list(response.chunk.token_ids)
            text += response.chunk.text
    return ids, text, complete


async def wait_idle(stack: Stack) -> None:
    for _ in range(200):
        if stack.loop.stats().running == 0 and not await stack.store.keys():
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"not idle: {stack.loop.stats()}, keys {await stack.store.keys()}")


PROMPTS = ["The quick brown fox " * 12, "x", "naïve café — 東京 " * 5, "0123456789" * 40]


async def test_concurrent_greedy_streams_equal_the_engine(model_dir, url):
    async with serving_stack(model_dir, url) as stack:
        requests = [generation_pb2.GenerateRequest(prompt=p, max_new_tokens=12, policy=POLICY)
                    for p in PROMPTS * 2]
        results = await asyncio.gather(*(collect(stack.generation, r) for r in requests))
        for prompt, (ids, text, complete) in zip(PROMPTS * 2, results, strict=True):
            expected = stack.engine.generate(prompt, 12, policy=ENGINE_POLICY)
            assert ids == expected.token_ids
            assert text == expected.text
            assert complete.completion_tokens == len(ids)
        await wait_idle(stack)  # every blob deleted, every row free


async def _long_stream_under_way(stack, prompt: str):
    """A 500-token stream, returned once its first 3 tokens have arrived."""
    call = stack.generation.Generate(generation_pb2.GenerateRequest(
        prompt=prompt, max_new_tokens=500, policy=POLICY))
    seen = 0
    async for response in call:
        seen += len(response.chunk.token_ids)
        if seen >= 3:
            return call
    raise AssertionError(f"the stream ended after {seen} tokens")


async def test_cancelled_stream_frees_its_row_and_blob(model_dir, url):
    async with serving_stack(model_dir, url) as stack:
        call = await _long_stream_under_way(stack, "cancel me " * 20)
        assert stack.loop.stats().running == 1
        call.cancel()
        await wait_idle(stack)


async def test_deadline_frees_its_row_and_blob(model_dir, url):
    async with serving_stack(model_dir, url) as stack:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await collect(stack.generation, generation_pb2.GenerateRequest(
                prompt="slow " * 20, max_new_tokens=1000, policy=POLICY), timeout=0.3)
        assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        await wait_idle(stack)


@pytest.mark.parametrize(("request_fields", "message"), [
    ({"prompt": ""}, "prompt is empty"),
    ({}, "input"),
    ({"prompt": "a" * 2100}, "context"),
    ({"prompt": "hi", "max_new_tokens": 0}, "max_new_tokens"),
    ({"prompt": "hi", "policy": common_pb2.CachePolicy(n_topk=5000)}, "budget"),
    ({"prompt": "hi", "policy": common_pb2.CachePolicy(kernel=4)}, "kernel"),
    ({"prompt": "long " * 300, "policy": common_pb2.CachePolicy(
        kernel=2**32 - 1, pooling=common_pb2.POOLING_MAX)}, "kernel must be at most"),
    ({"prompt": "hi", "sampling": common_pb2.SamplingParams(temperature=float("nan"))},
     "temperature"),
    ({"prompt": "hi", "sampling": common_pb2.SamplingParams(temperature=-1)}, "temperature"),
    ({"prompt": "hi", "sampling": common_pb2.SamplingParams(top_p=1.5)}, "top_p"),
    ({"prompt": "hi", "policy": common_pb2.CachePolicy(kind=common_pb2.POLICY_KIND_FULL),
      "max_new_tokens": 2047}, "growing policy"),
])
async def test_bad_requests_are_invalid_argument(model_dir, redis_url, request_fields, message):
    async with serving_stack(model_dir, redis_url) as stack:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await collect(stack.generation, generation_pb2.GenerateRequest(**request_fields))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert message in err.value.details()
        await wait_idle(stack)


async def test_stop_string_cuts_text_and_ends_stream(model_dir, redis_url):
    async with serving_stack(model_dir, redis_url) as stack:
        _, free_text, _ = await collect(stack.generation, generation_pb2.GenerateRequest(
            prompt="abc " * 10, max_new_tokens=16, policy=POLICY))
        stop = free_text[5:7]
        _, text, complete = await collect(stack.generation, generation_pb2.GenerateRequest(
            prompt="abc " * 10, max_new_tokens=16, policy=POLICY,
            sampling=common_pb2.SamplingParams(stop=[stop])))
        assert text == free_text[: free_text.index(stop)]
        assert complete.finish_reason == common_pb2.FINISH_REASON_STOP_STRING
        await wait_idle(stack)


@pytest.mark.parametrize("ending", ["max_new_tokens", "stop_token", "stop_string"])
async def test_a_generation_that_ends_at_its_first_token_leaves_no_blob(model_dir, redis_url,
                                                                        ending):
    """No decode stream consumes such a blob: the router releases it through the prefill
    worker."""
    async with serving_stack(model_dir, redis_url) as stack:
        prompt = "abc " * 10
        first = stack.engine.generate(prompt, 1, policy=ENGINE_POLICY)
        fields, reason = {
            "max_new_tokens": ({"max_new_tokens": 1}, common_pb2.FINISH_REASON_LENGTH),
            "stop_token": ({"sampling": common_pb2.SamplingParams(
                stop_token_ids=first.token_ids)}, common_pb2.FINISH_REASON_STOP_TOKEN),
            "stop_string": ({"sampling": common_pb2.SamplingParams(stop=[first.text])},
                            common_pb2.FINISH_REASON_STOP_STRING),
        }[ending]
        ids, _, complete = await collect(stack.generation, generation_pb2.GenerateRequest(
            prompt=prompt, policy=POLICY, **{"max_new_tokens": 16, **fields}))
        assert ids == first.token_ids
        assert complete.finish_reason == reason
        await wait_idle(stack)


async def test_release_of_a_malformed_key_is_invalid_argument(model_dir, redis_url):
    async with serving_stack(model_dir, redis_url) as stack:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stack.prefill.Release(prefill_pb2.ReleaseRequest(blob_key="no/slashes"))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "blob key" in err.value.details()


@pytest.mark.parametrize("sampling", [SamplingParams(), SamplingParams(temperature=0.9, seed=5)])
async def test_decode_resumes_from_blob_plus_streamed_tokens(model_dir, redis_url, sampling):
    """What the router does on failover: the resumed stream continues token-identically."""
    from serving.convert import sampling_to_pb

    async with serving_stack(model_dir, redis_url) as stack:
        full = await collect(stack.generation, generation_pb2.GenerateRequest(
            prompt="resume " * 20, max_new_tokens=20, policy=POLICY,
            sampling=sampling_to_pb(sampling)))
        ids = full[0]
        engine = stack.engine
        result = engine.prefill(engine.encode("resume " * 20), ENGINE_POLICY, 20,
                                capacity=engine.context_len)
        from kvstore.codec import encode_blob

        spec = blob_spec(engine)
        await stack.store.put("resume-key", encode_blob(result.cache, spec,
                                                        Seal(SECRET, "resume-key")), ttl_s=60)
        resumed = []
        async for message in stack.decode.Decode(decode_pb2.DecodeRequest(
                request_id="r", blob_key="resume-key", first_token_id=ids[0],
                generated_token_ids=ids[1:7], sampling=sampling_to_pb(sampling),
                max_new_tokens=20)):
            resumed += list(message.chunk.token_ids)
        assert ids[:7] + resumed == ids
        await wait_idle(stack)


@pytest.mark.parametrize("kv_dtype", ["int8", "float8_e4m3fn"])
async def test_an_8_bit_kv_stream_resumes_token_identically(model_dir, redis_url, kv_dtype):
    """Workers with an 8-bit KV cache: the stream equals the in-process engine's of that KV
    dtype, its blob holds that dtype's rows (int8: codes + scales; fp8: values alone), and a
    decode worker resuming from that blob plus the streamed tokens continues it token for
    token."""
    from kvstore.codec import decode_blob, encode_blob
    from snapstream.kvquant import kv_codec

    async with serving_stack(model_dir, redis_url, kv_dtype=kv_dtype) as stack:
        engine = stack.engine
        assert engine.kv_dtype == getattr(torch, kv_dtype)
        ids, _, _ = await collect(stack.generation, generation_pb2.GenerateRequest(
            prompt="resume " * 30, max_new_tokens=24, policy=POLICY))
        prompt = engine.encode("resume " * 30)
        assert ids == engine.generate(prompt, 24, ENGINE_POLICY).token_ids
        result = engine.prefill(prompt, ENGINE_POLICY, 24, capacity=engine.context_len)
        spec = blob_spec(engine)
        blob = encode_blob(result.cache, spec, Seal(SECRET, "resume-key"))
        (part,) = decode_blob(blob, spec, Seal(SECRET, "resume-key", None)).groups
        width = kv_codec(engine.kv_dtype).row_width(engine.config.head_dim)
        assert part.k.dtype == engine.kv_dtype and part.k.shape[-1] == width
        await stack.store.put("resume-key", blob, ttl_s=60)
        resumed = []
        async for message in stack.decode.Decode(decode_pb2.DecodeRequest(
                request_id="r", blob_key="resume-key", first_token_id=ids[0],
                generated_token_ids=ids[1:9], max_new_tokens=24)):
            resumed += list(message.chunk.token_ids)
        assert ids[:9] + resumed == ids
        await wait_idle(stack)


async def test_blob_from_another_model_is_failed_precondition(model_dir, redis_url, tmp_path):
    other_dir = tmp_path / "other"
    write_hf_dir(other_dir, random_model(tiny_config(max_position_embeddings=1024), seed=99))
    other = Engine.from_pretrained(other_dir)
    from kvstore.codec import encode_blob

    cache = other.prefill([1, 2, 3], ENGINE_POLICY, 4).cache
    blob = encode_blob(cache, BlobSpec.for_model(other.config, model_fingerprint(other.model),
                                                 other.dtype), Seal(SECRET, "foreign"))
    async with serving_stack(model_dir, redis_url) as stack:
        await stack.store.put("foreign", blob, ttl_s=60)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            async for _ in stack.decode.Decode(decode_pb2.DecodeRequest(
                    request_id="f", blob_key="foreign", first_token_id=1, max_new_tokens=4)):
                pass
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "model" in err.value.details()
        await wait_idle(stack)


async def test_sn40l_sim_backend_reports_simulated_time(model_dir, redis_url):
    async with serving_stack(model_dir, redis_url, BackendConfig("sn40l-sim")) as stack:
        ids, _, complete = await collect(stack.generation, generation_pb2.GenerateRequest(
            prompt="simulate " * 10, max_new_tokens=8, policy=POLICY))
        assert ids == stack.engine.generate("simulate " * 10, 8, policy=ENGINE_POLICY).token_ids
        assert complete.simulated_decode_time.ToNanoseconds() > 0


async def test_a_layout_that_does_not_fit_the_simulated_target_fails_cleanly(model_dir,
                                                                               redis_url):
    """The simulated SN40L (1 socket) cannot hold Llama-3.1-70B: the stream ends with
    FAILED_PRECONDITION naming the tier, and the worker stays usable."""
    big = BackendConfig("sn40l-sim", sim_target="llama-3.1-70b", sim_sockets=1)
    async with serving_stack(model_dir, redis_url, big) as stack:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await collect(stack.generation, generation_pb2.GenerateRequest(
                prompt="too big " * 5, max_new_tokens=4, policy=POLICY))
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "HBM" in err.value.details()
        await wait_idle(stack)


def test_worker_addresses_expand_dns_names():
    from router.workers import _resolve

    assert _resolve("localhost:50099") == ["127.0.0.1:50099"]
    assert _resolve("127.0.0.1:1234") == ["127.0.0.1:1234"]
    assert _resolve("no-such-host.invalid:1") == []


async def test_draining_worker_refuses_new_streams_and_keeps_cut_off_blobs(model_dir, redis_url):
    async with serving_stack(model_dir, redis_url) as stack:
        prefilled = await stack.prefill.Prefill(prefill_pb2.PrefillRequest(
            request_id="drained", prompt_token_ids=stack.engine.encode("drain " * 20),
            policy=POLICY, max_new_tokens=500))
        call = stack.decode.Decode(decode_pb2.DecodeRequest(  # as the router calls it
            request_id="drained", blob_key=prefilled.blob_key,
            first_token_id=prefilled.first_token_id, max_new_tokens=500))
        await call.read()
        stack.decode_servicer.start_draining()
        stats = await stack.decode.Stats(decode_pb2.StatsRequest())
        assert stats.free_rows == 0 and stats.running == 1
        call.cancel()  # the stream is cut while the worker drains
        for _ in range(100):
            if stack.loop.stats().running == 0:
                break
            await asyncio.sleep(0.02)
        assert stack.loop.stats().running == 0
        assert await stack.store.keys() == [prefilled.blob_key]  # kept for the resuming worker
        with pytest.raises(grpc.aio.AioRpcError) as err:
            async for _ in stack.decode.Decode(decode_pb2.DecodeRequest(
                    request_id="late", blob_key=prefilled.blob_key,
                    first_token_id=1, max_new_tokens=4)):
                pass
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        await stack.store.delete(prefilled.blob_key)  # the store is shared with later tests
