"""Render examples/first.png, the README's first frame: frame 0 of a shapes-world clip
(training/shapes_world.py), a yellow circle on a gray background at wan-shapes' native
64x64, drawn by the same renderer as the models' training data.

    python examples/first_frame.py [OUT]    # from the repository root; OUT: examples/first.png
"""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # training/ is scripts beside the package, not part of it

from PIL import Image  # noqa: E402

from training.shapes_world import ClipSpec, Shape, render  # noqa: E402

CIRCLE = Shape("circle", "yellow", "right", size=8.0, x0=22.0, y0=38.0, speed=1.0)


def first_frame() -> Image.Image:
    return Image.fromarray(render(ClipSpec((CIRCLE,), "gray", frames=17))[0])


if __name__ == "__main__":
    first_frame().save(sys.argv[1] if len(sys.argv) > 1 else ROOT / "examples" / "first.png")
