"""`jaxnorm.rms_norm_attention_input`: the kernel path (Pallas interpreter, race detection)
and the xla path against verify.rope's float64 judge, the xla path as the unfused ops the
model ran before, gradients, the automatic-dispatch rule and the errors."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxnorm
from jaxnorm import dispatch, row_stats
from jaxnorm.backends import mosaic_attention_input as mai
from jaxnorm.models import layers
from kernel_checks import assert_race_free
from pallas_kernels import hardware
from verify import rope as vr

BF16 = jnp.bfloat16


def _inputs(rng, lead, k, n_q, n_kv, hd, *, offset=0.0, folded=False) -> dict:
    """Fresh draws with a distinct position per row (up to 4096) and gains near unit."""
    rows = int(np.prod(lead))
    positions = rng.permutation(4096)[:rows].reshape(lead)
    angles = positions.astype(np.float32)[..., None] * layers.rope_frequencies(hd, 1e6, None)
    w = lambda n: jnp.asarray(rng.standard_normal((k, n * hd)) / np.sqrt(k), BF16)  # noqa: E731
    gain = lambda n: jnp.asarray(1 - offset + 0.2 * rng.standard_normal(n), BF16)  # noqa: E731
    return dict(x=jnp.asarray(rng.standard_normal((*lead, k)) + 0.3, BF16),
                scale=None if folded else gain(k), w_q=w(n_q), w_k=w(n_kv), w_v=w(n_kv),
                q_scale=gain(hd), k_scale=gain(hd), cos=jnp.cos(angles), sin=jnp.sin(angles))


def _call(a: dict, hd: int, impl: str, **kw):
    return jaxnorm.rms_norm_attention_input(**a, head_dim=hd, impl=impl, **kw)


def _judge(outs, a: dict, hd: int, *, offset=0.0) -> float:
    flat = {name: np.asarray(v, np.float32).reshape(-1, v.shape[-1]) if v is not None
            and np.ndim(v) > 1 else v for name, v in a.items()}
    q, k, v = (np.asarray(o, np.float32).reshape(-1, o.shape[-1]) for o in outs)
    return vr.check_attention_input(
        q, k, v, np.asarray(a["x"]).reshape(-1, a["x"].shape[-1]), flat["scale"], a["w_q"],
        a["w_k"], a["w_v"], a["q_scale"], a["k_scale"], flat["cos"], flat["sin"], head_dim=hd,
        scale_offset=offset, qk_offset=offset)


@pytest.mark.parametrize("lead, hd, offset, folded", [
    ((1, 1), 128, 0.0, False),  # one decode step, Qwen3's plain gains
    ((3, 1), 256, 1.0, False),  # a batch of three, Gemma 3's 1 + g gains and head_dim
    ((2, 4), 128, 0.0, True),  # gain folded: the row statistic in the kernel
])
@pytest.mark.parametrize("impl", ["interpret", "xla"])
def test_matches_float64(lead, hd, offset, folded, impl, rng):
    a = _inputs(rng, lead, 128, 2, 1, hd, offset=offset, folded=folded)
    outs = _call(a, hd, impl, scale_offset=offset)
    if impl == "interpret":
        assert_race_free()
    assert [o.shape for o in outs] == [(*lead, 2 * hd), (*lead, hd), (*lead, hd)]
    assert _judge(outs, a, hd, offset=offset) <= 1.0


@pytest.mark.parametrize("impl", ["interpret", "xla"])
def test_without_qk_norm_only_rotates(impl, rng):
    """q_scale = k_scale = None (Llama): q and k rotated, not normed (their head RMS is 4
    here, so a normed head fails the judge)."""
    a = _inputs(rng, (3, 1), 128, 2, 1, 128)
    a.update(q_scale=None, k_scale=None, w_q=4 * a["w_q"], w_k=4 * a["w_k"])
    outs = _call(a, 128, impl)
    if impl == "interpret":
        assert_race_free()
    assert _judge(outs, a, 128) <= 1.0


def test_qk_norm_gains_come_in_pairs(rng):
    a = _inputs(rng, (2, 1), 128, 2, 1, 128)
    with pytest.raises(ValueError, match="q_scale and k_scale: both"):
        _call(dict(a, k_scale=None), 128, "xla")


def test_given_statistics_replace_the_reduction(rng):
    """x's RowStats (as a residual GEMM writes them) give the kernel its row scale."""
    a = _inputs(rng, (4, 1), 128, 2, 1, 128)
    stats = row_stats.of_rows(a["x"].astype(jnp.float32))
    outs = _call(a, 128, "interpret", statistics=stats)
    assert _judge(outs, a, 128) <= 1.0
    with pytest.raises(ValueError, match="statistics"):
        _call(a, 128, "xla", statistics=row_stats.of_rows(jnp.ones((3, 1, 128))))


def test_xla_path_is_the_unfused_ops(rng):
    """Falling back computes what the model computed before the op: the pre-norm dense op,
    `rms_norm` per head, then `layers.rope` (bitwise)."""
    a = _inputs(rng, (2, 3), 128, 2, 1, 128)
    q, k, v = jaxnorm.rms_norm_dense(a["x"], a["scale"], (a["w_q"], a["w_k"], a["w_v"]),
                                     impl="xla")
    positions = jnp.asarray(np.arange(6).reshape(2, 3) * 37)
    inv_freq = layers.rope_frequencies(128, 1e6, None)
    angles = positions.astype(jnp.float32)[..., None] * inv_freq
    a.update(cos=jnp.cos(angles), sin=jnp.sin(angles))
    want = [layers.rope(jaxnorm.rms_norm(h.reshape(2, 3, -1, 128), g, impl="xla"), positions,
                        inv_freq).reshape(2, 3, -1) for h, g in ((q, a["q_scale"]),
                                                                  (k, a["k_scale"]))]
    got = _call(a, 128, "xla")
    for g, w in zip(got, [*want, v]):
        np.testing.assert_array_equal(np.asarray(g, np.float32), np.asarray(w, np.float32))


@pytest.mark.parametrize("impl", ["interpret", "xla"])
def test_a_prompts_table_is_shared_by_the_batch(impl, rng):
    """cos/sin [T, hd/2] (stock RoPE's tables for positions [T]) broadcast over the batch:
    the float64 judge on the broadcast tables, and on the xla path bitwise what
    `layers.rope` computes at positions [T]."""
    lead, hd = (3, 2), 128
    a = _inputs(rng, lead, 128, 2, 1, hd)
    positions = jnp.asarray(rng.permutation(4096)[:2])
    inv_freq = layers.rope_frequencies(hd, 1e6, None)
    angles = positions.astype(jnp.float32)[..., None] * jnp.asarray(inv_freq)
    a.update(cos=jnp.cos(angles), sin=jnp.sin(angles))
    outs = _call(a, hd, impl)
    if impl == "interpret":
        assert_race_free()
    full = dict(a, cos=jnp.broadcast_to(a["cos"], (*lead, hd // 2)),
                sin=jnp.broadcast_to(a["sin"], (*lead, hd // 2)))
    assert _judge(outs, full, hd) <= 1.0
    if impl == "xla":
        q, k, _ = jaxnorm.rms_norm_dense(a["x"], a["scale"], (a["w_q"], a["w_k"], a["w_v"]),
                                         impl="xla")
        want = layers.rope(jaxnorm.rms_norm(k.reshape(*lead, -1, hd), a["k_scale"], impl="xla"),
                           positions, inv_freq).reshape(*lead, -1)
        np.testing.assert_array_equal(np.asarray(outs[1], np.float32),
                                      np.asarray(want, np.float32))
    with pytest.raises(ValueError, match="or broadcast to it"):
        _call(dict(a, cos=jnp.ones((3, 1, hd // 2))[:, :, :-1]), hd, impl)
    with pytest.raises(ValueError, match="or broadcast to it"):
        _call(dict(a, cos=jnp.ones((4, hd // 2))), hd, impl)


def test_kernel_gradient_is_the_xla_formulations(rng):
    a = _inputs(rng, (2, 1), 128, 2, 1, 128)
    cot = [jnp.asarray(rng.standard_normal(s), jnp.float32) for s in ((2, 1, 256), (2, 1, 128),
                                                                       (2, 1, 128))]

    def loss(impl, x, scale, w_q):
        outs = _call(dict(a, x=x, scale=scale, w_q=w_q), 128, impl)
        return sum(jnp.sum(o.astype(jnp.float32) * c) for o, c in zip(outs, cot))

    want = jax.grad(loss, argnums=(1, 2, 3))("xla", a["x"], a["scale"], a["w_q"])
    got = jax.grad(loss, argnums=(1, 2, 3))("interpret", a["x"], a["scale"], a["w_q"])
    for g, w in zip(got, want):
        np.testing.assert_array_equal(np.asarray(g, np.float32), np.asarray(w, np.float32))


def test_prefill_rows_run_the_unfused_ops_under_an_explicit_impl(rng, monkeypatch):
    """Past 64 rows the kernel does not apply: impl='interpret' runs each unfused op with it."""
    seen = []
    real = jaxnorm.ops.rms_norm_dense
    monkeypatch.setattr(jaxnorm.ops, "rms_norm_dense",
                        lambda *a, **k: seen.append(k["impl"]) or real(*a, **k))
    a = _inputs(rng, (2, 40), 128, 2, 1, 128)
    outs = _call(a, 128, "interpret")
    assert seen == ["interpret"]
    assert _judge(outs, a, 128) <= 1.0


def test_automatic_dispatch_on_cpu_falls_back_with_a_reason(rng):
    a = _inputs(rng, (1, 1), 128, 2, 1, 128)
    want = _call(a, 128, "xla")
    got = _call(a, 128, None)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(np.asarray(g, np.float32), np.asarray(w, np.float32))
    assert "Hopper" in dispatch.fallback_reasons()[jaxnorm.attention_input.OP]


TABLE = dict(PROVENANCE={"sms": 132},
             ENTRIES=(((1, 1024, 16, 8, 128), 0.40, 0.95, None),
                      ((1, 2048, 16, 8, 128), 0.60, None, None)),
             ENTRIES_WITHOUT_QK_NORM=(((1, 4096, 32, 8, 128), 0.70, 0.80, None),))


@pytest.fixture
def measured_table(monkeypatch):
    """Dispatch reads TABLE, measured on a GPU of this one's SM count."""
    for name, value in TABLE.items():
        monkeypatch.setattr(mai.decode_attention_measured, name, value)
    monkeypatch.setattr(hardware, "num_sms", lambda: 132)


@pytest.mark.parametrize("m, k, heads, hd, folded, reason", [
    (1, 1024, 16, 128, True, None),  # measured 0.40x
    (1, 1536, 16, 128, True, None),  # nearest within 2x in each
    (2, 1024, 16, 128, True, None),  # M 2: nearest M = 1 within 2x
    (4, 1024, 16, 128, True, "no measured shape"),  # M 4x the nearest measured
    (1, 1024, 16, 128, False, "measured 0.950x stock"),
    (1, 3072, 16, 128, False, "is not measured"),  # nearest: K 2048, unfolded not timed
    (1, 1024, 8, 256, True, "no measured shape"),  # another head_dim
    (1, 8192, 16, 128, True, "no measured shape"),  # K 4x the largest measured
    (65, 1024, 16, 128, True, "serves decode"),
])
def test_the_kernel_runs_automatically_only_where_it_measured_faster(
        monkeypatch, measured_table, m, k, heads, hd, folded, reason):
    monkeypatch.setattr(mai, "SLOWER_IN_THE_MODEL", {})
    s = jax.ShapeDtypeStruct
    x, w_q, w_kv = s((m, k), BF16), s((k, heads * hd), BF16), s((k, heads // 2 * hd), BF16)
    got = mai._not_measured_faster(x, None if folded else s((k,), BF16), w_q, w_kv, w_kv,
                                   s((hd,), BF16), head_dim=hd)
    assert got is None if reason is None else reason in got


@pytest.mark.parametrize("k, reason", [(4096, None), (3072, None),
                                       (1024, "without QK-norm the attention-input kernel "
                                              "has no measured shape")])
def test_without_qk_norm_dispatch_reads_its_own_table(measured_table, k, reason):
    """K = 1024 has a QK-norm entry within 2x (0.40x) but none without QK-norm."""
    s = jax.ShapeDtypeStruct
    x, w_q, w_kv = s((1, k), BF16), s((k, 32 * 128), BF16), s((k, 8 * 128), BF16)
    got = mai._not_measured_faster(x, None, w_q, w_kv, w_kv, None, head_dim=128)
    assert got is None if reason is None else reason in got


@pytest.mark.parametrize("folded, declined", [(True, True), (False, False)])
def test_a_model_measured_slower_declines_where_the_op_measured_faster(
        monkeypatch, folded, declined):
    # Both gain modes measured fast alone; the model measured the folded one slower.
    monkeypatch.setattr(mai.decode_attention_measured, "PROVENANCE", {"sms": 132})
    monkeypatch.setattr(mai.decode_attention_measured, "ENTRIES",
                        (((1, 1024, 16, 8, 128), 0.40, 0.50, None),))
    monkeypatch.setattr(mai, "SLOWER_IN_THE_MODEL",
                        {((1, 1024, 16, 8, 128), "folded"): "step 1.02x stock with it"})
    monkeypatch.setattr(hardware, "num_sms", lambda: 132)
    s = jax.ShapeDtypeStruct
    x, w_q, w_kv = s((1, 1024), BF16), s((1024, 16 * 128), BF16), s((1024, 8 * 128), BF16)
    got = mai._not_measured_faster(x, None if folded else s((1024,), BF16), w_q, w_kv, w_kv,
                                   s((128,), BF16), head_dim=128)
    if declined:
        assert "made the model slower: step 1.02x stock with it" in got
    else:
        assert got is None


@pytest.mark.parametrize("change, reason", [
    (dict(w_q=jnp.zeros((128, 200), BF16)), r"w_q must be \[K=128, heads \* head_dim=128\]"),
    (dict(w_v=jnp.zeros((128, 256), BF16)), "w_k .* and w_v .* must match"),
    (dict(cos=jnp.zeros((2, 1, 32))), r"cos must be \[2, 1, head_dim/2=64\]"),
    (dict(q_scale=jnp.ones(64, BF16)), "q_scale"),
])
def test_bad_input_says_which_argument(change, reason, rng):
    a = _inputs(rng, (2, 1), 128, 2, 1, 128)
    a.update(change)
    with pytest.raises(ValueError, match=reason):
        _call(a, 128, "xla")
    with pytest.raises(ValueError, match="head_dim must be a positive even"):
        _call(_inputs(rng, (2, 1), 128, 2, 1, 128), 127, "xla")


@pytest.mark.parametrize("family", ["llama3", "qwen3"])
def test_a_declined_decode_step_computes_what_the_unfused_layers_did(monkeypatch, family):
    """On a (simulated) H200 where dispatch declines the kernel, a fused model's decode step
    through the op (its unfused composition) gives the logits of the layers it replaced,
    bitwise."""
    from flax import nnx

    from jaxnorm import models

    monkeypatch.setattr(dispatch, "hopper_or_newer", lambda: True)
    monkeypatch.setattr(hardware, "num_sms", lambda: 132)
    monkeypatch.setattr(mai.decode_attention_measured, "ENTRIES", ())
    calls = []
    composition = jaxnorm.attention_input._composition
    monkeypatch.setattr(jaxnorm.attention_input, "_composition",
                        lambda *a, **k: calls.append(1) or composition(*a, **k))
    cfg = getattr(models, family)(vocab_size=256, d_model=256, n_layers=2, n_heads=2,
                                  n_kv_heads=1, head_dim=128, d_ff=512, dtype=BF16,
                                  param_dtype=BF16)
    model = models.Transformer(cfg.replace(fused=True), rngs=nnx.Rngs(0))
    tokens = jnp.asarray(np.random.default_rng(1).integers(0, 256, (2, 6)), jnp.int32)
    _, cache = model(tokens[:, :5], cache=model.init_cache(2, 16))

    def step():
        jax.clear_caches()  # trace afresh: the op, then the layers it replaced
        return np.asarray(model(tokens[:, 5:], start=5, cache=cache)[0], np.float32)

    through_the_op = step()
    assert len(calls) == 2 * cfg.n_layers  # prefill and the step, each layer
    assert "no measured shape" in dispatch.fallback_reasons()[jaxnorm.attention_input.OP]
    monkeypatch.setattr(layers, "fuses_attention_input", lambda cfg: False)
    np.testing.assert_array_equal(step(), through_the_op)


def test_the_op_runs_the_config_its_measured_ratio_is_of(rng, monkeypatch):
    """At decode the kernel runs the nearest measured shape's fastest folded config (here each
    head's K split in a cluster of 2); right against float64 with it."""
    fields = dict(tile_n=64, tile_k=64, split_k=2, stages=2, warpgroups=1, reduction="cluster")
    monkeypatch.setattr(mai.decode_attention_measured, "PROVENANCE", {"sms": 132})
    monkeypatch.setattr(mai.decode_attention_measured, "ENTRIES",
                        (((8, 128, 2, 1, 128), 0.5, 0.6, fields),))
    monkeypatch.setattr(hardware, "num_sms", lambda: 132)
    configs = []
    original = mai.decode_attention_input.decode_attention_input
    monkeypatch.setattr(mai.decode_attention_input, "decode_attention_input",
                        lambda *a, **kw: configs.append(kw["config"]) or original(*a, **kw))
    a = _inputs(rng, (2, 4), 128, 2, 1, 128, folded=True)
    outs = _call(a, 128, "interpret")
    assert_race_free()
    assert [(c.split_k, c.reduction) for c in configs] == [(2, "cluster")]
    assert _judge(outs, a, 128) <= 1.0
