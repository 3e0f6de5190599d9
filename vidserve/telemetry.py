"""Prometheus metrics: queue depth and job counts read from the JobStore at scrape time,
histograms observed by the runner that does the work."""

from __future__ import annotations

from collections import Counter

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import GaugeMetricFamily

from vidserve.jobs import JobStatus, JobStore

_SECONDS = (0.1, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)


class Metrics:
    """One registry per process (or per app in tests), so nothing is registered twice."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.queue_wait = Histogram("vidserve_queue_wait_seconds", "Time from submission to start of a run.",
                                    ["model"], buckets=_SECONDS, registry=self.registry)
        self.run_time = Histogram("vidserve_job_run_seconds", "Time from start to end of a run, by outcome.",
                                  ["model", "status"], buckets=_SECONDS, registry=self.registry)
        self.step_time = Histogram("vidserve_denoise_step_seconds", "Seconds per denoising step.", ["model"],
                                   buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60), registry=self.registry)

    def watch(self, store: JobStore) -> None:
        self.registry.register(_StoreCollector(store))


class _StoreCollector:
    def __init__(self, store: JobStore):
        self.store = store

    def collect(self):
        by_status = GaugeMetricFamily("vidserve_jobs", "Jobs by status.", labels=["status"])
        for status, count in self.store.count_by_status().items():
            by_status.add_metric([status.value], count)
        yield by_status
        depth = GaugeMetricFamily("vidserve_queue_depth", "Queued jobs per model.", labels=["model"])
        for model, count in Counter(job.model for job in self.store.with_status([JobStatus.queued])).items():
            depth.add_metric([model], count)
        yield depth
