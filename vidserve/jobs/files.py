"""Every file a job keeps in Storage, named in one place: all of them under the job's id, so
deleting `JobFiles(id).prefix` removes the lot."""

from __future__ import annotations

from dataclasses import dataclass

SEGMENT_SUFFIX = ".m4s"
SOURCE_SEGMENT = "source"  # the segment of the video an extension continues
INIT_SEGMENT = "init.mp4"  # the stream's init segment (ftyp + moov), the same for every chunk
CHAIN_STATES = "chain"  # the folder of a job's chain states, one per chunk made


def segment_name(chunk: int | None) -> str:
    """The stream file of chunk `chunk` (None: of the source video)."""
    return f"{SOURCE_SEGMENT if chunk is None else chunk}{SEGMENT_SUFFIX}"


def segment_chunk(name: str) -> int | None:
    """The chunk whose segment `name` is (None: the source video's); ValueError for any other name."""
    stem = name.removesuffix(SEGMENT_SUFFIX)
    if stem == name or not (stem == SOURCE_SEGMENT or stem.isdigit()):
        raise ValueError(f"{name!r} names no media segment")
    return None if stem == SOURCE_SEGMENT else int(stem)


@dataclass(frozen=True)
class JobFiles:
    """The storage keys of job `job_id`."""

    job_id: str

    @property
    def prefix(self) -> str:
        return f"{self.job_id}/"

    @property
    def input_image(self) -> str:
        return f"{self.job_id}/input.png"

    @property
    def source_video(self) -> str:
        return f"{self.job_id}/source.mp4"

    @property
    def video(self) -> str:
        return f"{self.job_id}/video.mp4"

    def chunk_video(self, index: int) -> str:
        return f"{self.job_id}/chunk-{index}.mp4"

    @property
    def thumbnail(self) -> str:
        return f"{self.job_id}/thumbnail.webp"

    @property
    def spritesheet(self) -> str:
        return f"{self.job_id}/spritesheet.jpg"

    def rendition(self, filename: str) -> str:
        return f"{self.job_id}/outputs/{filename}"

    @property
    def stream_init(self) -> str:
        return f"{self.job_id}/stream/{INIT_SEGMENT}"

    def segment(self, chunk: int | None) -> str:
        return f"{self.job_id}/stream/{segment_name(chunk)}"

    @property
    def chain_states(self) -> str:
        return f"{self.job_id}/{CHAIN_STATES}/"

    def chain_state(self, index: int) -> str:
        """The chain's state after chunk `index`, for a rerun to go on from."""
        return f"{self.chain_states}{index}.npz"
