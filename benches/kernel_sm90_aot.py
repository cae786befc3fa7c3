"""The scoring kernels compiled ahead of time for Hopper (sm_90) on a machine without a GPU: shared memory per block.

Triton ships ptxas, so `triton.compile` with an explicit target builds the cubin here. A kernel whose block
needs more shared memory than the GPU allows (H100/H200: 227 KiB = 232448 B, opt-in) compiles but raises
triton's OutOfResources at its first launch there; this prints the need of each kernel for the shapes the GPU
check uses (docs/gpu-check.md), so that can be known before a GPU is lent.

    .venv/bin/python benches/kernel_sm90_aot.py                  # bf16 and float32, default num_stages (~2 min)
    .venv/bin/python benches/kernel_sm90_aot.py --num-stages 1
"""

from __future__ import annotations

import argparse
import time

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from spcli.kernels import score_triton as st

HOPPER_MAX_SHARED = 232448  # bytes per block, opt-in (cudaDevAttrMaxSharedMemoryPerBlockOptin on H100/H200)
POINTERS = ("q_ptr", "k_ptr")
SCALARS = {"limits_ptr": "*i32", "cu_seqlens_ptr": "*i32", "cu_steps_ptr": "*i32", "part_max_ptr": "*fp32",
           "part_sum_ptr": "*fp32", "running_ptr": "*fp32", "out_ptr": "*fp32", "qk_scale": "fp32"}
# (GQA group, head dim, query rows, pool): the 1B speculator with the paper's 9 rows; the 8B's shape with 32 window rows
SHAPES = ((4, 64, 9, 13), (4, 128, 32, 13))


def source(fn, dtype: str, constants: dict) -> ASTSource:
    types = {a: ("constexpr" if a in constants else "*" + dtype if a in POINTERS else SCALARS.get(a, "i32"))
             for a in fn.arg_names}
    return ASTSource(fn, types, constexprs=constants)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--num-stages", type=int, default=None, help="triton's software pipelining depth (default: its own)")
    args = ap.parse_args(argv)
    target = GPUTarget("cuda", 90, 32)
    print(f"triton {triton.__version__}, sm_90, num_stages {args.num_stages or 'default'}; limit {HOPPER_MAX_SHARED} B")
    for dtype in ("bf16", "fp32"):
        for group, head_dim, steps, pool in SHAPES:
            block_g, block_s = st.row_blocks(group, steps)
            common = dict(GROUP=group, BLOCK_G=block_g, BLOCK_S=block_s, HEAD_DIM=head_dim,
                          DIM_PAD=max(16, triton.next_power_of_2(head_dim)), HAS_LIMITS=True, IS_FP32_DOT=dtype == "fp32")
            stats = dict(common, BLOCK_N=st._BLOCK_N)
            pooled = dict(common, SPLITS_PAD=st._MAX_SPLITS, POOL=pool, POOL_PRECISION=st._POOL_PRECISION,
                          BLOCK_W=max(128, triton.next_power_of_2(4 * (pool // 2))), IS_FIRST_LAYER=False,
                          IS_LAST_LAYER=True, IS_ROW_MAX=False)
            for fn, constants, warps in ((st._softmax_stats_kernel, stats, 4), (st._pooled_max_kernel, pooled, 8)):
                options = {"num_warps": warps, **({"num_stages": args.num_stages} if args.num_stages else {})}
                t0 = time.perf_counter()
                kernel = triton.compile(source(fn, dtype, constants), target=target, options=options)
                shared = kernel.metadata.shared
                print(f"{dtype} group {group} D {head_dim} rows {steps} pool {pool} {fn.__name__}: {shared} B shared "
                      f"({'fits' if shared <= HOPPER_MAX_SHARED else 'TOO MUCH for sm_90'}), compiled in "
                      f"{time.perf_counter() - t0:.1f} s", flush=True)


if __name__ == "__main__":
    main()
