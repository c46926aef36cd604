"""Mosaic GPU backend of the attention input: `pallas_kernels.decode_attention_input` (one
weight-streaming launch at M <= 64: the input norm's row scale, q/k/v, per-head QK-norm where
the model has it, and RoPE in the epilogue).

Serves bfloat16/float16 x with weights of its dtype, head_dim 128 or 256, K and every
width multiples of 64. Anything else raises `Unsupported` with the reason, and dispatch
falls back to the unfused ops. Forward only: `jaxnorm.attention_input` pairs it with the
backward of the unfused composition.
"""

from __future__ import annotations

import jax

from jaxnorm import row_stats
from jaxnorm.attention_input import OP
from jaxnorm.backends import decode_attention_measured
from jaxnorm.backends.mosaic_dense import DECODE_MAX_RATIO, _check, nearest_measured
from jaxnorm.dispatch import decline_automatic, register
from pallas_kernels import decode_attention_input
from pallas_kernels.decode_config import MAX_ROWS, fitting_config

Array = jax.Array
_RESULTS = "bench/results/2026-12-01-decode"
# Where a model's decode step measured slower with the kernel than without it: the unfused
# ops it replaces already take the producer's statistics, so its op-level ratio to stock
# overstates the win. (nearest measured shape, gain) -> the model suite's kernel time / stock.
SLOWER_IN_THE_MODEL: dict[tuple[tuple[int, int, int, int, int], str], str] = {
    ((1, 1152, 4, 1, 256), "unfolded"): (
        "Gemma-3-1B's decode step at B = 1 took 0.944, 0.959x stock with it "
        f"and 0.894, 0.914x without (model-sessions-11-13.json, {_RESULTS}): "
        "its six heads are six CTAs streaming the weights"),
    ((1, 1152, 4, 1, 256), "folded"): (
        "Gemma-3-1B flashified, decode B = 1: 0.853, 0.868x stock with it "
        f"and 0.807, 0.820x without (model-sessions-11-13.json, {_RESULTS})"),
    ((8, 1024, 16, 8, 128), "folded"): (
        "Qwen3-0.6B flashified, decode B = 8: 1.005, 1.006x stock with it "
        f"(model-sessions-11-13.json) and 0.983, 0.985x without (model-decode.json, {_RESULTS})"),
}


@register(OP, "mosaic")
def rms_norm_attention_input(x: Array, scale: Array | None, w_q: Array, w_k: Array, w_v: Array,
                             q_scale: Array, k_scale: Array, cos: Array, sin: Array,
                             stats: row_stats.RowStats | None = None, *, head_dim: int,
                             eps: float, qk_eps: float, scale_offset: float,
                             interpret: bool) -> tuple[Array, Array, Array]:
    x = _check(x, (w_q, w_k, w_v), OP, interpret)
    (m, k), heads, kv_heads = x.shape, w_q.shape[1] // head_dim, w_k.shape[1] // head_dim
    entry = (_nearest_entry(m, k, heads, kv_heads, head_dim, q_scale is not None)
             if m <= MAX_ROWS else None)
    return decode_attention_input.decode_attention_input(
        x, (w_q, w_k, w_v), head_dim=head_dim, q_gain=q_scale, k_gain=k_scale, cos=cos,
        sin=sin, qk_eps=qk_eps, qk_offset=scale_offset, eps=eps, scale=scale,
        scale_offset=scale_offset,
        row_scale=None if stats is None else row_stats.rms_inverse(stats, eps),
        # The nearest measured shape's fastest folded config (the one its ratio is of).
        config=None if entry is None else fitting_config(entry[3], k), interpret=interpret)


def _nearest_entry(m: int, k: int, heads: int, kv_heads: int, head_dim: int, qk_norm: bool):
    """(shape, folded ratio, unfolded ratio, config fields) of the measured entry of this
    head_dim and QK-norm within 2x of (M, K, q/k/v width), nearest in log2; None if none."""
    table = (decode_attention_measured.ENTRIES if qk_norm
             else decode_attention_measured.ENTRIES_WITHOUT_QK_NORM)
    return nearest_measured(
        decode_attention_measured.PROVENANCE, (m, k, (heads + 2 * kv_heads) * head_dim),
        (((em, ek, (eh + 2 * ekv) * ehd), ((em, ek, eh, ekv, ehd), folded, unfolded, config))
         for (em, ek, eh, ekv, ehd), folded, unfolded, config in table if ehd == head_dim))


@decline_automatic(OP)
def _not_measured_faster(x, scale, w_q, w_k, w_v, q_scale, *args, head_dim: int,
                         **kwargs) -> str | None:
    """The kernel runs under impl=None only at decode, where the nearest measured shape had it
    at or under DECODE_MAX_RATIO of stock's attention input, with the gain as this call has it,
    and no model measured slower with it there (SLOWER_IN_THE_MODEL)."""
    (m, k), heads, kv_heads = x.shape, w_q.shape[1] // head_dim, w_k.shape[1] // head_dim
    qk_norm = q_scale is not None
    where = (f"at {m}x{k}, {heads}/{kv_heads} heads of {head_dim}"
             f"{'' if qk_norm else ' without QK-norm'}")
    if m > MAX_ROWS:
        return f"{where}: the attention-input kernel serves decode (M <= {MAX_ROWS})"
    entry = _nearest_entry(m, k, heads, kv_heads, head_dim, qk_norm)
    if entry is None:
        return (f"{where} the attention-input kernel has no measured shape within 2x "
                "(jaxnorm/backends/decode_attention_measured.py, "
                "bench/decode_attention_bench.py); impl='mosaic' forces it")
    shape, folded, unfolded, _ = entry
    gain = "folded" if scale is None else "unfolded"
    ratio = folded if scale is None else unfolded
    if qk_norm and (shape, gain) in SLOWER_IN_THE_MODEL:
        return (f"{where} the attention-input kernel with the gain {gain} (nearest measured "
                f"{shape}) made the model slower: {SLOWER_IN_THE_MODEL[shape, gain]}; "
                "impl='mosaic' forces it")
    if ratio is None or ratio > DECODE_MAX_RATIO:
        measured = "is not measured" if ratio is None else f"measured {ratio:.3f}x stock"
        return (f"{where} the attention-input kernel with the gain {gain} {measured} at "
                f"{shape} (over {DECODE_MAX_RATIO}x is declined; "
                "jaxnorm/backends/decode_attention_measured.py); impl='mosaic' forces it")
    return None
