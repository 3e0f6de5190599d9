"""Chat throughput: vidserve's continuous batching vs sequential transformers `generate`.

One random-weight Llama (built here, saved with vidserve's byte-level chat tokenizer into a temp
folder, float32) serves the same requests two ways, one after the other so they never share the CPU:
  generate  in this process, `model.generate` one request at a time: what a user without a server runs;
  vidserve  `vidserve serve --chat-model FOLDER`, streamed through the official `openai` SDK.

Workload: request r is a chat-templated user message of 20-200 bytes (= tokens) with seed r, sampled at
temperature 1 (top_p 1, no top_k) for exactly N new tokens (vidserve: ignore_eos, loop detection off,
prefix cache off, as each concurrency resends the first requests of the last; generate: min_new_tokens =
max_new_tokens = N). At concurrency C there are C clients; client c sends
requests c, c+C, c+2C, ... back to back (C*k requests in all).

Timing. TTFT is time to the first visible text (vidserve streams nothing before it: random bytes often
start with half a UTF-8 character); inter-token latency (ITL) = (last token - first text) / (N - 1).
vidserve: wall time from the first send to the last answer; TTFT = send -> first content chunk.
generate: each request runs once in-process (after warm-up); a streamer timestamps its tokens, giving its
own time to first text (prefill, sampling) and total time. The C clients are then replayed against a
one-at-a-time FIFO server: request i starts when request i-1 ends and arrives when its client's previous
request (i-C) ended (the first C at t=0), so TTFT_i = start_i - arrival_i + own TTFT_i, and the wall time
is the sum of the service times. A request's service time does not depend on the others, so the request
sets of all concurrencies (prefixes of one list) are measured in one pass. Output tok/s = tokens / wall.

Also measured, before the server starts: the decode ceiling, C x (a decode forward pass for 1 sequence) /
(one for C sequences) over the same model and cache length, with no prefill, sampling or serving: what
batching alone can give on this machine; and vidserve's engine in this process, no serving: its step with
C sequences decoding over the ceiling's C-sequence step, the two alternated (the paged cache's cost), and
its prefill rate for a burst of C prompts, which with the ceiling's step bounds the share of the ceiling
a server that must prefill the prompts can reach (`share_bound`).

Then the conversation workloads (chat_multi_turn.py), on a LLaVA made of the same Llama and a small CLIP
tower, served with a configured KV cache: 16 conversations of 4 turns at once, sharing a ~1,500-token
system prompt, each about its own image (time to first text per turn, prefix-cache hits, output tok/s
beside the decode ceiling at the conversations' context), and the server's peak resident memory while
16 requests run and 64 wait.

    python benchmarks/chat.py [--quick] [--only throughput|conversations] [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import signal
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

import torch

from api_overhead import start_server  # benchmarks/ is on sys.path: the same server start/stop as api_overhead's
from chat_multi_turn import build_vision_model, measure_memory, measure_multi_turn, system_prompt

# hidden 1024 x 8 layers (91M parameters): here one decode step takes ~25 ms for 1 sequence and ~60 ms
# for 16, of which transformers' Python is ~2 ms (timed at hidden 64), so batching shares real compute,
# not overhead. hidden 512 x 4 (~7 ms) is closer to the overhead; a bigger model would not fit ~5 min.
MODEL = dict(hidden_size=1024, intermediate_size=2816, num_hidden_layers=8, num_attention_heads=16,
             num_key_value_heads=4, max_position_embeddings=4096)
FULL = dict(tokens=64, requests={1: 4, 4: 8, 16: 32},  # concurrency: requests (k = 4, 2, 2 per client)
            conversations=dict(conversations=16, turns=4, system_bytes=1500, answer_tokens=32, running=16,
                               waiting=64, kv_tokens=16384))
QUICK = dict(tokens=8, requests={1: 2, 4: 4, 16: 16},
             conversations=dict(conversations=4, turns=3, system_bytes=300, answer_tokens=8, running=16,
                                waiting=8, kv_tokens=4096))
# The contexts the multi-turn workload decodes at: system prompt, image, four questions and answers.
CONVERSATION_CONTEXT = 1750
# Resident memory beyond the weights and the KV cache: Python, torch, transformers and the server (some
# 700 MiB idle), a step's activations, the waiting requests.
MEMORY_MARGIN_MIB = 1024
TEMPERATURE = 1.0
WORDS = "the a video frame model token batch queue server fox snow river light night prompt cache step".split()


def build_model(folder: Path) -> dict:
    from transformers import LlamaConfig, LlamaForCausalLM

    from vidserve.pipelines.llm.tiny import build_chat_tokenizer

    tokenizer = build_chat_tokenizer()
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, **MODEL)
    model = LlamaForCausalLM(config).eval()
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return {"class": "LlamaForCausalLM", **MODEL, "vocab_size": len(tokenizer), "dtype": "float32",
            "parameters_m": round(sum(p.numel() for p in model.parameters()) / 1e6, 1)}


def make_prompts(n: int) -> list[str]:
    rng = random.Random(0)
    lengths = [20 + (180 * i) // max(n - 1, 1) for i in range(n)]  # evenly 20..200 bytes, shuffled
    rng.shuffle(lengths)
    return [" ".join(rng.choice(WORDS) for _ in range(length))[:length] for length in lengths]


def messages(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


class Clock:
    """A transformers streamer that timestamps: put() gets the prompt first, then each new token.

    `first_text` is when the output first decodes to visible text: vidserve sends nothing before that
    (special tokens and half UTF-8 characters, common with random bytes, are held back), so both sides'
    TTFT means "first text a streaming client can show".
    """

    def __init__(self, tokenizer) -> None:
        self.tokenizer, self.ids, self.times, self.first_text = tokenizer, [], [], None

    def put(self, value) -> None:
        self.times.append(time.perf_counter())
        if len(self.times) == 1:
            return  # the prompt
        self.ids += value.flatten().tolist()
        if self.first_text is None:
            text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
            if text and not text.endswith("\ufffd"):  # vidserve's rule in Sequence._detokenize
                self.first_text = self.times[-1]

    def end(self) -> None:
        self.first_text = self.first_text or self.times[-1]


def measure_generate(folder: Path, prompts: list[str], tokens: int) -> list[dict]:
    """Each prompt once through model.generate: its prompt length, own TTFT, total time and ITL (s)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    # top_k=0: generation_config's default top_k of 50 would sample differently from vidserve.
    kwargs = dict(max_new_tokens=tokens, min_new_tokens=tokens, do_sample=True, temperature=TEMPERATURE,
                  top_p=1.0, top_k=0, pad_token_id=tokenizer.pad_token_id)

    def run(text: str, seed: int) -> dict:
        chat = tokenizer.apply_chat_template(messages(text), add_generation_prompt=True, tokenize=False)
        ids = tokenizer(chat, add_special_tokens=False, return_tensors="pt")  # as vidserve encodes it
        torch.manual_seed(seed)
        clock = Clock(tokenizer)
        start = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(**ids, streamer=clock, **kwargs)
        end = time.perf_counter()
        length = ids["input_ids"].shape[1]
        assert out.shape[1] - length == tokens
        return {"prompt_tokens": length, "ttft": clock.first_text - start, "total": end - start,
                "itl": (clock.times[-1] - clock.first_text) / max(tokens - 1, 1)}

    for text in prompts[:2]:  # warm-up
        run(text, 999)
    return [run(text, seed) for seed, text in enumerate(prompts)]


def decode_ceiling(folder: Path, concurrency: int, context: int = 120, steps: int = 20) -> dict:
    """What batching alone can give: C x (one decode step for 1 sequence) / (one step for C sequences).

    Plain forward passes over a KV cache of `context` tokens, no sampling or serving: no server
    can beat sequential decoding by more than this at concurrency C on this machine, before any
    prefill is counted (prefill costs every server the same compute per token)."""
    from transformers import AutoModelForCausalLM, DynamicCache

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()

    config = model.config
    shape = (config.num_key_value_heads, context, config.hidden_size // config.num_attention_heads)

    def step_seconds(batch: int) -> float:
        # A cache of random keys and values: a decode step costs the same as after a real prefill.
        cache = DynamicCache(ddp_cache_data=[(torch.randn(batch, *shape), torch.randn(batch, *shape))
                                             for _ in range(config.num_hidden_layers)])
        with torch.inference_mode():
            token = torch.randint(0, 256, (batch, 1))
            model(input_ids=token, cache=cache, use_cache=True, logits_to_keep=1)  # warm-up
            start = time.perf_counter()
            for _ in range(steps):
                model(input_ids=token, cache=cache, use_cache=True, logits_to_keep=1)
        return (time.perf_counter() - start) / steps

    one, many = step_seconds(1), step_seconds(concurrency)
    return {"concurrency": concurrency, "context": context, "step_ms_1": round(one * 1000, 1),
            f"step_ms_{concurrency}": round(many * 1000, 1), "speedup_ceiling": round(concurrency * one / many, 2),
            **engine_steps(folder, model, concurrency, context, steps)}


def engine_steps(folder: Path, model, concurrency: int, context: int, steps: int) -> dict:
    """vidserve's engine in this process (no serving): its step with C sequences decoding over the
    ceiling's step, the two alternated, median of the pairs (what the paged cache and its bookkeeping
    cost); and the step that prefilled the C prompts together, per prompt token."""
    from transformers import DynamicCache

    from vidserve.options import RepetitionOptions
    from vidserve.pipelines.llm.engine import LLMEngine
    from vidserve.pipelines.llm.model import ChatModel
    from vidserve.pipelines.llm.sequence import SamplingParams
    from vidserve.registry import resolve_chat

    chat = ChatModel.load(resolve_chat(str(folder)), "cpu", "float32")
    engine = LLMEngine(chat, prefix_cache=False)
    for i in range(concurrency):  # prompts of `context` distinct tokens, decoding for good
        engine.submit(chat.encode(messages(chr(65 + i) * (context - 3)), []),
                      SamplingParams(max_tokens=10 * steps, seed=i, ignore_eos=True,
                                     repetition_detection=RepetitionOptions(enabled=False)))
    start = time.perf_counter()
    engine.step()  # the prefill
    prefill_ms = (time.perf_counter() - start) * 1000 / (concurrency * context)
    config = model.config
    shape = (concurrency, config.num_key_value_heads, context, config.hidden_size // config.num_attention_heads)
    cache = DynamicCache(ddp_cache_data=[(torch.randn(shape), torch.randn(shape))
                                         for _ in range(config.num_hidden_layers)])
    token, ratios = torch.randint(0, 256, (concurrency, 1)), []
    with torch.inference_mode():
        for _ in range(steps):
            start = time.perf_counter()
            model(input_ids=token, cache=cache, use_cache=True, logits_to_keep=1)
            middle = time.perf_counter()
            engine.step()
            ratios.append((time.perf_counter() - middle) / (middle - start))
    return {"engine_vs_ceiling_step": round(statistics.median(ratios), 3),
            "engine_prefill_ms_per_token": round(prefill_ms, 2)}


def sequential(measured: list[dict], concurrency: int, tokens: int) -> dict:
    """Replay C closed-loop clients against a one-request-at-a-time FIFO server (see the docstring)."""
    finish, ttft = [], []
    for i, m in enumerate(measured):
        start = finish[-1] if finish else 0.0
        arrival = finish[i - concurrency] if i >= concurrency else 0.0
        ttft.append(start - arrival + m["ttft"])
        finish.append(start + m["total"])
    return summarize("generate", concurrency, len(measured) * tokens, finish[-1], ttft, [m["itl"] for m in measured])


async def measure_vidserve(url: str, model: str, prompts: list[str], concurrency: int, tokens: int,
                           lengths: list[int]) -> dict:
    import openai

    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=600)
    ttft, itl, generated = [], [], 0

    async def one(r: int) -> None:
        nonlocal generated
        start = time.perf_counter()
        stream = await client.chat.completions.create(
            model=model, messages=messages(prompts[r]), max_tokens=tokens, temperature=TEMPERATURE, top_p=1.0,
            seed=r, stream=True, stream_options={"include_usage": True},
            extra_body={"ignore_eos": True, "repetition_detection": False, "prefix_cache": False})
        first = last = usage = None
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                last = time.perf_counter()
                first = first or last
            usage = chunk.usage or usage
        # Same prompt tokens as generate saw, and exactly N new ones: both sides did the same work.
        assert usage.prompt_tokens == lengths[r] and usage.completion_tokens == tokens, (r, usage)
        ttft.append(first - start)
        itl.append((last - first) / max(tokens - 1, 1))
        generated += usage.completion_tokens

    async def client_loop(c: int) -> None:
        for r in range(c, len(prompts), concurrency):
            await one(r)

    start, cpu = time.perf_counter(), time.process_time()
    async with client:
        await asyncio.gather(*(client_loop(c) for c in range(concurrency)))
    wall = time.perf_counter() - start
    # The clients share the 2 cores with the server: report how much CPU they took from it.
    return {**summarize("vidserve", concurrency, generated, wall, ttft, itl),
            "client_cpu_share": round((time.process_time() - cpu) / wall, 3)}


def summarize(mode: str, concurrency: int, generated: int, wall: float, ttft: list[float], itl: list[float]) -> dict:
    ordered = sorted(ttft)
    return {"mode": mode, "concurrency": concurrency, "requests": len(ttft), "output_tokens": generated,
            "wall_s": round(wall, 2), "output_tok_s": round(generated / wall, 1),
            "ttft_median_s": round(statistics.median(ttft), 3),
            "ttft_p90_s": round(ordered[-(-9 * len(ordered) // 10) - 1], 3),  # nearest rank
            "itl_median_ms": round(statistics.median(itl) * 1000, 1)}


def conversations(tmp: Path, work: dict, ceiling_context: int, text_folder: Path) -> dict:
    """The multi-turn and memory workloads (chat_multi_turn.py) on a vision model with this Llama."""
    folder = tmp / "vision-model"
    vision = build_vision_model(folder, MODEL)
    system = system_prompt(work["system_bytes"])
    ceiling = decode_ceiling(text_folder, work["conversations"], context=ceiling_context)
    env = {"VIDSERVE_CHAT_KV_TOKENS": str(work["kv_tokens"])}
    with ExitStack() as stack:
        (tmp / "vision-server").mkdir()
        url = start_server(stack, tmp / "vision-server", env, ["--chat-model", str(folder)])
        asyncio.run(measure_multi_turn(url, str(folder), 2, 1, "warm-up", 4))  # the first image, prefill, decode
        print(f"multi-turn: {work['conversations']} conversations x {work['turns']} turns ...", file=sys.stderr)
        turns = asyncio.run(measure_multi_turn(url, str(folder), work["conversations"], work["turns"], system,
                                               work["answer_tokens"]))
        print(f"memory: {work['running']} running, {work['waiting']} waiting ...", file=sys.stderr)
        memory = measure_memory(url, str(folder), work["running"], work["waiting"], system, work["answer_tokens"])
    per_token = 2 * MODEL["num_hidden_layers"] * MODEL["num_key_value_heads"] * \
        (MODEL["hidden_size"] // MODEL["num_attention_heads"]) * 4
    kv_mib = work["kv_tokens"] * per_token / 2**20
    memory.update(weights_mib=vision["weights_mib"], kv_cache_mib=round(kv_mib), margin_mib=MEMORY_MARGIN_MIB,
                  within=memory["peak_rss_mib"] <= vision["weights_mib"] + kv_mib + MEMORY_MARGIN_MIB)
    ceiling_rate = work["conversations"] * 1000 / ceiling[f"step_ms_{work['conversations']}"]
    turns["decode_ceiling"] = {**ceiling, "tok_s": round(ceiling_rate, 1),
                               "share": round(turns["output_tok_s"] / ceiling_rate, 3)}
    return {"vision_model": vision, "server_env": env, "system_prompt_bytes": work["system_bytes"],
            "multi_turn": turns, "memory": memory}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="8 tokens, fewer requests: a smoke run")
    parser.add_argument("--prefill-tokens", type=int, default=None,
                        help="the server's VIDSERVE_CHAT_PREFILL_TOKENS (default: the server's default)")
    parser.add_argument("--only", choices=["throughput", "conversations"], default=None,
                        help="run one part (default: both)")
    parser.add_argument("--json", type=Path, default=Path(__file__).parent / "results" / "chat.json")
    args = parser.parse_args()
    work = QUICK if args.quick else FULL
    tokens, requests = work["tokens"], work["requests"]
    # SIGTERM would end Python without unwinding; as SystemExit, the ExitStack still stops the server.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    prompts = make_prompts(max(requests.values()))
    report, results, load = {}, [], {}
    with ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="vidserve-chat-bench-")))
        folder = tmp / "model"
        report["model"] = build_model(folder)
        print(f"model {report['model']}; torch threads {torch.get_num_threads()}", file=sys.stderr)
        if args.only != "conversations":
            results, ceiling, measured, env = throughput(tmp, folder, prompts, tokens, requests, args, load)
            report.update(workload={"output_tokens": tokens, "requests": {str(c): n for c, n in requests.items()},
                                    "prompt_tokens_min_max": [min(m["prompt_tokens"] for m in measured),
                                                              max(m["prompt_tokens"] for m in measured)],
                                    "temperature": TEMPERATURE, "top_p": 1.0,
                                    "server_flags": "--device cpu --dtype float32 --log-level warning "
                                                    "(chat_max_running 16)", "server_env": env},
                          rows=results, decode_ceiling=ceiling,
                          generate_requests=[{k: round(v, 4) for k, v in m.items()} for m in measured])
            print_throughput(results, ceiling, tokens)
        if args.only != "throughput":
            load["conversations_before"] = os.getloadavg()[0]
            report["conversations"] = conversations(tmp, work["conversations"], CONVERSATION_CONTEXT, folder)
            load["conversations_after"] = os.getloadavg()[0]
            print_conversations(report["conversations"])

    load = {k: round(v, 2) for k, v in load.items()}  # this benchmark alone adds ~2 (2 busy threads)
    report["machine"] = {"cpu_count": os.cpu_count(), "torch": torch.__version__,
                         "torch_threads": torch.get_num_threads(), "python": platform.python_version(),
                         "loadavg_1m": load}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    print(f"\n1-min load {load}; JSON in {args.json}")
    return 0


def throughput(tmp: Path, folder: Path, prompts: list[str], tokens: int, requests: dict, args, load: dict):
    """generate one at a time, the decode ceiling, then vidserve at each concurrency."""
    # Baseline first, in this process; the server starts only after, so they never compete for cores.
    load["generate_before"] = os.getloadavg()[0]
    print(f"generate: {len(prompts)} requests one at a time ...", file=sys.stderr)
    measured = measure_generate(folder, prompts, tokens)
    lengths = [m["prompt_tokens"] for m in measured]
    ceiling = decode_ceiling(folder, max(requests))
    load["generate_after"] = os.getloadavg()[0]
    baseline = {c: sequential(measured[:n], c, tokens) for c, n in requests.items()}

    print("starting vidserve ...", file=sys.stderr)
    (tmp / "server").mkdir()
    env = {} if args.prefill_tokens is None else {"VIDSERVE_CHAT_PREFILL_TOKENS": str(args.prefill_tokens)}
    results = []
    with ExitStack() as stack:
        url = start_server(stack, tmp / "server", env, ["--chat-model", str(folder)])
        # Warm-up, 4 at once: the first prefill and batched decode (30 bytes + 3 template tokens each).
        asyncio.run(measure_vidserve(url, str(folder), [c * 30 for c in "abcd"], 4, tokens, [33] * 4))
        load["vidserve_before"] = os.getloadavg()[0]
        for c, n in requests.items():
            print(f"vidserve: concurrency {c}, {n} requests ...", file=sys.stderr)
            results += [baseline[c], asyncio.run(measure_vidserve(url, str(folder), prompts[:n], c, tokens, lengths))]
        load["vidserve_after"] = os.getloadavg()[0]
    rate = {(r["mode"], r["concurrency"]): r["output_tok_s"] for r in results}
    for r in results:
        r["speedup_vs_generate"] = round(r["output_tok_s"] / rate["generate", r["concurrency"]], 2)
        if r["mode"] == "vidserve" and r["concurrency"] == ceiling["concurrency"]:
            r["share_of_ceiling"] = round(r["speedup_vs_generate"] / ceiling["speedup_ceiling"], 3)
            r["itl_vs_ceiling_step"] = round(r["itl_median_ms"] / ceiling[f"step_ms_{r['concurrency']}"], 3)
            r["share_bound"] = share_bound(measured[:r["requests"]], ceiling, tokens)
    return results, ceiling, measured, env


def share_bound(measured: list[dict], ceiling: dict, tokens: int) -> float:
    """The share of the ceiling vidserve would reach if serving cost nothing: its requests' prompts
    prefilled at the engine's burst rate, their tokens decoded C at a time at the ceiling's step;
    against generate's measured time for the same requests."""
    c = ceiling["concurrency"]
    prefill_s = sum(m["prompt_tokens"] for m in measured) * ceiling["engine_prefill_ms_per_token"] / 1000
    decode_s = len(measured) / c * tokens * ceiling[f"step_ms_{c}"] / 1000
    return round(sum(m["total"] for m in measured) / (prefill_s + decode_s) / ceiling["speedup_ceiling"], 3)


def print_throughput(results: list[dict], ceiling: dict, tokens: int) -> None:
    print("\n| mode | concurrency | requests | output tok/s | TTFT median s | TTFT p90 s | ITL median ms | "
          "vs generate |\n|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in results:
        print(f"| {r['mode']} | {r['concurrency']} | {r['requests']} | {r['output_tok_s']:.1f} | "
              f"{r['ttft_median_s']:.3f} | {r['ttft_p90_s']:.3f} | {r['itl_median_ms']:.1f} | "
              f"{r['speedup_vs_generate']:.2f}x |")
    top = results[-1]
    print(f"\nbatched decode alone, no prefill: {ceiling}; vidserve at {top['concurrency']}: "
          f"{top.get('share_of_ceiling')} of the ceiling ({top.get('share_bound')} if serving cost nothing), "
          f"ITL {top.get('itl_vs_ceiling_step')}x its step; {tokens} output tokens per request")


def print_conversations(report: dict) -> None:
    turns, memory = report["multi_turn"], report["memory"]
    print("\n| turn | TTFT median s | prompt tokens (mean) | cached tokens (mean) | hit rate |\n"
          "|---:|---:|---:|---:|---:|")
    for t in turns["per_turn"]:
        print(f"| {t['turn']} | {t['ttft_median_s']:.3f} | {t['prompt_tokens_mean']} | {t['cached_tokens_mean']} | "
              f"{t['hit_rate']:.0%} |")
    ceiling = turns["decode_ceiling"]
    print(f"\nturns 2-{turns['turns']}: median TTFT {turns['later_turns_ttft_median_s']} s = "
          f"{turns['later_vs_first_ttft']}x turn 1's; hit rate {turns['hit_rate']:.0%} over all turns; "
          f"{turns['output_tok_s']} output tok/s = {ceiling['share']:.0%} of batched decode alone at "
          f"{ceiling['concurrency']} x {ceiling['context']} tokens ({ceiling['tok_s']} tok/s)")
    print(f"memory, {memory['running']} running and {memory['waiting']} waiting: peak RSS {memory['peak_rss_mib']} "
          f"MiB (idle {memory['idle_rss_mib']}); weights {memory['weights_mib']} + KV cache {memory['kv_cache_mib']} + "
          f"margin {memory['margin_mib']} MiB: {'within' if memory['within'] else 'OVER'}")


if __name__ == "__main__":
    sys.exit(main())
