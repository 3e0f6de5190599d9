"""Drift measurement and colour correction for long videos made of chained chunks.

A long video is a chain of ~5 s image-to-video chunks: the last frame of chunk k conditions chunk
k+1. Each chunk inherits and adds a little error (darker, colour-shifted, softer), so unchecked the
picture decays towards black. Here we measure every chunk against an anchor (the first chunk, or
the input image) and pull its colours back to the anchor's. The anchor is the look a prompt asked
for: where the prompt changes mid-video (a steered session, a storyboard, a caption chain), the
first chunk made from the new prompt is the new anchor, so the change is kept, not corrected away.

Frames are uint8 numpy arrays [N, H, W, 3] RGB. numpy only (no torch): the API process imports this.
"""

from __future__ import annotations

import io
from dataclasses import asdict, dataclass
from typing import Callable, Protocol

import numpy as np

# Rec.709 luma weights, applied to the gamma-encoded RGB values (Y', as video encoders do).
REC709 = np.array([0.2126, 0.7152, 0.0722])
_HIST_BINS = 32
# Floor for a channel's std in match_colors: a flat frame (std ~ 0) would otherwise get a huge gain
# that blows its noise up to the anchor's contrast.
_MIN_STD = 1.0


def _luma(frames: np.ndarray) -> np.ndarray:
    return frames.astype(np.float32) @ REC709.astype(np.float32)


@dataclass(frozen=True)
class ColorStats:
    """Per-channel mean and std over a whole chunk (all frames, all pixels), and its mean luma."""

    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    luma: float


def color_stats(frames: np.ndarray) -> ColorStats:
    pixels = frames.reshape(-1, 3).astype(np.float64)
    mean = pixels.mean(axis=0)
    return ColorStats(
        mean=tuple(float(v) for v in mean),
        std=tuple(float(v) for v in pixels.std(axis=0)),
        luma=float(mean @ REC709),  # luma is linear in RGB, so the mean luma is the luma of the means
    )


def _histogram(frames: np.ndarray) -> np.ndarray:
    """Per-channel 32-bin histograms, each normalised to sum to 1: shape [3, 32]."""
    pixels = frames.reshape(-1, 3)
    hist = np.stack([np.bincount(pixels[:, c] // (256 // _HIST_BINS), minlength=_HIST_BINS) for c in range(3)])
    return hist / pixels.shape[0]


def _sharpness(frames: np.ndarray) -> float:
    """Variance of the 3x3 Laplacian of the luma, per frame, averaged over frames."""
    y = _luma(frames)
    lap = y[:, :-2, 1:-1] + y[:, 2:, 1:-1] + y[:, 1:-1, :-2] + y[:, 1:-1, 2:] - 4 * y[:, 1:-1, 1:-1]
    return float(lap.reshape(len(frames), -1).var(axis=1).mean())


@dataclass(frozen=True, eq=False)  # eq=False: == on the ndarray field would not give a bool
class Anchor:
    """What a chunk is compared with and corrected to: the first chunk, or the input image as 1 frame."""

    color: ColorStats
    histogram: np.ndarray  # [3, 32], see _histogram
    sharpness: float

    @classmethod
    def from_frames(cls, frames: np.ndarray) -> Anchor:
        return cls(color_stats(frames), _histogram(frames), _sharpness(frames))


@dataclass(frozen=True)
class DriftMetrics:
    mean_luma: float  # Rec.709 luma, 0-255
    channel_mean: tuple[float, float, float]
    channel_std: tuple[float, float, float]
    # Total-variation (half-L1) distance between per-channel 32-bin histograms, averaged over the
    # channels: 0 = same distribution, 1 = no overlap.
    histogram_distance: float
    sharpness: float  # see _sharpness
    luma_change: float  # (mean_luma - anchor) / anchor: -0.1 is 10% darker than the anchor
    sharpness_ratio: float  # sharpness / anchor sharpness: < 1 is softer

    def to_dict(self) -> dict:
        """Plain floats and lists of floats, ready for JSON: 4 decimals, more than any reader of the
        record needs, and a fraction of the bytes every event and video object carries."""
        def plain(value: float) -> float:
            return round(float(value), 4)

        return {k: [plain(x) for x in v] if isinstance(v, tuple) else plain(v) for k, v in asdict(self).items()}


def measure(frames: np.ndarray, anchor: Anchor) -> DriftMetrics:
    stats = color_stats(frames)
    sharpness = _sharpness(frames)
    # max(): an all-black anchor or a flat one must not divide by zero.
    return DriftMetrics(
        mean_luma=stats.luma,
        channel_mean=stats.mean,
        channel_std=stats.std,
        histogram_distance=float(0.5 * np.abs(_histogram(frames) - anchor.histogram).sum(axis=1).mean()),
        sharpness=sharpness,
        luma_change=(stats.luma - anchor.color.luma) / max(anchor.color.luma, 1e-6),
        sharpness_ratio=sharpness / max(anchor.sharpness, 1e-6),
    )


def match_colors(frames: np.ndarray, anchor: Anchor | ColorStats) -> np.ndarray:
    """Per-channel mean/std transfer (Reinhard) of the frames onto the anchor's RGB statistics.

    The frames' statistics are taken over the whole chunk, not per frame, so one affine map per
    channel is applied to every frame and motion/lighting changes within the chunk survive.
    RGB rather than LAB: matching RGB means pins the mean luma (linear in RGB) and the colour cast to
    the anchor's exactly, while LAB only pins L* and a*/b*, which left the chained test video's
    channel means several levels off. Neither can undo a hue *rotation* within the chunk (a per-channel
    map cannot rotate), so such drift is held in the mean/std but shows in histogram_distance.
    """
    target = anchor.color if isinstance(anchor, Anchor) else anchor
    own = color_stats(frames)
    gain = np.array(target.std) / np.maximum(own.std, _MIN_STD)
    out = (frames.astype(np.float32) - np.float32(own.mean)) * np.float32(gain) + np.float32(target.mean)
    return np.clip(out.round(), 0, 255).astype(np.uint8)


@dataclass(frozen=True, eq=False)  # eq=False: == on the ndarray fields would not give a bool
class ChainState:
    """Where a chain stands once a chunk is done: everything the chunks after it need from the
    ones before, so that a chain stopped there (its worker lost) goes on from it and makes what
    it would have made. The seed is not kept: chunk k's is the chain's seed + k."""

    next_chunk: int  # the index of the chunk to make next
    condition: np.ndarray  # [H, W, 3] uint8: the last frame made, which opens the next chunk
    anchor: Anchor  # what every chunk is measured against and corrected to
    # The prompt the anchor was made from: a later chunk with another prompt is a new anchor. None
    # where no chunk has said yet (a video being extended; a chain given no `prompt_of`).
    anchor_prompt: str | None = None

    def to_bytes(self) -> bytes:
        """An .npz (no pickles): the frame and the anchor's numbers, bit for bit."""
        out = io.BytesIO()
        color = self.anchor.color
        # A unicode array, not an object one, so that it loads without pickles; absent when None.
        prompt = {} if self.anchor_prompt is None else {"anchor_prompt": np.array(self.anchor_prompt)}
        np.savez_compressed(out, next_chunk=np.int64(self.next_chunk), condition=self.condition,
                            mean=np.array(color.mean), std=np.array(color.std), luma=np.float64(color.luma),
                            histogram=self.anchor.histogram, sharpness=np.float64(self.anchor.sharpness), **prompt)
        return out.getvalue()

    @classmethod
    def from_bytes(cls, data: bytes) -> ChainState:
        """ValueError for anything but what `to_bytes` wrote."""
        try:
            with np.load(io.BytesIO(data), allow_pickle=False) as saved:
                condition = saved["condition"]
                if condition.dtype != np.uint8 or condition.ndim != 3 or condition.shape[2] != 3:
                    raise ValueError(f"a condition frame of {condition.dtype} {condition.shape}")
                color = ColorStats(mean=tuple(float(v) for v in saved["mean"]),
                                   std=tuple(float(v) for v in saved["std"]), luma=float(saved["luma"]))
                anchor = Anchor(color, saved["histogram"], float(saved["sharpness"]))
                prompt = str(saved["anchor_prompt"]) if "anchor_prompt" in saved.files else None
                return cls(int(saved["next_chunk"]), condition, anchor, prompt)
        except ValueError:
            raise
        except Exception as exc:  # a truncated or foreign file: zipfile, OSError, a missing array
            raise ValueError(f"not a saved chain state: {type(exc).__name__}: {exc}") from exc


class VideoGenerator(Protocol):
    """An image-to-video model as chain() drives it: `num_frames` uint8 frames [N, H, W, 3] that open
    on `condition` when one is given, or a first chunk made from the seed when it is None."""

    def generate(self, condition: np.ndarray | None, num_frames: int, seed: int, chunk: int) -> np.ndarray: ...


CORRECTIONS = ("color", "none")
# The fewest frames a chunk makes: its first is the frame it opens on (the condition, or the
# frame a first chunk starts from), so it needs one more. Requests are held to it before a job
# exists (`vidserve.video_request.MIN_FRAMES`).
MIN_CHUNK_FRAMES = 2


class StopChain(Exception):
    """Raised by a generator to end the video before the chunk it was asked for."""


def chain(generator: VideoGenerator, plan: list[int], correction: str = "color", seed: int = 0, *,
          condition: np.ndarray | None = None, anchor: Anchor | None = None, continuing: bool = False,
          on_chunk: Callable[[int, np.ndarray, DriftMetrics], None] | None = None,
          on_state: Callable[[ChainState], None] | None = None, resume: ChainState | None = None,
          prompt_of: Callable[[int], str] | None = None) -> tuple[np.ndarray, list[DriftMetrics]]:
    """Chain chunks into one video; returns the frames and each chunk's drift metrics.

    `plan` is the number of frames each chunk generates. Chunk k+1 is conditioned on the last
    frame of chunk k and opens on it, so that frame is dropped rather than repeated. Chunk 1
    opens on `condition` when one is given: an input image is kept as the video's first frame,
    the last frame of a video being extended (`continuing`) is dropped like any other.
    Drift is measured against `anchor` (the input image or the video being extended), or
    against chunk 1 when there is none. With correction="color" the conditioning frame is
    matched to the anchor before it conditions (so the model starts from the right colours)
    and so is each new chunk (to remove the drift the model added on top). `prompt_of` names the
    prompt chunk k was made from, asked once it is made: the first chunk whose prompt differs from
    the anchor's is the new anchor, kept as made, and the chunks after it are measured against and
    corrected to it (an `anchor` given by the caller stands for the first chunk's prompt). Without
    it every chunk is taken to share one prompt. `on_chunk` sees
    each chunk as soon as it is done, so it can be stored and streamed. A generator that raises
    `StopChain` for a chunk after the first ends the video with the chunks made.

    `on_state` sees, just before `on_chunk`, the `ChainState` after each chunk. Given one as
    `resume`, the chain goes on from it (its condition, anchor and anchor's prompt stand in for
    `condition` and `anchor`) and returns only the chunks it makes then, with their metrics: the
    same frames the whole chain would have made from there.
    """
    if correction not in CORRECTIONS:
        raise ValueError(f"correction must be one of {', '.join(CORRECTIONS)}, got {correction!r}")
    if not plan or min(plan) < MIN_CHUNK_FRAMES:
        raise ValueError(f"need at least 1 chunk of at least {MIN_CHUNK_FRAMES} frames (a chunk's first frame is "
                         "its condition)")
    first, anchor_prompt = 0, None
    if resume is not None:
        if not 0 < resume.next_chunk <= len(plan):
            raise ValueError(f"cannot resume a chain of {len(plan)} chunks at chunk {resume.next_chunk}")
        first, condition, anchor = resume.next_chunk, resume.condition, resume.anchor
        anchor_prompt = resume.anchor_prompt
    videos, metrics = [], []
    for index, num_frames in enumerate(plan[first:], first):
        if condition is not None and anchor is not None and correction == "color":
            condition = match_colors(condition[None], anchor)[0]
        try:
            frames = generator.generate(condition, num_frames, seed + index, index)
        except StopChain:
            if index == 0:
                raise
            break
        if index > 0 or continuing:
            frames = frames[1:]
        prompt = prompt_of(index) if prompt_of is not None else None
        if anchor_prompt is None:
            anchor_prompt = prompt
        if anchor is None or prompt != anchor_prompt:
            # The look this prompt asked for: what its chunks are held to, not the old prompt's.
            anchor, anchor_prompt = Anchor.from_frames(frames), prompt
        elif correction == "color":
            frames = match_colors(frames, anchor)
        metric = measure(frames, anchor)
        videos.append(frames)
        metrics.append(metric)
        condition = frames[-1]
        if on_state is not None:
            on_state(ChainState(index + 1, condition, anchor, anchor_prompt))
        if on_chunk is not None:
            on_chunk(index, frames, metric)
    if not videos:  # resumed after its last chunk, or stopped at once
        return np.empty((0, *condition.shape), np.uint8), metrics
    return np.concatenate(videos), metrics
