"""The shapes each suite sweeps, shared by the GPU suites and the ledger's predictions.

(K, Ns) pairs come from the presets: Llama-3-8B qkv (4096 -> 4096 + 2x1024)
and gate/up (4096 -> 2x14336), Llama-2-70B qkv (8192 -> 8192 + 2x1024) and
gate/up (8192 -> 2x28672). Two weights share one norm, as gate and up do.
"""

from __future__ import annotations

import argparse

from bench.presets import ModelPreset

M_ALL = (1, 16, 64, 512, 2048, 8192, 16384)
M_QUICK = (16, 2048, 8192)
DECODE_M = (1, 16, 64)
DECODE_M_QUICK = (1, 64)
TRAIN_M = (2048, 8192)
TRAIN_M_QUICK = (2048,)

KNs = tuple[tuple[int, tuple[int, ...]], ...]
NORM_GEMM_KNS: KNs = (
    (4096, (6144,)),
    (4096, (14336, 14336)),
    (8192, (10240,)),
    (8192, (28672, 28672)),
)
NORM_GEMM_KNS_QUICK: KNs = NORM_GEMM_KNS[:2]
# Post-norm: square, a 2048-wide row (Qwen3-1.7B's hidden size) and
# down-projection shapes, and Gemma-2-9B's o_proj and down.
POST_NORM_KNS: KNs = ((4096, (4096,)), (4096, (2048,)), (14336, (4096,)), (4096, (3584,)),
                      (14336, (3584,)))
# r + Norm(x @ W): Gemma-2-9B's attention and MLP outputs (K = 16 x 256 and 14336, N = d =
# 3584), OLMo-2's, Gemma-3-1B's (K = 4 x 256 and 6912, N = 1152).
POST_NORM_ADD_KNS: KNs = ((4096, (3584,)), (14336, (3584,)), (4096, (4096,)), (1024, (1152,)),
                          (6912, (1152,)))
POST_NORM_ADD_MS = (16, 2048, 4096, 8192)
NORM_KS = (4096, 8192)
TRAIN_KNS: KNs = NORM_GEMM_KNS[:2]


def decode_projections(p: ModelPreset) -> list[tuple[str, str, int, tuple[int, ...]]]:
    """(name, op, K, Ns) of every norm-carrying projection of a decode step."""
    projections = [
        ("qkv", "norm_gemm", p.d_model, (p.q_width, p.kv_width, p.kv_width)),
        ("gate_up", "norm_gemm", p.d_model, (p.d_ff, p.d_ff)),
        ("lm_head", "norm_gemm", p.d_model, (p.vocab,)),
    ]
    if p.post_norms:
        projections += [
            ("o_proj", "gemm_norm", p.q_width, (p.d_model,)),
            ("down", "gemm_norm", p.d_ff, (p.d_model,)),
        ]
    return projections


def parse_dims(text: str, dims: int) -> tuple[tuple[int, ...], ...]:
    """A `--shapes` argument of `dims` sizes each: "2048x1152,4x8" (dims 2) ->
    ((2048, 1152), (4, 8))."""
    form = "x".join("MKN"[:dims]) if dims <= 3 else f"{dims} sizes"
    shapes = []
    for item in text.split(","):
        parts = item.strip().lower().split("x")
        if len(parts) != dims or not all(p.isdigit() and int(p) > 0 for p in parts):
            raise argparse.ArgumentTypeError(f"--shapes: {item!r} is not {form} of positive ints")
        shapes.append(tuple(map(int, parts)))
    return tuple(shapes)


def parse_mkn(text: str) -> tuple[tuple[int, int, int], ...]:
    """A `--shapes` argument: "8192x1152x6912,4x8x16" -> ((8192, 1152, 6912), (4, 8, 16))."""
    return parse_dims(text, 3)  # type: ignore[return-value]
