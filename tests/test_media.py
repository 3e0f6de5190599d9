"""Behaviour of vidserve.media against the real bundled ffmpeg and Pillow."""

from __future__ import annotations

import io
import struct
import zlib

import numpy as np
import pytest
from PIL import Image

from vidserve.errors import InvalidRequest
from vidserve.media import encode_mp4, last_frame, load_image, read_video, save_thumbnail


def moving_gradient(n: int = 33, h: int = 64, w: int = 64) -> np.ndarray:
    """Smooth content that drifts a few pixels per frame, like a slow pan."""
    t = np.arange(n)[:, None, None]
    y = np.arange(h)[None, :, None]
    x = np.arange(w)[None, None, :]
    r = 128 + 100 * np.sin(2 * np.pi * (x + 2 * t) / w)
    g = 128 + 100 * np.cos(2 * np.pi * (y + t) / h)
    b = 40 + 2 * (x + y) + 0 * t
    return np.stack(np.broadcast_arrays(r, g, b), axis=-1).round().astype(np.uint8)


@pytest.fixture(scope="module")
def clip() -> np.ndarray:
    return moving_gradient()


def png_bytes(img: Image.Image) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


# --- encode / decode ---------------------------------------------------------------------


@pytest.mark.parametrize("fps", [16, 24])
def test_round_trip_keeps_frame_count_size_fps_and_pixels(tmp_path, clip, fps):
    path = encode_mp4(clip, tmp_path / "out.mp4", fps=fps)
    assert path == tmp_path / "out.mp4"

    frames, got_fps = read_video(path)
    assert frames.shape == (33, 64, 64, 3)
    assert frames.dtype == np.uint8
    assert got_fps == pytest.approx(fps)
    err = np.abs(frames.astype(np.int16) - clip.astype(np.int16)).mean()
    assert err < 6, f"mean abs error {err:.2f} too high for smooth content at crf 18"


def test_frames_stay_in_order(tmp_path):
    # Each frame a distinct flat grey: any dropped, duplicated or reordered frame shows up.
    levels = np.linspace(20, 230, 12).round().astype(np.uint8)
    frames = np.broadcast_to(levels[:, None, None, None], (12, 32, 48, 3)).copy()
    decoded, _ = read_video(encode_mp4(frames, tmp_path / "steps.mp4", fps=16))
    assert decoded.shape == frames.shape
    assert np.abs(decoded.mean(axis=(1, 2, 3)) - levels).max() < 3


def test_encoding_is_deterministic(tmp_path, clip):
    a = encode_mp4(clip, tmp_path / "a.mp4", fps=16)
    b = encode_mp4(clip, tmp_path / "b.mp4", fps=16)
    assert np.array_equal(read_video(a)[0], read_video(b)[0])
    assert a.read_bytes() == b.read_bytes()


def test_output_is_faststart_and_overwrites_atomically(tmp_path, clip):
    target = tmp_path / "out.mp4"
    target.write_bytes(b"stale")
    encode_mp4(clip, target, fps=16)
    data = target.read_bytes()
    assert data.index(b"moov") < data.index(b"mdat")
    # No temp file is left behind next to the result.
    assert [p.name for p in tmp_path.iterdir()] == ["out.mp4"]


@pytest.mark.parametrize(
    "frames, match",
    [
        (np.zeros((4, 63, 64, 3), np.uint8), "even"),
        (np.zeros((4, 64, 65, 3), np.uint8), "even"),
        (np.zeros((4, 64, 64, 3), np.float32), "uint8"),
        (np.zeros((64, 64, 3), np.uint8), r"\[N, H, W, 3\]"),
        (np.zeros((4, 64, 64, 4), np.uint8), r"\[N, H, W, 3\]"),
        (np.zeros((0, 64, 64, 3), np.uint8), "at least one"),
    ],
)
def test_encode_rejects_bad_frames(tmp_path, frames, match):
    with pytest.raises(ValueError, match=match):
        encode_mp4(frames, tmp_path / "bad.mp4", fps=16)
    assert list(tmp_path.iterdir()) == []


def test_encode_reports_ffmpeg_failure(tmp_path, clip):
    # Only libx264 knows crf must be >= -1; its complaint should reach the caller.
    with pytest.raises(RuntimeError, match=r"(?s)ffmpeg failed.*crf.*out of range"):
        encode_mp4(clip, tmp_path / "out.mp4", fps=16, crf=-5)
    assert list(tmp_path.iterdir()) == []


# --- stills ------------------------------------------------------------------------------


@pytest.mark.parametrize("name, fmt", [("thumb.png", None), ("thumb.webp", None), ("thumb.img", "PNG")])
def test_thumbnail_is_the_middle_frame(tmp_path, clip, name, fmt):
    path = save_thumbnail(clip, tmp_path / name, format=fmt)
    with Image.open(path) as img:
        assert img.size == (64, 64)
        assert img.format == (fmt or path.suffix[1:].upper())
        pixels = np.asarray(img.convert("RGB")).astype(np.int16)
    middle = clip[len(clip) // 2].astype(np.int16)
    assert np.abs(pixels - middle).mean() < (0.01 if img.format == "PNG" else 4)
    # ...and not merely some frame: its neighbours are further away.
    assert np.abs(pixels - clip[0].astype(np.int16)).mean() > 10


def test_last_frame(clip):
    img = last_frame(clip)
    assert img.mode == "RGB" and img.size == (64, 64)
    assert np.array_equal(np.asarray(img), clip[-1])


# --- load_image --------------------------------------------------------------------------


@pytest.fixture
def sample() -> Image.Image:
    return Image.fromarray(moving_gradient(1, 40, 60)[0])


def test_load_image_from_bytes_path_and_file(tmp_path, sample):
    data = png_bytes(sample)
    path = tmp_path / "in.png"
    path.write_bytes(data)
    with open(path, "rb") as fh:
        from_file = load_image(fh, max_pixels=10_000)
        assert not fh.closed  # the caller's file stays the caller's to close
    for img in (from_file, load_image(data, 10_000), load_image(path, 10_000), load_image(str(path), 10_000)):
        assert img.mode == "RGB" and img.size == (60, 40)
        assert np.array_equal(np.asarray(img), np.asarray(sample))


def test_load_image_converts_to_rgb(sample):
    img = load_image(png_bytes(sample.convert("RGBA")), max_pixels=10_000)
    assert img.mode == "RGB"
    img = load_image(png_bytes(sample.convert("L")), max_pixels=10_000)
    assert img.mode == "RGB"


def test_load_image_applies_exif_orientation(sample):
    exif = Image.Exif()
    exif[0x0112] = 6  # "rotate 90 CW to display"
    buf = io.BytesIO()
    sample.save(buf, format="JPEG", exif=exif)
    assert load_image(buf.getvalue(), max_pixels=10_000).size == (40, 60)


def assert_invalid(source, max_pixels: int, match: str) -> InvalidRequest:
    with pytest.raises(InvalidRequest, match=match) as info:
        load_image(source, max_pixels=max_pixels)
    assert info.value.param == "image"
    return info.value


def test_load_image_rejects_non_images(tmp_path):
    text = tmp_path / "x.txt"
    text.write_text("hello, not an image\n")
    err = assert_invalid(text, 10_000, "Pillow can decode")
    assert "x.txt" in err.message
    assert_invalid(b"", 10_000, "Pillow can decode")
    assert_invalid(tmp_path / "missing.png", 10_000, "no such file")


def test_load_image_rejects_truncated_png(sample):
    data = png_bytes(sample)
    assert_invalid(data[: len(data) // 2], 10_000, "corrupt or truncated")


def png_header(width: int, height: int) -> bytes:
    """A PNG that claims a size but carries no pixel data: only a header-first check passes it."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)  # 8-bit RGB
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", b"") + chunk(b"IEND", b"")


def test_load_image_checks_size_before_decoding(sample):
    assert_invalid(png_bytes(sample), 60 * 40 - 1, r"60x40 = 2400 pixels; the limit is 2399")
    # Header-only files: if load_image decoded before checking, it would fail as truncated instead.
    assert_invalid(png_header(8000, 8000), 16_777_216, r"8000x8000 = 64000000 pixels; the limit is 16777216")
    # Past Pillow's own bomb guard, Image.open refuses before our check can run.
    assert_invalid(png_header(20_000, 20_000), 10**12, "decompression-bomb limit")
