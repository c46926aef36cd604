"""The cost ledger, checked on cases small enough to count by hand.

Expected values are written out as arithmetic on literal numbers, never by
calling the helper under test, so a wrong formula cannot agree with itself.
"""

import dataclasses
from fractions import Fraction

import pytest

from bench import ledger as L
from bench.__main__ import main
from bench.presets import GEMMA2_9B, LLAMA2_70B, LLAMA3_8B, QWEN3_32B, TINY

# ---------------------------------------------------------------- primitives


def test_2x2_matmul_is_12_operations_and_12_moves() -> None:
    # 4 outputs, each 2 multiplies + 1 add; read 4 + 4, write 4.
    assert L.matmul(2, 2, 2) == L.Cost(8 + 4, 4 + 4 + 4)


def test_matmul_1x3_by_3x2() -> None:
    # 2 outputs, each 3 multiplies + 2 adds; read 3 + 6, write 2.
    assert L.matmul(1, 3, 2) == L.Cost(2 * (3 + 2), 3 + 6 + 2)


@pytest.mark.parametrize("n", range(1, 17))
def test_square_matmul_intensity_is_2n_minus_1_over_3(n: int) -> None:
    assert L.matmul(n, n, n).intensity == Fraction(2 * n - 1, 3)


@pytest.mark.parametrize("n", range(1, 9))
def test_rms_norm_of_a_vector_is_3n_plus_1_operations_and_2n_moves(n: int) -> None:
    assert L.rms_norm(1, n, gain=False) == L.Cost(3 * n + 1, 2 * n)


def test_rms_norm_length_2_counted_op_by_op() -> None:
    # 2 squares, 1 add, 1 fused (ssq/n + eps), 1 rsqrt, 2 multiplies.
    assert L.rms_norm(1, 2, gain=False).flops == 2 + 1 + 1 + 1 + 2


def test_rms_norm_with_gain_and_offset() -> None:
    # 2 rows of 3: 2 * 10 + gain multiplies 2 * 3; moves 2 * 2 * 3 + gain 3.
    assert L.rms_norm(2, 3) == L.Cost(20 + 6, 12 + 3)
    # Gemma's (1 + g): 3 more adds, once per kernel.
    assert L.rms_norm(2, 3, scale_offset=1.0) == L.Cost(20 + 6 + 3, 12 + 3)


@pytest.mark.parametrize("n", range(1, 9))
def test_layer_norm_of_a_vector_is_5n_plus_1(n: int) -> None:
    assert L.layer_norm(1, n, gain=False, bias=False) == L.Cost(5 * n + 1, 2 * n)


def test_layer_norm_with_gain_and_bias() -> None:
    # 2 rows of 3: 2 * 16, gain 6, bias 6; moves 12 + 3 + 3.
    assert L.layer_norm(2, 3) == L.Cost(32 + 6 + 6, 12 + 3 + 3)


def test_lazy_rms_norm_moves_nothing() -> None:
    # 2 rows, K = 3: statistics 2 * (3 + 2 + 1 + 1) = 14, row scale of 4 outputs 2 * 4.
    assert L.lazy_rms_norm(2, 3, 4) == L.Cost(14 + 8, 0)
    # Training: gain on the A tile (2 * 3 multiplies) and the gain read (3).
    assert L.lazy_rms_norm(2, 3, 4, gain_in_kernel=True) == L.Cost(14 + 8 + 6, 3)


def test_lazy_layer_norm() -> None:
    # Per row, K = 3: sum 2, squares 3, adds 2, scalars 6 = 13; epilogue 4 per output.
    assert L.lazy_layer_norm(2, 3, 4) == L.Cost(2 * 13 + 2 * 4 * 4, 4 + 4)


def test_epilogue_norm_reads_only_the_gain() -> None:
    assert L.epilogue_rms_norm(2, 3) == L.Cost(2 * 10 + 6, 3)


def test_rms_norm_backward() -> None:
    # One element: r (square, fused, rsqrt) 3, xhat 1, g dy 1, dot 1, c 1, dx 3; dg 1.
    assert L.rms_norm_backward(1, 1) == L.Cost(3 + 1 + 1 + 1 + 1 + 3 + 1, 3 + 2)
    # 2 rows of 3: 2 * 28 per-row work, dg 6 multiplies + 3 adds; read x, dy, g, write dx, dg.
    assert L.rms_norm_backward(2, 3) == L.Cost(56 + 6 + 3, 6 + 6 + 3 + 6 + 3)


def test_unfused_swiglu_moves_3_I_per_token_not_d_times_I() -> None:
    d, i = 4096, 14336
    cost = L.gated_activation(1, i)
    assert cost.moves * L.BF16_BYTES == 3 * i * 2
    assert cost.moves != d * i
    assert cost.flops == 5 * i  # negate, exp, add, divide, times up
    assert L.gated_activation(1, i, "gelu_tanh").flops == 10 * i


def test_softmax() -> None:
    # Length 2: 1 compare, 2 subtracts, 2 exps, 1 add, 1 reciprocal, 2 multiplies.
    assert L.softmax(1, 2) == L.Cost(1 + 2 + 2 + 1 + 1 + 2, 4)
    assert L.softmax(3, 4) == L.Cost(3 * 19, 3 * 8)


def test_rope() -> None:
    # One pair: 4 multiplies + 2 adds; read 2, write 2, cos and sin 1 each.
    assert L.rope(1, 1, 2) == L.Cost(6, 2 + 2 + 2)
    # 2 tokens x 3 heads x 4: 24 elements; tables 4 numbers per token.
    assert L.rope(2, 3, 4) == L.Cost(3 * 24, 2 * 24 + 2 * 4)


def test_residual_kv_write_embedding_bias_sampler() -> None:
    assert L.residual_add(2, 5) == L.Cost(10, 30)
    assert L.kv_cache_write(3, 10) == L.Cost(0, 60)
    assert L.embedding_gather(2, 5) == L.Cost(0, 20)
    assert L.bias_add(2, 5) == L.Cost(10, 5)
    # Vocabulary 2: 6 operations per logit, 1 compare; read 2 logits, write 1 token.
    assert L.sampler(1, 2) == L.Cost(2 * 6 + 1, 3)


def test_attention_pairs() -> None:
    assert L.attention_pairs(1, 5) == 5  # decode: all 5 positions
    assert L.attention_pairs(3, 3) == 1 + 2 + 3  # causal prefill
    assert L.attention_pairs(2, 5) == 4 + 5


def test_attention_one_head_decode() -> None:
    # head_dim 2, 3 positions: scores 3 x (2 + 1); softmax 5 * 3 - 1;
    # values 2 outputs x (3 + 2). Moves: q 2 + K 6; V 6 + out 2.
    scores, probs, values = L.attention(1, 1, 1, 2, 1, 3)
    assert scores == L.Cost(9, 8)
    assert probs == L.Cost(14, 0)
    assert values == L.Cost(10, 8)


def test_attention_gqa_reads_each_kv_head_once() -> None:
    # 4 query heads share 2 kv heads: K is 3 positions x 2 heads x 2, q is 4 x 2.
    scores, _, _ = L.attention(1, 4, 2, 2, 1, 3)
    assert scores.moves == 4 * 2 + 3 * 2 * 2


def test_roofline_seconds() -> None:
    c = L.Ceilings(hbm_bytes_per_s=4.0, gemm_flops_per_s=10.0)
    assert c.seconds(L.Cost(100, 1)) == 10.0  # compute-bound: 100 / 10
    assert c.seconds(L.Cost(1, 100)) == 50.0  # bandwidth-bound: 200 bytes / 4


# ---------------------------------------------------------------- fused vs unfused


def test_fusion_saves_the_normalized_round_trip() -> None:
    m, k, n = 8, 16, 32
    saved = L.total_cost(L.norm_gemm_ops(m, k, [n], fused=False)).moves - L.total_cost(
        L.norm_gemm_ops(m, k, [n], fused=True)
    ).moves
    assert saved == 2 * m * k + k  # norm reads x, writes xhat; its gain
    # Two weights: the unfused GEMMs each read xhat, the fused kernel reads x once.
    saved2 = L.total_cost(L.norm_gemm_ops(m, k, [n, n], fused=False)).moves - L.total_cost(
        L.norm_gemm_ops(m, k, [n, n], fused=True)
    ).moves
    assert saved2 == 3 * m * k + k


def test_rider_is_charged_only_what_it_adds() -> None:
    c = L.Ceilings(hbm_bytes_per_s=2.0, gemm_flops_per_s=1.0)  # seconds = max(flops, moves)
    host = L.Op("gemm", L.GEMM, L.Cost(10, 100))
    hidden = L.Op("norm", L.NORM, L.Cost(50, 0), host="gemm")
    assert L.op_seconds([host, hidden], c) == {"gemm": 100.0, "norm": 0.0}
    costly = L.Op("norm", L.NORM, L.Cost(200, 0), host="gemm")
    assert L.op_seconds([host, costly], c) == {"gemm": 100.0, "norm": 110.0}
    assert L.kernel_count([host, costly]) == 1


def test_fused_decode_norms_cost_nothing_when_weights_stream() -> None:
    seconds = L.op_seconds(L.decode_step(LLAMA3_8B, 1, 4096, fused=True), L.Ceilings())
    assert seconds["attn_norm"] == seconds["mlp_norm"] == seconds["final_norm"] == 0.0


def test_post_norm_op() -> None:
    # x [2, 3] @ W [3, 4]: 8 dots of 5; moves 6 + 12 + 8. Bias: 8 adds, read 4.
    # Norm of 2 rows of 4 with gain: 2 * 13 + 8; separate: 16 + 4 moves, epilogue: 4.
    unfused = L.gemm_norm_ops(2, 3, 4, fused=False)
    fused = L.gemm_norm_ops(2, 3, 4, fused=True)
    assert L.total_cost(unfused) == L.Cost(40 + 8 + 34, 26 + 4 + 20)
    assert L.total_cost(fused) == L.Cost(40 + 8 + 34, 26 + 4 + 4)
    assert (L.kernel_count(unfused), L.kernel_count(fused)) == (2, 1)


def test_post_norm_with_the_residual_after() -> None:
    # r + RMSNorm(x @ W + b) on the same 2 x 4 output: 8 more adds; fused, r [2, 4] read once
    # by the epilogue (8 moves); unfused, a third kernel reads y and r and writes the sum (24).
    unfused = L.gemm_norm_add_ops(2, 3, 4, fused=False)
    fused = L.gemm_norm_add_ops(2, 3, 4, fused=True)
    assert L.total_cost(unfused) == L.Cost(40 + 8 + 34 + 8, 26 + 4 + 20 + 24)
    assert L.total_cost(fused) == L.Cost(40 + 8 + 34 + 8, 26 + 4 + 4 + 8)
    assert (L.kernel_count(unfused), L.kernel_count(fused)) == (3, 1)


def test_train_step_op() -> None:
    # m 2, k 3, N 4. Forward GEMM (40, 26), dxhat [2, 4] @ [4, 3] (2 * 3 * 7, 8 + 12 + 6),
    # norm backward (65, 24), dW [3, 2] @ [2, 4] (3 * 4 * 3, 6 + 8 + 12).
    common_flops, common_moves = 40 + 42 + 65 + 36, 26 + 26 + 24 + 26
    unfused = L.train_norm_gemm_ops(2, 3, [4], fused=False)
    assert L.total_cost(unfused) == L.Cost(common_flops + 26, common_moves + 15)
    # Fused: forward rider 2 * 7 + 8 + 6 with the gain (3) read and 1/rms (2) written;
    # dW rider rebuilds xhat (2 * 2 * 3) reading 1/rms (2).
    fused = L.train_norm_gemm_ops(2, 3, [4], fused=True)
    assert L.total_cost(fused) == L.Cost(common_flops + 28 + 12, common_moves + 5 + 2)
    assert (L.kernel_count(unfused), L.kernel_count(fused)) == (5, 4)


def test_prefill_attention_is_causal() -> None:
    # Tiny, 4 tokens: 1 + 2 + 3 + 4 = 10 pairs per head, 4 heads of 64, 2 kv heads.
    ops = {o.name: o.cost for o in L.prefill_layer(TINY, 4, fused=False)}
    assert ops["attn_scores"] == L.Cost(4 * 10 * 127, 4 * 256 + 4 * 128)
    assert ops["softmax"] == L.Cost(4 * (5 * 10 - 4), 0)
    assert ops["attn_values"] == L.Cost(4 * 64 * (2 * 10 - 4), 4 * 128 + 4 * 256)


# ---------------------------------------------------------------- the tiny preset by hand

# Tiny: d 256, I 704, 4 heads / 2 kv heads of 64, 2 layers, V 512. One sequence
# (B = 1) decoding at context L = 8. q width 256, k and v 128 each, qkv 512.
TINY_LAYER_UNFUSED = {  # kernel: (flops, moves)
    "attn_norm": (3 * 256 + 1 + 256, 2 * 256 + 256),
    "qkv": (512 * (2 * 256 - 1), 256 + 256 * 512 + 512),
    "rope": (3 * 6 * 64, 2 * 6 * 64 + 64),
    "kv_write": (0, 2 * 256),
    # scores 4 heads x 8 x 127, softmax 4 x 39, values 4 x 64 x 15;
    # q 256 + K 8 x 128, V 8 x 128 + out 256.
    "attention": (4 * 8 * 127 + 4 * 39 + 4 * 64 * 15, 256 + 1024 + 1024 + 256),
    "o_proj": (256 * 511, 256 + 256 * 256 + 256),
    "attn_residual": (256, 3 * 256),
    "mlp_norm": (3 * 256 + 1 + 256, 2 * 256 + 256),
    "gate_up": (1408 * 511, 256 + 256 * 1408 + 1408),
    "activation": (5 * 704, 3 * 704),
    "down": (256 * 1407, 704 + 704 * 256 + 256),
    "mlp_residual": (256, 3 * 256),
}
TINY_STEP_UNFUSED = {
    "embed": (0, 2 * 256),
    "final_norm": (3 * 256 + 1 + 256, 2 * 256 + 256),
    "lm_head": (512 * 511, 256 + 256 * 512 + 512),
    "sampler": (7 * 512 - 1, 512 + 1),
}


def _tiny_fused() -> tuple[dict, dict]:
    """The same step with each pre-norm's statistics (2 * 256 + 1) and row scale in its GEMM."""
    layer = {k: v for k, v in TINY_LAYER_UNFUSED.items() if k not in ("attn_norm", "mlp_norm")}
    layer["qkv"] = (layer["qkv"][0] + 513 + 512, layer["qkv"][1])
    layer["gate_up"] = (layer["gate_up"][0] + 513 + 1408, layer["gate_up"][1])
    step = {k: v for k, v in TINY_STEP_UNFUSED.items() if k != "final_norm"}
    step["lm_head"] = (step["lm_head"][0] + 513 + 512, step["lm_head"][1])
    return layer, step


def _by_hand(layer: dict, step: dict) -> tuple[int, int, int]:
    flops = 2 * sum(f for f, _ in layer.values()) + sum(f for f, _ in step.values())
    moves = 2 * sum(m for _, m in layer.values()) + sum(m for _, m in step.values())
    return flops, moves, 2 * len(layer) + len(step)


@pytest.mark.parametrize("fused", [False, True])
def test_tiny_decode_step_totals(fused: bool) -> None:
    layer, step = _tiny_fused() if fused else (TINY_LAYER_UNFUSED, TINY_STEP_UNFUSED)
    flops, moves, kernels = _by_hand(layer, step)
    ops = L.decode_step(TINY, 1, 8, fused=fused)
    assert L.total_cost(ops) == L.Cost(flops, moves)
    assert L.kernel_count(ops) == kernels == (23 if fused else 28)


@pytest.mark.parametrize("fused", [False, True])
def test_tiny_decode_step_roofline_time(fused: bool) -> None:
    # 1 FLOP/s and 2 bytes/s: each kernel takes max(flops, moves) seconds.
    layer, step = _tiny_fused() if fused else (TINY_LAYER_UNFUSED, TINY_STEP_UNFUSED)
    expected = 2 * sum(max(f, m) for f, m in layer.values()) + sum(
        max(f, m) for f, m in step.values()
    )
    ceilings = L.Ceilings(hbm_bytes_per_s=2.0, gemm_flops_per_s=1.0)
    assert L.step_seconds(L.decode_step(TINY, 1, 8, fused=fused), ceilings) == pytest.approx(
        expected, rel=1e-12
    )


def test_preset_flags_add_exactly_their_ops() -> None:
    """Tiny with QK-norm, Gemma's post-norms, (1 + g) gains and GeGLU, against plain tiny."""
    full = dataclasses.replace(
        TINY, qk_norm=True, post_norms=True, scale_offset=1.0, activation="gelu_tanh"
    )
    post_flops = 3 * 256 + 1 + 256 + 256  # RMSNorm of 256 with gain, + 256 offset adds
    qk_flops = (4 * 193 + 4 * 64) + (2 * 193 + 2 * 64)  # q: 4 heads, k: 2 heads of 64
    gelu_extra = 5 * 704
    # Unfused: separate post-norm and QK-norm kernels; the pre-norms gain the offset adds.
    layer_flops = 2 * post_flops + qk_flops + 2 * 256 + gelu_extra
    layer_moves = 2 * (2 * 256 + 256) + (2 * 4 * 64 + 64) + (2 * 2 * 64 + 64)
    extra = L.Cost(2 * layer_flops + 256, 2 * layer_moves)  # + the final norm's offset
    plain, flagged = (L.decode_step(p, 1, 8, fused=False) for p in (TINY, full))
    assert L.total_cost(flagged) == L.total_cost(plain) + extra
    assert L.kernel_count(flagged) == L.kernel_count(plain) + 2 * 3
    # Fused: the norms ride their GEMMs reading only gains; pre-norm offsets fold away.
    layer_flops = 2 * post_flops + qk_flops + gelu_extra
    extra = L.Cost(2 * layer_flops, 2 * (2 * 256 + 2 * 64))
    plain, flagged = (L.decode_step(p, 1, 8, fused=True) for p in (TINY, full))
    assert L.total_cost(flagged) == L.total_cost(plain) + extra
    assert L.kernel_count(flagged) == L.kernel_count(plain)


# ---------------------------------------------------------------- presets and the CLI


def _params(p) -> int:
    """Weights of the published checkpoints (norm gains are negligible)."""
    per_layer = p.d_model * (p.q_width + 2 * p.kv_width) + p.q_width * p.d_model
    per_layer += 3 * p.d_model * p.d_ff
    return p.n_layers * per_layer + p.vocab * p.d_model


@pytest.mark.parametrize(
    ("preset", "published", "tied"),
    [(LLAMA3_8B, 8.03e9, False), (LLAMA2_70B, 68.98e9, False), (QWEN3_32B, 32.8e9, False),
     (GEMMA2_9B, 9.24e9, True)],
)  # fmt: skip
def test_presets_match_published_parameter_counts(preset, published: float, tied: bool) -> None:
    total = _params(preset) + (0 if tied else preset.vocab * preset.d_model)
    assert total == pytest.approx(published, rel=0.01)


def test_ledger_suite_runs_on_cpu(tmp_path, capsys) -> None:
    assert main(["--suite", "ledger", "--out", str(tmp_path), "--preset", "tiny,llama3-8b"]) == 0
    assert "Prefill layer" in capsys.readouterr().out
    assert (tmp_path / "ledger.md").exists() and (tmp_path / "ledger.json").exists()
