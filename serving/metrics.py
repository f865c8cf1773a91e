"""Prometheus metrics of every service (one process registers the ones its service uses)."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager

from prometheus_client import Counter, Gauge, Histogram, Info

log = logging.getLogger(__name__)
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
SIZE_BUCKETS = tuple(2.0**k for k in range(10, 32, 2))

REQUESTS = Counter("snapstream_requests_total",
                   "Requests by service, API (grpc, openai) and outcome",
                   ["service", "api", "outcome"])
TIME_TO_FIRST_TOKEN = Histogram("snapstream_time_to_first_token_seconds",
                                "Request received to first token sent", buckets=LATENCY_BUCKETS)
INTER_TOKEN_LATENCY = Histogram("snapstream_inter_token_latency_seconds",
                                "Time between consecutive chunks of a stream (a chunk holds "
                                "one token unless the stream fell behind the decode step)",
                                buckets=LATENCY_BUCKETS)
END_TO_END = Histogram("snapstream_e2e_latency_seconds", "Request received to stream end",
                       ["service"], buckets=LATENCY_BUCKETS)
QUEUE_TIME = Histogram("snapstream_queue_time_seconds", "Waiting for a place on a worker",
                       ["service"], buckets=LATENCY_BUCKETS)
RUNNING = Gauge("snapstream_running_requests", "Requests being served", ["service"])
WAITING = Gauge("snapstream_waiting_requests", "Requests queued", ["service"])
ROW_OCCUPANCY = Gauge("snapstream_row_occupancy_ratio", "Busy decode rows / all rows")
BLOB_BYTES = Histogram("snapstream_blob_bytes", "KV blob size", ["op"], buckets=SIZE_BUCKETS)
BLOB_TRANSFER = Histogram("snapstream_blob_transfer_seconds", "KV blob put/get time", ["op"],
                          buckets=LATENCY_BUCKETS)
PREFILL_MODEL_TIME = Histogram("snapstream_prefill_model_seconds",
                               "A prompt's turn on the model thread (forward, SnapKV, blob "
                               "encoding, first token)", buckets=LATENCY_BUCKETS)
STEP_TIME = Histogram("snapstream_decode_step_seconds", "One static decode step (wall)",
                      buckets=LATENCY_BUCKETS)
STEP_ROWS = Histogram("snapstream_decode_step_rows",
                      "Rows one decode step ran: the power-of-two prefix of the pool that covers "
                      "the rows in use", buckets=tuple(2.0**i for i in range(11)))
SIM_STEP_TIME = Histogram("snapstream_sim_decode_step_seconds",
                          "One decode step on the simulated target", buckets=LATENCY_BUCKETS)
PREFIX_CACHE = Counter("snapstream_prefix_cache_total",
                       "Document cache requests by outcome and tenant: hit, stored, bypass "
                       "(served without caching); dropped: a cached blob that failed its MAC or "
                       "checks, deleted", ["outcome", "tenant"])
PREFIX_CACHE_BYTES = Gauge("snapstream_prefix_cache_bytes",
                           "Bytes of document caches each tenant holds in the store (the "
                           "store's ledger, as this prefill worker last read it)", ["tenant"])
TENANT_REQUESTS = Counter("snapstream_tenant_requests_total",
                          "Router requests by tenant and outcome", ["tenant", "outcome"])
TENANT_RUNNING = Gauge("snapstream_tenant_running_requests", "Router requests in flight",
                       ["tenant"])
TENANT_QUEUED_TOKENS = Gauge("snapstream_tenant_queued_prompt_tokens",
                             "Prompt tokens of requests not yet prefilled", ["tenant"])
TENANT_PROMPT_TOKENS = Counter("snapstream_tenant_prompt_tokens_total",
                               "Prompt tokens of admitted requests", ["tenant"])
PREFIX_CACHE_SAVED = Counter("snapstream_prefix_cache_saved_seconds_total",
                             "Document compression time saved by hits (estimated: the document's "
                             "tokens x this worker's last compression time per token)")
MEMORY = Gauge("snapstream_memory_bytes",
               "A model worker's memory by component (limit, weights, gemm_weights, held, "
               "activations_at_max_prompt) and the longest prompt it admits "
               "(max_prompt_tokens, in tokens), as measured once it is warm", ["component"])
MACHINE = Info("snapstream_machine",
               "A model worker's machine: CPU model and features, the kernels' cap and each "
               "kernel's path, dtypes and threads (snapstream info)")
FAILOVERS = Counter("snapstream_decode_failovers_total", "Decode streams resumed elsewhere")
SHARE_BUCKETS = (0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.75, 1.0)
DRAFT_TIME = Histogram("snapstream_speculative_draft_seconds",
                       "Speculative prefill: the draft's prefill, look-ahead and selection",
                       buckets=LATENCY_BUCKETS)
KEPT_SHARE = Histogram("snapstream_speculative_kept_share",
                       "Speculative prefill: target tokens prefilled / prompt tokens",
                       buckets=SHARE_BUCKETS)
TARGET_PREFILL_TIME = Histogram("snapstream_speculative_target_prefill_seconds",
                                "Speculative prefill: the target's forward over the kept tokens",
                                buckets=LATENCY_BUCKETS)


@contextmanager
def prefill_turn(submitted: float) -> Iterator[None]:
    """One prompt's turn on a model thread: records how long it waited since ``submitted``
    (``time.perf_counter()``) and how long the turn took."""
    started = time.perf_counter()
    QUEUE_TIME.labels("prefill").observe(started - submitted)
    yield
    PREFILL_MODEL_TIME.observe(time.perf_counter() - started)


def report_memory(report: dict[str, int]) -> None:
    """A worker's memory by component, into the log and the ``snapstream_memory_bytes`` gauge."""
    log.info("memory: %s", ", ".join(
        f"{name} {value / 2**20:,.0f} MiB" if name != "max_prompt_tokens" else
        f"{name} {value:,}" for name, value in report.items()))
    for name, value in report.items():
        MEMORY.labels(name).set(value)


def report_machine(labels: dict[str, str]) -> None:
    """A model worker's machine (``snapstream.machine.Machine.labels``), into the log and the
    ``snapstream_machine_info`` metric."""
    log.info("machine: %s", "; ".join(f"{name} {value}" for name, value in labels.items()))
    MACHINE.info(labels)
