"""The cost ledger: what each op must compute and move, and its roofline time.

Conventions (every formula in this file follows them; tests/test_ledger.py
checks each on cases small enough to count by hand):

- An *operation* (FLOP) is one scalar multiply, add, subtract, divide,
  compare, exp, log, tanh or rsqrt. A matmul's multiplies and adds count
  separately: a dot product of length K is K multiplies + (K - 1) adds, so a
  2x2 matmul is 8 + 4 = 12 operations. One stated exception: a norm's per-row
  scalar `ssq * (1/n) + eps` is a single fused multiply-add and counts once,
  which makes RMSNorm of a length-n vector exactly 3n + 1 operations.
- A *move* is one number read from or written to HBM, with ideal on-chip reuse
  (each input read once, each output written once). Bytes = moves times one
  width for every tensor (bf16: 2 bytes). Parameters (gains, biases) count
  once per kernel; integer token ids are not counted.
- A *kernel* is one launch. Ops that share a kernel share its HBM traffic; its
  roofline time is max(FLOPs / F, bytes / B), F the bf16 GEMM rate and B the
  HBM copy bandwidth. Elementwise work is priced at F too: it sits at <= 4
  FLOPs per byte (the sampler's 3.5 is the most), far below even the CUDA-core
  ridge (datasheet FP32 ~67 TFLOP/s over 3.17 TB/s ~ 21), so it is
  bandwidth-bound whichever compute ceiling is used. Launch latency is not in
  the roofline; kernel counts are reported beside it.
- *Unfused*: every norm is its own kernel, reading x and writing the
  normalized x, which the next GEMM reads again. *Fused*: the norm rides a
  GEMM (docs/design.md section 1): pre-norm statistics accumulate while x streams
  through the GEMM's K-loop, the gain is folded into the weights offline and
  1/rms scales the output in the epilogue; post-norms and QK-norm run in the
  producing GEMM's epilogue, statistics exchanged on chip. The normalized
  activation never touches HBM. Everything else (residual adds, RoPE, KV-cache
  write, gated activation, sampler) is a separate kernel in both, so the
  comparison isolates the norms. Attention is one flash-style kernel in both:
  scores and probabilities never leave the chip.
- A rider (an op sharing another op's kernel) is charged only the time it adds
  to that kernel; the host op is charged its time alone.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from fractions import Fraction

from bench.presets import ModelPreset

BF16_BYTES = 2

GEMM = "gemm"
ATTENTION = "attention"
NORM = "norm"
ELEMENTWISE = "elementwise"

# Operations per element of a gated activation act(gate) * up:
# silu(g) * u = g / (1 + exp(-g)) * u: negate, exp, add, divide, multiply = 5.
# gelu_tanh(g) * u = 0.5 g (1 + tanh(c (g + 0.044715 g^3))) * u: g^3 (2),
# * 0.044715, + g, * c, tanh, + 1, * g, * 0.5, * u (1 each) = 10.
ACTIVATION_FLOPS: dict[str, int] = {"silu": 5, "gelu_tanh": 10}


@dataclass(frozen=True)
class Cost:
    """Operations and HBM moves (numbers, not bytes) of one piece of work."""

    flops: int
    moves: int

    def __add__(self, other: Cost) -> Cost:
        return Cost(self.flops + other.flops, self.moves + other.moves)

    @property
    def intensity(self) -> Fraction:
        """Operations per number moved (multiply the denominator by the width for bytes)."""
        return Fraction(self.flops, self.moves)


ZERO = Cost(0, 0)


@dataclass(frozen=True)
class Ceilings:
    """Measured machine limits the roofline divides by.

    The defaults are single-run XLA numbers of an H200 session from before this
    repository (not recorded in it) and stand in until a benchmark run measures
    both in the same process (the 2026-11-29 runs measured 3.36 TB/s and
    821 TFLOP/s: bench/results/2026-11-29-norm-gemm).
    """

    hbm_bytes_per_s: float = 3.17e12
    gemm_flops_per_s: float = 680e12
    source: str = "defaults from an earlier H200 session's XLA runs; replace with measurements"

    def seconds(self, cost: Cost, bytes_per_number: int = BF16_BYTES) -> float:
        """Roofline time of one kernel doing `cost`."""
        return max(
            cost.flops / self.gemm_flops_per_s,
            cost.moves * bytes_per_number / self.hbm_bytes_per_s,
        )


# ---------------------------------------------------------------- primitives


def matmul(m: int, k: int, n: int) -> Cost:
    """[m, k] @ [k, n]: m*n dot products of length k; read both, write [m, n]."""
    return Cost(m * n * (2 * k - 1), m * k + k * n + m * n)


def rms_norm(rows: int, n: int, *, gain: bool = True, scale_offset: float = 0.0) -> Cost:
    """Separate RMSNorm kernel over `rows` vectors of length n.

    Per row: n squares, n - 1 adds, 1 fused (ssq/n + eps), 1 rsqrt, n multiplies
    by 1/rms = 3n + 1; the gain adds n multiplies per row and, for (offset + g),
    n adds once per kernel. Moves: read x, write y (2n per row), read the gain.
    """
    flops = rows * (3 * n + 1)
    moves = 2 * rows * n
    if gain:
        flops += rows * n + (n if scale_offset else 0)
        moves += n
    return Cost(flops, moves)


def layer_norm(
    rows: int, n: int, *, gain: bool = True, bias: bool = True, scale_offset: float = 0.0
) -> Cost:
    """Separate two-pass LayerNorm kernel over `rows` vectors of length n.

    Per row: mean (n - 1 adds, 1 multiply by 1/n), center (n subtracts),
    variance (n squares, n - 1 adds, 1 fused /n + eps), 1 rsqrt, n multiplies
    = 5n + 1; gain and bias add n each per row (offset: n adds once).
    """
    flops = rows * (5 * n + 1)
    moves = 2 * rows * n
    if gain:
        flops += rows * n + (n if scale_offset else 0)
        moves += n
    if bias:
        flops += rows * n
        moves += n
    return Cost(flops, moves)


def lazy_rms_norm(rows: int, k: int, n_out: int, *, gain_in_kernel: bool = False) -> Cost:
    """RMSNorm riding a GEMM of width n_out (docs/design.md identity 1); x is read by the GEMM.

    Per row: statistics n squares, n - 1 adds, 1 fused, 1 rsqrt (2k + 1), then
    the epilogue scales the n_out outputs (n_out multiplies). Inference folds
    the gain into the weights (free); training multiplies the A tile by it
    (k per row) and reads it.
    """
    flops = rows * (2 * k + 1) + rows * n_out
    moves = 0
    if gain_in_kernel:
        flops += rows * k
        moves += k
    return Cost(flops, moves)


def lazy_layer_norm(rows: int, k: int, n_out: int) -> Cost:
    """LayerNorm riding a GEMM (docs/design.md identity 2), gain folded into the weights.

    Per row: sum (k - 1 adds), sum of squares (k multiplies, k - 1 adds), then
    mean, mean square (1 multiply each), variance (multiply, subtract), + eps,
    rsqrt = 3k + 4. Epilogue per output: s * (acc - mu * c) + b' = 4 operations.
    Moves: the column sums c = 1^T W* and the folded bias b', n_out each.
    """
    return Cost(rows * (3 * k + 4) + 4 * rows * n_out, 2 * n_out)


def epilogue_rms_norm(rows: int, n: int, *, scale_offset: float = 0.0) -> Cost:
    """RMSNorm of a GEMM's own output rows, in its epilogue (post-norm, QK-norm).

    Same arithmetic as the separate kernel; only the gain is read from HBM
    (partial sums cross CTAs through on-chip memory, docs/design.md identity 3).
    """
    separate = rms_norm(rows, n, gain=True, scale_offset=scale_offset)
    return Cost(separate.flops, n)


def rms_norm_backward(rows: int, n: int) -> Cost:
    """Backward of y = x * r * g: gradients for x and g from x, g and dy.

    Per row: recompute r (2n + 1), xhat = x r (n), g dy (n), dot = sum xhat g dy
    (2n - 1), c = dot / n (1), dx = r (g dy - c xhat) (3n): 9n + 1. dg sums
    dy * xhat over rows: rows*n multiplies + (rows - 1)*n adds.
    Moves: read x, dy, g; write dx, dg.
    """
    flops = rows * (9 * n + 1) + rows * n + (rows - 1) * n
    return Cost(flops, 3 * rows * n + 2 * n)


def bias_add(rows: int, n: int) -> Cost:
    """Bias add inside a GEMM epilogue: one add per output, the bias read once."""
    return Cost(rows * n, n)


def residual_add(rows: int, n: int) -> Cost:
    """h + delta: one add per element; read both, write the sum."""
    return Cost(rows * n, 3 * rows * n)


def rope(tokens: int, heads: int, head_dim: int) -> Cost:
    """Rotary embedding of `heads` vectors per token.

    Each pair (a, b) -> (a cos - b sin, b cos + a sin): 4 multiplies + 2 adds,
    3 per element. Moves: read and write each element, plus the position's
    cos and sin tables (head_dim / 2 each, shared by all heads of a token).
    """
    elements = tokens * heads * head_dim
    return Cost(3 * elements, 2 * elements + tokens * head_dim)


def gated_activation(rows: int, n: int, activation: str = "silu") -> Cost:
    """act(gate) * up over n channels: read gate, read up, write the product."""
    return Cost(rows * n * ACTIVATION_FLOPS[activation], 3 * rows * n)


def softmax(rows: int, n: int) -> Cost:
    """Separate softmax over rows of length n.

    Per row: max (n - 1 compares), subtract (n), exp (n), sum (n - 1 adds),
    reciprocal (1), scale (n) = 5n - 1. Moves: read and write each element.
    """
    return Cost(rows * (5 * n - 1), 2 * rows * n)


def kv_cache_write(tokens: int, width: int) -> Cost:
    """Copy the new tokens' k and v (`width` numbers per token) into the cache."""
    return Cost(0, 2 * tokens * width)


def embedding_gather(rows: int, d: int) -> Cost:
    """Look up one embedding row per token: read it, write it."""
    return Cost(0, 2 * rows * d)


def sampler(rows: int, vocab: int) -> Cost:
    """Temperature sampling by Gumbel-max, one token per row.

    Per logit: scale by 1/T (1), noise -log(-log u) (4: two logs, two
    negations; u is drawn in registers), add (1) = 6; argmax: vocab - 1
    compares. Moves: read the logits, write one token.
    """
    return Cost(rows * (7 * vocab - 1), rows * (vocab + 1))


def attention_pairs(new_tokens: int, context: int) -> int:
    """(query, key) pairs per sequence and head: the new tokens see the earlier
    context and, causally, each other (context includes the new tokens)."""
    return new_tokens * (context - new_tokens) + new_tokens * (new_tokens + 1) // 2


def attention(
    batch: int, heads: int, kv_heads: int, head_dim: int, new_tokens: int, context: int
) -> tuple[Cost, Cost, Cost]:
    """One flash-style attention kernel, split as (scores, softmax, values).

    Scores: each pair is a dot of length head_dim (2 head_dim - 1). Softmax:
    rows of length n cost 5n - 1 (see `softmax`), summed over the new tokens'
    rows, with no moves (the scores stay on chip). Values: head_dim outputs per
    row, each a dot over the row's n probabilities (2n - 1). The 1/sqrt(head_dim)
    score scale is folded into q (free). Moves: q and K with the scores, V and
    the output with the values; GQA reads each kv head once for its whole
    query group.
    """
    pairs = attention_pairs(new_tokens, context)
    q_or_o = batch * new_tokens * heads * head_dim
    k_or_v = batch * context * kv_heads * head_dim
    scores = Cost(batch * heads * pairs * (2 * head_dim - 1), q_or_o + k_or_v)
    probs = Cost(batch * heads * (5 * pairs - new_tokens), 0)
    values = Cost(batch * heads * head_dim * (2 * pairs - new_tokens), k_or_v + q_or_o)
    return scores, probs, values


# ---------------------------------------------------------------- op lists


@dataclass(frozen=True)
class Op:
    """One op of a step: its cost per repetition, and the kernel it runs in."""

    name: str
    category: str
    cost: Cost
    host: str | None = None
    """Name of the op whose kernel this op rides; None = a kernel of its own."""
    repeat: int = 1
    """Times per step (n_layers for the ops of a layer)."""

    @property
    def kernel(self) -> str:
        return self.host or self.name


def _pre_norm(
    name: str, rows: int, k: int, host: str, n_out: int, p: ModelPreset, fused: bool
) -> Op:
    if fused:
        return Op(name, NORM, lazy_rms_norm(rows, k, n_out), host=host)
    return Op(name, NORM, rms_norm(rows, k, scale_offset=p.scale_offset))


def _post_norm(name: str, rows: int, host: str, p: ModelPreset, fused: bool) -> Op:
    if fused:
        cost = epilogue_rms_norm(rows, p.d_model, scale_offset=p.scale_offset)
        return Op(name, NORM, cost, host=host)
    return Op(name, NORM, rms_norm(rows, p.d_model, scale_offset=p.scale_offset))


def layer_ops(
    p: ModelPreset, batch: int, new_tokens: int, context: int, *, fused: bool, repeat: int = 1
) -> list[Op]:
    """One decoder layer for `batch` sequences each adding `new_tokens` tokens."""
    m = batch * new_tokens
    d, f = p.d_model, p.d_ff
    qkv_n = p.q_width + 2 * p.kv_width
    ops = [
        _pre_norm("attn_norm", m, d, "qkv", qkv_n, p, fused),
        Op("qkv", GEMM, matmul(m, d, qkv_n)),
    ]
    if p.qk_norm:
        rows_q, rows_k = m * p.n_heads, m * p.n_kv_heads
        if fused:
            cost = epilogue_rms_norm(rows_q, p.head_dim) + epilogue_rms_norm(rows_k, p.head_dim)
            ops.append(Op("qk_norm", NORM, cost, host="qkv"))
        else:
            cost = rms_norm(rows_q, p.head_dim) + rms_norm(rows_k, p.head_dim)
            ops.append(Op("qk_norm", NORM, cost))
    scores, probs, values = attention(
        batch, p.n_heads, p.n_kv_heads, p.head_dim, new_tokens, context
    )
    ops += [
        Op("rope", ELEMENTWISE, rope(m, p.n_heads + p.n_kv_heads, p.head_dim)),
        Op("kv_write", ELEMENTWISE, kv_cache_write(m, 2 * p.kv_width)),
        Op("attn_scores", ATTENTION, scores),
        Op("softmax", ELEMENTWISE, probs, host="attn_scores"),
        Op("attn_values", ATTENTION, values, host="attn_scores"),
        Op("o_proj", GEMM, matmul(m, p.q_width, d)),
    ]
    if p.post_norms:
        ops.append(_post_norm("post_attn_norm", m, "o_proj", p, fused))
    ops += [
        Op("attn_residual", ELEMENTWISE, residual_add(m, d)),
        _pre_norm("mlp_norm", m, d, "gate_up", 2 * f, p, fused),
        Op("gate_up", GEMM, matmul(m, d, 2 * f)),
        Op("activation", ELEMENTWISE, gated_activation(m, f, p.activation)),
        Op("down", GEMM, matmul(m, f, d)),
    ]
    if p.post_norms:
        ops.append(_post_norm("post_mlp_norm", m, "down", p, fused))
    ops.append(Op("mlp_residual", ELEMENTWISE, residual_add(m, d)))
    return [Op(o.name, o.category, o.cost, o.host, repeat) for o in ops]


def decode_step(p: ModelPreset, batch: int, context: int, *, fused: bool) -> list[Op]:
    """One token for each of `batch` sequences that attend `context` positions."""
    d = p.d_model
    return [
        Op("embed", ELEMENTWISE, embedding_gather(batch, d)),
        *layer_ops(p, batch, 1, context, fused=fused, repeat=p.n_layers),
        _pre_norm("final_norm", batch, d, "lm_head", p.vocab, p, fused),
        Op("lm_head", GEMM, matmul(batch, d, p.vocab)),
        Op("sampler", ELEMENTWISE, sampler(batch, p.vocab)),
    ]


def prefill_layer(p: ModelPreset, tokens: int, *, fused: bool) -> list[Op]:
    """One layer over one causal sequence of `tokens` tokens (M = tokens)."""
    return layer_ops(p, 1, tokens, tokens, fused=fused)


def gemm_ops(m: int, k: int, ns: Sequence[int]) -> list[Op]:
    """One GEMM per weight, each reading x (how a plain GEMM or XLA's dot runs them)."""
    return [Op(f"gemm{i}", GEMM, matmul(m, k, n)) for i, n in enumerate(ns)]


def norm_gemm_ops(
    m: int, k: int, ns: Sequence[int], *, norm: str = "rms", fused: bool
) -> list[Op]:
    """Pre-norm then projection(s) sharing it: the benchmark's norm-gemm op.

    Fused: one kernel reads x once for all weights. Unfused: a norm kernel,
    then one GEMM per weight, each reading the normalized x.
    """
    n_total = sum(ns)
    if fused:
        rider = lazy_rms_norm(m, k, n_total) if norm == "rms" else lazy_layer_norm(m, k, n_total)
        return [Op("gemm", GEMM, matmul(m, k, n_total)), Op("norm", NORM, rider, host="gemm")]
    separate = rms_norm(m, k) if norm == "rms" else layer_norm(m, k)
    return [Op("norm", NORM, separate), *gemm_ops(m, k, ns)]


def gemm_norm_ops(m: int, k: int, n: int, *, fused: bool) -> list[Op]:
    """Post-norm RMSNorm(x @ W + b): the bias rides the GEMM; the norm rides it when fused."""
    if fused:
        norm = Op("norm", NORM, epilogue_rms_norm(m, n), host="gemm")
    else:
        norm = Op("norm", NORM, rms_norm(m, n))
    bias = Op("bias", ELEMENTWISE, bias_add(m, n), host="gemm")
    return [Op("gemm", GEMM, matmul(m, k, n)), bias, norm]


def gemm_norm_add_ops(m: int, k: int, n: int, *, fused: bool) -> list[Op]:
    """r + RMSNorm(x @ W + b) (Gemma 2/3, OLMo 2): fused, the residual tile is read once by
    the GEMM's epilogue; unfused, a separate add reads the normed output and r."""
    if fused:
        add = Op("residual_add", ELEMENTWISE, Cost(m * n, m * n), host="gemm")
    else:
        add = Op("residual_add", ELEMENTWISE, residual_add(m, n))
    return gemm_norm_ops(m, k, n, fused=fused) + [add]


def norm_ops(m: int, k: int, *, norm: str = "rms") -> list[Op]:
    """A standalone norm with gain (LayerNorm: and bias)."""
    return [Op("norm", NORM, rms_norm(m, k) if norm == "rms" else layer_norm(m, k))]


def train_norm_gemm_ops(m: int, k: int, ns: Sequence[int], *, fused: bool) -> list[Op]:
    """Forward and backward of RMSNorm + projection(s), gain learned (not folded).

    Backward GEMMs: dxhat = dY W^T and dW = xhat^T dY, all weights as one N.
    Unfused: XLA's autodiff of the pair, xhat written in the forward and read
    by dW. Fused: the forward GEMM multiplies the A tile by the gain and keeps
    1/rms per row (written, then read by dW, which rebuilds xhat = x r g on
    the fly: 2 operations per element of x).
    """
    n = sum(ns)
    backward = [
        Op("dx_gemm", GEMM, matmul(m, n, k)),
        Op("norm_backward", NORM, rms_norm_backward(m, k)),
        Op("dw_gemm", GEMM, matmul(k, m, n)),
    ]
    if not fused:
        return [Op("norm", NORM, rms_norm(m, k)), Op("gemm", GEMM, matmul(m, k, n)), *backward]
    fwd_rider = lazy_rms_norm(m, k, n, gain_in_kernel=True) + Cost(0, m)
    dw_rider = Cost(2 * m * k, m)
    return [
        Op("gemm", GEMM, matmul(m, k, n)),
        Op("norm", NORM, fwd_rider, host="gemm"),
        *backward,
        Op("xhat_rebuild", NORM, dw_rider, host="dw_gemm"),
    ]


# ---------------------------------------------------------------- totals


def total_cost(ops: Iterable[Op]) -> Cost:
    """FLOPs and moves of a whole op list, repetitions included."""
    total = ZERO
    for o in ops:
        total += Cost(o.cost.flops * o.repeat, o.cost.moves * o.repeat)
    return total


def _kernels(ops: Iterable[Op]) -> dict[str, list[Op]]:
    grouped: dict[str, list[Op]] = defaultdict(list)
    for o in ops:
        grouped[o.kernel].append(o)
    return grouped


def kernel_count(ops: Iterable[Op]) -> int:
    """Kernel launches per step."""
    return sum(group[0].repeat for group in _kernels(ops).values())


def op_seconds(
    ops: Iterable[Op], ceilings: Ceilings, bytes_per_number: int = BF16_BYTES
) -> dict[str, float]:
    """Roofline seconds charged to each op name over a step (repetitions included).

    A host op is charged its time alone; the riders of its kernel share the
    time they add, in proportion to their own roofline times.
    """
    charged: dict[str, float] = {}
    for group in _kernels(ops).values():
        host = next(o for o in group if o.host is None)
        riders = [o for o in group if o is not host]
        kernel_cost = host.cost
        for o in riders:
            kernel_cost += o.cost
        alone = ceilings.seconds(host.cost, bytes_per_number)
        added = ceilings.seconds(kernel_cost, bytes_per_number) - alone
        charged[host.name] = charged.get(host.name, 0.0) + alone * host.repeat
        rider_alone = [ceilings.seconds(o.cost, bytes_per_number) for o in riders]
        weight = sum(rider_alone)
        for o, t in zip(riders, rider_alone, strict=True):
            share = added * t / weight if weight else 0.0
            charged[o.name] = charged.get(o.name, 0.0) + share * o.repeat
    return charged


def step_seconds(
    ops: Iterable[Op], ceilings: Ceilings, bytes_per_number: int = BF16_BYTES
) -> float:
    """Roofline time of a step: the sum over its kernels."""
    return sum(op_seconds(ops, ceilings, bytes_per_number).values())


def category_seconds(
    ops: Sequence[Op], ceilings: Ceilings, bytes_per_number: int = BF16_BYTES
) -> dict[str, float]:
    """Charged seconds summed per category (gemm, attention, norm, elementwise)."""
    category = {o.name: o.category for o in ops}
    totals: dict[str, float] = defaultdict(float)
    for name, t in op_seconds(ops, ceilings, bytes_per_number).items():
        totals[category[name]] += t
    return dict(totals)
