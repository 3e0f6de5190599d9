"""What the Triton kernel costs a GPU, found without one: compile it ahead of time for an
architecture (Triton ships ptxas) and read shared memory, registers, spills and the
software pipeline from the result.

    TRITON_CACHE_DIR=/tmp/triton python -m vidserve.kernels.resources   # every supported row, sm_90 and sm_80
"""

from __future__ import annotations

import re
import subprocess
import tempfile
from dataclasses import dataclass

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.backends.nvidia.compiler import get_ptxas, sm_arch_from_capability
from triton.compiler import ASTSource

from .sparse_triton import _block_sparse_attention_kernel, dot_precision
from .support import SUPPORTED, LaunchConfig, launch_config

# Most shared memory one block may use (opt-in), CUDA C Programming Guide, compute capability table.
MAX_SHARED = {90: 227 * 1024, 80: 163 * 1024}

_TYPES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}
_POINTERS = ("Q", "K", "V", "Out", "KeyTiles", "KeptCounts", "KeyRealCounts")


@dataclass(frozen=True)
class Resources:
    shared: int  # bytes of shared memory per block
    registers: int  # per thread
    spilled: int  # bytes of spill stores per thread
    kv_buffers: int  # K (and V) tiles in shared memory: the pipeline depth
    in_flight: int  # async copy groups (a K or a V tile each) left outstanding by the loop's wait


def compile_kernel(arch: int, config: LaunchConfig, dtype: torch.dtype):
    """The kernel compiled for sm_`arch` with full tiles of this config's blocks."""
    element = _TYPES[dtype]
    signature = {name: f"*{element}" for name in _POINTERS[:4]}
    signature.update(KeyTiles="*i32", KeptCounts="*i32", KeyRealCounts="*i32", n_query_tiles="i32",
                     n_key_tiles="i32", max_kept="i32", scale_log2e="fp32")
    constexprs = dict(QUERY_TILE=config.block_m, KEY_TILE=config.block_n, HEAD_DIM=config.block_d,
                      BLOCK_M=config.block_m, BLOCK_N=config.block_n, BLOCK_D=config.block_d,
                      DOT_PRECISION=dot_precision(dtype))
    signature.update(dict.fromkeys(constexprs, "constexpr"))
    # torch allocations are 16-byte aligned, and a launch tells the compiler so.
    attrs = {(_block_sparse_attention_kernel.arg_names.index(name),): [["tt.divisibility", 16]] for name in _POINTERS}
    source = ASTSource(fn=_block_sparse_attention_kernel, signature=signature, constexprs=constexprs, attrs=attrs)
    return triton.compile(source, target=GPUTarget("cuda", arch, 32),
                          options=dict(num_warps=config.num_warps, num_stages=config.num_stages))


def resources(compiled, arch: int) -> Resources:
    # Registers and spills are only known after ptxas (a GPU driver reports them at load).
    with tempfile.NamedTemporaryFile("w", suffix=".ptx") as ptx:
        ptx.write(compiled.asm["ptx"])
        ptx.flush()
        log = subprocess.run([get_ptxas(arch).path, "-v", f"--gpu-name={sm_arch_from_capability(arch)}", ptx.name,
                              "-o", "/dev/null"], capture_output=True, text=True, check=True).stderr
    ttgir = compiled.asm["ttgir"]
    # K and V each get one multi-buffered allocation of [buffers, block_n, block_d].
    buffers = [int(n) for n in re.findall(r"ttg\.local_alloc[^\n]*memdesc<(\d+)x\d+x\d+x", ttgir)]
    waits = [int(n) for n in re.findall(r"ttg\.async_wait[^\n]*num = (\d+)", ttgir)]
    return Resources(
        shared=compiled.metadata.shared,
        registers=int(re.search(r"Used (\d+) registers", log).group(1)),
        spilled=int(re.search(r"(\d+) bytes spill stores", log).group(1)),
        kv_buffers=max(buffers, default=1),
        in_flight=max(waits, default=0),
    )


def main() -> None:
    for row in SUPPORTED:
        config = launch_config(row.query_block, row.key_block, row.head_block, row.dtype)
        for arch in MAX_SHARED:
            figures = resources(compile_kernel(arch, config, row.dtype), arch)
            print(f"sm_{arch} {_TYPES[row.dtype]} {config}: {figures} (limit {MAX_SHARED[arch]} B)")


if __name__ == "__main__":
    main()
