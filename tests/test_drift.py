"""Drift metrics, colour matching and the reference chaining loop (vidserve.media.drift), on small synthetic frames."""

from __future__ import annotations

import json

import numpy as np
import pytest

from drift_doubles import SyntheticDriftGenerator
from vidserve.media.drift import Anchor, ChainState, chain, color_stats, match_colors, measure

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


# --- a prompt that changes mid-video (a steered session, a storyboard): a new colour reference ---

WARM, COOL = "a warm scene", "a cool scene, 青い"  # not only ASCII: the stored state keeps it as written
STORYBOARD = [WARM, WARM, COOL, COOL, COOL]


def looks_cool(frames: np.ndarray) -> bool:
    mean = frames.reshape(-1, 3).mean(axis=0)
    return bool(mean[2] > mean[0])


class SteeredGenerator(SyntheticDriftGenerator):
    """The stand-in model, following its prompt: a chunk made from COOL has its red and blue swapped
    where the frame it opens on is warm (and WARM the other way), then drifts as before."""

    def __init__(self, prompts: list[str]):
        super().__init__()
        self.prompts = prompts

    def generate(self, condition, num_frames, seed, chunk=0):
        frames = super().generate(condition, num_frames, seed, chunk)
        made = frames if condition is None else frames[1:]  # the opening frame is the condition itself
        if looks_cool(made) != (self.prompts[chunk] == COOL):
            made[...] = made[..., ::-1].copy()
        return frames


def storyboard_chunks(correction: str, prompts: list[str] = STORYBOARD) -> tuple[list[np.ndarray], list]:
    chunks = []
    _, metrics = chain(SteeredGenerator(prompts), [FRAMES] * len(prompts), correction=correction, seed=4,
                       prompt_of=prompts.__getitem__, on_chunk=lambda index, frames, metric: chunks.append(frames))
    return chunks, metrics


def test_a_new_prompt_starts_a_new_colour_reference_and_drift_within_it_is_still_corrected():
    chunks, metrics = storyboard_chunks("color")
    # Each chunk has the look its prompt asked for: the cool ones are not pulled back to chunk 1.
    assert [looks_cool(c) for c in chunks] == [p == COOL for p in STORYBOARD]
    # The first cool chunk is the reference of the cool ones, and they are held to it as the
    # warm ones are to chunk 1.
    assert metrics[2].luma_change == pytest.approx(0.0, abs=1e-12)
    for reference, last in ((metrics[0], metrics[1]), (metrics[2], metrics[4])):
        assert abs(last.mean_luma - reference.mean_luma) / reference.mean_luma < 0.02
        np.testing.assert_allclose(chromaticity(last), chromaticity(reference), atol=0.005)
    # Uncorrected, the cool chunks drift, measured against the first of them.
    _, uncorrected = storyboard_chunks("none")
    assert uncorrected[2].luma_change == pytest.approx(0.0, abs=1e-12)
    assert uncorrected[4].luma_change <= -0.15


def test_one_prompt_throughout_is_corrected_to_chunk_1_as_without_prompts():
    prompts = [WARM] * CHUNKS
    frames, metrics = chain(SteeredGenerator(prompts), [FRAMES] * CHUNKS, seed=2, prompt_of=prompts.__getitem__)
    unnamed, unnamed_metrics = chain(SteeredGenerator(prompts), [FRAMES] * CHUNKS, seed=2)
    np.testing.assert_array_equal(frames, unnamed)
    assert metrics == unnamed_metrics


@pytest.mark.parametrize("stopped_after", [1, 2, 3])  # 2: the next chunk is the first cool one
def test_a_storyboard_resumed_from_a_stored_state_makes_what_the_whole_chain_made(stopped_after):
    states = []
    plan = [FRAMES] * len(STORYBOARD)
    whole, metrics = chain(SteeredGenerator(STORYBOARD), plan, seed=4, prompt_of=STORYBOARD.__getitem__,
                           on_state=states.append)
    stored = ChainState.from_bytes(states[stopped_after - 1].to_bytes())
    assert stored.anchor_prompt == STORYBOARD[0 if stopped_after < 3 else 2]
    rest, rest_metrics = chain(SteeredGenerator(STORYBOARD), plan, seed=4, prompt_of=STORYBOARD.__getitem__,
                               resume=stored)
    np.testing.assert_array_equal(rest, whole[FRAMES + (FRAMES - 1) * (stopped_after - 1):])
    assert rest_metrics == metrics[stopped_after:]
