"""The internal Prefill RPC: the router validated the request's fields, so a message sent past
it is refused (INVALID_ARGUMENT, nothing stored) only where the engine could not run it; and
the blob goes where its caller asks."""

from __future__ import annotations

import grpc
import pytest

from kvstore import new_blob_key
from prefill_svc.service import PrefillServicer
from snapstream.memory_plan import PrefillMemory, prefill_activation_bytes
from snapstream.v1 import common_pb2, prefill_pb2
from tests.integration.test_services import POLICY, serving_stack


@pytest.mark.parametrize(("fields", "message"), [
    ({"policy": common_pb2.CachePolicy(kind=common_pb2.POLICY_KIND_SNAPSTREAM, n_sink=4,
                                       n_topk=40, n_recent=24, observation=8, kernel=2**32 - 1,
                                       pooling=common_pb2.POOLING_MAX)},
     "kernel must be at most the model's context of"),
    ({"policy": common_pb2.CachePolicy(kind=common_pb2.POLICY_KIND_SNAPSTREAM, n_sink=4,
                                       n_topk=2**32 - 1, n_recent=24, observation=8)},
     "exceeds the model's context"),
    ({"prompt_token_ids": [1, 2, 10**6]}, "outside the vocabulary"),
    ({"prompt_token_ids": []}, "prompt is empty"),
    ({"blob_key": "no/slashes"}, "blob key"),
    ({"prompt_token_ids": [1, 2, 3], "prefix_tokens": 3}, "prefix_tokens (3) must be less"),
    ({"prefix_tokens": 2, "policy": common_pb2.CachePolicy(kind=common_pb2.POLICY_KIND_FULL)},
     "cache_prefix needs a policy that bounds the cache"),
    ({"prefix_tokens": 2, "speculative": common_pb2.SpeculativeSettings(keep=0.5)},
     "prefix_tokens and speculative cannot be combined"),
])
async def test_bad_prefill_requests_are_invalid_argument(tiny_model_dir, redis_url, fields,
                                                         message):
    request = {"request_id": "bad", "prompt_token_ids": [3 + i % 250 for i in range(300)],
               "policy": POLICY,
               "max_new_tokens": 8, **fields}
    async with serving_stack(tiny_model_dir, redis_url) as stack:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stack.prefill.Prefill(prefill_pb2.PrefillRequest(**request), timeout=30)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert message in err.value.details()
        assert await stack.store.keys() == []


async def test_the_blob_goes_where_the_caller_asks(tiny_model_dir, redis_url):
    key = new_blob_key()
    async with serving_stack(tiny_model_dir, redis_url) as stack:
        response = await stack.prefill.Prefill(prefill_pb2.PrefillRequest(
            request_id="keyed", prompt_token_ids=[5, 6, 7], policy=POLICY, max_new_tokens=4,
            blob_key=key))
        assert response.blob_key == key
        assert await stack.store.keys() == [key]
        await stack.store.delete(key)


class TightPrefill(PrefillServicer):
    """A prefill worker whose memory limit leaves room for the activations of 100 prompt
    tokens beside what it holds."""

    def __init__(self, engine, *args, **kwargs) -> None:
        super().__init__(engine, *args, **kwargs)
        held = 1 << 30
        room = prefill_activation_bytes(engine.config, 100, engine.prefill_dtype)
        self.memory = PrefillMemory(config=engine.config, dtype=engine.prefill_dtype,
                                    limit=held + room, weights=held // 2, gemm_weights=0,
                                    held=held)


async def test_a_prompt_whose_activations_do_not_fit_is_resource_exhausted(tiny_model_dir,
                                                                          redis_url):
    """Refused before it queues or runs (nothing stored), with the retry hint; what fits runs."""
    async with serving_stack(tiny_model_dir, redis_url, prefill_cls=TightPrefill) as stack:
        request = prefill_pb2.PrefillRequest(request_id="long", policy=POLICY, max_new_tokens=4,
                                             prompt_token_ids=[3 + i % 250 for i in range(101)])
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stack.prefill.Prefill(request, timeout=30)
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "a prompt of 101 tokens" in err.value.details()
        assert "admits prompts up to 100 tokens" in err.value.details()
        assert ("retry-after", "1") in tuple(err.value.trailing_metadata())
        assert await stack.store.keys() == []
        del request.prompt_token_ids[100:]
        response = await stack.prefill.Prefill(request, timeout=30)
        assert response.prompt_tokens == 100
        await stack.store.delete(response.blob_key)
