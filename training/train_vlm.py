"""Train vlm-shapes to caption frames and answer questions about them: `python -m training.train_vlm`.

Frames (one of each clip, tens of thousands: a vision tower trained from scratch on a few
thousand memorises them and never learns shape) come from train-split clips whose (shape,
colour, background) triples are not in shapes_world.FRAME_HELDOUT, so held-out evaluation
frames show combinations it never saw. Each frame is also rendered in a random palette
(shapes_world.random_palette) and repainted in colours no video uses (shapes_world.repaint):
trained on named colours alone, the model learns which shapes go with a colour and
background and names a held-out triple's shape wrong every time.

Two stages, as LLaVA's: (1) the vision tower alone classifies frames (pretrain_tower), from
scratch; (2) with the tower frozen, projector and decoder learn to answer: each step asks
every frame of the batch a fresh question (a caption, a colour, a shape, the background, a
count; random-palette frames only their shape) in the chat template the engine uses, the
loss on the answer and its end token only.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from . import common, shapes_world as world
from .vlm_shapes import FOLDER, build, pixel_values, questions, user_message


def render_frames(job: tuple[int, list, list]) -> np.ndarray:
    """One random frame of each clip: in its named colours, in a random palette and as the job's
    repainted clips show it: uint8 [3, N, H, W, 3], frame and palette chosen by the job's seed.
    (Each render draws the whole clip for one frame: 83 s of the 18-minute default run.)"""
    seed, specs, repainted = job
    rng = np.random.default_rng(seed)
    frames = []
    for spec, other in zip(specs, repainted):
        t = rng.integers(spec.frames)
        palette = world.random_palette(spec, rng)
        frames.append([world.render(s, palette=p)[t] for s, p in ((spec, None), (spec, palette), (other, None))])
    return np.stack(frames, axis=1)


def pretrain_tower(tower, processor, specs: list, views: np.ndarray, args, rng: np.random.Generator) -> list:
    """Stage 1, as LLaVA starts from a pretrained CLIP tower: the tower alone, with linear heads
    on its mean patch feature (dropped afterwards), classifies one-shape frames' shape, colour and
    background, half of them in their named colours, half in a random palette (render_frames'
    first two `views`), where shape is the only label, so it cannot be read off colour and
    background. Returns the log."""
    single = np.flatnonzero([len(s.objects) == 1 for s in specs])
    vocab = {"shape": world.SHAPES, "colour": tuple(world.COLOURS), "background": tuple(world.BACKGROUNDS)}
    heads = torch.nn.ModuleDict({k: torch.nn.Linear(tower.config.hidden_size, len(v)) for k, v in vocab.items()})
    heads.to(args.device)
    params = [*tower.parameters(), *heads.parameters()]
    opt, schedule = common.optimizer(params, args.lr, args.tower_steps, warmup=100, floor=0.05, weight_decay=0.01)
    log, losses = [], []
    for step in range(args.tower_steps):
        if common.stopped_early(args, log, step, last_phase=False):
            break
        idx, view = rng.choice(single, size=args.batch), rng.integers(2, size=args.batch)  # named or random palette
        features = tower(pixel_values=pixel_values(processor, views[view, idx]).to(args.device))
        features = features.last_hidden_state[:, 1:].mean(1)
        loss = 0
        for kind, values in vocab.items():
            labels = [-100 if v == 1 and kind != "shape" else values.index(getattr(specs[i], kind))
                      for i, v in zip(idx, view)]
            if any(label >= 0 for label in labels):  # a batch all in palettes has no colour to learn
                loss = loss + F.cross_entropy(heads[kind](features), torch.tensor(labels, device=args.device))
        common.update(opt, schedule, loss, params)
        losses = common.log_losses(log, [*losses, loss.detach()], step, args.tower_steps, args.started)
    return log


def main() -> None:
    parser = common.parser(__doc__, FOLDER)
    parser.add_argument("--steps", type=int, default=6000, help="stage 2: projector and decoder")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--frames", type=int, default=40000,
                        help="distinct training frames (a ViT from scratch memorises a few thousand)")
    parser.add_argument("--tower-steps", type=int, default=4000, help="stage 1: the vision tower alone")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--named", type=float, default=0.25,
                        help="stage 2: share of questions about frames in their named colours; the rest "
                             "are about repainted frames or (half of them, one-shape frames) random-palette "
                             "frames asked their shape, in which every shape meets every colour and background")
    args = common.parse(parser)
    rng = np.random.default_rng(args.seed)
    model, processor = build(args.seed)
    model.to(args.device).train()
    tokenizer = processor.tokenizer
    specs = [s for s in world.sample_specs(int(args.frames * 1.3), args.seed + 11, frames=17, two_shapes=0.3,
                                            gradient=0.2, extra_motions=0.15) if not world.is_frame_heldout(s)]
    specs = specs[:args.frames]
    repainted = [world.repaint(s, rng) for s in specs]
    jobs = ((args.seed * 1_000_003 + i, specs[i:i + 256], repainted[i:i + 256]) for i in range(0, len(specs), 256))
    views = np.concatenate(list(common.prefetch(render_frames, jobs, args.workers)), axis=1)
    frames, painted, repainted_frames = views
    print(f"rendered {len(frames)} frames in {time.time() - args.started:.0f} s", flush=True)
    tower = model.model.vision_tower
    tower_log = pretrain_tower(tower, processor, specs, views, args, rng)
    tower.requires_grad_(False)  # stage 2 trains projector and decoder on what the tower sees, as LLaVA does
    prompt_ids: dict[tuple[str, bool], list[int]] = {}

    def sample(i: int) -> tuple[list[int], list[int], np.ndarray]:
        draw = rng.random()
        if draw < args.named:
            (question, answer), frame = questions(specs[i], rng), frames[i]
        elif draw < (1 + args.named) / 2 and len(specs[i].objects) == 1:
            (question, answer), frame = ("What shape is it?", specs[i].shape), painted[i]
        else:
            (question, answer), frame = questions(repainted[i], rng), repainted_frames[i]
        key = (question, bool(rng.random() < 0.7))  # the image before or after the question, as users send them
        if key not in prompt_ids:
            text = processor.apply_chat_template(user_message(*key), add_generation_prompt=True, tokenize=False)
            image = Image.fromarray(frames[i])
            prompt_ids[key] = processor(text=text, images=[image], add_special_tokens=False)["input_ids"][0]
        target = tokenizer(answer, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        return list(prompt_ids[key]) + target, [-100] * len(prompt_ids[key]) + target, frame

    params = [p for p in model.parameters() if p.requires_grad]
    opt, schedule = common.optimizer(params, args.lr, args.steps, warmup=100, floor=0.05, weight_decay=0.01)
    torch.manual_seed(args.seed)
    log, losses = [], []
    for step in range(args.steps):
        if common.stopped_early(args, log, step):
            break
        idx = rng.integers(len(specs), size=args.batch)
        rows = [sample(i) for i in idx]
        width = max(len(ids) for ids, _, _ in rows)
        ids = torch.full((args.batch, width), tokenizer.pad_token_id)
        labels = torch.full((args.batch, width), -100)
        mask = torch.zeros((args.batch, width), dtype=torch.long)
        for r, (row_ids, row_labels, _) in enumerate(rows):
            ids[r, :len(row_ids)], labels[r, :len(row_ids)], mask[r, :len(row_ids)] = (
                torch.tensor(row_ids), torch.tensor(row_labels), 1)
        pixels = pixel_values(processor, np.stack([frame for _, _, frame in rows]))
        loss = model(input_ids=ids.to(args.device), attention_mask=mask.to(args.device),
                     pixel_values=pixels.to(args.device), labels=labels.to(args.device)).loss
        common.update(opt, schedule, loss, params)
        losses = common.log_losses(log, [*losses, loss.detach()], step, args.steps, args.started)
    model.to("cpu").eval()
    model.save_pretrained(args.out, safe_serialization=True)
    processor.save_pretrained(args.out)
    common.write_log(Path(args.out) / "training.json", {"args": vars(args), "tower_log": tower_log, "log": log})


if __name__ == "__main__":
    main()
