"""Classical (no learning) scorer for shapes-world clips: which shape, colour, motion, background.

Why: benchmarks/shapes_eval.py and the training scripts grade generated clips against
the prompt they were made from, automatically and reproducibly, without a learned judge that
could share the generator's blind spots. The shapes world (training/shapes_world.py) is
simple enough for hand-written rules, which are kept tolerant of what a generative model
emits: noise, blur, soft edges, graded or tinted backgrounds. numpy only (scipy is not a
project dependency).

Pipeline: background = a plane fitted to the border pixels, named by its nearest gray ->
foreground = pixels far from that plane and saturated -> each foreground pixel named by hue
(blending a colour with any gray keeps its hue, so anti-aliased and blurred edges still vote
for the right colour) -> per colour, a cleaned mask whose centroid track names the motion;
the masks stacked on their centroids name the shape: lopsided about its box's middle ->
triangle, else fill of its bounding box ~pi/4 -> circle, ~1 -> square.
"""

from __future__ import annotations

import numpy as np

from training.shapes_world import BACKGROUNDS, COLOURS, NEW_COLOURS, parse_prompt

# Of shapes_world.COLOURS and NEW_COLOURS; a pixel takes the nearest. Purple, last, keeps the others'
# indices; it takes hues 260-320, which the base colours are never rendered in.
HUES = {"red": 0.0, "yellow": 52.0, "green": 120.0, "blue": 240.0, "purple": 280.0}
RGB = {**COLOURS, **NEW_COLOURS}
# Shape features of the centroid-aligned mask (see _shape), ideal vs measured on 5-10 px shapes
# at 64x64 with up to sigma=30 noise and blur: one-sided share triangle 0.5, circle/square 0
# (measured >= 0.24 vs <= 0.12); bounding-box fill circle pi/4, square 1 (measured <= 0.83 vs >= 0.88).
TRIANGLE_ASYM = 0.2
SQUARE_FILL = 0.86
FG_DISTANCE = 80.0  # RGB distance from the background: every colour sits >= 220 away from every gray
COVER = 0.4  # a pixel belongs to a shape when its colour is >= 40% of the way from background to it
MIN_CHROMA = 60.0  # max - min channel: the colours have 255, a noisy gray rarely reaches 60
MIN_AREA = 6  # px in a frame for that frame to count; also the least mean area of an object
MIN_SHARE = 0.1  # a colour with under 10% of the main object's pixels is debris, not an object
MIN_STEADY = 0.5  # see _shape: measured >= 0.85 on rendered clips even at sigma=40, <= 0.13 on pure noise
BORDER = 2  # px ring used for the background; shapes_world keeps shapes off it


def _background(clip: np.ndarray) -> tuple[np.ndarray, str, float]:
    """Plane per channel fitted to the border ring (temporal median first: a shape passing by
    doesn't move it), refitted once without outliers. Returns plane [H, W, 3], name, confidence."""
    _, h, w, _ = clip.shape
    ys, xs = np.mgrid[0:h, 0:w]
    ring = (np.minimum(ys, h - 1 - ys) < BORDER) | (np.minimum(xs, w - 1 - xs) < BORDER)
    values = np.median(clip[:, ring].astype(np.float32), axis=0)  # [N, 3]
    design = np.stack([np.ones(ring.sum()), ys[ring] / h, xs[ring] / w], axis=1)
    keep = np.ones(len(values), bool)
    for _ in range(2):
        coef = np.linalg.lstsq(design[keep], values[keep], rcond=None)[0]
        keep = np.linalg.norm(design @ coef - values, axis=1) < 40
        if keep.sum() < 3:
            keep[:] = True
    plane = (np.stack([np.ones((h, w)), ys / h, xs / w], axis=-1) @ coef).astype(np.float32)
    mean = np.median(values[keep], axis=0)
    dist = {name: np.linalg.norm(mean - level) for name, level in BACKGROUNDS.items()}
    d1, d2 = sorted(dist.values())[:2]
    return plane, min(dist, key=dist.get), float(1 - d1 / max(d2, 1e-6))


def _hue(f: np.ndarray, top: np.ndarray, chroma: np.ndarray) -> np.ndarray:
    r, g, b = f[..., 0], f[..., 1], f[..., 2]
    c = np.maximum(chroma, 1e-6)
    h = np.where(top == r, ((g - b) / c) % 6, np.where(top == g, (b - r) / c + 2, (r - g) / c + 4))
    return h * 60.0


def _clean(mask: np.ndarray) -> np.ndarray:
    """Per frame: drop pixels with under 2 of 8 neighbours set (noise specks), fill pixels with
    at least 6 set (pinholes). Unlike a majority filter it keeps corners and a triangle's apex."""
    _, h, w = mask.shape
    p = np.pad(mask, ((0, 0), (1, 1), (1, 1))).astype(np.uint8)
    count = sum(p[:, i:i + h, j:j + w] for i in range(3) for j in range(3))
    return (mask & (count >= 3)) | (~mask & (count >= 6))


def _shape(mask: np.ndarray, visible: np.ndarray, ys: list, xs: list) -> dict:
    """Shape from the visible frames stacked on their centroids: the objects are rigid, so the
    average cancels the noise that stretches any one frame's bounding box by a pixel."""
    _, h, w = mask.shape
    stack = sum(np.roll(mask[t], (h // 2 - round(y), w // 2 - round(x)), axis=(0, 1))
                for t, y, x in zip(np.nonzero(visible)[0], ys, xs))
    core = stack >= 0.5 * stack.max()
    y, x = np.nonzero(core)
    fill = len(y) / ((np.ptp(y) + 1) * (np.ptp(x) + 1))
    # Share of pixels on one side of the box's middle, along the more lopsided axis
    asym = max(abs(np.sign(2 * v - v.min() - v.max()).sum()) for v in (y, x)) / len(y)
    if asym >= TRIANGLE_ASYM:  # confidence: how far past the boundary, toward the ideal value
        shape, conf = "triangle", (asym - TRIANGLE_ASYM) / (0.5 - TRIANGLE_ASYM)
    elif fill >= SQUARE_FILL:
        shape, conf = "square", min((fill - SQUARE_FILL) / (1 - SQUARE_FILL), 1 - asym / TRIANGLE_ASYM)
    else:
        shape, conf = "circle", min((SQUARE_FILL - fill) / (SQUARE_FILL - np.pi / 4), 1 - asym / TRIANGLE_ASYM)
    return {"shape": shape, "shape_conf": float(np.clip(conf, 0, 1)), "fill": float(fill), "asymmetry": float(asym),
            # how often a core pixel is on: ~0.9 for a rigid shape, ~0.1 for scattered noise
            "steadiness": float(stack[core].mean() / visible.sum())}


def _object(mask: np.ndarray, colour: str, colour_conf: float, min_move: float) -> dict:
    visible = mask.sum((1, 2)) >= MIN_AREA
    ys, xs = zip(*(np.nonzero(frame) for frame in mask[visible]))
    ys, xs = [y.mean() for y in ys], [x.mean() for x in xs]  # centroid track
    dx, dy = xs[-1] - xs[0], ys[-1] - ys[0]  # net displacement, first to last visible frame
    if max(abs(dx), abs(dy)) >= min_move:
        motion = ("right" if dx > 0 else "left") if abs(dx) > abs(dy) else ("down" if dy > 0 else "up")
        motion_conf = max(abs(dx), abs(dy)) / (abs(dx) + abs(dy))
    else:  # back where it started: a hop (a real upward excursion) or nothing
        motion = "bouncing" if ys[0] - min(ys) >= 1.5 * min_move else "still"
        motion_conf = 1 - float(np.hypot(dx, dy)) / min_move
    return {"colour": colour, "colour_conf": colour_conf, **_shape(mask, visible, ys, xs),
            "motion": motion, "motion_conf": float(motion_conf), "displacement": (float(dx), float(dy)),
            "area": float(mask[visible].sum() / visible.sum())}


def detect(clip: np.ndarray) -> dict:
    """Predictions for a uint8 [F, H, W, 3] clip: background (+ confidence), the objects found
    (largest first), and the largest one's colour/shape/motion (+ confidences) at top level
    (None when nothing is found). Confidences are in [0, 1]: 1 - nearest/second-nearest
    distance, vote share for colour, share of the displacement along the called axis."""
    clip = np.asarray(clip)
    if clip.ndim != 4 or clip.shape[-1] != 3 or clip.shape[0] < 2 or clip.dtype != np.uint8:
        raise ValueError(f"expected a uint8 [F, H, W, 3] clip with F >= 2, got {clip.dtype} {clip.shape}")
    plane, bg_name, bg_conf = _background(clip)
    # Channel-first: per-channel arithmetic is much faster than reducing a trailing axis of 3
    f = np.moveaxis(clip, -1, 0).astype(np.float32)
    plane = np.moveaxis(plane, -1, 0)[:, None]  # [3, 1, H, W]
    diff = f - plane
    chroma = np.maximum(np.maximum(f[0], f[1]), f[2]) - np.minimum(np.minimum(f[0], f[1]), f[2])
    distance2 = diff[0] * diff[0] + diff[1] * diff[1] + diff[2] * diff[2]
    where = np.nonzero((distance2 > FG_DISTANCE ** 2) & (chroma > MIN_CHROMA))
    pix = f[(slice(None), *where)].T  # only the few foreground candidates get a hue: most is background
    hue = _hue(pix, pix.max(-1), chroma[where])
    gap = np.abs((hue[:, None] - np.array(list(HUES.values())) + 180) % 360 - 180)  # circular distance
    label = np.full(clip.shape[:3], -1, np.int8)
    label[where] = gap.argmin(-1)
    votes = np.bincount(label[where], minlength=len(HUES))
    min_move = max(2.0, 0.04 * min(clip.shape[1:3]))  # generated motions cover >= 8 px at 64 px
    objects = []
    for k in np.argsort(-votes, kind="stable"):
        name = list(HUES)[k]
        if votes[k] < max(MIN_AREA * len(clip), MIN_SHARE * votes.max()):
            continue
        target = np.array(RGB[name], np.float32)[:, None, None, None] - plane
        cover = (diff * target).sum(0) / (target * target).sum(0)  # projection onto background -> colour
        mask = _clean((cover > COVER) & (label == k))
        if (mask.sum((1, 2)) >= MIN_AREA).sum() >= 2:
            found = _object(mask, name, float(votes[k] / votes.sum()), min_move)
            if found["steadiness"] >= MIN_STEADY:
                objects.append(found)
    first = objects[0] if objects else {}
    top_level = {k: first.get(k) for k in ("colour", "colour_conf", "shape", "shape_conf", "motion", "motion_conf")}
    return {"background": bg_name, "background_conf": bg_conf, **top_level, "objects": objects}


def _pair(wanted: list, found: list) -> list:
    """Prompt objects matched to detections: same colour first, then the rest by size, so a
    wrong colour costs only the colour and shape/motion are still judged on the main object."""
    pairs, left = [], list(found)
    for w in wanted:
        match = next((g for g in left if g["colour"] == w["colour"]), None)
        if match is not None:
            left.remove(match)
        pairs.append([w, match])
    for pair in pairs:
        if pair[1] is None and left:
            pair[1] = left.pop(0)
    return [p for p in pairs if p[1] is not None]


def score(clip: np.ndarray, prompt: str) -> dict:
    """{"colour", "shape", "motion", "background", "all"}: does the clip show what the prompt says?

    A clip with no foreground scores all False (a blank clip is a failed generation even if its
    background is right); so does an attribute the prompt doesn't name. With two objects in
    the prompt, an attribute is True only if it is right for both."""
    want, got = parse_prompt(prompt), detect(clip)
    result = dict.fromkeys(("colour", "shape", "motion", "background"), False)
    pairs = _pair(want["objects"], got["objects"])
    if pairs and len(pairs) == len(want["objects"]):
        result["background"] = want["background"] == got["background"]
        for key in ("colour", "shape", "motion"):
            result[key] = all(w[key] == g[key] for w, g in pairs)
    result["all"] = all(result.values())
    return result


def score_caption(text: str, truth: str) -> dict:
    """{"colour", "shape", "background", "colour+shape"}: does a caption (a VLM's answer) name what
    the frame shows? Both are read with parse_prompt, so word order and synonyms don't matter;
    "colour+shape" needs exactly the truth's objects, each with its colour and shape (naming one
    that isn't there is as wrong as missing one)."""
    said, want = parse_prompt(text), parse_prompt(truth)
    named = {(o["colour"], o["shape"]) for o in said["objects"]}
    return {
        "colour": all(any(c == o["colour"] for c, _ in named) for o in want["objects"]),
        "shape": all(any(s == o["shape"] for _, s in named) for o in want["objects"]),
        "background": said["background"] == want["background"],
        "colour+shape": named == {(o["colour"], o["shape"]) for o in want["objects"]},
    }
