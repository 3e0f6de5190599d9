"""Prompt adherence of the trained shapes-world models, scored without a learned judge.

    python benchmarks/shapes_eval.py            # everything, 6-15 min on 2 CPU cores
    python benchmarks/shapes_eval.py --only t2v,vlm --prompts 20
    python benchmarks/shapes_eval.py --only t2v,i2v,chain --set-seed 11 --first-seed 100 --prompts 100 --chains 30 \
        --out benchmarks/results/shapes_eval_other.json   # another draw of the held-out prompts

Every clip is graded by training/shapes_score.py (background plane, hue vote, fill/asymmetry
for the shape, centroid track for the direction) against the prompt it was made from; every
VLM answer by parsing it for the words of the shapes world. Held-out means attribute
combinations the models never saw in training (shapes_world.HELDOUT for clips,
FRAME_HELDOUT for frames). Sections:

- t2v: text-to-video on held-out prompts, per attribute, and shape per shape asked for.
- i2v: the first frame of a held-out clip plus its prompt: does the clip keep shape and colour?
- vae: the same held-out clips through wan-shapes' VAE and back. Every generated clip leaves
  through this decoder, so its figures are a practical ceiling for t2v and i2v.
- chain: 5-chunk videos (each chunk continues from the last frame of the one before, the
  direction reversing every chunk so the shape stays in frame): from a held-out clip's first
  frame with and without drift correction, and from the prompt alone with it; adherence and
  drift per chunk, and the chains kept per first prompt.
- fidelity: t2v adherence for dense attention, top-k at densities 0.25 and 0.125 (with the
  default 4x4x4 tiles and with 1x4x4), top-k with dense first steps or a dense first block,
  mass selection, and step caching, all on the same prompts and seeds, with seconds per clip.
- fast: the `fast` preset (4 steps without guidance through the bundled step-distilled adapter
  wan-shapes-4step) beside the default (20 guided steps) and 4 plain steps: adherence, and
  seconds per clip for denoising and for the whole job, in one run.
- vlm: captions and answers from vlm-shapes through POST /v1/chat/completions.
- lora (not in the default --only): a LoRA adapter (--adapter, by default
  vidserve/weights/wan-shapes-purple) on held-out purple prompts (shapes_world.PURPLE_HELDOUT:
  (shape, direction, background) triples no purple training clip shows), with the adapter
  and without it, and the usual held-out prompts with it loaded at scale 1 (does it leave the
  known colours alone?). "colour" on purple prompts is the share of clips read purple.
  Without an adapter folder (`--adapter none`) it measures only the base model on the
  purple prompts.

t2v, i2v, vae and every chunk of a chain also report area_ratio: the main shape's mean area
in the generated clips over that in the rendered held-out clips; above 1, the model paints
shapes too big (and so rounder). In a chain it shows how the shape grows chunk by chunk.

Results: a table per section on stdout, everything in benchmarks/results/shapes_eval.json.
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np
import torch
from diffusers import AutoencoderKLWan
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # training/ is not an installed package

from training import shapes_world as world  # noqa: E402
from training.shapes_score import detect, score, score_caption  # noqa: E402
from training.wan_shapes import to_clips, to_tensor  # noqa: E402
from vidserve.config import Settings  # noqa: E402
from vidserve.loras import LoraRegistry  # noqa: E402
from vidserve.media import save_thumbnail  # noqa: E402
from vidserve.media.hls import encode_segment, join_segments  # noqa: E402
from vidserve.pipelines.chain import generate_video  # noqa: E402
from vidserve.pipelines.video import get_pipeline  # noqa: E402
from vidserve.registry import resolve  # noqa: E402
from vidserve.options import GenerationOptions  # noqa: E402
from vidserve.video_request import build_request  # noqa: E402

MODEL, CHAT_MODEL = "wan-shapes", "vlm-shapes"
SEED = 2026  # the eval set: never a training seed
ADAPTER = "wan-shapes-purple"  # its adapter_name in the pipeline
ADAPTER_FOLDER = Path(__file__).resolve().parents[1] / "vidserve" / "weights" / ADAPTER
ATTRIBUTES = ("colour", "shape", "motion", "background")
TOPK = {"mode": "topk", "selection": "topk", "min_tokens": 0}
TOPK_SMALL_TILES = {**TOPK, "density": 0.125, "tile": (1, 4, 4)}
VARIANTS = {
    "dense": {},
    # The sparse rows force sparsity (min_tokens 0): with default options this model's 320 tokens
    # run dense, which the "top-k, default options" row shows.
    "top-k, default options": {"attention": {"mode": "topk"}},
    "top-k 0.25": {"attention": {**TOPK, "density": 0.25}},
    "top-k 0.125": {"attention": {**TOPK, "density": 0.125}},
    # This model's 5x8x8 token grid is only 8 tiles of 4x4x4, and a query tile (4x8x4) always
    # keeps the 2 it covers, so 0.125 keeps what 0.25 does; 1x4x4 tiles make 20 key tiles.
    "top-k 0.25, 1x4x4 tiles": {"attention": {**TOPK, "density": 0.25, "tile": (1, 4, 4)}},
    "top-k 0.125, 1x4x4 tiles": {"attention": TOPK_SMALL_TILES},
    # What the dense guards buy back: the first steps (of 20) or the first block run dense.
    "top-k 0.125, 1x4x4 tiles, 4 dense steps": {"attention": {**TOPK_SMALL_TILES, "dense_steps": 4}},
    "top-k 0.125, 1x4x4 tiles, 8 dense steps": {"attention": {**TOPK_SMALL_TILES, "dense_steps": 8}},
    "top-k 0.125, 1x4x4 tiles, 1 dense block": {"attention": {**TOPK_SMALL_TILES, "dense_layers": 1}},
    "top-k 0.125, 1x4x4 tiles, 4 dense steps + 1 dense block": {
        "attention": {**TOPK_SMALL_TILES, "dense_steps": 4, "dense_layers": 1}},
    "mass selection, 1x4x4 tiles": {"attention": {"mode": "topk", "selection": "mass", "min_tokens": 0,
                                                   "tile": (1, 4, 4)}},
    "dense + TaylorSeer cache": {"cache": {"kind": "taylorseer", "interval": 3, "warmup_steps": 3}},
    "top-k 0.125 + TaylorSeer cache": {"attention": {**TOPK, "density": 0.125},
                                       "cache": {"kind": "taylorseer", "interval": 3, "warmup_steps": 3}},
}


def heldout(n: int, seed: int = SEED) -> list[world.ClipSpec]:
    spec = resolve(MODEL)
    return world.sample_specs(n, seed, split="heldout", frames=spec.frames_per_chunk, width=spec.width,
                              height=spec.height)


def rates(scores: list[dict], keys=(*ATTRIBUTES, "all")) -> dict:
    out = {k: round(float(np.mean([s[k] for s in scores])), 3) for k in keys}
    out["colour+shape+motion"] = round(float(np.mean([s["colour"] and s["shape"] and s["motion"] for s in scores])), 3)
    out["n"] = len(scores)
    return out


def shape_by_kind(scores: list[dict], specs: list) -> dict:
    """Clips whose shape read right, per shape asked for ("7/15"): a round blob passes for a
    circle, so the overall rate hides which shapes fail."""
    return {kind: f"{sum(s['shape'] for s, spec in zip(scores, specs) if spec.shape == kind)}/"
                  f"{sum(spec.shape == kind for spec in specs)}" for kind in world.SHAPES}


def area_ratio(clips: list, specs: list) -> float | None:
    """Mean area of the main shape in the clips over that in the rendered held-out clips (both by
    the detector; pairs where either shows none are skipped). 1 is right; a loss that favours
    painting shape over background draws shapes too big, and rounder (measured in
    vidserve/weights/wan-shapes/README.md, "Training history")."""
    pairs = [(detect(c)["objects"], detect(world.render(s))["objects"]) for c, s in zip(clips, specs)]
    pairs = [(made[0]["area"], true[0]["area"]) for made, true in pairs if made and true]
    return round(sum(m for m, _ in pairs) / sum(t for _, t in pairs), 2) if pairs else None


def generate(settings: Settings, prompt: str, seed: int, on_chunk=None, image=None, num_frames=None,
             adapters: LoraRegistry | None = None, **options):
    request = build_request(resolve(MODEL), settings, prompt, GenerationOptions(seed=seed, **options),
                            num_frames=num_frames, image=image, adapters=adapters)
    return generate_video(request, device="cpu", dtype="float32", on_chunk=on_chunk, adapters=adapters)


def run_t2v(settings: Settings, specs: list, first_seed: int = 0, **kwargs) -> dict:
    clips, start = [], time.perf_counter()
    for i, spec in enumerate(specs):
        clips.append(generate(settings, world.caption(spec), seed=first_seed + i, **kwargs).frames)
    seconds = (time.perf_counter() - start) / len(specs)
    scores = [score(clip, world.caption(spec)) for clip, spec in zip(clips, specs)]
    return {**rates(scores), "shape_by_kind": shape_by_kind(scores, specs), "area_ratio": area_ratio(clips, specs),
            "seconds_per_clip": round(seconds, 2)}


FEW_STEPS = {
    "default (20 steps, guidance 4)": {},
    "fast (4 steps, no guidance, wan-shapes-4step)": {"preset": "fast"},
    "4 steps, no guidance, no adapter": {"steps": 4, "guidance": 1.0},
}


def run_fast(settings: Settings, specs: list, first_seed: int = 0) -> dict:
    """The few-step preset beside the default and beside 4 plain steps, on the same prompts and
    seeds in one run: adherence, and per clip the denoising seconds and the whole job's (the
    pipeline, decoding included, then the MP4 and thumbnail a worker writes)."""
    adapters = LoraRegistry.from_settings("", "")  # the bundled ones: wan-shapes-4step
    out = {}
    for name, options in FEW_STEPS.items():
        generate(settings, world.caption(specs[0]), 0, adapters=adapters, **options)  # loads what the row uses
        clips, denoise, whole = [], 0.0, 0.0
        for i, spec in enumerate(specs):
            start = time.perf_counter()
            result = generate(settings, world.caption(spec), first_seed + i, adapters=adapters, **options)
            with tempfile.TemporaryDirectory() as tmp:
                segment = encode_segment(result.frames, result.fps)
                join_segments(segment.init, [segment.media], Path(tmp) / "video.mp4")
                save_thumbnail(result.frames, Path(tmp) / "thumbnail.webp")
            whole += time.perf_counter() - start
            denoise += result.timings["denoise"]
            clips.append(result.frames)
        scores = [score(clip, world.caption(spec)) for clip, spec in zip(clips, specs)]
        out[name] = {**rates(scores), "area_ratio": area_ratio(clips, specs),
                     "denoise_s": round(denoise / len(specs), 3), "job_s": round(whole / len(specs), 3)}
    default = out[next(iter(FEW_STEPS))]
    for row in out.values():
        row["denoise_speedup"] = round(default["denoise_s"] / row["denoise_s"], 1)
        row["job_speedup"] = round(default["job_s"] / row["job_s"], 1)
    return out


def use_adapter(folder: Path | None, scale: float = 1.0) -> None:
    """Load the LoRA in `folder` (once) onto the resident wan-shapes pipeline that generate() uses,
    at `scale`; None turns every adapter off. Straight through diffusers, so the eval needs no
    registered adapter: any folder diffusers' Wan LoRA loader reads."""
    pipe = get_pipeline(resolve(MODEL), "cpu", "float32").text_pipe  # the image pipeline shares its transformer
    if folder is None:
        if pipe.get_list_adapters():
            pipe.disable_lora()
        return
    if ADAPTER not in pipe.get_list_adapters().get("transformer", []):
        pipe.load_lora_weights(str(folder), adapter_name=ADAPTER)
    pipe.enable_lora()
    pipe.set_adapters([ADAPTER], [scale])


def run_lora(settings: Settings, n: int, folder: Path | None, specs: list, set_seed: int = SEED,
             first_seed: int = 0) -> dict:
    """Held-out purple prompts without and with the adapter, and `specs` (the usual held-out
    prompts) with it at scale 1."""
    model = resolve(MODEL)
    purple = world.sample_specs(n, set_seed, "heldout", frames=model.frames_per_chunk, width=model.width,
                                height=model.height, colours="purple")
    start, out = time.perf_counter(), {"adapter": str(folder) if folder else None,
                                       "heldout_triples": sorted(" ".join(c) for c in world.PURPLE_HELDOUT)}
    use_adapter(None)
    out["purple, base model"] = run_t2v(settings, purple, first_seed)
    if folder is not None:
        try:
            use_adapter(folder, 1.0)
            out["purple, with the adapter"] = run_t2v(settings, purple, first_seed)
            out["held-out prompts, with the adapter"] = run_t2v(settings, specs, first_seed)
        finally:
            use_adapter(None)
    out["seconds"] = round(time.perf_counter() - start, 1)
    return out


def run_i2v(settings: Settings, specs: list, first_seed: int = 0) -> dict:
    clips = [generate(settings, world.caption(spec), seed=first_seed + i,
                      image=Image.fromarray(world.render(spec)[0])).frames
             for i, spec in enumerate(specs)]
    scores = [score(clip, world.caption(spec)) for clip, spec in zip(clips, specs)]
    return {**rates(scores), "colour+shape": round(float(np.mean([s["colour"] and s["shape"] for s in scores])), 3),
            "shape_by_kind": shape_by_kind(scores, specs), "area_ratio": area_ratio(clips, specs)}


@torch.no_grad()
def run_vae(specs: list) -> dict:
    vae = AutoencoderKLWan.from_pretrained(Path(resolve(MODEL).source) / "vae").eval()
    clips = [to_clips(vae.decode(vae.encode(to_tensor([world.render(spec)])).latent_dist.mode()).sample)[0]
             for spec in specs]
    scores = [score(clip, world.caption(spec)) for clip, spec in zip(clips, specs)]
    return {**rates(scores), "shape_by_kind": shape_by_kind(scores, specs), "area_ratio": area_ratio(clips, specs)}


def run_chain(settings: Settings, specs: list, chunks: int, start: str, drift_correction: str,
              first_seed: int = 0) -> dict:
    """5-chunk chains from the first frame of a held-out clip (start="image": do later chunks keep
    the given frame's shape and colour?) or from the prompt alone (start="text", where chunk 1
    is a t2v clip and carries t2v's misses down the chain)."""
    per_chunk: list[list[dict]] = [[] for _ in range(chunks)]
    drift: list[list[dict]] = [[] for _ in range(chunks)]
    chunk_clips: list[list] = [[] for _ in range(chunks)]
    frames = resolve(MODEL).frames_per_chunk
    for i, spec in enumerate(specs):
        prompts = world.chain_prompts(spec, chunks)
        image = Image.fromarray(world.render(spec)[0]) if start == "image" else None

        def on_chunk(index, chunk_frames, metrics, prompt):
            per_chunk[index].append(score(chunk_frames, prompt))
            drift[index].append(metrics.to_dict())
            chunk_clips[index].append(chunk_frames)

        generate(settings, prompts[0], seed=first_seed + i, prompts=prompts,
                 num_frames=frames + (chunks - 1) * (frames - 1),
                 image=image, drift_correction=drift_correction, on_chunk=on_chunk)
    kept = [all(per_chunk[c][i]["colour"] and per_chunk[c][i]["shape"] for c in range(chunks))
            for i in range(len(specs))]
    chains = Counter(world.caption(spec) for spec in specs)
    kept_chains = Counter(world.caption(spec) for spec, k in zip(specs, kept) if k)
    return {
        "start": start, "drift_correction": drift_correction, "chains": len(specs),
        "kept_shape_and_colour_to_the_end": round(float(np.mean(kept)), 3),
        # Held-out combinations repeat across chains, and misses gather on a few of them
        "kept_by_prompt": {c: [kept_chains[c], n] for c, n in sorted(chains.items())},  # kept, chains
        "per_chunk": [{**rates(s), "colour+shape": round(float(np.mean([x["colour"] and x["shape"] for x in s])), 3),
                       "area_ratio": area_ratio(clips, specs),
                       "luma_change": round(float(np.mean([d["luma_change"] for d in dr])), 4),
                       "histogram_distance": round(float(np.mean([d["histogram_distance"] for d in dr])), 4)}
                      for s, dr, clips in zip(per_chunk, drift, chunk_clips)],
    }


def _data_url(image: Image.Image) -> str:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def run_vlm(n: int) -> dict:
    from fastapi.testclient import TestClient

    from vidserve.api.app import create_app

    pool = world.sample_specs(40 * n, SEED, frames=17, width=64, height=64)
    specs = [s for s in pool if world.is_frame_heldout(s) and len(s.objects) == 1][:n]
    rng = np.random.default_rng(SEED)
    described, colour_answers, shape_answers = [], [], []
    with tempfile.TemporaryDirectory() as data, TestClient(create_app(Settings(
            data_dir=Path(data), chat_model=CHAT_MODEL, device="cpu", dtype="float32"))) as client:

        def ask(image: Image.Image, question: str) -> str:
            reply = client.post("/v1/chat/completions", json={
                "model": CHAT_MODEL, "max_tokens": 24, "temperature": 0,
                "messages": [{"role": "user", "content": [
                    {"type": "image_url", "image_url": {"url": _data_url(image)}},
                    {"type": "text", "text": question}]}]})
            reply.raise_for_status()
            return reply.json()["choices"][0]["message"]["content"]

        for spec in specs:
            image = Image.fromarray(world.render(spec)[rng.integers(spec.frames)])
            truth = f"a {spec.colour} {spec.shape} on a {spec.background} background"
            described.append(score_caption(ask(image, "Describe the image."), truth))
            colour_answers.append(ask(image, f"What colour is the {spec.shape}?").strip().lower() == spec.colour)
            shape_answers.append(ask(image, "What shape is it?").strip().lower() == spec.shape)
    return {
        "frames": len(specs), "heldout_triples": sorted(" ".join(t) for t in world.FRAME_HELDOUT),
        "caption": {k: round(float(np.mean([d[k] for d in described])), 3)
                    for k in ("colour", "shape", "background", "colour+shape")},
        "colour_question": round(float(np.mean(colour_answers)), 3),
        "shape_question": round(float(np.mean(shape_answers)), 3),
    }


def table(title: str, rows: dict, columns: tuple) -> str:
    lines = [f"\n{title}\n", "| | " + " | ".join(columns) + " |", "|---|" + "---:|" * len(columns)]
    lines += [f"| {name} | " + " | ".join(str(row.get(c, "")) for c in columns) + " |" for name, row in rows.items()]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="t2v,i2v,vae,chain,fidelity,fast,vlm", help="comma-separated sections")
    parser.add_argument("--prompts", type=int, default=50, help="held-out prompts per t2v/i2v/fidelity run")
    parser.add_argument("--chains", type=int, default=10)
    parser.add_argument("--frames", type=int, default=100, help="held-out frames for the VLM")
    parser.add_argument("--set-seed", type=int, default=SEED,
                        help="draws the held-out prompts: another seed is another set of the same held-out "
                             "combinations, to check that what was chosen on the default set holds elsewhere")
    parser.add_argument("--first-seed", type=int, default=0, help="clip i is generated with seed first-seed + i")
    parser.add_argument("--purple", type=int, default=30, help="held-out purple prompts for the lora section")
    parser.add_argument("--adapter", default=str(ADAPTER_FOLDER),
                        help="the lora section's LoRA folder (diffusers' pytorch_lora_weights.safetensors); "
                             "'none': the base model only")
    parser.add_argument("--out", default="benchmarks/results/shapes_eval.json")
    args = parser.parse_args()
    sections = set(args.only.split(","))
    settings = Settings(device="cpu", dtype="float32", chat_model="")
    specs = heldout(args.prompts, args.set_seed)
    results: dict = {"model": MODEL, "chat_model": CHAT_MODEL, "set_seed": args.set_seed, "first_seed": args.first_seed}
    cols = ("colour", "shape", "motion", "background", "colour+shape+motion", "all", "area_ratio", "n")
    if "fidelity" in sections:
        results["fidelity"] = {name: run_t2v(settings, specs, args.first_seed, **kwargs)
                               for name, kwargs in VARIANTS.items()}
    if "t2v" in sections:
        results["t2v"] = (results["fidelity"]["dense"] if "fidelity" in results
                          else run_t2v(settings, specs, args.first_seed))
        print(table(f"text-to-video, {len(specs)} held-out prompts", {"wan-shapes": results["t2v"]}, cols))
    if "i2v" in sections:
        results["i2v"] = run_i2v(settings, specs, args.first_seed)
        print(table("image-to-video from the first frame of held-out clips", {"wan-shapes": results["i2v"]},
                    ("colour+shape", *cols)))
    if "vae" in sections:
        results["vae"] = run_vae(specs)
        print(table("the same held-out clips through the VAE and back: a ceiling for t2v and i2v",
                    {"wan-shapes VAE": results["vae"]}, cols))
    kinds = {name: results[name]["shape_by_kind"] for name in ("t2v", "i2v", "vae") if name in results}
    if kinds:
        print(table("shape read right, per shape asked for", kinds, world.SHAPES))
    if "chain" in sections:
        chain_specs = heldout(args.chains, args.set_seed)
        results["chain"] = [run_chain(settings, chain_specs, 5, start, d, args.first_seed)
                            for start, d in (("image", "color"), ("image", "none"), ("text", "color"))]
        for run in results["chain"]:
            print(table(f"5-chunk chains from the {run['start']}, drift_correction={run['drift_correction']}: shape "
                        f"and colour kept in every chunk by {run['kept_shape_and_colour_to_the_end']:.0%} of "
                        f"{run['chains']}",
                        {f"chunk {i + 1}": row for i, row in enumerate(run["per_chunk"])},
                        ("colour+shape", "colour", "shape", "motion", "area_ratio", "luma_change",
                         "histogram_distance")))
            missed = [f"{c}: {k}/{n}" for c, (k, n) in run["kept_by_prompt"].items() if k < n]
            print("not kept to the end, kept/chains by first prompt:", "; ".join(missed) or "none")
    if "fidelity" in sections:
        print(table(f"fidelity: t2v adherence on {len(specs)} held-out prompts", results["fidelity"],
                    (*cols, "seconds_per_clip")))
    if "vlm" in sections:
        results["vlm"] = run_vlm(args.frames)
        print(f"\nvlm-shapes on {results['vlm']['frames']} held-out frames via /v1/chat/completions: "
              f"caption {results['vlm']['caption']}, colour question {results['vlm']['colour_question']}, "
              f"shape question {results['vlm']['shape_question']}")
    if "fast" in sections:
        results["fast"] = run_fast(settings, specs, args.first_seed)
        print(table(f"few steps: {len(specs)} held-out prompts, seconds per clip", results["fast"],
                    (*cols, "denoise_s", "job_s", "denoise_speedup", "job_speedup")))
    if "lora" in sections:
        folder = None if args.adapter == "none" else Path(args.adapter)
        if folder is not None and not (folder / "pytorch_lora_weights.safetensors").is_file():
            parser.error(f"no LoRA in {folder} (pytorch_lora_weights.safetensors); --adapter none for the base only")
        results["lora"] = run_lora(settings, args.purple, folder, specs, args.set_seed, args.first_seed)
        rows = {k: v for k, v in results["lora"].items() if isinstance(v, dict)}
        print(table(f"LoRA {folder.name if folder else '(none)'}: {args.purple} held-out purple prompts "
                    f"(colour = read purple) and {len(specs)} held-out prompts; {results['lora']['seconds']} s",
                    rows, (*cols, "seconds_per_clip")))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
