"""Drift metrics, colour matching and the reference chaining loop (vidserve.media.drift), on small synthetic frames."""

from __future__ import annotations

import json

import numpy as np
import pytest

from drift_doubles import SyntheticDriftGenerator
from vidserve.media.drift import Anchor, chain, color_stats, match_colors, measure

CHUNKS, FRAMES = 5, 9


def chromaticity(metrics) -> np.ndarray:
    """Channel means over their sum: the colour cast, with the brightness divided out."""
    mean = np.array(metrics.channel_mean)
    return mean / mean.sum()


def box_blur(frames: np.ndarray) -> np.ndarray:
    padded = np.pad(frames.astype(np.float32), ((0, 0), (1, 1), (1, 1), (0, 0)), mode="edge")
    h, w = frames.shape[1:3]
    out = sum(padded[:, dy : dy + h, dx : dx + w] for dy in range(3) for dx in range(3)) / 9
    return out.round().astype(np.uint8)


@pytest.fixture(scope="module")
def clip() -> np.ndarray:
    return SyntheticDriftGenerator().generate(None, FRAMES, seed=7)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_color_correction_holds_chunk_5_at_chunk_1(seed):
    frames, metrics = chain(SyntheticDriftGenerator(), [FRAMES] * CHUNKS, correction="color", seed=seed)
    first, last = metrics[0], metrics[-1]
    # The metrics describe the frames that were emitted: chunk 5 is the last FRAMES - 1 of them.
    assert last.mean_luma == pytest.approx(color_stats(frames[-(FRAMES - 1) :]).luma)
    assert abs(last.mean_luma - first.mean_luma) / first.mean_luma < 0.02
    np.testing.assert_allclose(last.channel_mean, first.channel_mean, atol=2.0)
    np.testing.assert_allclose(chromaticity(last), chromaticity(first), atol=0.005)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_without_correction_chunk_5_drifts_dark_and_off_colour(seed):
    _, metrics = chain(SyntheticDriftGenerator(), [FRAMES] * CHUNKS, correction="none", seed=seed)
    first, last = metrics[0], metrics[-1]
    assert last.mean_luma <= 0.70 * first.mean_luma
    assert last.luma_change <= -0.30
    assert np.abs(chromaticity(last) - chromaticity(first)).max() > 0.02
    # Luma falls chunk by chunk: the drift compounds.
    assert all(b.mean_luma < a.mean_luma for a, b in zip(metrics, metrics[1:]))


@pytest.mark.parametrize("chunks, frames_per_chunk", [(1, 5), (3, 2), (CHUNKS, FRAMES)])
@pytest.mark.parametrize("correction", ["color", "none"])
def test_chain_emits_each_conditioning_frame_once(chunks, frames_per_chunk, correction):
    frames, metrics = chain(SyntheticDriftGenerator(), [frames_per_chunk] * chunks, correction=correction)
    assert frames.shape == (chunks * (frames_per_chunk - 1) + 1, 48, 64, 3)
    assert frames.dtype == np.uint8
    assert len(metrics) == chunks


def test_chain_rejects_unknown_correction():
    with pytest.raises(ValueError, match="correction"):
        chain(SyntheticDriftGenerator(), [3, 3], correction="lab")


def test_generator_opens_on_condition_and_darkens_it(clip):
    gen = SyntheticDriftGenerator()
    chunk = gen.generate(clip[-1], FRAMES, seed=3)
    assert chunk.shape == clip.shape and chunk.dtype == np.uint8
    np.testing.assert_array_equal(chunk[0], clip[-1])
    assert color_stats(chunk[1:]).luma == pytest.approx(0.9 * color_stats(clip[-1:]).luma, rel=0.01)
    np.testing.assert_array_equal(chunk, gen.generate(clip[-1], FRAMES, seed=3))  # seeded


def test_identical_frames_show_no_drift(clip):
    m = measure(clip, Anchor.from_frames(clip))
    assert m.histogram_distance == pytest.approx(0.0, abs=1e-12)
    assert m.luma_change == pytest.approx(0.0, abs=1e-12)
    assert m.sharpness_ratio == pytest.approx(1.0)
    assert 0 < m.mean_luma < 255 and m.sharpness > 0


def test_darker_copy_has_lower_luma(clip):
    anchor = Anchor.from_frames(clip)
    darker = (clip * 0.8).round().astype(np.uint8)
    m = measure(darker, anchor)
    assert m.mean_luma < anchor.color.luma
    assert m.luma_change == pytest.approx(-0.2, abs=0.01)
    assert 0 < m.histogram_distance <= 1


def test_blurred_copy_is_less_sharp(clip):
    m = measure(box_blur(clip), Anchor.from_frames(clip))
    assert m.sharpness_ratio < 0.5
    assert abs(m.luma_change) < 0.01  # a blur moves detail, not brightness


def test_metrics_serialise_as_plain_floats(clip):
    d = measure(clip, Anchor.from_frames(clip[:1])).to_dict()
    assert json.loads(json.dumps(d)) == d
    assert len(d["channel_mean"]) == 3 and len(d["channel_std"]) == 3
    assert all(type(v) is float for v in d.values() if not isinstance(v, list))


def test_match_colors_leaves_a_matched_chunk_alone(clip):
    anchor = Anchor.from_frames(clip)
    out = match_colors(clip, anchor)
    assert out.dtype == np.uint8 and out.shape == clip.shape
    assert np.abs(out.astype(int) - clip).max() <= 1  # rounding only
    np.testing.assert_array_equal(match_colors(clip, anchor.color), out)  # ColorStats is enough


def test_match_colors_undoes_a_gain_and_cast(clip):
    cast = (clip * np.array([0.7, 0.8, 0.95])).round().astype(np.uint8)
    m = measure(match_colors(cast, Anchor.from_frames(clip)), Anchor.from_frames(clip))
    assert abs(m.luma_change) < 0.005
    assert m.histogram_distance < 0.05


def test_chain_anchored_on_an_input_image_keeps_it_and_streams_each_chunk(clip):
    image = clip[0]
    seen = []
    frames, metrics = chain(SyntheticDriftGenerator(), [5, 5, 5], condition=image, anchor=Anchor.from_frames(image[None]),
                            on_chunk=lambda index, chunk, metric: seen.append((index, len(chunk), metric)))
    assert frames.shape[0] == 5 + 4 + 4
    assert [(i, n) for i, n, _ in seen] == [(0, 5), (1, 4), (2, 4)]
    assert [m for _, _, m in seen] == metrics
    assert abs(metrics[-1].luma_change) < 0.02  # anchored on the image, corrected to it


def test_continuing_a_video_drops_its_last_frame():
    last_frame = SyntheticDriftGenerator().generate(None, 3, seed=1)[-1]
    frames, _ = chain(SyntheticDriftGenerator(), [5, 5], condition=last_frame, continuing=True,
                      anchor=Anchor.from_frames(last_frame[None]))
    assert frames.shape[0] == 4 + 4
