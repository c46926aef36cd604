"""Cross-lowering of the decode attention-input kernel for "cuda" (no GPU) at the presets'
decode shapes: the Pallas -> Mosaic GPU lowering (layout inference of the accumulators'
head reductions, the cos/sin tiles' WGMMA-layout loads, TMA descriptors of the half-head
stores, the SMEM budget) with the H200's SM count; it does not run ptxas."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from pallas_kernels import decode_attention_input as dai
from pallas_kernels import decode_config as dc
from pallas_kernels import hardware

H200 = hardware.h200_mesh()
S = jax.ShapeDtypeStruct
BF16, F32 = jnp.bfloat16, jnp.float32
# (name, d_model, q heads, kv heads, head_dim, QK-norm gain offset).
PRESETS = [("qwen3-0.6b", 1024, 16, 8, 128, 0.0), ("qwen3-4b", 2560, 32, 8, 128, 0.0),
           ("gemma-3-1b", 1152, 4, 1, 256, 1.0)]


def _lower(m: int, d: int, n_q: int, n_kv: int, hd: int, qk_offset: float, *, gain: bool,
           config: dc.DecodeConfig | None = None, qk_norm: bool = True) -> None:
    def fn(x, w_q, w_k, w_v, g, q_gain, k_gain, cos, sin):
        return dai.decode_attention_input(x, (w_q, w_k, w_v), head_dim=hd, q_gain=q_gain,
                                          k_gain=k_gain, cos=cos, sin=sin, qk_offset=qk_offset,
                                          scale=g, scale_offset=qk_offset, config=config)

    args = (S((m, d), BF16), S((d, n_q * hd), BF16), S((d, n_kv * hd), BF16),
            S((d, n_kv * hd), BF16), S((d,), F32) if gain else None,
            *(S((hd,), F32) if qk_norm else None for _ in range(2)),
            S((m, hd // 2), F32), S((m, hd // 2), F32))
    with jax.sharding.use_abstract_mesh(H200):
        lowered = jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",))
    assert "mosaic_gpu" in lowered.as_text()


@pytest.mark.parametrize("m", [1, 8, 64])
@pytest.mark.parametrize("preset", PRESETS, ids=lambda p: p[0])
def test_lowers_at_decode_with_the_statistic_in_the_kernel(m, preset):
    """The input gain folded (scale=None): the statistic from the x tiles."""
    _lower(m, *preset[1:], gain=False)


@pytest.mark.parametrize("preset", PRESETS, ids=lambda p: p[0])
def test_lowers_with_a_gain_scaling_x(preset):
    """A gain scaling x in XLA, the row scale given to the kernel."""
    _lower(8, *preset[1:], gain=True)


@pytest.mark.parametrize("hd", [128, 256])
def test_every_candidate_tile_lowers(hd):
    config = dc.deepest(dc.DecodeConfig(tile_n=hd // 2), 2, streams=2,
                        constants=dai.constants_bytes(hd))
    _lower(64, 2048, 16, 4, hd, 0.0, gain=False, config=config)


@pytest.mark.parametrize("m, gain", [(1, False), (8, True)])
def test_lowers_without_qk_norm_at_llama3_8b(m, gain):
    """Llama-3-8B's attention input (32/8 heads of 128, no QK-norm): RoPE alone."""
    _lower(m, 4096, 32, 8, 128, 0.0, gain=gain, qk_norm=False)


@pytest.mark.parametrize("split", [2, 4, 8])
@pytest.mark.parametrize("m", [1, 8, 64])
@pytest.mark.parametrize("preset", PRESETS + [("llama3-8b", 4096, 32, 8, 128, 0.0)],
                         ids=lambda p: p[0])
def test_cluster_splits_lower(m, preset, split):
    """Each head's K splits in a cluster, rank 0 summing both halves' partials through DSMEM
    (which the interpreter cannot run) before the QK-norm and RoPE; the partials and the
    cos/sin tables share one shared-memory region (Gemma's head_dim 256 fits only so)."""
    _, d, n_q, n_kv, hd, qk_offset = preset
    config = dc.deepest(dc.DecodeConfig(tile_n=hd // 2, split_k=split, reduction="cluster"), 2,
                        streams=2, constants=dai.constants_bytes(hd))
    _lower(m, d, n_q, n_kv, hd, qk_offset, gain=False, config=config,
           qk_norm=preset[0] != "llama3-8b")
