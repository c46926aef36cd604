"""Model shapes the ledger and the benchmarks are built from.

Public configurations, rounded to what changes the cost model: widths, head
counts, layer count, vocabulary, and where the norms sit. Details that do not
move bytes or FLOPs in a decode step (rope base, tied embeddings, Gemma's
logit soft-capping and sliding window at L <= 4096) are left out on purpose.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelPreset:
    """One decoder-only transformer, as far as the cost ledger needs it."""

    name: str
    d_model: int
    d_ff: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    n_layers: int
    vocab: int
    qk_norm: bool = False
    """Per-head RMSNorm of q and k before RoPE (Qwen3, Gemma 3)."""
    post_norms: bool = False
    """Extra RMSNorm on the attention and MLP outputs before the residual add (Gemma 2)."""
    scale_offset: float = 0.0
    """Norm gain is (scale_offset + g): Gemma stores g and uses (1 + g)."""
    activation: str = "silu"
    """Gated MLP activation: "silu" (SwiGLU) or "gelu_tanh" (GeGLU)."""

    @property
    def q_width(self) -> int:
        return self.n_heads * self.head_dim

    @property
    def kv_width(self) -> int:
        """Width of k (and of v) per token."""
        return self.n_kv_heads * self.head_dim


LLAMA3_8B = ModelPreset("llama3-8b", 4096, 14336, 32, 8, 128, 32, 128256)
LLAMA2_70B = ModelPreset("llama2-70b", 8192, 28672, 64, 8, 128, 80, 32000)
QWEN3_32B = ModelPreset("qwen3-32b", 5120, 25600, 64, 8, 128, 64, 151936, qk_norm=True)
GEMMA2_9B = ModelPreset(
    "gemma2-9b",
    3584,
    14336,
    16,
    8,
    256,
    42,
    256000,
    post_norms=True,
    scale_offset=1.0,
    activation="gelu_tanh",
)
TINY = ModelPreset("tiny", 256, 704, 4, 2, 64, 2, 512)

PRESETS: dict[str, ModelPreset] = {
    p.name: p for p in (LLAMA3_8B, LLAMA2_70B, QWEN3_32B, GEMMA2_9B, TINY)
}
