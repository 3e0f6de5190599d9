"""Seeing the video sooner: when the first second of a chained video can play, against when
the whole video is ready; and what a chunk's encoding costs now that each is encoded once.

  stream   `vidserve serve` (embedded, wan-shapes at its native 64x64, 20 steps): a video of N
           chunks, POST → its HLS playlist polled every 20 ms → the first segment listed, and
           → completed. Without the stream (as with diffusers' WanPipeline, or before it) the
           first frame a client sees is the completed video's.
  encode   one video's encoding at 832x480, 4 chunks of 81/80 frames of moving content: the
           old path (each chunk's MP4, then the whole video, each encoded from frames) against
           the stream's (each chunk encoded once as a segment; its MP4 and the video joined
           from segments, copied).

    python benchmarks/live_video.py [--chunks 4 8] [--runs 3] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from servers import Server  # noqa: E402  (the tests' real-server helper: `vidserve serve` on a free port)

from vidserve.media import encode_mp4  # noqa: E402
from vidserve.media.hls import Timeline, encode_segment, join_segments  # noqa: E402

POLL_S = 0.02


def stream_run(url: str, chunks: int) -> dict[str, float]:
    seconds = (17 + 16 * (chunks - 1)) / 16  # wan-shapes: 17 frames at 16 fps, then 16 a chunk
    with httpx.Client(base_url=url, timeout=60) as http:
        start = time.perf_counter()
        video = http.post("/v1/videos", json={"model": "wan-shapes", "prompt": "a red circle moving right",
                                              "seconds": seconds, "seed": 1}).json()
        first = None
        while True:
            if first is None and "stream/0.m4s" in http.get(video["stream_url"]).text:
                first = time.perf_counter() - start
            status = http.get(f"/v1/videos/{video['id']}").json()["status"]
            if status in ("completed", "failed", "cancelled"):
                assert status == "completed", status
                return {"first_segment_s": first, "completed_s": time.perf_counter() - start}
            time.sleep(POLL_S)


def moving(count: int, start: int) -> np.ndarray:
    x = np.arange(832)[None, :]
    y = np.arange(480)[:, None]
    frames = np.empty((count, 480, 832, 3), np.uint8)
    for i in range(count):
        t = start + i
        frames[i, ..., 0] = (128 + 100 * np.sin((x + 4 * t) / 40.0)).astype(np.uint8)
        frames[i, ..., 1] = (128 + 100 * np.cos((y - 3 * t) / 30.0)).astype(np.uint8)
        frames[i, ..., 2] = ((x + y + 2 * t) % 256).astype(np.uint8)
    return frames


def encode_run(chunks: list[np.ndarray], fps: int = 16) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        start = time.perf_counter()
        for i, frames in enumerate(chunks):
            encode_mp4(frames, folder / f"old-chunk-{i}.mp4", fps)
        old_video = encode_mp4(np.concatenate(chunks), folder / "old-video.mp4", fps)
        old = time.perf_counter() - start
        start = time.perf_counter()
        timeline = Timeline()
        for i, frames in enumerate(chunks):
            segment = encode_segment(frames, fps)
            join_segments(segment.init, [segment.media], folder / f"new-chunk-{i}.mp4")
            timeline.add(segment)
        new_video = timeline.join(folder / "new-video.mp4")
        new = time.perf_counter() - start
        return {"old_s": old, "new_s": new, "old_bytes": old_video.stat().st_size,
                "new_bytes": new_video.stat().st_size}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--chunks", type=int, nargs="+", default=[4, 8])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json", type=Path, default=Path(__file__).parent / "results" / "live_video.json")
    args = parser.parse_args()

    results: dict = {"stream": {}, "encode": None}
    with tempfile.TemporaryDirectory() as tmp:
        server = Server(Path(tmp) / "data", env={"VIDSERVE_CHAT_MODEL": ""}).start()
        try:
            stream_run(server.url, 1)  # loads the model
            for chunks in args.chunks:
                runs = [stream_run(server.url, chunks) for _ in range(args.runs)]
                results["stream"][chunks] = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        finally:
            server.stop()
    print("| chunks | first segment s | completed s | first segment at |")
    print("|---:|---:|---:|---:|")
    for chunks, row in results["stream"].items():
        print(f"| {chunks} | {row['first_segment_s']:.2f} | {row['completed_s']:.2f} | "
              f"{row['first_segment_s'] / row['completed_s']:.0%} of the job |")

    chunks = [moving(81, 0)] + [moving(80, 81 + 80 * i) for i in range(3)]
    runs = [encode_run(chunks) for _ in range(args.runs)]
    results["encode"] = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    e = results["encode"]
    print("\n| path | encode s | video MB |")
    print("|---|---:|---:|")
    print(f"| each chunk's MP4, then the video, from frames | {e['old_s']:.2f} | {e['old_bytes'] / 1e6:.2f} |")
    print(f"| each chunk once as a segment; MP4s joined | {e['new_s']:.2f} | {e['new_bytes'] / 1e6:.2f} |")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=2) + "\n")
    print(f"\nJSON in {args.json}")


if __name__ == "__main__":
    main()
