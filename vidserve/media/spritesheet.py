"""The `spritesheet` variant: a JPEG grid of evenly spaced frames, the preview strip a player
shows while scrubbing (what OpenAI's `download_content(variant="spritesheet")` fetches).

Up to 16 frames, the first and the last among them, left to right then top to bottom, in a
grid ceil(sqrt(count)) tiles wide; each tile is a frame scaled to at most 256 pixels a side.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
from PIL import Image

from vidserve.media import check_frames

MAX_TILES = 16
TILE_SIDE = 256
JPEG_QUALITY = 85


def sprite_indices(frames: int) -> list[int]:
    """The frames a spritesheet of a `frames`-frame video shows."""
    tiles = min(MAX_TILES, frames)
    if tiles == 1:
        return [0]
    return [round(i * (frames - 1) / (tiles - 1)) for i in range(tiles)]


def save_spritesheet(frames: np.ndarray, path: str | Path) -> Path:
    check_frames(frames)
    indices = sprite_indices(len(frames))
    _, height, width, _ = frames.shape
    scale = min(1.0, TILE_SIDE / max(width, height))
    tile = (max(1, round(width * scale)), max(1, round(height * scale)))
    columns = math.ceil(math.sqrt(len(indices)))
    rows = math.ceil(len(indices) / columns)
    sheet = Image.new("RGB", (columns * tile[0], rows * tile[1]))
    for i, index in enumerate(indices):
        frame = Image.fromarray(frames[index])
        if frame.size != tile:
            frame = frame.resize(tile, Image.LANCZOS)
        sheet.paste(frame, ((i % columns) * tile[0], (i // columns) * tile[1]))
    path = Path(path)
    sheet.save(path, format="JPEG", quality=JPEG_QUALITY)
    return path
