"""The `frames` rendition: a ZIP of numbered, lossless PNG frames and a manifest.json saying
what they are (rate, size, and the prompt, model and seed they came from)."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path
from typing import Any

MANIFEST = "manifest.json"
FRAME_NAME = "frame-%06d.png"  # numbered from 0, as the frames' indices


def write_archive(pngs: list[Path], manifest: dict[str, Any], path: Path) -> Path:
    """A ZIP at `path` of the manifest, then `pngs` renamed in order."""
    # Stored, not deflated: PNG is compressed already, and deflating it again only costs time.
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as archive:
        archive.writestr(MANIFEST, json.dumps({**manifest, "frames": len(pngs), "names": FRAME_NAME}, indent=2))
        for index, png in enumerate(pngs):
            archive.write(png, FRAME_NAME % index)
    return path
