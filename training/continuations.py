"""Chained continuations of wan-shapes' own frames: `python -m training.continuations` (then train_wan --continuations).

Why: a chain from a given frame loses its shape where the shape grows chunk by chunk:
guidance paints it ~1.3x the area in each chunk, and the next chunk starts from that frame
and grows it again (benchmarks/RESULTS.md). In training, the transformer was only ever given
rendered first frames, never its own. This runs the model in --out through the serving path
(chain, colour drift correction, default steps and guidance) for --depth chunks from the first
frame of train-split clips, the direction reversing every chunk as the evaluation's chains do,
and keeps the last frame of every chunk: a frame a next chunk is conditioned on. Each becomes
an image-to-video sample whose target is what the world would show next: the clip's own
shape, colour and size, rendered from where the model left the shape and moving as the next
prompt says, so that training on them teaches the model to continue its own frames back to
the prompt's shape and size. Written to --data as an .npz of those frames and their clips'
specs (and the arguments that made them, for training/replay.py); train_wan renders the targets.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
from PIL import Image
from tqdm import tqdm

from vidserve.config import Settings
from vidserve.pipelines.chain import generate_video
from vidserve.registry import resolve
from vidserve.requests import build_request

from . import common, shapes_world as world
from .shapes_score import detect
from .wan_shapes import FOLDER, FRAMES, SIZE

def next_spec(spec: world.ClipSpec, frame: np.ndarray, chunk: int) -> world.ClipSpec | None:
    """The clip that should follow chunk `chunk` (0-based) of spec's chain, opening on `frame`:
    spec's shape, colour, size and speed from where the model left the shape, moving the way the
    next chunk's prompt says. None when no shape is found, or it would leave the frame."""
    found = detect(np.stack([frame, frame]))["objects"]
    if not found:
        return None
    (x, y), shape = found[0]["last_centre"], spec.objects[0]
    if shape.shape == "triangle":  # its centre is its box's; the centroid of its area lies size / 3 below
        y -= shape.size / 3
    motion = shape.motion if chunk % 2 else world.OPPOSITE[shape.motion]  # chunk 0 went there, chunk 1 comes back
    try:
        return replace(spec, objects=(replace(shape, motion=motion, x0=x + 0.5, y0=y + 0.5),))
    except ValueError:  # the model let it drift too near an edge for a whole chunk's travel
        return None


def load(path: Path) -> tuple[list[world.ClipSpec], np.ndarray, dict]:
    """(target specs, the frame each opens on uint8 [N, H, W, 3], the arguments that made them)
    from a --data file."""
    data = np.load(path)
    specs = [world.ClipSpec(objects=tuple(world.Shape(**o) for o in s["objects"]),
                            **{k: v for k, v in s.items() if k != "objects"})
             for s in json.loads(str(data["specs"]))]
    return specs, data["frames"], json.loads(str(data["made_by"]))


def main() -> None:
    parser = common.parser(__doc__, FOLDER)
    parser.add_argument("--chains", type=int, default=400)
    parser.add_argument("--depth", type=int, default=3, help="chunks per chain: one sample each")
    parser.add_argument("--data", default="continuations.npz")
    args = common.parse(parser)
    model = resolve(str(Path(args.out)))
    settings = Settings()
    # One shape moving in one of the four directions, as in the evaluation's chains.
    specs = world.sample_specs(args.chains, args.seed + 100, frames=FRAMES, width=SIZE, height=SIZE, gradient=0.2)
    targets, frames, done = [], [], 0
    for spec in tqdm(specs, desc="chains"):
        if common.out_of_time(args):
            print(f"stopped at the deadline after {done} chains", flush=True)
            break
        chunk_last, prompts = [], world.chain_prompts(spec, args.depth)
        request = build_request(model, settings, prompts[0], seed=args.seed * 100_000 + done, prompts=prompts,
                                num_frames=FRAMES + (args.depth - 1) * (FRAMES - 1),
                                image=Image.fromarray(world.render(spec)[0]), drift_correction="color")
        generate_video(request, device=args.device, dtype="float32",
                       on_chunk=lambda _index, chunk_frames, _metrics, _prompt: chunk_last.append(chunk_frames[-1]))
        for chunk, frame in enumerate(chunk_last):
            if (target := next_spec(spec, frame, chunk)) is not None:
                targets.append(target)
                frames.append(frame)
        done += 1
    if not targets:
        raise SystemExit("no continuation kept: the model drew no shape that could go on in frame")
    made_by = {"seed": args.seed, "threads": args.threads, "chains": done, "depth": args.depth}
    np.savez_compressed(args.data, frames=np.stack(frames), specs=json.dumps([asdict(s) for s in targets]),
                        made_by=json.dumps(made_by))
    print(f"{len(targets)} continuations from {done} chains of {args.depth} in "
          f"{time.time() - args.started:.0f} s: {args.data}", flush=True)


if __name__ == "__main__":
    main()
