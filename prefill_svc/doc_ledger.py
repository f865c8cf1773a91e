"""The document cache's ledger: which documents are stored, whose, how large and when last
used, as one record in the KV store (``BlobStore.read_record`` / ``write_record``), so that
every prefill worker counts the same bytes and a restarted one forgets nothing.

Every change is a compare and set on the record: read it, change it, write it unless another
worker wrote it since (then read again). Entries past their blob's expiry are dropped on the
way.

The caps (``LedgerLimits``): a tenant holds at most ``tenant_max_bytes``; a document that would
pass it evicts that tenant's own least recently used ones, never another tenant's. All tenants
hold at most ``max_bytes``; a document that would pass it evicts the least recently used
document of the tenant that would then hold the most bytes, the newcomer's tenant counted with
its new document (ties: the newcomer's own). So a tenant below its share of the cache is never
evicted for one above it, and filling the cache with one's own documents evicts one's own.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass

from kvstore import BlobStore, StoreUnavailable

LEDGER_RECORD = "prefix-ledger"
LEDGER_FORMAT = 1
MAX_ATTEMPTS = 16  # compare-and-set rounds before the store counts as unavailable
RETRY_WAIT_S = 0.01  # up to, before another round (random: contenders spread out)


@dataclass(frozen=True)
class LedgerLimits:
    max_bytes: int  # of every tenant's documents together
    tenant_max_bytes: int  # of one tenant's

    def __post_init__(self) -> None:
        if self.max_bytes < 0 or self.tenant_max_bytes < 0:
            raise ValueError(f"--prefix-cache-max-bytes ({self.max_bytes}) and "
                             f"--prefix-cache-tenant-max-bytes ({self.tenant_max_bytes}) must "
                             "be >= 0")


@dataclass(frozen=True)
class Entry:
    tenant: str
    size: int  # bytes of the blob
    used_at: float  # unix seconds of its last store or hit
    expires_at: float  # unix seconds: its blob's TTL ends


Entries = dict[str, Entry]  # store key -> entry


@dataclass(frozen=True)
class Reservation:
    """The outcome of :meth:`Ledger.reserve`: whether the document fits (and is now in the
    ledger) and the keys it evicted, whose blobs the caller deletes."""

    fits: bool
    evicted: tuple[str, ...] = ()


class Ledger:
    def __init__(self, store: BlobStore, limits: LedgerLimits) -> None:
        self.store, self.limits = store, limits
        self.usage: Counter[str] = Counter()  # bytes per tenant, as last read or written

    async def reserve(self, key: str, tenant: str, size: int, ttl_s: float) -> Reservation:
        """Enters ``key`` (``tenant``'s, ``size`` bytes, expiring in ``ttl_s``) after taking
        out the entries the caps need gone; a document no eviction makes room for (larger than
        a cap) does not fit and changes nothing."""
        outcome: list[Reservation] = []

        def change(entries: Entries) -> Entries | None:
            entries.pop(key, None)
            evicted = _evictions(entries, tenant, size, self.limits)
            outcome[:] = [Reservation(evicted is not None, tuple(evicted or ()))]
            if evicted is None:
                return None
            for gone in evicted:
                del entries[gone]
            now = time.time()
            entries[key] = Entry(tenant, size, now, now + ttl_s)
            return entries

        await self._update(change)
        return outcome[0]

    async def touch(self, key: str, ttl_s: float | None = None) -> Entry | None:
        """Marks ``key`` used now (and, with ``ttl_s``, its blob put again: expiring then);
        -> its entry, None when the ledger does not hold it."""
        found: list[Entry] = []

        def change(entries: Entries) -> Entries | None:
            if key not in entries:
                return None
            entry, now = entries[key], time.time()
            entries[key] = Entry(entry.tenant, entry.size, now,
                                 entry.expires_at if ttl_s is None else now + ttl_s)
            found.append(entries[key])
            return entries

        await self._update(change)
        return found[0] if found else None

    async def remove(self, key: str) -> None:
        await self._update(lambda entries: entries if entries.pop(key, None) else None)

    async def _update(self, change: Callable[[Entries], Entries | None]) -> None:
        """Applies ``change`` (None: nothing to write) to the record as stored, until no other
        writer came in between."""
        for _ in range(MAX_ATTEMPTS):
            record = await self.store.read_record(LEDGER_RECORD)
            entries = _live(_parse(record.value))
            changed = change(dict(entries))
            final = entries if changed is None else changed
            if changed is None or await self.store.write_record(
                    LEDGER_RECORD, _dump(changed), record.version):
                self.usage = _usage(final)
                return
            await asyncio.sleep(random.uniform(0, RETRY_WAIT_S))
        raise StoreUnavailable(f"the document cache's ledger in {self.store.url} changed "
                               f"under {MAX_ATTEMPTS} writes in a row; retry later")


def _evictions(entries: Entries, tenant: str, size: int, limits: LedgerLimits
               ) -> list[str] | None:
    """The keys to evict so that ``tenant``'s new document of ``size`` bytes fits both caps
    (the module's docstring), None when none would do."""
    if size > limits.tenant_max_bytes or size > limits.max_bytes:
        return None
    held = _usage(entries)
    by_age = sorted(entries, key=lambda k: entries[k].used_at)  # least recently used first
    evicted: list[str] = []

    def evict_of(owner: str) -> None:
        victim = next(k for k in by_age if entries[k].tenant == owner and k not in evicted)
        evicted.append(victim)
        held[owner] -= entries[victim].size

    while held[tenant] + size > limits.tenant_max_bytes:
        evict_of(tenant)
    while sum(held.values()) + size > limits.max_bytes:
        weight = {owner: held[owner] + (size if owner == tenant else 0)
                  for owner in held if held[owner] > 0}
        evict_of(max(weight, key=lambda owner: (weight[owner], owner == tenant)))
    return evicted


def _usage(entries: Entries) -> Counter[str]:
    usage: Counter[str] = Counter()
    for entry in entries.values():
        usage[entry.tenant] += entry.size
    return usage


def _live(entries: Entries) -> Entries:
    now = time.time()
    return {key: entry for key, entry in entries.items() if entry.expires_at > now}


def _parse(value: bytes | None) -> Entries:
    if not value:
        return {}
    fields = json.loads(value)
    if fields.get("format") != LEDGER_FORMAT:
        return {}  # another format's ledger: start afresh (its blobs expire with their TTL)
    return {key: Entry(**entry) for key, entry in fields["entries"].items()}


def _dump(entries: Entries) -> bytes:
    return json.dumps({"format": LEDGER_FORMAT,
                       "entries": {key: asdict(entry) for key, entry in entries.items()}},
                      separators=(",", ":")).encode()
