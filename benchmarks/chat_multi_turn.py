"""benchmarks/chat.py's conversation workloads, on a vision model served by vidserve.

multi-turn  C conversations at once, each T turns in a row, all sharing one long system prompt,
            each about its own image (sent in its first user turn, and again with every later
            turn, as chat clients resend the history). Turn t sends the conversation so far
            (system, the image, the questions and the answers vidserve gave) and streams the
            answer: time to first text per turn, the prompt tokens the prefix cache served
            (`usage.prompt_tokens_details.cached_tokens`), output tokens per second overall.
memory      first turns of distinct conversations, as many as the engine runs together and as
            many again as may wait, while the server's resident memory is sampled: its peak
            beside the model's weights and the configured KV cache.
"""

from __future__ import annotations

import asyncio
import base64
import io
import random
import statistics
import threading
import time

import numpy as np
import psutil
import torch
from PIL import Image

WORDS = "the a video frame model token batch queue server fox snow river light night prompt cache step".split()
QUESTIONS = ["What is in the picture?", "Which colours stand out?", "Where would you put the camera?",
             "What happens next in the shot?", "Describe the light.", "Name one object."]


def build_vision_model(folder, text: dict) -> dict:
    """A LLaVA: the chat benchmark's Llama decoder (`text`, random weights, answering in printable
    ASCII) with a small CLIP tower (112-pixel images in 14-pixel patches: 64 image tokens each),
    vidserve's byte-level tokenizer."""
    from transformers import CLIPVisionConfig, LlamaConfig

    from vidserve.pipelines.llm.tiny import assemble_llava, build_chat_tokenizer

    tokenizer = build_chat_tokenizer()
    torch.manual_seed(0)
    vision = CLIPVisionConfig(hidden_size=256, intermediate_size=1024, num_hidden_layers=4, num_attention_heads=4,
                              image_size=112, patch_size=14, projection_dim=256)
    config = LlamaConfig(vocab_size=len(tokenizer), bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, **text)
    model, processor = assemble_llava(tokenizer, vision, config, 112, 14)
    printable_ascii_only(model.lm_head.weight, tokenizer)
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
    params = sum(p.numel() for p in model.parameters())
    return {"class": "LlavaForConditionalGeneration", "text": "the Llama above", "vision_layers": 4,
            "image_tokens": 64, "parameters_m": round(params / 1e6, 1), "weights_mib": round(params * 4 / 2**20)}


def printable_ascii_only(lm_head: torch.Tensor, tokenizer) -> None:
    """Random weights emit random bytes: special tokens, which the answer's text leaves out, and
    broken UTF-8, which it shows as U+FFFD; sent back in the next turn, either tokenizes otherwise
    than generated. A trained model's answers come back as they were generated, and so must these:
    the output layer is zeroed for every token but printable ASCII, whose rows are scaled up so far
    that a zero logit is never drawn. Compute is unchanged."""
    allowed = torch.zeros(lm_head.shape[0], dtype=torch.bool)
    for char in map(chr, range(32, 127)):
        allowed[tokenizer.convert_tokens_to_ids(tokenizer.tokenize(char))] = True
    with torch.no_grad():
        lm_head[~allowed] = 0
        lm_head[allowed] *= 50


def image_url(seed: int) -> str:
    """A distinct 112x112 picture: coloured noise."""
    pixels = np.random.default_rng(seed).integers(0, 256, (112, 112, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def system_prompt(length: int) -> str:
    rng = random.Random(1)
    return ("You write shot notes for a video studio. " + " ".join(rng.choice(WORDS) for _ in range(length)))[:length]


def first_turn(system: str, conversation: int) -> list[dict]:
    return [{"role": "system", "content": system},
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": image_url(conversation)}},
                                         {"type": "text", "text": QUESTIONS[conversation % len(QUESTIONS)]}]}]


async def stream_answer(client, model: str, messages: list[dict], tokens: int, seed: int,
                        started: asyncio.Event | None = None) -> dict:
    """Stream one answer; `started` is set at its first text."""
    start = time.perf_counter()
    stream = await client.chat.completions.create(
        model=model, messages=messages, max_tokens=tokens, temperature=1.0, seed=seed, stream=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True, "repetition_detection": False})
    first, parts, usage = None, [], None
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            first = first or time.perf_counter()
            parts.append(chunk.choices[0].delta.content)
            if started is not None:
                started.set()
        usage = chunk.usage or usage
    assert usage.completion_tokens == tokens, usage
    return {"ttft": (first or time.perf_counter()) - start, "text": "".join(parts),
            "prompt_tokens": usage.prompt_tokens, "cached_tokens": usage.prompt_tokens_details.cached_tokens}


async def measure_multi_turn(url: str, model: str, conversations: int, turns: int, system: str,
                             tokens: int) -> dict:
    import openai

    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=1200)
    results: list[list[dict]] = [[] for _ in range(turns)]

    async def converse(c: int) -> None:
        messages = first_turn(system, c)
        for t in range(turns):
            answer = await stream_answer(client, model, messages, tokens, seed=100 * c + t)
            results[t].append(answer)
            messages = messages + [{"role": "assistant", "content": answer["text"]},
                                   {"role": "user", "content": QUESTIONS[(c + t + 1) % len(QUESTIONS)]}]

    start = time.perf_counter()
    async with client:
        await asyncio.gather(*(converse(c) for c in range(conversations)))
    wall = time.perf_counter() - start
    per_turn = [{"turn": t + 1, "ttft_median_s": round(statistics.median(r["ttft"] for r in rows), 3),
                 "prompt_tokens_mean": round(statistics.mean(r["prompt_tokens"] for r in rows)),
                 "cached_tokens_mean": round(statistics.mean(r["cached_tokens"] for r in rows)),
                 "hit_rate": round(sum(r["cached_tokens"] for r in rows) / sum(r["prompt_tokens"] for r in rows), 3)}
                for t, rows in enumerate(results)]
    later = [r for rows in results[1:] for r in rows]
    later_ttft = statistics.median(r["ttft"] for r in later) if later else float("nan")
    return {"conversations": conversations, "turns": turns, "answer_tokens": tokens, "wall_s": round(wall, 2),
            "output_tok_s": round(conversations * turns * tokens / wall, 1), "per_turn": per_turn,
            "later_turns_ttft_median_s": round(later_ttft, 3),
            "later_vs_first_ttft": round(later_ttft / per_turn[0]["ttft_median_s"], 3),
            "hit_rate": round(sum(r["cached_tokens"] for rows in results for r in rows)
                              / sum(r["prompt_tokens"] for rows in results for r in rows), 3)}


def server_process(port: int) -> psutil.Process:
    """The process listening on `port` (a child of this one)."""
    for child in psutil.Process().children(recursive=True):
        if any(c.laddr.port == port and c.status == psutil.CONN_LISTEN for c in child.net_connections()):
            return child
    raise RuntimeError(f"no child process listens on port {port}")


def measure_memory(url: str, model: str, running: int, waiting: int, system: str, tokens: int) -> dict:
    """Peak resident memory of the server while `running` first turns run and `waiting` more wait
    (sent once the first have started: sent together, more than `waiting` could be in line
    before the engine admits any)."""
    import openai

    server = server_process(int(url.rsplit(":", 1)[1]))
    idle = server.memory_info().rss
    peak, done = [idle], threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], server.memory_info().rss)
            time.sleep(0.02)

    async def run() -> None:
        client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=1200)
        started = [asyncio.Event() for _ in range(running)]
        async with client:
            first = [asyncio.ensure_future(stream_answer(client, model, first_turn(system, 1000 + r), tokens, seed=r,
                                                         started=started[r])) for r in range(running)]
            await asyncio.gather(*(event.wait() for event in started))
            rest = [stream_answer(client, model, first_turn(system, 1000 + r), tokens, seed=r)
                    for r in range(running, running + waiting)]
            await asyncio.gather(*first, *rest)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        asyncio.run(run())
    finally:
        done.set()
        sampler.join()
    return {"running": running, "waiting": waiting, "idle_rss_mib": round(idle / 2**20),
            "peak_rss_mib": round(peak[0] / 2**20)}
