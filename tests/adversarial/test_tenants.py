"""Tenants and the shared document cache: a client learns nothing of another tenant's documents
(``prefix_cache`` states and single flight are per namespace), cannot flush them, and is held
to its own quotas; through the official openai client with each tenant's key."""

from __future__ import annotations

import asyncio

import openai
import pytest
import pytest_asyncio
from prometheus_client import REGISTRY

from kvstore.codec import encode_blob
from kvstore.seal import Seal
from prefill_svc.prefix_store import PrefixStoreConfig
from prefill_svc.service import PrefillServicer
from router.tenants import TenantLimits
from serving.worker import blob_spec
from tests.adversarial.conftest import Keyed, keyed_stack
from tests.integration.test_services import ENGINE_POLICY, SECRET

pytestmark = pytest.mark.asyncio(loop_scope="module")
EXTENSION = {"policy": "snapstream", "n_sink": 4, "n_topk": 40, "n_recent": 24, "observation": 8}
DOCUMENT = ("The vault's code is 4711. " + "Gulls circled over the harbour all day. " * 12)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def keyed(tiny_model_dir, redis_url):
    async with keyed_stack(tiny_model_dir, redis_url) as served:
        yield served
        for key in await served.stack.store.keys():  # the next modules expect an empty store
            await served.stack.store.delete(key)


async def ask(keyed: Keyed, tenant: str, document: str, question: str, **snapstream) -> dict:
    """One chat request marking its system message as the document: -> its usage."""
    response = await keyed.client(tenant).chat.completions.create(
        model=keyed.model, max_tokens=4, temperature=0,
        messages=[{"role": "system", "content": document},
                  {"role": "user", "content": question}],
        extra_body={"snapstream": {"cache_prefix": "system", **EXTENSION, **snapstream}})
    return response.usage.model_dump()


def state(usage: dict) -> str:
    return usage["snapstream"]["prefix_cache"]


async def test_two_tenants_with_one_document_each_store_it_and_a_tenant_hits_its_own(keyed):
    document = "tenants: " + DOCUMENT
    alice = state(await ask(keyed, "alice", document, "What is the code?"))
    bob = state(await ask(keyed, "bob", document, "Who circled?"))
    alice_again = state(await ask(keyed, "alice", document, "Who circled?"))
    assert (alice, bob, alice_again) == ("stored", "stored", "hit")


async def test_a_cache_salt_isolates_inside_a_tenant(keyed):
    document = "salted: " + DOCUMENT
    plain = state(await ask(keyed, "alice", document, "Q?"))
    salted = state(await ask(keyed, "alice", document, "Q?", cache_salt="project-x"))
    salted_again = state(await ask(keyed, "alice", document, "Q?", cache_salt="project-x"))
    assert (plain, salted, salted_again) == ("stored", "stored", "hit")


async def test_a_guess_waiting_for_another_tenants_compression_is_its_own(keyed):
    """Single flight is per namespace: bob's request for alice's document, sent while hers
    compresses, compresses it again for bob instead of sharing hers (which its timing would
    reveal)."""
    document = "single flight: " + DOCUMENT
    alice, bob = await asyncio.gather(ask(keyed, "alice", document, "Q?"),
                                      ask(keyed, "bob", document, "Q?"))
    assert (state(alice), state(bob)) == ("stored", "stored")


async def test_the_tenants_metrics_count_their_own_requests(keyed):
    def count(tenant: str) -> float:
        return REGISTRY.get_sample_value("snapstream_tenant_requests_total",
                                         {"tenant": tenant, "outcome": "ok"}) or 0.0

    before = count("bob")
    await ask(keyed, "bob", "metrics: " + DOCUMENT, "Q?")
    assert count("bob") == before + 1
    stored = REGISTRY.get_sample_value("snapstream_prefix_cache_bytes", {"tenant": "bob"})
    assert stored is not None and stored > 0


async def test_a_key_of_no_tenant_is_refused(keyed):
    client = openai.AsyncOpenAI(base_url=keyed.base_url, api_key="x" * 20, max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        await client.models.list()


def _blob_bytes(keyed: Keyed, doc_tokens: int) -> int:
    engine = keyed.stack.engine
    cache = engine.compress_prefix([3 + i % 250 for i in range(doc_tokens)], ENGINE_POLICY,
                                   4, engine.context_len)
    return len(encode_blob(cache, blob_spec(engine), Seal(SECRET, "k")))


async def test_one_tenants_documents_never_evict_anothers(tiny_model_dir, redis_url):
    """A cache with room for about three documents: bob's fillers evict bob's own, never
    alice's."""
    async with keyed_stack(tiny_model_dir, redis_url) as probe:
        tokens = len(probe.stack.engine.tokenizer.encode("filler 0: " + DOCUMENT))
        size = _blob_bytes(probe, tokens + 8)
    config = PrefixStoreConfig(max_bytes=3 * size)
    async with keyed_stack(tiny_model_dir, redis_url, prefix_config=config) as keyed:
        document = "alice's: " + DOCUMENT
        assert state(await ask(keyed, "alice", document, "Q?")) == "stored"
        for i in range(5):
            assert state(await ask(keyed, "bob", f"filler {i}: " + DOCUMENT, "Q?")) == "stored"
        assert state(await ask(keyed, "alice", document, "Q?")) == "hit"
        kept = await keyed.stack.store.keys()
        assert len(kept) < 6  # bob's fillers did evict: their own oldest
        for key in kept:
            await keyed.stack.store.delete(key)


class HeldPrefill(PrefillServicer):
    """Holds every prefill until ``release`` is set, so that requests pile up."""

    release: asyncio.Event

    async def Prefill(self, request, context):
        await HeldPrefill.release.wait()
        return await super().Prefill(request, context)


async def test_over_its_quota_a_tenant_gets_429_naming_the_limit_and_the_other_is_served(
        tiny_model_dir, redis_url):
    HeldPrefill.release = asyncio.Event()
    limits = TenantLimits(max_running=1)
    async with keyed_stack(tiny_model_dir, redis_url, tenant_limits=limits,
                           prefill_cls=HeldPrefill) as keyed:
        first = asyncio.ensure_future(ask(keyed, "alice", "quota: " + DOCUMENT, "Q?"))
        while keyed.stack.router.tenants.running["alice"] == 0:
            await asyncio.sleep(0.01)
        with pytest.raises(openai.RateLimitError) as err:
            await ask(keyed, "alice", "quota: " + DOCUMENT, "Q?")
        assert "--tenant-max-running 1" in err.value.message
        assert err.value.response.headers["retry-after"]
        bob = asyncio.ensure_future(ask(keyed, "bob", "quota: " + DOCUMENT, "Q?"))
        HeldPrefill.release.set()
        assert state(await first) == "stored" and state(await bob) == "stored"
        for key in await keyed.stack.store.keys():
            await keyed.stack.store.delete(key)
