"""Train vlm-shapes to caption frames and answer questions about them: `python -m training.train_vlm`.

Frames (one of each clip, tens of thousands: a vision tower trained from scratch on a few
thousand memorises them and never learns shape) come from train-split clips whose (shape,
colour, background) triples are not in shapes_world.FRAME_HELDOUT, so held-out evaluation
frames show combinations it never saw.
Each step asks every frame of the batch a fresh question (a caption, a colour, a shape, the
background, a count) in the chat template the engine uses; the loss is on the answer and
its end token only. Vision tower, projector and decoder are all trained, from scratch.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from . import common, shapes_world as world
from .vlm_shapes import FOLDER, build, pixel_values, questions, user_message


def render_frames(job: tuple[int, list]) -> np.ndarray:
    """One random frame of each clip, uint8 [N, H, W, 3], the frame chosen by the job's seed."""
    seed, specs = job
    rng = np.random.default_rng(seed)
    return np.stack([world.render(s)[rng.integers(s.frames)] for s in specs])


def main() -> None:
    parser = common.parser(__doc__, FOLDER)
    parser.add_argument("--steps", type=int, default=2500)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--frames", type=int, default=40000,
                        help="distinct training frames (a ViT from scratch memorises a few thousand)")
    parser.add_argument("--lr", type=float, default=1e-3)
    args = common.parse(parser)
    rng = np.random.default_rng(args.seed)
    model, processor = build(args.seed)
    model.to(args.device).train()
    tokenizer = processor.tokenizer
    specs = [s for s in world.sample_specs(int(args.frames * 1.3), args.seed + 11, frames=17, two_shapes=0.3,
                                            gradient=0.2, extra_motions=0.15) if not world.is_frame_heldout(s)]
    specs = specs[:args.frames]
    jobs = ((args.seed * 1_000_003 + i, specs[i:i + 256]) for i in range(0, len(specs), 256))
    frames = np.concatenate(list(common.prefetch(render_frames, jobs, args.workers)))
    print(f"rendered {len(frames)} frames in {time.time() - args.started:.0f} s", flush=True)
    prompt_ids: dict[tuple[str, bool], list[int]] = {}

    def sample(i: int) -> tuple[list[int], list[int]]:
        question, answer = questions(specs[i], rng)
        key = (question, bool(rng.random() < 0.7))  # the image before or after the question, as users send them
        if key not in prompt_ids:
            text = processor.apply_chat_template(user_message(*key), add_generation_prompt=True, tokenize=False)
            image = Image.fromarray(frames[i])
            prompt_ids[key] = processor(text=text, images=[image], add_special_tokens=False)["input_ids"][0]
        target = tokenizer(answer, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        return list(prompt_ids[key]) + target, [-100] * len(prompt_ids[key]) + target

    params = list(model.parameters())
    opt, schedule = common.optimizer(params, args.lr, args.steps, warmup=100, floor=0.05, weight_decay=0.01)
    torch.manual_seed(args.seed)
    log, losses = [], []
    for step in range(args.steps):
        if common.stopped_early(args, log, step):
            break
        idx = rng.integers(len(specs), size=args.batch)
        rows = [sample(i) for i in idx]
        width = max(len(ids) for ids, _ in rows)
        ids = torch.full((args.batch, width), tokenizer.pad_token_id)
        labels = torch.full((args.batch, width), -100)
        mask = torch.zeros((args.batch, width), dtype=torch.long)
        for r, (row_ids, row_labels) in enumerate(rows):
            ids[r, :len(row_ids)], labels[r, :len(row_ids)], mask[r, :len(row_ids)] = (
                torch.tensor(row_ids), torch.tensor(row_labels), 1)
        pixels = pixel_values(processor, frames[idx])
        loss = model(input_ids=ids.to(args.device), attention_mask=mask.to(args.device),
                     pixel_values=pixels.to(args.device), labels=labels.to(args.device)).loss
        common.update(opt, schedule, loss, params)
        losses = common.log_losses(log, [*losses, loss.detach()], step, args.steps, args.started)
    model.to("cpu").eval()
    model.save_pretrained(args.out, safe_serialization=True)
    processor.save_pretrained(args.out)
    common.write_log(Path(args.out) / "training.json", {"args": vars(args), "log": log})


if __name__ == "__main__":
    main()
