"""The video job: its record (`job.py`, `records.py`), its state machine (`transitions.py`), the
JobStore contract (`store.py`) and its files in Storage (`files.py`).

    queued ──start──> in_progress ──complete──> completed
      │                  │  ├──────fail──────> failed
      │                  │  └──cancelled─────> cancelled
      │                  ├──release (an outage)──> lease lapsed at once, then as below
      │                  └──lease lost──> queued again (or failed, attempts used up)
      └──cancel──> cancelled
"""

from vidserve.jobs.job import Job, JobError, JobStatus
from vidserve.jobs.records import ChunkDrift, ChunkRecord, PromptUpdate, SegmentRecord
from vidserve.jobs.store import (AdmissionLimits, JobNotFound, JobStore, QuotaExceeded, WebhookDelivery,
                                 check_page)
from vidserve.jobs.transitions import (InvalidTransition, LeaseLost, PromptUpdatesUsedUp, cancelled, chunk_done,
                                       chunk_started, complete, expire, fail, heartbeat, prompt_extended, recover,
                                       release, request_cancel, request_stop, segment_done, start, steered_prompt,
                                       update_prompt)

__all__ = ["AdmissionLimits", "ChunkDrift", "ChunkRecord", "InvalidTransition", "Job", "JobError", "JobNotFound",
           "JobStatus", "JobStore", "LeaseLost", "PromptUpdate", "PromptUpdatesUsedUp", "QuotaExceeded",
           "SegmentRecord", "WebhookDelivery", "cancelled", "check_page", "chunk_done", "chunk_started", "complete",
           "expire", "fail", "heartbeat", "prompt_extended", "recover", "release", "request_cancel", "request_stop",
           "segment_done", "start", "steered_prompt", "update_prompt"]
