"""A stand-in image-to-video model for the drift tests: chunks that drift like chained real ones."""

from __future__ import annotations

import numpy as np

from vidserve.media.drift import REC709


def _hue_rotation(degrees: float) -> np.ndarray:
    """RGB matrix rotating colours about the grey axis: a hue shift that leaves greys alone."""
    t = np.deg2rad(degrees)
    c, k, q = np.cos(t), (1 - np.cos(t)) / 3, np.sin(t) / np.sqrt(3)
    return np.array([[c + k, k - q, k + q], [k + q, c + k, k - q], [k - q, k + q, c + k]])


class SyntheticDriftGenerator:
    """A stand-in image-to-video model whose chunks drift like chained real ones.

    A chunk conditioned on a frame opens on that frame; the rest is the frame hue-rotated by
    `hue_degrees` and `darken` darker (in mean luma), under a slow pan with mild seeded noise so the
    histograms and the sharpness have something to measure. Without a condition it makes an
    undrifted first chunk from the seed.
    """

    def __init__(self, height: int = 48, width: int = 64, darken: float = 0.10, hue_degrees: float = 6.0,
                 noise: float = 1.0, pan: int = 2):
        self.height, self.width = height, width
        self.darken, self.hue_degrees, self.noise, self.pan = darken, hue_degrees, noise, pan

    def _scene(self, rng: np.random.Generator) -> np.ndarray:
        """A warm gradient with a few coloured discs: its mean colour is off the grey axis, so a hue shift shows."""
        y, x = np.mgrid[0 : self.height, 0 : self.width]
        yn, xn = y / (self.height - 1), x / (self.width - 1)
        img = np.stack([170 + 60 * xn, 100 + 70 * yn, 70 + 50 * (1 - xn) * yn], axis=-1)
        for _ in range(4):
            cy, cx, r = rng.uniform(0, self.height), rng.uniform(0, self.width), rng.uniform(4, self.height / 4)
            img[(y - cy) ** 2 + (x - cx) ** 2 < r * r] = rng.uniform(0, 255, 3)
        return img

    def generate(self, condition: np.ndarray | None, num_frames: int, seed: int, chunk: int = 0) -> np.ndarray:
        rng = np.random.default_rng(seed)
        base = self._scene(rng) if condition is None else condition.astype(np.float64)
        if condition is not None:
            # The drift: hue-rotate, then set the gain so the mean luma is exactly `darken` lower
            # (a hue rotation alone moves luma, as it trades red for green).
            shifted = base @ _hue_rotation(self.hue_degrees).T
            base = shifted * (1 - self.darken) * (base @ REC709).mean() / max((shifted @ REC709).mean(), 1e-6)
        frames = np.empty((num_frames, *base.shape), np.uint8)
        for t in range(num_frames):
            frame = np.roll(base, self.pan * t, axis=1)  # a pan: motion that keeps the colour statistics
            frame = frame + rng.normal(0, self.noise, frame.shape)
            frames[t] = np.clip(frame.round(), 0, 255)
        if condition is not None:
            frames[0] = condition  # image-to-video: the chunk opens on the conditioning frame itself
        return frames
