"""`vidserve` command line: generate a clip, list models, export the tiny models."""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections.abc import Iterable
from importlib.metadata import version
from pathlib import Path
from typing import Literal, get_args, get_origin

from pydantic import ValidationError
from pydantic.fields import FieldInfo

from vidserve.config import DEVICE_PATTERN, DTYPE_NAMES, Settings, get_settings
from vidserve.errors import InvalidRequest, VidserveError, from_validation_error
from vidserve.media.quality import OutputWarning, chunk_warnings, output_warnings, video_warnings
from vidserve.options import GenerationOptions

PROG = "vidserve"


class _Parser(argparse.ArgumentParser):
    """Bad arguments end in one line on stderr and exit status 2, not a usage dump."""

    def error(self, message: str):
        self.exit(2, f"{PROG}: error: {message} (see '{self.prog} --help')\n")


def _settings(args: argparse.Namespace) -> Settings:
    names = ("host", "device", "dtype", "data_dir", "storage", "queue", "redis_url", "allow_volatile_redis",
             "chat_model", "chat_url", "quantization", "compile", "offload", "vae_tiling")
    overrides = {k: v for k in names if (v := getattr(args, k, None)) is not None}
    base = get_settings()
    # Adapters registered on the command line come on top of those the environment registers.
    for flag, setting in (("lora_dir", "lora_dirs"), ("register_lora", "loras")):
        if getattr(args, flag, None):
            overrides[setting] = ",".join(filter(None, [getattr(base, setting), *map(str, getattr(args, flag))]))
    try:
        return Settings.model_validate({**base.model_dump(), **overrides})
    except ValidationError as exc:
        raise from_validation_error(exc) from None


def _placed(settings: Settings) -> Settings:
    """Settings whose device, dtype and load options can run here, checked before any work."""
    from vidserve.pipelines import quiet_libraries
    from vidserve.pipelines.devices import placement

    quiet_libraries()
    placement(settings.device, settings.dtype, settings.load)
    return settings


def cmd_models(args: argparse.Namespace) -> int:
    from vidserve.registry import MODELS

    rows = [("name", "kind", "native size", "fps", "chunk", "shift", "experts", "stride x patch", "presets",
             "source")]
    for s in MODELS.values():
        geometry = "x".join(map(str, s.vae_stride)) + " x " + "x".join(map(str, s.patch_size))
        rows.append((s.name, s.kind, f"{s.width}x{s.height}", str(s.fps), str(s.frames_per_chunk),
                     f"{s.flow_shift:g}", str(s.experts), geometry, ",".join(n for n, _ in s.presets) or "-",
                     s.source))
    _print_table(rows)
    print()
    _print_table(_preset_adapters(_settings(args)))
    print("\n'vidserve check --model MODEL --preset PRESET' prints the command that fetches a missing file.")
    return 0


def _preset_adapters(settings: Settings) -> list[tuple[str, ...]]:
    """A row for each adapter a preset applies: whether it is registered here, and its file:
    where it is, or what to fetch (the published ones) or to register (the others)."""
    from vidserve.loras import PUBLIC_ADAPTERS, LoraRegistry
    from vidserve.registry import MODELS

    adapters = LoraRegistry.from_settings(settings.lora_dirs, settings.loras)
    rows = [("model", "preset", "adapter", "here", "file")]
    for spec in MODELS.values():
        for name, preset in spec.presets:
            for lora in preset.loras:
                found, public = adapters.get(lora.name), PUBLIC_ADAPTERS.get(lora.name)
                if found is not None:
                    file = str(found.path)
                elif public is not None:
                    file = f"{public.filename} from {public.repo}"
                else:
                    file = f"register it: --lora {lora.name}=PATH"
                rows.append((spec.name, name, lora.name, "yes" if found is not None else "no", file))
    return rows


def _print_table(rows: list[tuple[str, ...]]) -> None:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())


def _lora_uses(given: list[str] | None) -> list[dict] | None:
    """--lora NAME[:SCALE] values as the request's `loras`."""
    if not given:
        return None
    uses = []
    for value in given:
        name, sep, scale = value.rpartition(":")
        try:
            uses.append({"name": name, "scale": float(scale)} if sep else {"name": value})
        except ValueError:
            raise InvalidRequest(f"--lora takes NAME or NAME:SCALE, got {value!r}", param="loras") from None
    return uses


def _attention_overrides(args: argparse.Namespace) -> dict | None:
    given = {"mode": args.attention, "density": args.density, "dense_steps": args.dense_steps}
    overrides = {k: v for k, v in given.items() if v is not None}
    return overrides or None


def _cache_overrides(args: argparse.Namespace) -> dict | None:
    given = {"kind": args.cache, "threshold": args.cache_threshold}
    overrides = {k: v for k, v in given.items() if v is not None}
    return overrides or None


def _generation_options(args: argparse.Namespace) -> GenerationOptions:
    try:
        return GenerationOptions(**{name: getattr(args, name) for name in _option_flags()},
                                 prompts=args.chunk_prompt, attention=_attention_overrides(args),
                                 cache=_cache_overrides(args), loras=_lora_uses(args.use_lora))
    except ValidationError as exc:
        raise from_validation_error(exc) from None


# The generation options `generate` spells its own way (flags in build_parser), and those it
# does not take: prompt_extend and caption_chain need the LLM path, which only the server runs,
# and priority orders a server's queue, which `generate` skips. Every other option is a flag
# of its name, made from its declaration.
_OWN_FLAGS = ("prompts", "attention", "cache", "loras")
_SERVER_ONLY = ("prompt_extend", "caption_chain", "priority")


def _option_flags() -> dict[str, FieldInfo]:
    return {name: field for name, field in GenerationOptions.model_fields.items()
            if name not in _OWN_FLAGS + _SERVER_ONLY}


def _add_option_flags(parser: argparse.ArgumentParser) -> None:
    """--NAME for each generation option not spelled otherwise, typed and described as declared."""
    for name, field in _option_flags().items():
        flag, help = "--" + name.replace("_", "-"), field.description[0].lower() + field.description[1:].rstrip(".")
        kinds = [kind for kind in get_args(field.annotation) or (field.annotation,) if kind is not type(None)]
        if field.annotation is bool:
            parser.add_argument(flag, action="store_true", help=help)
        elif get_origin(field.annotation) is Literal:
            parser.add_argument(flag, choices=kinds, default=field.default, help=f"{help} (default: {field.default})")
        elif len(kinds) == 1 and kinds[0] in (str, int, float):
            parser.add_argument(flag, type=kinds[0], help=help)
        else:
            raise TypeError(f"GenerationOptions.{name} ({field.annotation}) has no CLI flag: spell it in "
                            "vidserve/cli.py (_OWN_FLAGS) or leave it to the server (_SERVER_ONLY)")


def _output_requests(given: list[str] | None, default: str):
    """--output PATH[,KEY=VALUE...] values (or `default`) as (path, OutputRequest) pairs; the
    format is the path's suffix's unless format= says otherwise."""
    from vidserve.media.formats import FORMATS
    from vidserve.media.renditions import OutputRequest

    by_suffix = {f.extension: name for name, f in FORMATS.items()}
    requests = []
    for value in given or [default]:
        path, *options = value.split(",")
        if any("=" not in option for option in options):
            raise InvalidRequest(f"--output takes PATH[,KEY=VALUE...], got {value!r}", param="outputs")
        fields = dict(option.partition("=")[::2] for option in options)
        fields.setdefault("format", by_suffix.get(Path(path).suffix.lower()))
        if fields["format"] is None:
            raise InvalidRequest(f"--output {path}: end it in {', '.join(by_suffix)} or add format=...",
                                 param="outputs")
        try:
            requests.append((Path(path), OutputRequest.model_validate(fields)))
        except ValidationError as exc:
            raise from_validation_error(exc, prefix="--output") from None
    return requests


def cmd_generate(args: argparse.Namespace) -> int:
    from vidserve.media.renderer import Provenance, Renderer
    from vidserve.loras import LoraRegistry
    from vidserve.media import load_image
    from vidserve.registry import resolve_local
    from vidserve.media.renditions import resolve_output
    from vidserve.video_request import build_request

    # Every argument is checked before `_placed` imports torch, so a mistake is one line at once.
    settings = _settings(args)
    spec = resolve_local(args.model or settings.default_model)
    image = load_image(args.image, settings.max_image_pixels) if args.image else None
    adapters = LoraRegistry.from_settings(settings.lora_dirs, settings.loras, settings.lora_cache)
    request = build_request(spec, settings, args.prompt, _generation_options(args), size=args.size,
                            seconds=args.seconds, num_frames=args.frames, fps=args.fps, image=image, adapters=adapters)
    outputs = [(path, resolve_output(asked, "--output", request.width, request.height, request.fps,
                                     request.num_frames, settings))
               for path, asked in _output_requests(args.output, f"vidserve-{request.seed}.mp4")]
    _placed(settings)
    for path, _ in outputs:
        path.parent.mkdir(parents=True, exist_ok=True)
    _warn(request.warnings)  # said before the wait: the request alone gives reason to doubt the clip

    from tqdm import tqdm

    from vidserve.pipelines.chain import generate_video

    chunks = len(request.chunk_frames)
    desc = f"{spec.name} {request.width}x{request.height}x{request.num_frames}" + (f", {chunks} chunks" if chunks > 1
                                                                                   else "")
    # Each chunk is checked as it is made, as the API's worker does, so a blank chunk in a long
    # video is named even where the whole video is not blank.
    chunk_findings: list[OutputWarning] = []
    with tqdm(total=request.steps * chunks, desc=desc, unit="step", file=sys.stderr, disable=args.quiet) as bar:
        result = generate_video(request, settings.device, settings.dtype,
                                on_step=lambda done, total: bar.update(done - bar.n), load=settings.load,
                                adapters=adapters,
                                on_chunk=lambda index, frames, *_: chunk_findings.extend(chunk_warnings(frames, index)))
    start = time.perf_counter()
    renderer = Renderer(result.frames, request.fps, Provenance(request.prompt, spec.name, request.seed))
    for path, rendition in outputs:
        renderer.write(rendition, path)
        print(path)
    timings = {**result.timings, "encode": time.perf_counter() - start}
    print(f"seed {request.seed}, {len(result.frames)} frames {request.width}x{request.height} @ {request.fps} fps; "
          + ", ".join(f"{name} {seconds:.2f}s" for name, seconds in timings.items()), file=sys.stderr)
    if chunks > 1:
        print(_drift_table(result.chunks), file=sys.stderr)
    findings = video_warnings(output_warnings(result.frames), chunk_findings)
    _warn(findings)
    warnings = [*request.warnings, *findings]
    if args.report:
        report = {"output": str(outputs[0][0]),
                  "outputs": [{"path": str(path), **rendition.describe(request.num_frames, request.fps,
                                                                         path.stat().st_size)}
                              for path, rendition in outputs],
                  "model": spec.name, "prompt": request.prompt, "seed": request.seed,
                  "width": request.width, "height": request.height, "fps": request.fps, "frames": len(result.frames),
                  "steps": request.steps, "drift_correction": request.drift_correction, "timings": timings,
                  "warnings": [w.model_dump() for w in warnings],
                  "chunks": [{"index": c.index, "frames": c.frames, "drift": c.drift} for c in result.chunks]}
        Path(args.report).write_text(json.dumps(report, indent=2) + "\n")
    return 0


def _warn(warnings: Iterable[OutputWarning]) -> None:
    for warning in warnings:
        print(f"{PROG}: warning: {warning.code}: {warning.message}", file=sys.stderr)


def _drift_table(chunks) -> str:
    rows = [f"{'chunk':>5} {'frames':>6} {'luma':>7} {'luma Δ':>8} {'hist dist':>9} {'sharpness':>9}"]
    for c in chunks:
        d = c.drift
        rows.append(f"{c.index + 1:>5} {c.frames:>6} {d['mean_luma']:>7.1f} {d['luma_change']:>+8.1%} "
                    f"{d['histogram_distance']:>9.3f} {d['sharpness_ratio']:>9.2f}")
    return "\n".join(rows)


def cmd_export_tiny(args: argparse.Namespace) -> int:
    from vidserve.registry import resolve

    spec = resolve(args.model)
    if not spec.builtin:
        raise VidserveError(f"{args.model} is not a built-in model; export-tiny writes one of the built-in ones")
    if Path(args.dir).exists() and any(Path(args.dir).iterdir()):
        raise VidserveError(f"{args.dir} exists and is not empty")
    from vidserve.pipelines import quiet_libraries

    quiet_libraries()  # before torch: torchao's unloadable CUDA extensions and pytree notes come with it
    import torch

    from vidserve.pipelines.video import VideoPipeline

    # float32 on the CPU, so loading the folder reproduces the built-in model exactly.
    VideoPipeline.load(spec, torch.device("cpu"), torch.float32).save(args.dir)
    print(args.dir)
    return 0


def _is_loopback(host: str) -> bool:
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def cmd_serve(args: argparse.Namespace) -> int:
    settings = _settings(args)
    if args.api_key:
        settings = settings.model_copy(update={"api_keys": ",".join(args.api_key)})
    if args.keys_file:
        settings = settings.model_copy(update={"keys_file": args.keys_file})
    if not settings.keys and not settings.keys_file and not _is_loopback(settings.host) \
            and not args.allow_unauthenticated:
        raise VidserveError(f"refusing to serve {settings.host} without API keys: pass --api-key KEY or --keys-file "
                            "(or VIDSERVE_API_KEYS), or --allow-unauthenticated if a proxy in front does auth")
    from vidserve.keys import KeyRing

    KeyRing.from_settings(settings.keys, settings.keys_file)  # a bad keys file stops here, in one line
    try:
        from vidserve.api.serving import listen, playground_url, serve

        sock = listen(settings.host, args.port)  # a port in use stops here, in one line, before torch loads
        serve(_placed(settings), sock, playground_url(settings.host, args.port), args.log_level)
    except KeyboardInterrupt:  # Ctrl-C while it loads, before the server's own handling: nothing to stop yet
        return 130
    return 0


def cmd_hash_key(args: argparse.Namespace) -> int:
    import secrets

    from vidserve.keys import key_digest

    key = args.key or "vs-" + secrets.token_urlsafe(32)
    if not args.key:
        print(f"# the new key (give it to the client; it is not stored): {key}")
    print(f'[[keys]]\nname = "{args.name}"\nsha256 = "{key_digest(key)}"\nrole = "user"')
    return 0


def cmd_worker(args: argparse.Namespace) -> int:
    from vidserve.workers.celery_app import run_worker

    return run_worker(_placed(_settings(args)), args.model, metrics_port=args.metrics_port)


def cmd_check(args: argparse.Namespace) -> int:
    if args.gpu:
        return _check_gpu(args.device if args.device and args.device.startswith("cuda") else "cuda")
    from vidserve.check import run_checks
    from vidserve.pipelines.devices import placement

    settings = _settings(args)
    uses_redis = settings.queue == "celery" or args.redis_url is not None
    # A preset is checked on each model --model names, or on the default model if it names none.
    presets = [(model, preset) for model in args.model or [settings.default_model] for preset in args.preset or []]
    results = run_checks(settings, [settings.default_model, *(args.model or [])], placement, redis=uses_redis,
                         presets=presets)
    for result in results:
        print(result.line())
    return 0 if all(result.ok for result in results) else 1


def _check_gpu(device: str) -> int:
    from vidserve.kernels.gpu_check import run_gpu_checks

    results = run_gpu_checks(device)
    for result in results:
        print(result.line(), flush=True)
    if not all(result.ok for result in results):
        print("vidserve check --gpu: FAILED; the GPU kernels cannot run on this machine as it is", file=sys.stderr)
        return 1
    return 0


def _device(value: str) -> str:
    if not re.fullmatch(DEVICE_PATTERN, value):
        raise argparse.ArgumentTypeError(f"{value!r} is not auto, cpu, cuda or cuda:N")
    return value


def _add_lora_dir_flag(parser: argparse.ArgumentParser, settings: Settings) -> None:
    parser.add_argument("--lora-dir", action="append", type=Path, metavar="DIR",
                        help="register every LoRA adapter in DIR (.safetensors files, or folders holding one); "
                             f"repeatable (default: {settings.lora_dirs or 'the bundled adapters only'})")


def _add_lora_registration_flags(parser: argparse.ArgumentParser, settings: Settings) -> None:
    """The adapters requests may name: the API and its workers must register the same ones."""
    _add_lora_dir_flag(parser, settings)
    parser.add_argument("--lora", dest="register_lora", action="append", metavar="NAME=PATH",
                        help="register the adapter at PATH (a .safetensors file or a folder) as NAME; repeatable")


def _add_placement_flags(parser: argparse.ArgumentParser, settings: Settings) -> None:
    parser.add_argument("--device", type=_device,
                        help=f"auto (cuda if there is a GPU), cpu, cuda or cuda:N (default: {settings.device})")
    parser.add_argument("--dtype", choices=DTYPE_NAMES,
                        help=f"weights' dtype; auto is bfloat16 on CUDA, float32 on CPU (default: {settings.dtype})")


def _add_volatile_redis_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--allow-volatile-redis", action="store_true", default=None,
                        help="accept a Redis without its append-only file, where a crash of Redis loses recent jobs "
                             "and queue messages (default: such a Redis is refused)")


def _add_load_flags(parser: argparse.ArgumentParser, settings: Settings) -> None:
    parser.add_argument("--quantization", choices=["none", "int8", "fp8"],
                        help="weight-only quantization of the transformer blocks (torchao; fp8 needs CUDA) "
                             f"(default: {settings.quantization})")
    parser.add_argument("--compile", action="store_true", default=None,
                        help="regional torch.compile of the transformer blocks (once per video size)")
    parser.add_argument("--offload", choices=["none", "model", "group", "sequential"],
                        help="keep weights in CPU memory, moving them to the GPU as needed (CUDA) "
                             f"(default: {settings.offload})")
    parser.add_argument("--vae-tiling", action="store_true", default=None, help="decode frames in tiles")


def build_parser(settings: Settings | None = None) -> argparse.ArgumentParser:
    """The command line; `settings` (the environment's) supply the defaults its help shows."""
    from vidserve.video_request import MIN_FRAMES

    s = settings or get_settings()
    parser = _Parser(prog=PROG, description="Video/diffusion inference server for open Wan models.")
    parser.add_argument("--version", action="version", version=f"{PROG} {version('vidserve')}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    gen = sub.add_parser("generate", help="render one clip to an MP4 (or the files --output names)",
                         description="Render one clip to an MP4, or to the files --output names.")
    gen.add_argument("prompt", help="what the video shows")
    gen.add_argument("--model", help=f"registry name (see 'vidserve models') or local diffusers folder "
                                     f"(default: {s.default_model})")
    gen.add_argument("--image", help="first frame (PNG/JPEG) for image-to-video models")
    gen.add_argument("--size", help="WIDTHxHEIGHT, multiples of 16 (default: the model's native size)")
    length = gen.add_mutually_exclusive_group()
    length.add_argument("--seconds", type=float,
                        help="clip length; frames = 4*ceil(seconds*fps/4)+1 (default: one chunk of the model)")
    length.add_argument("--frames", type=int,
                        help=f"exact frame count, 4k+1 of at least {MIN_FRAMES} (instead of --seconds)")
    gen.add_argument("--fps", type=int, help="frames per second (default: the model's)")
    _add_option_flags(gen)
    gen.add_argument("--chunk-prompt", action="append",
                     help="prompt for the next chunk of a long video (repeatable; later chunks use PROMPT)")
    gen.add_argument("--report", help="write a JSON report here: chunks, frames, timings, drift metrics")
    gen.add_argument("--attention", choices=["dense", "sparse", "topk"],
                     help=f"self-attention (default: {s.attention.mode})")
    gen.add_argument("--density", type=float,
                     help=f"share of key tiles kept by --attention sparse (default: {s.attention.density:g})")
    gen.add_argument("--dense-steps", type=int,
                     help=f"first denoising steps that run dense (default: {s.attention.dense_steps})")
    gen.add_argument("--cache", choices=["none", "first_block", "taylorseer"],
                     help=f"step caching through diffusers' hooks (default: {s.cache.kind})")
    gen.add_argument("--cache-threshold", type=float,
                     help=f"first_block: reuse a step below this change (default: {s.cache.threshold:g})")
    _add_load_flags(gen, s)
    gen.add_argument("--lora", dest="use_lora", action="append", metavar="NAME[:SCALE]",
                     help="apply this registered LoRA adapter (bundled, or from --lora-dir), at SCALE (default 1); "
                          "repeatable")
    _add_lora_dir_flag(gen, s)
    gen.add_argument("-o", "--output", action="append", metavar="PATH[,KEY=VALUE...]",
                     help="write the video here, as the suffix says (.mp4 .webm .mov .gif .apng, .zip for PNG "
                          "frames); KEY=VALUE pairs set the rendition's codec, fps, fps_mode, quality and size, as "
                          "the API's outputs do; repeatable (default: vidserve-SEED.mp4)"),
    _add_placement_flags(gen, s)
    gen.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    gen.set_defaults(func=cmd_generate)

    serve = sub.add_parser("serve", help="run the HTTP API (embedded queue by default: no services needed)",
                           description="Run the HTTP API: OpenAI-shaped /v1/videos and /v1/chat/completions.")
    serve.add_argument("--host", help=f"address to listen on (default: {s.host})")
    serve.add_argument("--port", type=int, default=8000, help="port to listen on (default: 8000)")
    serve.add_argument("--data-dir", type=Path, help=f"job database and outputs (default: {s.data_dir})")
    serve.add_argument("--queue", choices=["embedded", "celery"],
                       help=f"embedded: jobs run in this process; celery: on 'vidserve worker's (default: {s.queue})")
    serve.add_argument("--redis-url", help=f"Redis for --queue celery (default: {s.redis_url})")
    _add_volatile_redis_flag(serve)
    serve.add_argument("--storage", help=f"job files: 'local' or s3://BUCKET[/PREFIX] (default: {s.storage})")
    serve.add_argument("--api-key", action="append", help="accept this Bearer key (repeatable; default: "
                       + ("VIDSERVE_API_KEYS)" if s.keys else "none, no auth)"))
    serve.add_argument("--keys-file", type=Path, help="TOML/JSON file of named keys with roles and quotas "
                       f"(default: {s.keys_file or 'none'}); see 'vidserve hash-key'")
    serve.add_argument("--allow-unauthenticated", action="store_true",
                       help="serve a non-loopback address without API keys")
    _add_placement_flags(serve, s)
    serve.add_argument("--chat-model", help="chat model: name, hub id or folder; '' for none "
                                            f"(default: {s.chat_model or 'none'})")
    _add_load_flags(serve, s)
    _add_lora_registration_flags(serve, s)
    serve.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"],
                       help="server log level (default: info)")
    serve.set_defaults(func=cmd_serve)

    worker = sub.add_parser("worker", help="run one Celery worker (one GPU, one model) for --queue celery",
                            description="Run one Celery worker: it holds one model and takes only its jobs.")
    worker.add_argument("--model", required=True, help="the model this worker holds; it takes only its jobs")
    worker.add_argument("--redis-url", help=f"broker and job store (default: {s.redis_url})")
    _add_volatile_redis_flag(worker)
    worker.add_argument("--data-dir", type=Path, help="this worker's own directory (its webhook secret, unless "
                                                      "VIDSERVE_WEBHOOK_SECRET is set); with --storage local, the "
                                                      f"job files too, shared with the API (default: {s.data_dir})")
    worker.add_argument("--storage", help="job files, the API's: 'local' (the shared data dir) or "
                                          f"s3://BUCKET[/PREFIX] (default: {s.storage})")
    _add_placement_flags(worker, s)
    worker.add_argument("--metrics-port", type=int,
                        help="serve this worker's Prometheus metrics on this port (default: none)")
    worker.add_argument("--chat-url", help="chat endpoint for prompt_extend / caption_chain, e.g. "
                                           f"http://api:8000/v1 (default: {s.chat_url or 'none'})")
    _add_load_flags(worker, s)
    _add_lora_registration_flags(worker, s)
    worker.set_defaults(func=cmd_worker)

    check = sub.add_parser("check", help="verify what a deployment needs: Redis, storage, models, device",
                           description="Verify what a deployment needs, one ok/FAIL line each: Redis reachable and "
                                       "durable (with --queue celery or --redis-url), storage readable and writable, "
                                       "models resolvable, the adapters of each --preset registered, device and "
                                       "dtype usable. Exit status 1 if any fails.")
    check.add_argument("--queue", choices=["embedded", "celery"], help=f"the queue to check for (default: {s.queue})")
    check.add_argument("--redis-url", help="Redis to check; checked when given or with --queue celery "
                       f"(default: {s.redis_url})")
    _add_volatile_redis_flag(check)
    check.add_argument("--storage", help=f"job files: 'local' or s3://BUCKET[/PREFIX] (default: {s.storage})")
    check.add_argument("--data-dir", type=Path, help=f"job database and outputs (default: {s.data_dir})")
    check.add_argument("--model", action="append", help="a model to check besides the default one, by registry "
                       f"name or local folder (repeatable; default: only {s.default_model})")
    check.add_argument("--preset", action="append", help="a preset whose adapters must be registered, on each "
                       "--model (or the default one); a missing file's line gives the command that fetches it "
                       "(repeatable)")
    _add_lora_registration_flags(check, s)
    _add_placement_flags(check, s)
    check.add_argument("--gpu", action="store_true", help="instead, check that the GPU kernels run here: a "
                       "trivial Triton kernel, then the block-sparse attention kernel on a tiny bf16 case against "
                       "an fp32 reference (on --device cuda:N, default cuda)")
    check.set_defaults(func=cmd_check)

    hash_key = sub.add_parser("hash-key", help="print a keys-file entry for an API key (its SHA-256)",
                              description="Print a keys-file entry for an API key: the file holds only its SHA-256.")
    hash_key.add_argument("name", help="the key's name, recorded on its jobs and in metrics")
    hash_key.add_argument("key", nargs="?", help="the key (default: a new random one, printed once)")
    hash_key.set_defaults(func=cmd_hash_key)

    models = sub.add_parser("models", help="list the model registry, and the adapter files its presets need",
                            description="List the model registry, then each adapter a preset applies: its file, "
                                        "and whether it is registered here.")
    _add_lora_registration_flags(models, s)
    models.set_defaults(func=cmd_models)

    export = sub.add_parser("export-tiny", help="write a built-in tiny model as a diffusers folder",
                            description="Write a built-in tiny model as a diffusers folder that --model loads.")
    export.add_argument("dir", help="folder to write (must not exist or be empty)")
    export.add_argument("--model", default="wan-tiny", help="built-in model to export (default: wan-tiny)")
    export.set_defaults(func=cmd_export_tiny)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # the subcommand's own parser says it, so the hint names its --help
        subcommand = parser._subparsers._group_actions[0].choices[args.command]
        subcommand.error(f"unrecognized arguments: {' '.join(unknown)}")
    try:
        return args.func(args)
    except VidserveError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
