"""A job queue that takes jobs and runs none, for tests about what gets in, not the frames;
it records the ids it was given, in order, and stands them in line in that order."""

from __future__ import annotations

from vidserve.jobs.place_in_line import PlaceInLine


class IdleQueue:
    alive = True
    warming = False

    def __init__(self) -> None:
        self.submitted: list[str] = []
        self._models: dict[str, str] = {}

    def start(self) -> None: ...
    def stop(self) -> None: ...

    def submit(self, job) -> None:
        self.submitted.append(job.id)
        self._models[job.id] = job.model

    def places_in_line(self, model: str) -> dict[str, PlaceInLine]:
        """The jobs of `model` it was given, in the order given, with no estimate: a line that never moves."""
        line = [job_id for job_id in self.submitted if self._models[job_id] == model]
        return {job_id: PlaceInLine(position, None) for position, job_id in enumerate(line, 1)}
