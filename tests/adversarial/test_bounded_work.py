"""Work a request can make the servers do is bounded: every per-request knob that costs
compute has a server-side maximum, refused at the router (400 naming the limit) before any
prefill; a request the cluster was not started for is refused naming the flag; and a cancelled
request's draft and prefill work stops at its next layer or look-ahead step."""

from __future__ import annotations

import asyncio
import threading
from typing import ClassVar

import grpc
import openai
import pytest
import pytest_asyncio

from prefill_svc.service import PrefillServicer
from router.request import RequestLimits
from snapstream.cancel import Cancelled
from snapstream.specprefill.selector import DraftSelector
from snapstream.v1 import common_pb2, generation_pb2
from tests.adversarial.conftest import KEYS, Keyed, keyed_stack
from tests.integration.test_services import POLICY, wait_idle

pytestmark = pytest.mark.asyncio(loop_scope="module")
DOCUMENT = " ".join(f"Item {i} costs {i * 37 % 1000} coins." for i in range(60))
LIMITS = RequestLimits(max_new_tokens=64, look_ahead=16, chunk_size=64)


class CountedPrefill(PrefillServicer):
    calls = 0

    async def Prefill(self, request, context):
        CountedPrefill.calls += 1
        return await super().Prefill(request, context)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def keyed(tiny_model_dir, redis_url):
    async with keyed_stack(tiny_model_dir, redis_url, limits=LIMITS,
                           prefill_cls=CountedPrefill) as served:
        yield served


def speculative(**settings) -> dict:
    return {"snapstream": {"speculative": settings}}


@pytest.mark.parametrize(("body", "param", "limit"), [
    (speculative(look_ahead=4294967295), "speculative.look_ahead", "--limit-look-ahead"),
    (speculative(look_ahead=17), "speculative.look_ahead", "--limit-look-ahead"),
    (speculative(chunk_size=65), "speculative.chunk_size", "--limit-chunk-size"),
    (speculative(keep=1.00000001), "snapstream.speculative.keep", "(0, 1]"),
    ({"max_tokens": 65}, "max_new_tokens", "--limit-max-new-tokens"),
])
async def test_a_knob_past_its_limit_is_400_naming_it_before_any_work(keyed: Keyed, body,
                                                                      param, limit):
    before = CountedPrefill.calls
    extra = {key: value for key, value in body.items() if key != "max_tokens"}
    with pytest.raises(openai.BadRequestError) as err:
        await keyed.client("alice").completions.create(
            model=keyed.model, prompt=DOCUMENT, max_tokens=body.get("max_tokens", 4),
            extra_body=extra)
    assert err.value.status_code == 400
    assert err.value.body["param"] == param and limit in err.value.message
    assert CountedPrefill.calls == before  # refused at the router: no prefill worker saw it


async def test_the_same_limits_hold_over_grpc(keyed: Keyed):
    request = generation_pb2.GenerateRequest(
        prompt=DOCUMENT, max_new_tokens=4, policy=POLICY,
        speculative=common_pb2.SpeculativeSettings(look_ahead=4294967295))
    with pytest.raises(grpc.aio.AioRpcError) as err:
        async for _ in keyed.stack.generation.Generate(request, metadata=(
                ("authorization", f"Bearer {KEYS['bob']}"),)):
            pass
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "--limit-look-ahead" in err.value.details()


async def test_speculation_without_a_draft_is_412_naming_the_flag(keyed: Keyed):
    with pytest.raises(openai.APIStatusError) as err:
        await keyed.client("alice").completions.create(
            model=keyed.model, prompt=DOCUMENT, max_tokens=4, extra_body=speculative(keep=0.5))
    assert err.value.status_code == 412 and "--draft-model" in err.value.message
    await wait_idle(keyed.stack)


class GatedPrefill(PrefillServicer):
    """Its model thread waits for ``go`` before the work starts, and records how the work
    ended: the window in which a client cancels a running draft."""

    started = threading.Event()
    go = threading.Event()
    outcomes: ClassVar[list[str]] = []
    instances: ClassVar[list[GatedPrefill]] = []

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        GatedPrefill.instances.append(self)

    def _run_model(self, work, submitted, prefix):
        GatedPrefill.started.set()
        GatedPrefill.go.wait(30)
        try:
            out = super()._run_model(work, submitted, prefix)
        except Cancelled:
            GatedPrefill.outcomes.append("cancelled")
            raise
        GatedPrefill.outcomes.append("finished")
        return out


async def test_a_client_that_cancels_stops_its_draft_and_prefill(tiny_model_dir, redis_url,
                                                                 draft):
    GatedPrefill.started.clear()
    GatedPrefill.go.clear()
    GatedPrefill.outcomes.clear()
    GatedPrefill.instances.clear()

    def with_draft(*args, **kwargs):
        return GatedPrefill(*args, **kwargs, selector=DraftSelector(draft))

    async with keyed_stack(tiny_model_dir, redis_url, limits=LIMITS,
                           prefill_cls=with_draft) as keyed:
        asking = asyncio.ensure_future(keyed.client("alice").completions.create(
            model=keyed.model, prompt=DOCUMENT, max_tokens=4,
            extra_body=speculative(keep=0.5, look_ahead=16)))
        started = asyncio.ensure_future(asyncio.to_thread(GatedPrefill.started.wait, 30))
        await asyncio.wait([asking, started], return_when=asyncio.FIRST_COMPLETED)
        assert started.done() and not asking.done(), "the request never reached the model"
        asking.cancel()  # the client leaves while its work waits for the model thread
        with pytest.raises(asyncio.CancelledError):
            await asking
        (worker,) = GatedPrefill.instances
        while worker.outstanding:  # until the router's cancel has reached the prefill worker
            await asyncio.sleep(0.01)
        GatedPrefill.go.set()
        for _ in range(100):
            if GatedPrefill.outcomes:
                break
            await asyncio.sleep(0.05)
        assert GatedPrefill.outcomes == ["cancelled"]
        await wait_idle(keyed.stack)
