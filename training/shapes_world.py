"""The "shapes world": procedurally generated, exactly labelled text-video pairs.

Why: training needs unlimited clips a small model can learn on one GPU, and
benchmarks/shapes_eval.py needs prompts whose right answer is known, so that the classical
scorer in training/shapes_score.py can grade generated clips without a learned judge.
Everything is numpy and seeded: the same seed gives the same bytes, so a data set or an
eval set is reproducible from its seed alone.

A clip is one (optionally two) flat-coloured shape translating at constant speed over a
black, white or gray background (optionally a gentle gradient of it). A fixed ~15% of the
(shape, colour, motion, background) combinations, HELDOUT, never appears in train, so the
eval can measure compositional generalisation: every value, pair and triple of values of a
held-out combination is seen in training; only the combination itself is new.
"""

from __future__ import annotations

import hashlib
import itertools
import re
from dataclasses import dataclass, replace

import numpy as np

SHAPES = ("circle", "square", "triangle")
# Pure, fully saturated colours with well separated hues, so the scorer can name them by hue.
COLOURS = {"red": (255, 0, 0), "green": (0, 255, 0), "blue": (0, 0, 255), "yellow": (255, 220, 0)}
BACKGROUNDS = {"black": 0, "white": 255, "gray": 128}
# Colours only vlm-shapes' training frames wear (see repaint); no video data or prompt uses them.
# Hues 60 degrees or more from every named one, so that no frame's colour is ambiguous.
PAINT_COLOURS = {"cyan": (0, 255, 255), "magenta": (255, 0, 255)}
# Colours the base models never saw, for adapters that would teach them (benchmarks/shapes_eval.py
# --only lora measures one; training/vae_colours.py shows why the frozen VAE stands in the way):
# kept out of COLOURS so that every draw of the base models' data, and of their held-out sets,
# stays what it was; sample_specs draws them only when asked (colours="purple"). Purple is a clear
# violet, hue 280: 40 degrees from blue, 80 from red (20 from the VLM-only magenta, which no video uses).
NEW_COLOURS = {"purple": (170, 0, 255)}
ALL_COLOURS = {**COLOURS, **PAINT_COLOURS, **NEW_COLOURS}
MOTIONS = ("left", "right", "up", "down")  # the core motions; HELDOUT is defined over these
EXTRA_MOTIONS = ("still", "bouncing")
GRADIENTS = ("vertical", "horizontal")
FPS = 16
MARGIN = 2  # px between a shape's bounding box and the frame edge, in every frame
GRADIENT_SPAN = 48  # a graded background stays within 48 levels of its named gray, so the name stays right
OPPOSITE = {"left": "right", "right": "left", "up": "down", "down": "up"}
_VELOCITY = {"left": (-1, 0), "right": (1, 0), "up": (0, -1), "down": (0, 1)}  # y grows downward


@dataclass(frozen=True)
class Shape:
    shape: str
    colour: str
    motion: str
    size: float  # radius (circle) or half-side of the bounding box (square, triangle), px
    x0: float  # centre at frame 0, px from the left edge (pixel i spans [i, i+1))
    y0: float  # centre at frame 0, px from the top edge
    speed: float  # px/frame; "bouncing" hops twice in place, up to 3/4 of the distance a mover covers

    def centres(self, frames: int) -> tuple[np.ndarray, np.ndarray]:
        t = np.arange(frames, dtype=float)
        dx, dy = _VELOCITY.get(self.motion, (0, 0))
        x, y = self.x0 + dx * self.speed * t, self.y0 + dy * self.speed * t
        if self.motion == "bouncing":
            y = self.y0 - 0.75 * self.speed * (frames - 1) * np.abs(np.sin(2 * np.pi * t / (frames - 1)))
        return x, y


@dataclass(frozen=True)
class ClipSpec:
    """One clip. Construction checks the words, a Wan-compatible frame count, and that every shape
    is fully in frame in every frame; keeping two shapes apart is sample_specs' job."""

    objects: tuple[Shape, ...]
    background: str
    gradient: str | None = None
    frames: int = 33
    fps: int = FPS
    width: int = 64
    height: int = 64

    def __post_init__(self):
        object.__setattr__(self, "objects", objs := tuple(self.objects))  # a list would make it unhashable
        ok = (1 <= len(objs) <= 2 and self.background in BACKGROUNDS and self.gradient in (None, *GRADIENTS)
              and all(o.shape in SHAPES and o.colour in ALL_COLOURS and o.motion in MOTIONS + EXTRA_MOTIONS for o in objs)
              and len({o.shape for o in objs}) == len({o.colour for o in objs}) == len(objs)
              # Wan takes 4k+1 frames; 17..33 is 1-2 s at 16 fps, enough to see the motion
              and 17 <= self.frames <= 33 and self.frames % 4 == 1)
        if not ok:
            raise ValueError(f"invalid clip spec: {self}")
        for o in objs:  # the whole shape stays visible in every frame, so every label is checkable
            for c, n in zip(o.centres(self.frames), (self.width, self.height)):
                if c.min() - o.size < MARGIN or c.max() + o.size > n - MARGIN:
                    raise ValueError(f"{o} leaves the {self.width}x{self.height} frame")

    shape = property(lambda self: self.objects[0].shape)
    colour = property(lambda self: self.objects[0].colour)
    motion = property(lambda self: self.objects[0].motion)


def _inside(shape: str, dx: np.ndarray, dy: np.ndarray, r: float) -> np.ndarray:
    if shape == "circle":
        return dx * dx + dy * dy <= r * r
    if shape == "square":
        return (np.abs(dx) <= r) & (np.abs(dy) <= r)
    return (dy <= r) & (np.abs(dx) <= (dy + r) / 2)  # apex up, base = height = 2r: fills half its box


def background(spec: ClipSpec, level: float | None = None) -> np.ndarray:
    """The background alone, float [H, W, 3]. A gradient stays on the near side of the named gray
    (black 0..48, white 207..255, gray 104..152), so the name is still the nearest gray.
    `level` replaces the named gray (the gradient, if any, is kept within 0..255)."""
    plane = np.full((spec.height, spec.width), float(BACKGROUNDS[spec.background] if level is None else level))
    if spec.gradient is not None:
        ramp = np.linspace(0, 1, spec.height)[:, None] if spec.gradient == "vertical" else np.linspace(0, 1, spec.width)
        plane = np.clip(plane + GRADIENT_SPAN * (ramp - {"black": 0, "white": 1, "gray": 0.5}[spec.background]), 0, 255)
    return np.repeat(plane[:, :, None], 3, axis=2)


def render(spec: ClipSpec, antialias: bool = True, palette: tuple | None = None) -> np.ndarray:
    """uint8 [F, H, W, 3]. Anti-aliasing = 4x4 supersampled coverage, blended toward the pure colour.

    `palette` = (one RGB per object, a background gray) paints the clip in colours outside the
    vocabulary, the same shapes and motion: data in which shape owes nothing to colour."""
    ss = 4 if antialias else 1
    rgbs, level = palette or ([ALL_COLOURS[o.colour] for o in spec.objects], None)
    out = np.repeat(background(spec, level)[None], spec.frames, axis=0)
    offsets = (np.arange(ss) + 0.5) / ss
    for o, rgb in zip(spec.objects, rgbs, strict=True):
        colour = np.array(rgb, dtype=float)
        for t, (cx, cy) in enumerate(zip(*o.centres(spec.frames))):
            x0, x1 = int(np.floor(cx - o.size)), int(np.ceil(cx + o.size))  # only the bounding box is sampled
            y0, y1 = int(np.floor(cy - o.size)), int(np.ceil(cy + o.size))
            px = (np.arange(x0, x1)[:, None] + offsets).ravel() - cx
            py = (np.arange(y0, y1)[:, None] + offsets).ravel() - cy
            cover = _inside(o.shape, px[None, :], py[:, None], o.size).reshape(y1 - y0, ss, x1 - x0, ss).mean((1, 3))
            region = out[t, y0:y1, x0:x1]
            region += cover[..., None] * (colour - region)
    return np.rint(out).astype(np.uint8)


def shape_pixels(spec: ClipSpec, clip: np.ndarray) -> np.ndarray:
    """bool [F, H, W]: the pixels a shape covers (anti-aliased edges included) in a render of spec."""
    return np.abs(clip.astype(np.int16) - background(spec)[None]).max(-1) > 8


def random_palette(spec: ClipSpec, rng: np.random.Generator) -> tuple[list, float]:
    """A palette for render: any RGB per object and any gray behind them, each object >= 100 (RGB
    distance) from the gray so it stays plainly visible."""
    level = float(rng.uniform(0, 255))
    rgbs = []
    while len(rgbs) < len(spec.objects):
        rgb = rng.uniform(0, 255, 3)
        if np.linalg.norm(rgb - level) >= 100:
            rgbs.append(tuple(rgb))
    return rgbs, level


def repaint(spec: ClipSpec, rng: np.random.Generator) -> ClipSpec:
    """The same clip with its objects in distinct PAINT_COLOURS: in such frames any shape meets
    any background and colour, so a model can't learn which shapes go with a named colour."""
    names = rng.permutation(list(PAINT_COLOURS))
    return replace(spec, objects=tuple(replace(o, colour=str(n)) for o, n in zip(spec.objects, names)))


def caption(spec: ClipSpec) -> str:
    verb = {"still": "standing still", "bouncing": "bouncing"}
    parts = [f"a {o.colour} {o.shape} {verb.get(o.motion, 'moving ' + o.motion)}" for o in spec.objects]
    return " and ".join(parts) + f" on a {spec.background} background"


def chain_prompts(spec: ClipSpec, chunks: int) -> list[str]:
    """Prompts for a chained video of spec that keeps its shapes in frame: the caption with every
    object's direction reversed in every other chunk ("still" and "bouncing" stay as they are)."""
    there = caption(spec)
    back = re.sub(r"moving (\w+)", lambda m: f"moving {OPPOSITE[m[1]]}", there)
    return [there if c % 2 == 0 else back for c in range(chunks)]


_SYNONYMS = {"grey": "gray", "disc": "circle", "disk": "circle", "leftward": "left", "rightward": "right",
             "upward": "up", "downward": "down", "stationary": "still", "static": "still", "bounces": "bouncing"}
_KIND = {**dict.fromkeys(SHAPES, "shape"), **dict.fromkeys(ALL_COLOURS, "colour"), **dict.fromkeys(BACKGROUNDS, "background"),
         **dict.fromkeys(MOTIONS + EXTRA_MOTIONS, "motion")}


def parse_prompt(text: str) -> dict:
    """{shape, colour, motion, background} of the first object (None where not named), plus "objects".

    Object colours and background names are disjoint words, so no grammar is needed: a colour
    or shape word that would repeat a slot starts the next object; a motion word goes to the
    object it follows."""
    objects, background = [], None
    for word in re.findall(r"[a-z]+", text.lower()):
        value = _SYNONYMS.get(word.removesuffix("s") if word.endswith("wards") else word, word)
        kind = _KIND.get(value)
        if kind == "background":
            background = value
        elif kind in ("shape", "colour"):
            if not objects or objects[-1][kind] is not None:
                objects.append({"shape": None, "colour": None, "motion": None})
            objects[-1][kind] = value
        elif kind == "motion" and objects and objects[-1]["motion"] is None:
            objects[-1]["motion"] = value
    first = objects[0] if objects else {"shape": None, "colour": None, "motion": None}
    return {**first, "background": background, "objects": objects}


def combo(obj: Shape, spec: ClipSpec) -> tuple[str, str, str, str]:
    return (obj.shape, obj.colour, obj.motion, spec.background)


def _choose_heldout(vocab: tuple, fraction: float = 0.15) -> frozenset:
    """A fixed set of combinations of `vocab`'s values, taken in hash order (stable across Python
    and numpy versions), skipping any whose removal would leave one of its values or sub-tuples
    unseen in train, or would hold out more than its share of one value (so no colour, say, is
    mostly held out)."""
    combos = list(itertools.product(*vocab))
    target = round(fraction * len(combos))
    subsets = [s for k in range(1, len(vocab)) for s in itertools.combinations(range(len(vocab)), k)]
    held: set = set()
    for c in sorted(combos, key=lambda c: hashlib.sha256(" ".join(c).encode()).hexdigest()):
        if len(held) == target:
            break
        if any(sum(h[i] == c[i] for h in held) >= -(-target // len(v)) for i, v in enumerate(vocab)):
            continue
        train = [d for d in combos if d not in held and d != c]
        if all(any(all(d[i] == c[i] for i in s) for d in train) for s in subsets):
            held.add(c)
    return frozenset(held)


HELDOUT = _choose_heldout((SHAPES, tuple(COLOURS), MOTIONS, tuple(BACKGROUNDS)))
# For still frames (the VLM): (shape, colour, background) triples never shown in its training.
FRAME_HELDOUT = _choose_heldout((SHAPES, tuple(COLOURS), tuple(BACKGROUNDS)))
TRAIN_COMBOS = tuple(c for c in itertools.product(SHAPES, COLOURS, MOTIONS, BACKGROUNDS) if c not in HELDOUT)
# Purple's own split, over (shape, motion, background): a quarter of the 36 triples never appear in
# an adapter's training (every value and pair of them does), so its evaluation, too, is of new
# combinations. As 4-tuples with the colour, like HELDOUT's.
PURPLE_HELDOUT = frozenset((s, "purple", m, b)
                           for s, m, b in _choose_heldout((SHAPES, MOTIONS, tuple(BACKGROUNDS)), 0.25))
PURPLE_TRAIN_COMBOS = tuple(c for c in itertools.product(SHAPES, ("purple",), MOTIONS, BACKGROUNDS)
                            if c not in PURPLE_HELDOUT)


def is_heldout(spec: ClipSpec) -> bool:
    return any(combo(o, spec) in HELDOUT or combo(o, spec) in PURPLE_HELDOUT for o in spec.objects)


def is_frame_heldout(spec: ClipSpec) -> bool:
    return any((o.shape, o.colour, spec.background) in FRAME_HELDOUT for o in spec.objects)


def _place(rng, shape, colour, motion, size, frames, width, height) -> Shape:
    """A start and speed that keep the shape fully in frame and move it at least 8 px (at 64 px)."""
    s = min(width, height) / 64
    span = min(width, height) - 2 * (MARGIN + size)
    lo, hi = max(0.5 * s, 8 * s / (frames - 1)), min(1.5 * s, span / (frames - 1))
    speed = 0.0 if motion == "still" else float(rng.uniform(lo, max(lo, hi)))
    travel, (dx, dy) = speed * (frames - 1), _VELOCITY.get(motion, (0, 0))
    up = 0.75 * travel if motion == "bouncing" else travel * (dy < 0)
    x0 = rng.uniform(MARGIN + size + travel * (dx < 0), width - MARGIN - size - travel * (dx > 0))
    y0 = rng.uniform(MARGIN + size + up, height - MARGIN - size - travel * (dy > 0))
    return Shape(shape, colour, motion, size, float(x0), float(y0), speed)


def sample_specs(n: int, seed: int, split: str = "train", *, frames: int = 33, width: int = 64, height: int = 64,
                 two_shapes: float = 0.0, gradient: float = 0.0, extra_motions: float = 0.0,
                 colours: str = "base") -> list[ClipSpec]:
    """n specs, reproducible from (seed, split). The float options are probabilities per clip:
    a second shape, a gradient background, and (train only) "still"/"bouncing" instead of a direction.
    colours="purple" draws the main shape in purple, from PURPLE_TRAIN_COMBOS or PURPLE_HELDOUT
    (a second shape, if any, is still a base train combination), from a random stream of its own:
    the default "base" draws exactly what it always did."""
    if split not in ("train", "heldout"):
        raise ValueError(f"split must be 'train' or 'heldout', not {split!r}")
    if colours not in ("base", "purple"):
        raise ValueError(f"colours must be 'base' or 'purple', not {colours!r}")
    purple = colours == "purple"
    rng = np.random.default_rng([seed, int(split == "heldout")] + [1] * purple)
    pools = {("base", "train"): TRAIN_COMBOS, ("base", "heldout"): sorted(HELDOUT),
             ("purple", "train"): PURPLE_TRAIN_COMBOS, ("purple", "heldout"): sorted(PURPLE_HELDOUT)}
    pool, scale, specs = pools[colours, split], min(width, height) / 64, []
    while len(specs) < n:
        shape, colour, motion, bg = pool[rng.integers(len(pool))]
        if split == "train" and rng.random() < extra_motions:
            motion = EXTRA_MOTIONS[rng.integers(len(EXTRA_MOTIONS))]
        grad = GRADIENTS[rng.integers(2)] if rng.random() < gradient else None
        second = None
        if rng.random() < two_shapes:  # another shape and colour, itself a train combination
            second = [c for c in TRAIN_COMBOS if c[3] == bg and c[0] != shape and c[1] != colour]
            second = second[rng.integers(len(second))]
        sizes = (5, 8) if second else (5, 10)  # >= 10 px across: smaller shapes are hard to tell apart
        size = float(max(3, round(scale * rng.integers(sizes[0], sizes[1] + 1))))
        objs = (_place(rng, shape, colour, motion, size, frames, width, height),)
        for _ in range(100 if second else 0):  # rejection-sample the second shape so the two never touch
            other = _place(rng, *second[:3], size, frames, width, height)
            (ax, ay), (bx, by) = objs[0].centres(frames), other.centres(frames)
            if np.hypot(ax - bx, ay - by).min() > 2 * np.sqrt(2) * size + 2:
                objs += (other,)
                break
        if second and len(objs) == 1:
            continue  # no room for this pair: draw the whole clip again (still deterministic)
        specs.append(ClipSpec(objs, bg, grad, frames, FPS, width, height))
    return specs
