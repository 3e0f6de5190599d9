"""Distil wan-shapes' 20-step guided sampling into a 4-step LoRA without guidance:
`python -m training.distill` (about 50 minutes on 2 CPU cores).

The method is rectified-flow distillation ("reflow": Liu et al., Flow Straight and Fast, 2022;
InstaFlow, 2023) on teacher pairs computed once:

1. Teacher pairs. For train-split captions, seeded noise goes through the committed model as a
   default request runs it (20 UniPC steps, guidance 4.0, flow shift 2.0), kept as latents: a
   (noise, latents) pair per caption.
2. The student is the same transformer with a LoRA, called once a step (guidance 1 makes the
   pipeline skip the unconditional pass). It learns flow matching on the straight line of each
   pair: input (1 - sigma) latents + sigma noise, target velocity noise - latents, sigma at the
   4 points where the `fast` preset's sampler calls it (and a share anywhere). A straight path
   is followed exactly by any solver in any number of steps, so 4 steps from the teacher's noise
   land where its 20 guided steps did.
3. Held-out prompts the models never saw, teacher and student on the same seeds, scored by
   training/shapes_score.py; the LoRA (diffusers layout), its adapter.json and the run's log go
   to vidserve/weights/wan-shapes-4step.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import torch
from diffusers import UniPCMultistepScheduler, WanPipeline
from peft import LoraConfig
from peft.utils import get_peft_model_state_dict

from vidserve.loras import SIDECAR
from vidserve.registry import WEIGHTS

from . import common, shapes_world as world
from .shapes_score import score
from .wan_shapes import FLOW_SHIFT, FOLDER, FRAMES, LATENT_CHANNELS, SIZE, TEXT_TOKENS

OUT = WEIGHTS / "wan-shapes-4step"
TEACHER_STEPS, TEACHER_GUIDANCE = 20, 4.0  # wan-shapes' defaults: what a request without options gets
LATENT_SHAPE = (LATENT_CHANNELS, (FRAMES - 1) // 4 + 1, SIZE // 4, SIZE // 4)
TARGETS = ["to_q", "to_k", "to_v", "to_out.0", "ffn.net.0.proj", "ffn.net.2"]  # every block's attention and MLP


def load_pipeline(device: torch.device) -> WanPipeline:
    pipe = WanPipeline.from_pretrained(FOLDER).to(device)
    pipe.transformer.eval().requires_grad_(False)
    pipe.text_encoder.eval()
    pipe.set_progress_bar_config(disable=True)
    return pipe


def sample(pipe: WanPipeline, captions: list[str], noise: torch.Tensor, steps: int, guidance: float,
           output_type: str = "latent") -> torch.Tensor | np.ndarray:
    """The pipeline's latents (or frames) from the given starting noise, at `steps` and `guidance`."""
    scheduler = pipe.scheduler
    pipe.scheduler = UniPCMultistepScheduler.from_config(scheduler.config, flow_shift=FLOW_SHIFT)
    try:
        return pipe(prompt=captions, num_frames=FRAMES, height=SIZE, width=SIZE, num_inference_steps=steps,
                    guidance_scale=guidance, latents=noise.clone(), max_sequence_length=TEXT_TOKENS,
                    output_type=output_type).frames
    finally:
        pipe.scheduler = scheduler


@torch.no_grad()
def teacher_pairs(pipe: WanPipeline, captions: list[str], seed: int, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(noise, the teacher's latents from it), one pair per caption."""
    gen = torch.Generator().manual_seed(seed)
    noise = torch.randn((len(captions), *LATENT_SHAPE), generator=gen).to(pipe.device)
    latents = []
    for i in range(0, len(captions), batch):
        latents.append(sample(pipe, captions[i:i + batch], noise[i:i + batch], TEACHER_STEPS, TEACHER_GUIDANCE))
        print(f"teacher: {i + len(latents[-1])}/{len(captions)} pairs", flush=True)
    return noise, torch.cat(latents)


def sampling_sigmas(pipe: WanPipeline, steps: int) -> torch.Tensor:
    """The sigmas at which the `fast` preset's sampler calls the transformer."""
    scheduler = UniPCMultistepScheduler.from_config(pipe.scheduler.config, flow_shift=FLOW_SHIFT)
    scheduler.set_timesteps(steps)
    return scheduler.sigmas[:-1].float()


@torch.no_grad()
def evaluate(pipe: WanPipeline, n: int, seed: int, steps: int, guidance: float, batch: int) -> dict:
    """Adherence on `n` held-out prompts (the same prompts and noise for every call)."""
    specs = world.sample_specs(n, seed, split="heldout", frames=FRAMES, width=SIZE, height=SIZE)
    captions = [world.caption(s) for s in specs]
    noise = torch.randn((n, *LATENT_SHAPE), generator=torch.Generator().manual_seed(seed)).to(pipe.device)
    start, clips = time.perf_counter(), []
    for i in range(0, n, batch):
        video = sample(pipe, captions[i:i + batch], noise[i:i + batch], steps, guidance, output_type="np")
        clips += list((np.clip(video, 0.0, 1.0) * 255.0).round().astype(np.uint8))  # as the video path makes frames
    scores = [score(clip, caption) for clip, caption in zip(clips, captions)]
    rates = {k: round(float(np.mean([s[k] for s in scores])), 3) for k in ("colour", "shape", "motion", "background")}
    return {**rates, "n": n, "seconds": round(time.perf_counter() - start, 1)}


def save(pipe: WanPipeline, out: Path, rank: int, log: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    WanPipeline.save_lora_weights(out, transformer_lora_layers=get_peft_model_state_dict(pipe.transformer),
                                  safe_serialization=True)
    (out / SIDECAR).write_text(json.dumps({
        "base_models": ["wan-shapes"], "rank": rank, "recommended_preset": "fast",
        "description": "Step distillation of wan-shapes: 4 steps without guidance in place of 20 guided ones "
                       "(training/distill.py)"}, indent=2) + "\n")
    common.write_log(out / "training" / "distill.json", log)


def main() -> None:
    parser = common.parser(__doc__, OUT)
    parser.add_argument("--pairs", type=int, default=320, help="teacher pairs (train-split captions)")
    parser.add_argument("--teacher-batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=700, help="student training steps")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--student-steps", type=int, default=4, help="the sampling steps the student is made for")
    parser.add_argument("--anywhere", type=float, default=0.25,
                        help="share of samples with sigma uniform in (0, 1) rather than at the sampling points")
    parser.add_argument("--eval-prompts", type=int, default=48)
    args = common.parse(parser)
    device = torch.device(args.device)
    torch.manual_seed(args.seed)
    pipe = load_pipeline(device)

    specs = world.sample_specs(args.pairs, args.seed + 11, frames=FRAMES, width=SIZE, height=SIZE,
                               two_shapes=0.15, gradient=0.2, extra_motions=0.15)
    captions = [world.caption(s) for s in specs]
    noise, latents = teacher_pairs(pipe, captions, args.seed + 12, args.teacher_batch)
    with torch.no_grad():
        context = torch.cat([pipe.encode_prompt(captions[i:i + 256], do_classifier_free_guidance=False,
                                                max_sequence_length=TEXT_TOKENS, device=device)[0]
                             for i in range(0, len(captions), 256)])
    log: dict = {"args": vars(args), "teacher_seconds": round(time.time() - args.started, 1), "log": []}
    print(f"{len(captions)} teacher pairs in {log['teacher_seconds']} s", flush=True)

    model = pipe.transformer
    model.add_adapter(LoraConfig(r=args.rank, lora_alpha=args.rank, target_modules=TARGETS))
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt, schedule = common.optimizer(params, args.lr, args.steps, warmup=100, floor=0.05)
    points = sampling_sigmas(pipe, args.student_steps)
    frame_tokens = (LATENT_SHAPE[2] // 2) * (LATENT_SHAPE[3] // 2)
    gen = torch.Generator().manual_seed(args.seed + 13)
    losses = []
    for step in range(args.steps):
        if common.stopped_early(args, log["log"], step):
            break
        idx = torch.randint(len(captions), (args.batch,), generator=gen).to(device)
        sigma = points[torch.randint(len(points), (args.batch,), generator=gen)]
        anywhere = torch.rand(args.batch, generator=gen) < args.anywhere
        sigma = torch.where(anywhere, torch.rand(args.batch, generator=gen), sigma).to(device)
        x0, eps = latents[idx], noise[idx]
        xt = (1 - sigma.view(-1, 1, 1, 1, 1)) * x0 + sigma.view(-1, 1, 1, 1, 1) * eps
        timestep = (sigma * 1000).view(-1, 1).repeat(1, LATENT_SHAPE[1] * frame_tokens)
        pred = model(xt, timestep, context[idx], return_dict=False)[0]
        loss = (pred - (eps - x0)).square().mean()
        common.update(opt, schedule, loss, params)
        losses = common.log_losses(log["log"], [*losses, loss.detach()], step, args.steps, args.started)
    model.eval()

    log["student"] = evaluate(pipe, args.eval_prompts, 7, args.student_steps, 1.0, args.teacher_batch)
    model.disable_adapters()
    log["teacher"] = evaluate(pipe, args.eval_prompts, 7, TEACHER_STEPS, TEACHER_GUIDANCE, args.teacher_batch)
    log["plain"] = evaluate(pipe, args.eval_prompts, 7, args.student_steps, 1.0, args.teacher_batch)
    model.enable_adapters()
    log["seconds"] = round(time.time() - args.started, 1)
    print(json.dumps({k: log[k] for k in ("student", "teacher", "plain", "seconds")}), flush=True)
    save(pipe, Path(args.out), args.rank, log)


if __name__ == "__main__":
    main()
