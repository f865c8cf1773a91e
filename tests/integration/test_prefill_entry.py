"""The internal Prefill RPC: the router validated the request's fields, so a message sent past
it is refused (INVALID_ARGUMENT, nothing stored) only where the engine could not run it; and
the blob goes where its caller asks."""

from __future__ import annotations

import grpc
import pytest

from kvstore import new_blob_key
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
