"""Prometheus metrics: queue depth and job counts read from the JobStore at scrape time,
histograms observed by the runner that does the work."""

from __future__ import annotations

from collections import Counter

import time

from prometheus_client import CollectorRegistry, Counter as CounterMetric, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily

from vidserve.jobs import JobStatus, JobStore

ANONYMOUS_LABEL = "anonymous"  # the key label of a server without keys
_SECONDS = (0.1, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)


class Metrics:
    """One registry per process (or per app in tests), so nothing is registered twice."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        # By API key name (never the key), as the other per-key metrics below.
        self.queue_wait = Histogram("vidserve_queue_wait_seconds", "Time from submission to start of a run, by "
                                    "model, priority and API key name.", ["model", "priority", "key"],
                                    buckets=_SECONDS, registry=self.registry)
        self.run_time = Histogram("vidserve_job_run_seconds", "Time from start to end of a run, by outcome.",
                                  ["model", "status"], buckets=_SECONDS, registry=self.registry)
        self.first_segment = Histogram("vidserve_time_to_first_segment_seconds", "Time from submission until "
                                       "the first segment of a video's stream is playable.", ["model"],
                                       buckets=_SECONDS, registry=self.registry)
        self.step_time = Histogram("vidserve_denoise_step_seconds", "Seconds per denoising step.", ["model"],
                                   buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60), registry=self.registry)
        self.output_warnings = CounterMetric("vidserve_output_warnings", "Completed videos that look wrong "
                                             "(blank, one flat colour, frozen), by model and warning code.",
                                             ["model", "code"], registry=self.registry)
        self.lora_loads = CounterMetric("vidserve_lora_loads", "LoRA adapters loaded onto a pipeline, by model "
                                        "and adapter.", ["model", "adapter"], registry=self.registry)
        self.lora_cache_hits = CounterMetric("vidserve_lora_cache_hits", "Requests (chunks) that found their adapter "
                                             "loaded already, by model and adapter.", ["model", "adapter"],
                                             registry=self.registry)
        self.lora_load_time = Histogram("vidserve_lora_load_seconds", "Seconds to load one adapter.", ["model"],
                                        buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60),
                                        registry=self.registry)

        # Per API key name (never the key): what each tenant gets and is refused.
        self.key_accepted = CounterMetric("vidserve_key_jobs_accepted", "Jobs accepted, by API key name.", ["key"],
                                          registry=self.registry)
        self.key_rejected = CounterMetric("vidserve_key_rejected", "Requests refused by a quota, by API key name "
                                          "and the limit.", ["key", "limit"], registry=self.registry)

        self.chat = ChatMetrics(self.registry)

    def watch(self, store: JobStore) -> None:
        self.registry.register(_StoreCollector(store))

    def redis_volatile(self, volatile: bool) -> None:
        """Celery mode: whether this process runs on a Redis not known to keep what it acknowledged
        (started with allow_volatile_redis), so an alert can say so; embedded servers have no such gauge."""
        gauge = Gauge("vidserve_redis_volatile", "1 when the Redis holding jobs and queue messages has no "
                      "append-only file (or its persistence could not be checked), 0 when it has one.",
                      registry=self.registry)
        gauge.set(int(volatile))


class ChatMetrics:
    """The LLM path's latency vocabulary: time to first token, inter-token latency, end to end."""

    def __init__(self, registry: CollectorRegistry) -> None:
        fast = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)
        self.ttft = Histogram("vidserve_chat_time_to_first_token_seconds", "Arrival to first generated token.",
                              buckets=fast + (5, 10, 30), registry=registry)
        self.itl = Histogram("vidserve_chat_inter_token_latency_seconds", "Time between a sequence's tokens.",
                             buckets=fast, registry=registry)
        self.e2e = Histogram("vidserve_chat_request_seconds", "Arrival to last token, by finish reason.",
                             ["finish_reason"], buckets=_SECONDS, registry=registry)
        self.prompt_tokens = CounterMetric("vidserve_chat_prompt_tokens", "Prompt tokens prefilled.",
                                           registry=registry)
        self.generation_tokens = CounterMetric("vidserve_chat_generation_tokens", "Tokens generated.",
                                               registry=registry)
        self.running = Gauge("vidserve_chat_running", "Sequences in the decode batch.", registry=registry)
        self.waiting = Gauge("vidserve_chat_waiting", "Sequences waiting for a batch slot.", registry=registry)
        self.cached_tokens = CounterMetric("vidserve_chat_prompt_tokens_cached", "Prompt tokens whose KV came "
                                           "from the prefix cache.", registry=registry)
        self.hit_rate = Gauge("vidserve_chat_prefix_cache_hit_rate", "Share of prompt tokens taken from the prefix "
                              "cache, over requests that had it on.", registry=registry)
        self.blocks_in_use = Gauge("vidserve_chat_kv_blocks_in_use", "KV cache blocks held by sequences.",
                                   registry=registry)
        self.blocks = Gauge("vidserve_chat_kv_blocks", "KV cache blocks in all.", registry=registry)
        self.preemptions = CounterMetric("vidserve_chat_preemptions", "Sequences that gave their KV blocks back "
                                         "to make room, to be recomputed.", registry=registry)
        self._queried = self._hits = 0

    def token(self, seq) -> None:
        if seq.previous_token_at is None:
            self.ttft.observe(seq.first_token_at - seq.arrival)
        else:
            self.itl.observe(seq.last_token_at - seq.previous_token_at)

    def finished(self, seq) -> None:
        self.e2e.labels(seq.finish_reason or "unknown").observe(time.perf_counter() - seq.arrival)
        self.prompt_tokens.inc(seq.prompt_len)
        self.generation_tokens.inc(len(seq.output_ids))

    def prompt_cached(self, seq, cache_on: bool) -> None:
        """A prompt's first prefill is done: how much of it came from the prefix cache."""
        self.cached_tokens.inc(seq.cached_tokens)
        if cache_on:
            self._queried += seq.prompt_len
            self._hits += seq.cached_tokens
            self.hit_rate.set(self._hits / self._queried)

    def preempted(self) -> None:
        self.preemptions.inc()

    def load(self, running: int, waiting: int, blocks_in_use: int, blocks: int) -> None:
        self.running.set(running)
        self.waiting.set(waiting)
        self.blocks_in_use.set(blocks_in_use)
        self.blocks.set(blocks)


class _StoreCollector:
    def __init__(self, store: JobStore):
        self.store = store

    def collect(self):
        by_status = GaugeMetricFamily("vidserve_jobs", "Jobs by status.", labels=["status"])
        for status, count in self.store.count_by_status().items():
            by_status.add_metric([status.value], count)
        yield by_status
        depth = GaugeMetricFamily("vidserve_queue_depth", "Queued jobs per model.", labels=["model"])
        active = self.store.with_status([JobStatus.queued, JobStatus.in_progress])
        for model, count in Counter(job.model for job in active if job.status is JobStatus.queued).items():
            depth.add_metric([model], count)
        yield depth
        by_key = GaugeMetricFamily("vidserve_key_jobs", "Queued and running jobs, by API key name.",
                                   labels=["key", "status"])
        for (owner, status), count in Counter((job.owner or ANONYMOUS_LABEL, job.status.value)
                                              for job in active).items():
            by_key.add_metric([owner, status], count)
        yield by_key
