"""Hypothesis strategies: shapes, dtypes and the values that break norms.

Values are drawn with numpy from a hypothesis-chosen seed (fast, and
hypothesis still shrinks shapes, dtypes and kinds). Row kinds:
normal, heavy-tailed outliers, near-zero rows, zero rows, and rows with a
large mean and small spread (|mean|/std up to 1e5 in float32, 1e2 in 16-bit).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
from hypothesis import strategies as st

DTYPES = (np.dtype(np.float32), np.dtype(ml_dtypes.bfloat16), np.dtype(np.float16))
VALUE_KINDS = ("normal", "heavy_tailed", "near_zero_rows", "zero_rows", "large_mean")
EPS_VALUES = (1e-6, 1e-5, 0.0, 1e-2)
# K: multiples of 8/64/128 and awkward sizes, up to 8192.
K_VALUES = (1, 2, 3, 7, 8, 24, 63, 64, 100, 128, 192, 320, 1000, 1024, 4096, 8192)

dtypes = st.sampled_from(DTYPES)
value_kinds = st.sampled_from(VALUE_KINDS)
seeds = st.integers(0, 2**32 - 1)


def _large_mean_ratio(dtype: np.dtype) -> float:
    return 1e5 if dtype == np.float32 else 1e2


def rows(rng: np.random.Generator, m: int, k: int, dtype: np.dtype, kind: str) -> np.ndarray:
    """m rows of length k of the given kind; row 0 is ordinary so no draw is all-degenerate."""
    x = rng.standard_normal((m, k))
    special = rng.random(m) < 0.5
    special[0] = False
    if kind == "heavy_tailed":
        x = rng.standard_t(2.0, (m, k))
        outliers = rng.random((m, k)) < 0.01
        x = np.where(outliers, x * 100.0, x)
    elif kind == "near_zero_rows":
        x[special] *= 1e-3
    elif kind == "zero_rows":
        x[special] = 0.0
    elif kind == "large_mean":
        means = _large_mean_ratio(dtype) * rng.choice([-1.0, 1.0], m)
        x = np.where(special[:, None], means[:, None] + x, x)
    limit = float(ml_dtypes.finfo(dtype).max) / 4
    return np.clip(x, -limit, limit).astype(dtype)


def gains(rng: np.random.Generator, k: int, offset: float) -> np.ndarray:
    """Gains near 1 (or near 0 when the convention adds 1), float32 like Flax parameters."""
    centre = 0.0 if offset else 1.0
    return (centre + 0.2 * rng.standard_normal(k)).astype(np.float32)


def _dims(multiple: int, upper: int) -> st.SearchStrategy[int]:
    """Sizes up to `upper`; with multiple > 1 only multiples (what a kernel's tiles serve)."""
    if multiple > 1:
        return st.integers(1, max(1, upper // multiple)).map(lambda v: v * multiple)
    return st.sampled_from([v for v in K_VALUES if v <= upper]) | st.integers(1, min(300, upper))


@st.composite
def op_inputs(draw, op: str, dtype: np.dtype | None = None, max_k: int = 8192,
              kinds: tuple[str, ...] = VALUE_KINDS, multiple: int = 1,
              weights_like_x: bool = False) -> dict:
    """A full keyword set for `verify.checks.check_op(op, impl, **inputs)`.

    `multiple=64` draws K and N as multiples of 64 (the Mosaic kernels' tiles),
    so a kernel is exercised instead of raising Unsupported; `weights_like_x`
    draws kernels in x's dtype (the kernels do not cast weights per call).
    """
    dtype = draw(dtypes) if dtype is None else np.dtype(dtype)
    rng = np.random.default_rng(draw(seeds))
    k = draw(_dims(multiple, max_k))
    m = draw(st.integers(1, 8 if k <= 1024 else 3))
    kind = draw(st.sampled_from(kinds))
    x = rows(rng, m, k, dtype, kind)
    if draw(st.booleans()):  # leading batch dims
        x = x.reshape(1, m, k)
    inputs: dict = {"x": x, "eps": draw(st.sampled_from(EPS_VALUES))}
    dense = op in ("rms_norm_dense", "layer_norm_dense")
    post = op in ("dense_rms_norm", "dense_layer_norm")
    offset = draw(st.sampled_from([0.0, 1.0]))
    inputs["scale_offset"] = offset
    if not post and draw(st.booleans()):
        inputs["scale"] = gains(rng, k, offset)
    if op == "layer_norm" and draw(st.booleans()):
        inputs["bias"] = rng.standard_normal(k).astype(np.float32)
    if op == "layer_norm_dense" and draw(st.booleans()):
        inputs["norm_bias"] = rng.standard_normal(k).astype(np.float32)
    if dense or post:
        n_kernels = draw(st.integers(1, 2)) if dense else 1
        max_n = max(64 if k > 1024 else 160, multiple * 2)
        w_dtype = dtype if weights_like_x else draw(st.sampled_from([np.dtype(np.float32), dtype]))
        ns = [draw(st.integers(1, max_n // multiple).map(lambda v: v * multiple))
              for _ in range(n_kernels)]
        kernels = [(rng.standard_normal((k, n)) / np.sqrt(k)).astype(w_dtype) for n in ns]
        use_bias = draw(st.booleans())
        biases = [rng.standard_normal(n).astype(np.float32) for n in ns] if use_bias else None
        if dense and n_kernels > 1:
            inputs["kernel"], inputs["bias"] = kernels, biases
        else:
            inputs["kernel"], inputs["bias"] = kernels[0], None if biases is None else biases[0]
    if post:
        n = inputs["kernel"].shape[1]
        inputs["scale"] = gains(rng, n, offset) if draw(st.booleans()) else None
        if op == "dense_layer_norm" and draw(st.booleans()):
            inputs["norm_bias"] = rng.standard_normal(n).astype(np.float32)
        # A residual added before the norm, after it (Gemma 2/3, OLMo 2), or none.
        where = draw(st.sampled_from([None, "residual", "residual_after"]))
        if where is not None:
            inputs[where] = rng.standard_normal((*x.shape[:-1], n)).astype(dtype)
    return inputs


def impl_dtypes(impl: str | None) -> tuple[np.dtype, ...]:
    """The dtypes an implementation serves: the Mosaic kernels take 16-bit x only."""
    return DTYPES if impl == "xla" else DTYPES[1:]


def impl_inputs(op: str, impl: str | None, dtype: np.dtype,
                max_k: int = 8192) -> st.SearchStrategy[dict]:
    """`op_inputs` drawn as `impl` serves them, so a kernel runs instead of declining.

    The kernels tile K and N by 64 (the post-norm GEMM's N by 128: two 64-wide
    warpgroups) and take weights in x's dtype; xla takes any shape and mixed weights.
    """
    kernel = impl != "xla"
    multiple = (128 if op.startswith("dense_") else 64) if kernel else 1
    return op_inputs(op, dtype, max_k=max_k, multiple=multiple, weights_like_x=kernel)
