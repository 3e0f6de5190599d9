"""A job queue that takes jobs and runs none, for tests about what gets in, not the frames;
it records the ids it was given, in order."""

from __future__ import annotations


class IdleQueue:
    alive = True

    def __init__(self) -> None:
        self.submitted: list[str] = []

    def start(self) -> None: ...
    def stop(self) -> None: ...

    def submit(self, job) -> None:
        self.submitted.append(job.id)
