"""Per-jit XLA options for a program that runs jaxnorm's Mosaic kernels.

XLA records runs of a program's kernels into CUDA graphs (command buffers), and by
default (FUSION, CUBLAS, CUBLASLT, CUSTOM_CALL, CUDNN) that includes FFI custom calls,
which is how a Pallas Mosaic GPU kernel reaches XLA. On the H200 (jax 0.11.2) a
Gemma-3-1B prefill whose one graph held jaxnorm's 13 kernels waited 0.8-1.5 ms from
its dispatch to its first kernel, against stock Flax's 0.5-1.2 ms, although its kernels
ran 2-3% shorter; with custom calls left out of the graphs (XLA then launches each
kernel between graphs of the rest) the wait was 0.7-0.9 ms and the whole call shorter
than stock's (docs/guide.md, "Compiling a step"; bench/results/2026-12-04-launches).
Graphs of fusions and library GEMMs stay as XLA's default has them.

Use: `jax.jit(step, compiler_options=jaxnorm.compiler_options())`. It changes only that
program's compilation, never the process's XLA flags.
"""

from __future__ import annotations

# XLA's default command-buffer kinds without CUSTOM_CALL.
COMMAND_BUFFER_KINDS = ("FUSION", "CUBLAS", "CUBLASLT", "CUDNN")


def compiler_options() -> dict[str, str]:
    """`compiler_options` for `jax.jit` (or `.lower(...).compile(...)`) of a step that runs
    jaxnorm's kernels: XLA's CUDA graphs without custom calls."""
    return {"xla_gpu_enable_command_buffer": ",".join(COMMAND_BUFFER_KINDS)}
