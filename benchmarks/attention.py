"""Block-sparse attention vs dense SDPA on this machine's CPU.

For L in {4096, 8192, 16384} tokens (grids 4x32x32, 8x32x32, 16x32x32; on request 512-2048,
where sparsity stops paying, and the Wan 480p grid 21x30x52, L=32760, whose edge tiles are
partial), B=1, 12 heads, head_dim 128, fp32 and bf16: dense SDPA time, sparse time (tiling,
selection, attention and the permutation back all included), speedup, and the sparse
output's cosine similarity and relative L2 error vs dense. Inputs come from each family of
`--family` (vidserve.kernels.synthetic.FAMILIES, and `captured`: q, k, v of the trained
wan-shapes transformer, saved by benchmarks/capture_attention.py at L 8192 and 16384, 2 heads
of 64 channels, one draw per captured block and step). Dense and sparse are timed alternately
in the same process; the table shows medians.

`--sweep` instead compares the candidate settings of CANDIDATES (selection, mass target,
density bounds, query tile) on every family in fp32, and prints each one's worst cosine over
all families and draws: the defaults are the setting whose worst case is best among those
at least MIN_SPEEDUP times faster than SDPA at L=8192.

`kept` is the mean number of key tiles a query tile keeps (of all key tiles). Two columns
say how much to trust a row:
  mass   share of the dense attention weight (sampled queries) that falls in the kept
         tiles, and in brackets the most any choice of the same number of tiles could keep:
         how sparse the inputs are and how close the selection gets to the best selection.
  cpu    CPU time of this process / (wall time * threads) while timing; well below 1.0
         means another process competed for the cores and the timings are suspect.

    python benchmarks/attention.py [--family all|NAME ...] [--quick] [--lengths 8192 32760 ...]
        [--density 0.125] [--tile 4x4x4] [--query-tile 4x8x4] [--neighbours 0] [--sink]
        [--selection mass] [--mass 0.6] [--min-density 0.08] [--max-density 0.25] [--repeats 5]
        [--draws 10] [--json PATH]
    python benchmarks/attention.py --sweep [--family all] [--lengths 8192 16384] [--draws 10] [--repeats 3]

Without options it measures sparse_attention's defaults (the other options are for ablations).
"""

from __future__ import annotations

import argparse
import functools
import inspect
import json
import math
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from capture_attention import SIZES as CAPTURED_LENGTHS, capture_path
from vidserve.kernels import dense_attention, sparse_attention
from vidserve.kernels.dispatch import default_query_tile
from vidserve.kernels.selection import select_key_tiles
from vidserve.kernels.synthetic import FAMILIES, family_qkv
from vidserve.kernels.tiles import tile_layout

GRIDS = {512: (2, 16, 16), 1024: (4, 16, 16), 2048: (8, 16, 16),  # where sparsity stops paying
         4096: (4, 32, 32), 8192: (8, 32, 32), 16384: (16, 32, 32), 32760: (21, 30, 52)}
DEFAULT_LENGTHS = (4096, 8192, 16384)  # 32760 (Wan 480p, 5 s; partial edge tiles) on request
QUICK_LENGTHS = (4096, 8192)
HEADS, HEAD_DIM = 12, 128
MASS_SAMPLE_QUERIES = 256
DEFAULT_JSON = Path(__file__).parent / "results" / "attention.json"
SWEEP_JSON = DEFAULT_JSON.with_name("attention_sweep.json")
ALL_FAMILIES = (*FAMILIES, "captured")
MIN_SPEEDUP = 4.5  # fp32 at L=8192: below it a setting is not worth its loss of fidelity
DEFAULTS = {name: p.default for name, p in inspect.signature(sparse_attention).parameters.items()}
SELECTION_OPTIONS = ("neighbours", "sink", "selection", "mass", "min_density", "max_density")


def family_inputs(family: str, length: int, draw: int, dtype: torch.dtype):
    """(q, k, v, grid) of one draw of a family at L tokens (None past a captured family's draws)."""
    if family != "captured":
        return (*family_qkv(family, 1, HEADS, GRIDS[length], HEAD_DIM, dtype=dtype, seed=draw), GRIDS[length])
    path = capture_path(length)
    if not path.exists():
        sys.exit(f"no captured attention at L={length}: run python benchmarks/capture_attention.py --lengths {length}")
    captures = _captures(path)
    if draw >= len(captures):
        return None
    one = captures[draw]
    return (*(one[name].to(dtype) for name in "qkv"), tuple(one["grid"]))


@functools.lru_cache(maxsize=1)
def _captures(path: Path) -> list:
    return torch.load(path)["captures"]


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def timed(fn) -> tuple[float, float]:
    """Wall seconds of one call, and CPU seconds this process used meanwhile."""
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - wall, time.process_time() - cpu


def attention_mass_kept(q, k, grid, density, options) -> tuple[float, float, float]:
    """(kept, best, tiles): mean share of dense attention weight inside the selected key tiles,
    and inside the same number of tiles chosen with hindsight, over sampled queries of all
    heads; and the mean number of key tiles a query tile keeps, over all query tiles and heads."""
    q_layout, k_layout = tile_layout(grid, options["query_tile"]), tile_layout(grid, options["tile"])
    q_tiles, k_tiles = q_layout.to_tiles(q), k_layout.to_tiles(k)
    selection = select_key_tiles(q_tiles, k_tiles, q_layout, k_layout, density,
                                 **{name: options[name] for name in SELECTION_OPTIONS})
    queries = torch.randperm(q.shape[2], generator=torch.Generator().manual_seed(0))[:MASS_SAMPLE_QUERIES]
    weights = torch.softmax(q[0, :, queries].float() @ k[0].float().transpose(-1, -2) / math.sqrt(q.shape[-1]), -1)
    tile_weights = torch.zeros(q.shape[1], len(queries), k_layout.n_tiles)
    tile_weights.index_add_(-1, k_layout.tile_of_token(), weights)
    query_tiles = q_layout.tile_of_token()[queries]
    kept_tiles = selection.key_tiles[0][:, query_tiles]  # [heads, queries, max_kept]
    used = torch.arange(selection.max_kept) < selection.counts[0][:, query_tiles, None]
    kept = (tile_weights.gather(-1, kept_tiles) * used).sum(-1).mean().item()
    best_first = tile_weights.sort(dim=-1, descending=True).values[..., : selection.max_kept]
    best = (best_first * used).sum(-1).mean().item()
    return kept, best, selection.counts.float().mean().item()


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return F.cosine_similarity(a.double().flatten(), b.double().flatten(), dim=0).item()


def measure(family: str, length: int, dtype: torch.dtype, density: float, options: dict, repeats: int,
            draws: int) -> dict:
    """Timings on the family's first draw; fidelity on `draws` draws (seeds 0, 1, ...)."""
    q, k, v, grid = family_inputs(family, length, 0, dtype)
    run_dense = lambda: dense_attention(q, k, v)  # noqa: E731
    run_sparse = lambda: sparse_attention(q, k, v, grid, density=density, **options)  # noqa: E731
    dense, sparse = run_dense(), run_sparse()  # warm-up; also the outputs compared below

    times = {"dense": [], "sparse": []}
    wall_total = cpu_total = 0.0
    for _ in range(repeats):
        for name, fn in (("dense", run_dense), ("sparse", run_sparse)):
            wall, cpu = timed(fn)
            times[name].append(wall)
            wall_total, cpu_total = wall_total + wall, cpu_total + cpu

    dense64, sparse64 = dense.double().flatten(), sparse.double().flatten()
    mass_kept, mass_best, kept_tiles = attention_mass_kept(q, k, grid, density, options)
    cosines = [cosine(sparse, dense)]
    for draw in range(1, draws):
        if (inputs := family_inputs(family, length, draw, dtype)) is None:
            break
        q, k, v, _ = inputs
        cosines.append(cosine(sparse_attention(q, k, v, grid, density=density, **options), dense_attention(q, k, v)))
    dense_ms = 1000 * statistics.median(times["dense"])
    sparse_ms = 1000 * statistics.median(times["sparse"])
    return {
        "family": family,
        "L": length,
        "grid": list(grid),
        "heads": q.shape[1],
        "head_dim": q.shape[-1],
        "dtype": str(dtype).removeprefix("torch."),
        "dense_ms": round(dense_ms, 1),
        "sparse_ms": round(sparse_ms, 1),
        "speedup": round(dense_ms / sparse_ms, 2),
        "cosine_worst": round(min(cosines), 5),
        "cosine_median": round(statistics.median(cosines), 5),
        "cosines": [round(c, 5) for c in cosines],
        "kept_tiles": round(kept_tiles, 1),
        "key_tiles": tile_layout(grid, options["tile"]).n_tiles,
        "rel_l2": round(((sparse64 - dense64).norm() / dense64.norm()).item(), 4),
        "mass_kept": round(mass_kept, 3),
        "mass_best": round(mass_best, 3),
        "cpu_share": round(cpu_total / (wall_total * torch.get_num_threads()), 2),
        "dense_runs_ms": [round(1000 * t, 1) for t in times["dense"]],
        "sparse_runs_ms": [round(1000 * t, 1) for t in times["sparse"]],
    }


# Candidate defaults for --sweep, all at density 0.125 (within top-k's total there, so at most
# its cost), 4x4x4 key tiles, no neighbours or sink; query tiles 4x8x4 unless named.
CANDIDATES = {
    "topk": dict(selection="topk"),
    "topk, query tile 4x4x4": dict(selection="topk", query_tile=(4, 4, 4)),
    "mass 0.6 [0.08, 0.25]": dict(selection="mass", mass=0.6, min_density=0.08, max_density=0.25),
    "mass 0.8 [0.08, 0.25]": dict(selection="mass", mass=0.8, min_density=0.08, max_density=0.25),
    "mass 0.9 [0.08, 0.25]": dict(selection="mass", mass=0.9, min_density=0.08, max_density=0.25),
    "mass 0.95 [0.1, 0.25]": dict(selection="mass", mass=0.95, min_density=0.1, max_density=0.25),
    "mass 0.9 [0.1, 0.375]": dict(selection="mass", mass=0.9, min_density=0.1, max_density=0.375),
}


def candidate_options(name: str) -> dict:
    options = {"tile": (4, 4, 4), "query_tile": default_query_tile((4, 4, 4)), "neighbours": 0, "sink": False,
               "selection": "topk", "mass": DEFAULTS["mass"], "min_density": DEFAULTS["min_density"],
               "max_density": DEFAULTS["max_density"]}
    return {**options, **CANDIDATES[name]}


def sweep(families: list[str], lengths: list[int], draws: int, repeats: int, timed_at: int) -> list[dict]:
    """Every candidate on every draw of every family, fp32: cosine vs dense, kept tiles, and at
    L=`timed_at` the speedup on the first draw (dense and each candidate timed alternately)."""
    rows = []
    for family, length in runs(families, lengths):
        results = {name: {"cosines": []} for name in CANDIDATES}
        for draw in range(draws):
            if (inputs := family_inputs(family, length, draw, torch.float32)) is None:
                break
            q, k, v, grid = inputs
            dense = dense_attention(q, k, v)
            for name, result in results.items():
                options = candidate_options(name)
                run = lambda: sparse_attention(q, k, v, grid, density=0.125, **options)  # noqa: E731
                result["cosines"].append(cosine(run(), dense))
                if draw == 0:
                    result["kept"], result["key_tiles"] = kept_tiles(q, k, grid, options)
                    if length == timed_at:
                        times = {"dense": [], "sparse": []}
                        for _ in range(repeats):
                            times["dense"].append(timed(lambda: dense_attention(q, k, v))[0])
                            times["sparse"].append(timed(run)[0])
                        result["speedup"] = statistics.median(times["dense"]) / statistics.median(times["sparse"])
        for name, result in results.items():
            cosines = result["cosines"]
            rows.append({"family": family, "L": length, "setting": name, "draws": len(cosines),
                         "heads": q.shape[1], "head_dim": q.shape[-1],
                         "kept_tiles": round(result["kept"], 1), "key_tiles": result["key_tiles"],
                         "speedup": round(result["speedup"], 2) if "speedup" in result else None,
                         "cosine_worst": round(min(cosines), 5),
                         "cosine_median": round(statistics.median(cosines), 5)})
            row = rows[-1]
            speedup = f"{row['speedup']:.2f}x" if row["speedup"] else "-"
            print(f"{family:>10} {length:>6} {name:>26} {row['kept_tiles']:>6.1f}/{row['key_tiles']:<4} "
                  f"{speedup:>7} {row['cosine_worst']:>8.4f} {row['cosine_median']:>8.4f}", flush=True)
    return rows


def runs(families: list[str], lengths: list[int]) -> list[tuple[str, int]]:
    """(family, L) pairs to measure: the captured family only at the lengths it was captured at."""
    return [(f, n) for f in families for n in lengths if f != "captured" or n in CAPTURED_LENGTHS]


def kept_tiles(q, k, grid, options) -> tuple[float, int]:
    """Mean key tiles a query tile keeps, and the number of key tiles."""
    q_layout, k_layout = tile_layout(grid, options["query_tile"]), tile_layout(grid, options["tile"])
    selection = select_key_tiles(q_layout.to_tiles(q), k_layout.to_tiles(k), q_layout, k_layout, 0.125,
                                 **{name: options[name] for name in SELECTION_OPTIONS})
    return selection.counts.float().mean().item(), k_layout.n_tiles


def worst_cases(rows: list[dict], timed_at: int) -> list[dict]:
    """Per candidate: its worst cosine over every family, length and draw, and its slowest
    speedup over the families at L=`timed_at`, best worst case first."""
    summary = []
    for name in CANDIDATES:
        mine = [r for r in rows if r["setting"] == name]
        speedups = [r["speedup"] for r in mine if r["L"] == timed_at and r["speedup"]]
        worst = min(mine, key=lambda r: r["cosine_worst"])
        summary.append({"setting": name, "cosine_worst": worst["cosine_worst"], "where": f"{worst['family']} "
                        f"L={worst['L']}", "speedup_slowest": min(speedups) if speedups else None})
    return sorted(summary, key=lambda r: -r["cosine_worst"])


def triple(text: str) -> tuple[int, int, int]:
    return tuple(int(n) for n in text.split("x"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", nargs="+", choices=("all", *ALL_FAMILIES), default=["all"],
                        help="input families (all: every one)")
    parser.add_argument("--sweep", action="store_true", help="compare CANDIDATES on the families, fp32")
    parser.add_argument("--quick", action="store_true", help=f"L in {QUICK_LENGTHS} and 3 repeats (under a minute)")
    parser.add_argument("--lengths", type=int, nargs="+", choices=tuple(GRIDS), default=DEFAULT_LENGTHS)
    parser.add_argument("--density", type=float, default=DEFAULTS["density"])
    parser.add_argument("--tile", type=triple, default=(4, 4, 4), help="key tile, e.g. 4x4x4")
    parser.add_argument("--query-tile", type=triple, default=None, help="default: sparse_attention's")
    parser.add_argument("--neighbours", type=int, default=0)
    parser.add_argument("--sink", action="store_true")
    parser.add_argument("--selection", choices=("topk", "mass"), default=DEFAULTS["selection"])
    parser.add_argument("--mass", type=float, default=DEFAULTS["mass"], help="--selection mass: attention to keep")
    parser.add_argument("--min-density", type=float, default=DEFAULTS["min_density"], help="--selection mass")
    parser.add_argument("--max-density", type=float, default=DEFAULTS["max_density"], help="--selection mass")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--draws", type=int, default=1, help="draws of the synthetic inputs (seeds 0, 1, ...) for "
                        "fidelity: the table's cosine is the worst, with the median beside it")
    parser.add_argument("--json", type=Path, help=f"default: {DEFAULT_JSON} ({SWEEP_JSON.name} with --sweep)")
    args = parser.parse_args()
    lengths = QUICK_LENGTHS if args.quick else args.lengths
    repeats = 3 if args.quick else args.repeats
    families = list(ALL_FAMILIES) if "all" in args.family else args.family
    if args.sweep:
        return run_sweep(args, families, lengths, repeats)
    options = dict(
        tile=args.tile,
        query_tile=args.query_tile or default_query_tile(args.tile),
        neighbours=args.neighbours,
        sink=args.sink,
        selection=args.selection,
        mass=args.mass,
        min_density=args.min_density,
        max_density=args.max_density,
    )

    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {cpu_model()}; B=1, heads {HEADS}, "
          f"head_dim {HEAD_DIM}; density {args.density}, {options}; medians of {repeats}; {args.draws} draw(s); "
          f"load average before: {os.getloadavg()[0]:.2f}")
    header = f"{'family':>10} {'L':>6} {'grid':>9} {'dtype':>8} {'dense ms':>9} {'sparse ms':>10} {'speedup':>8} " \
             f"{'kept':>8} {'cosine':>8} {'median':>8} {'rel L2':>7} {'mass (best)':>13} {'cpu':>5}"
    print(header)
    print("-" * len(header))
    rows = []
    for family, length, dtype in ((f, n, t) for f, n in runs(families, lengths)
                                  for t in (torch.float32, torch.bfloat16)):
        row = measure(family, length, dtype, args.density, options, repeats, args.draws)
        rows.append(row)
        grid = "x".join(map(str, row["grid"]))
        print(f"{family:>10} {length:>6} {grid:>9} {row['dtype']:>8} {row['dense_ms']:>9.1f} "
              f"{row['sparse_ms']:>10.1f} {row['speedup']:>7.2f}x {row['kept_tiles']:>4.1f}/{row['key_tiles']:<3} "
              f"{row['cosine_worst']:>8.4f} {row['cosine_median']:>8.4f} {row['rel_l2']:>7.3f} "
              f"{row['mass_kept']:>6.3f} ({row['mass_best']:.3f}) {row['cpu_share']:>5.2f}", flush=True)

    write_json(args.json or DEFAULT_JSON, {
        "families": families,
        "density": args.density,
        "options": options,
        "repeats": repeats,
        "draws": args.draws,
        "load_average_after": os.getloadavg()[0],
        "rows": rows,
    })


def run_sweep(args, families: list[str], lengths: list[int], repeats: int) -> None:
    timed_at = 8192 if 8192 in lengths else lengths[0]
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {cpu_model()}; fp32, density 0.125; "
          f"up to {args.draws} draws a family; speedups at L={timed_at}, medians of {repeats}; "
          f"load average before: {os.getloadavg()[0]:.2f}")
    print(f"{'family':>10} {'L':>6} {'setting':>26} {'kept':>11} {'speedup':>7} {'worst':>8} {'median':>8}")
    rows = sweep(families, lengths, args.draws, repeats, timed_at)
    summary = worst_cases(rows, timed_at)
    print(f"\n{'setting':>26} {'worst cosine':>12} {'where':>20} {'slowest speedup':>15}")
    for row in summary:
        speedup = f"{row['speedup_slowest']:.2f}x" if row["speedup_slowest"] else "-"
        print(f"{row['setting']:>26} {row['cosine_worst']:>12.4f} {row['where']:>20} {speedup:>15}")
    fast = [r for r in summary if (r["speedup_slowest"] or 0) >= MIN_SPEEDUP]
    print(f"best worst case at >= {MIN_SPEEDUP}x: {fast[0]['setting'] if fast else 'none'}")
    write_json(args.json or SWEEP_JSON, {"families": families, "lengths": lengths, "draws": args.draws,
                                         "repeats": repeats, "candidates": CANDIDATES, "rows": rows,
                                         "worst_cases": summary, "load_average_after": os.getloadavg()[0]})


def write_json(path: Path, fields: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"command": " ".join(["python", *sys.argv]), "torch": torch.__version__,
                                "threads": torch.get_num_threads(), "machine": cpu_model(), **fields}, indent=2))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
