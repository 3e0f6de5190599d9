"""How large a vision model's image processor will make an image, worked out from the
processor's own resize rules before it runs.

A processor scales an image before it crops, pads or patches it, and that scaled array is
the largest thing it allocates: CLIP-style processors bring the short side to
`shortest_edge` (so a thin strip grows along its long side without limit), Qwen2-VL's keep
the area between `min_pixels` and `max_pixels` in multiples of its patch grid, LLaVA-NeXT's
fit the best of their grid pinpoints. Knowing the size first, the server can refuse an
image whose processing would be huge instead of finding out by running it.
"""

from __future__ import annotations

from transformers.image_processing_utils import select_best_resolution
from transformers.image_transforms import get_size_with_aspect_ratio
from transformers.image_utils import get_image_size_for_max_height_width
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize


def _get(size, key: str):
    """A field of a processor's `size` (a transformers SizeDict, or a plain dict in older configs)."""
    return size.get(key) if isinstance(size, dict) else getattr(size, key, None)


def processed_size(image_processor, width: int, height: int) -> tuple[int, int] | None:
    """(width, height) the processor scales a width x height image to; None when its rules are not known here."""
    if not getattr(image_processor, "do_resize", True):
        return width, height
    size = getattr(image_processor, "size", None) or {}
    shortest, longest = _get(size, "shortest_edge"), _get(size, "longest_edge")
    merge = getattr(image_processor, "merge_size", None)
    if merge and shortest and longest:  # Qwen2-VL / Qwen2.5-VL: the edges are min and max *pixels*
        factor = image_processor.patch_size * merge
        h, w = smart_resize(height, width, factor=factor, min_pixels=shortest, max_pixels=longest)
        return w, h
    pinpoints = getattr(image_processor, "image_grid_pinpoints", None)
    if pinpoints:  # LLaVA-NeXT: the image is fit into one of these, then cut into tiles
        h, w = select_best_resolution((height, width), pinpoints)
        return w, h
    if shortest and longest:
        h, w = get_size_with_aspect_ratio((height, width), shortest, longest)
        return w, h
    if shortest:  # the short side becomes `shortest`, the long side keeps the aspect ratio
        if width <= height:
            return shortest, int(shortest * height / width)
        return int(shortest * width / height), shortest
    max_height, max_width = _get(size, "max_height"), _get(size, "max_width")
    if max_height and max_width:
        h, w = get_image_size_for_max_height_width((height, width), max_height, max_width)
        return w, h
    fixed_height, fixed_width = _get(size, "height"), _get(size, "width")
    if fixed_height and fixed_width:
        return fixed_width, fixed_height
    return None
