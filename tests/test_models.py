"""jaxnorm.models: stock and jaxnorm layers are one network; decoding; training entry points."""

import importlib.util
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from bench import tiny_model
from jaxnorm import models
from verify import tolerances as tol
from verify.references import f64

PRESETS = [models.llama, models.llama3, models.qwen2, models.qwen3, models.gemma, models.gemma2,
           models.gemma3, models.olmo2]


def _tokens(cfg, shape=(3, 17), seed=1):
    return jax.random.randint(jax.random.key(seed), shape, 0, cfg.vocab_size)


@pytest.mark.parametrize("preset", PRESETS, ids=lambda p: p.__name__)
def test_stock_and_jaxnorm_layers_are_one_network(preset):
    """Same tree and values from the same Rngs; same logits and gradients."""
    cfg = preset()
    fused = models.Transformer(cfg.replace(fused=True), rngs=nnx.Rngs(0))
    stock = models.Transformer(cfg.replace(fused=False), rngs=nnx.Rngs(0))
    p_fused, p_stock = models.params_of(fused), models.params_of(stock)
    assert jax.tree.structure(p_fused) == jax.tree.structure(p_stock)
    for a, b in zip(jax.tree.leaves(p_fused), jax.tree.leaves(p_stock)):
        np.testing.assert_array_equal(a, b)

    tokens = _tokens(cfg)
    logits, _ = fused(tokens)
    logits_stock, _ = stock(tokens)
    np.testing.assert_allclose(logits, logits_stock, rtol=1e-5, atol=1e-5)

    # Normwise, with each gradient as its own magnitude (stricter than verify's
    # term-wise magnitude, which a whole model does not expose).
    longest = max(cfg.d_model, cfg.d_ff, cfg.vocab_size, tokens.size)
    g_fused = nnx.to_pure_dict(nnx.grad(models.next_token_loss)(fused, tokens))
    g_stock = nnx.to_pure_dict(nnx.grad(models.next_token_loss)(stock, tokens))
    for a, b in zip(jax.tree.leaves(g_fused), jax.tree.leaves(g_stock)):
        bound = 2 * tol.grad_tolerance(np.abs(f64(b)), np.float32, longest)
        assert np.linalg.norm(f64(a) - f64(b)) <= bound


# Windows shorter than the decoded sequence, so decoding must slide them too.
DECODING = {"llama": models.llama(), "gemma": models.gemma(),
            "gemma2": models.gemma2(n_layers=3, sliding_window=3),
            "gemma3": models.gemma3(n_layers=3, sliding_window=4,
                                    layer_types=("sliding", "full", "sliding")),
            "olmo2": models.olmo2()}


@pytest.mark.parametrize("name", sorted(DECODING))
def test_kv_cache_decoding_equals_recomputation(name):
    model = models.Transformer(DECODING[name], rngs=nnx.Rngs(2))
    prompt = _tokens(model.cfg, (2, 5))
    steps = 6
    tokens = models.greedy_decode(model, prompt, steps)
    assert tokens.shape == (2, steps) and tokens.dtype == jnp.int32
    # Causal: one pass over the decoded sequence predicts each token from its prefix.
    sequence = jnp.concatenate([prompt, tokens], axis=1)
    logits, _ = model(sequence)
    predicted = jnp.argmax(logits[:, prompt.shape[1] - 1:-1], axis=-1)
    np.testing.assert_array_equal(tokens, predicted)

    # Cached logits for a continuation equal the full-sequence logits at those positions.
    cache = model.init_cache(2, 12)
    _, cache = model(sequence[:, :5], cache=cache)
    cached, _ = model(sequence[:, 5:8], start=5, cache=cache)
    full, _ = model(sequence[:, :8])
    np.testing.assert_allclose(cached, full[:, 5:8], rtol=1e-5, atol=1e-5)


def test_training_curves_match():
    cfg = models.llama()
    fused = models.Transformer(cfg, rngs=nnx.Rngs(0))
    stock = models.load_params(fused, fused=False)
    optimizers = [nnx.Optimizer(m, optax.adam(3e-3), wrt=nnx.Param) for m in (fused, stock)]
    losses = []
    for step in range(15):
        batch = _tokens(cfg, (8, 17), seed=step)
        losses.append([float(models.train_step(m, o, batch))
                       for m, o in zip((fused, stock), optimizers)])
    losses = np.asarray(losses)
    assert losses[-1, 0] < losses[0, 0]
    np.testing.assert_allclose(losses[:, 0], losses[:, 1], rtol=1e-4)


def test_tiny_train_step_is_flat_and_jittable():
    results = {}
    for variant in ("stock", "jaxnorm"):
        step, args = tiny_model.tiny_train_step(variant, batch=2, seq_len=8)
        assert all(isinstance(a, jax.Array) for a in args)
        loss, *params = jax.jit(step)(*args)
        assert len(params) == len(args) - 1
        results[variant] = float(loss)
    assert results["stock"] == pytest.approx(results["jaxnorm"], rel=1e-5)
    with pytest.raises(ValueError, match="variant"):
        tiny_model.tiny_train_step("other")


def test_sliding_window_limits_what_a_query_sees():
    """A sliding layer's query at q sees q - W < k <= q: tokens further back change nothing."""
    model = models.Transformer(models.gemma2(n_layers=1, sliding_window=3,
                                             layer_types=("sliding",)), rngs=nnx.Rngs(3))
    tokens = _tokens(model.cfg, (1, 9))
    changed = tokens.at[0, 0].set((tokens[0, 0] + 1) % model.cfg.vocab_size)
    a, _ = model(tokens)
    b, _ = model(changed)
    np.testing.assert_array_equal(a[0, 3:], b[0, 3:])  # position 0 is out of their window
    assert not np.allclose(a[0, :3], b[0, :3])


def test_config_is_checked():
    with pytest.raises(ValueError, match="multiple of n_kv_heads"):
        models.ModelConfig(n_heads=3, n_kv_heads=2)
    with pytest.raises(ValueError, match="even"):
        models.ModelConfig(head_dim=7)
    with pytest.raises(ValueError, match="activation"):
        models.ModelConfig(activation="relu")
    with pytest.raises(ValueError, match="qk_norm_over"):
        models.ModelConfig(qk_norm_over="row")
    with pytest.raises(ValueError, match="layer_types"):
        models.ModelConfig(n_layers=2, layer_types=("full",))
    with pytest.raises(ValueError, match="sliding_window"):
        models.ModelConfig(n_layers=1, layer_types=("sliding",))
    with pytest.raises(ValueError, match="pre_norms, post_norms"):
        models.ModelConfig(pre_norms=False)
    with pytest.raises(ValueError, match="kind"):
        models.RopeScaling("yarn", 2.0)
    with pytest.raises(ValueError, match="high_freq_factor"):
        models.RopeScaling("llama3", 8.0, low_freq_factor=4.0, high_freq_factor=1.0)
    with pytest.raises(ValueError, match="steps"):
        models.greedy_decode(models.Transformer(models.llama(), rngs=nnx.Rngs(0)),
                             jnp.zeros((1, 2), jnp.int32), 0)


def test_demo_quick_run(tmp_path):
    """examples/demo.py --quick: every check it prints passes and the plot is written."""
    path = Path(__file__).parents[1] / "examples" / "demo.py"
    spec = importlib.util.spec_from_file_location("demo", path)
    demo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(demo)
    assert demo.main(["--quick", "--out", str(tmp_path)]) == 0
    assert (tmp_path / "loss_curves.png").stat().st_size > 0


@pytest.mark.parametrize("preset, per_layer", [(models.llama, 0), (models.gemma2, 2),
                                               (models.gemma3, 2), (models.olmo2, 4)],
                         ids=["llama", "gemma2", "gemma3", "olmo2"])
def test_post_sublayer_norms_run_on_the_post_norm_op(monkeypatch, preset, per_layer):
    """Under fused=True each output norm (and OLMo 2's q/k norms) is one dense_rms_norm call;
    stock layers make none."""
    import jaxnorm
    calls = []
    real = jaxnorm.dense_rms_norm
    monkeypatch.setattr(jaxnorm, "dense_rms_norm",
                        lambda *a, **k: calls.append(1) or real(*a, **k))
    tokens = _tokens(preset(), (1, 4))
    for fused, want in ((True, per_layer), (False, 0)):
        calls.clear()
        cfg = preset(fused=fused)
        models.Transformer(cfg, rngs=nnx.Rngs(0))(tokens)
        assert len(calls) == want * cfg.n_layers


def test_gemma2_post_norms_through_the_post_norm_kernel(monkeypatch):
    """The post-norm Mosaic kernel (Pallas interpreter) in a bf16 Gemma 2 block agrees with
    the xla path: the model hands the kernel its sublayer outputs correctly."""
    import jaxnorm
    real = jaxnorm.dense_rms_norm
    cfg = models.gemma2(n_layers=1, d_model=128, head_dim=32, d_ff=256, vocab_size=128,
                        dtype=jnp.bfloat16, impl="xla")
    model = models.Transformer(cfg, rngs=nnx.Rngs(4))
    tokens = _tokens(cfg, (2, 32))
    want, _ = model(tokens)
    calls = []
    monkeypatch.setattr(jaxnorm, "dense_rms_norm", lambda *a, **k: calls.append(1) or real(
        *a, **{**k, "impl": "interpret"}))
    got, _ = model(tokens)
    assert len(calls) == 2
    # Normwise: the two paths round differently in bf16 (the kernel's statistics are of the
    # float32 sum, the xla path's of the stored one), a few ulps of the logits; a wrongly
    # wired sublayer would be off by their whole size.
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert np.linalg.norm(got - want) <= 1e-2 * np.linalg.norm(want)


@pytest.mark.parametrize("family", ["qwen3", "gemma3", "llama3"])
def test_decode_through_the_attention_input_kernel(monkeypatch, family):
    """Decode steps whose attention input is the Mosaic kernel (Pallas interpreter): q/k
    QK-normed (Llama 3: not; its llama3-scaled frequencies) and rotated in its epilogue at
    every step's position, the sliding layers' own rope base (Gemma 3), logits as the xla
    path's and the same greedy tokens."""
    import jaxnorm
    real = jaxnorm.rms_norm_attention_input
    build = getattr(models, family)
    cfg = build(n_layers=2, d_model=128, n_heads=2, n_kv_heads=1, head_dim=128, d_ff=256,
                vocab_size=128, dtype=jnp.bfloat16, impl="xla",
                **({"sliding_window": 4, "layer_types": ("sliding", "full")}
                   if family == "gemma3" else {}))
    model = models.Transformer(cfg, rngs=nnx.Rngs(6))
    prompt = _tokens(cfg, (2, 5))
    want = models.greedy_decode(model, prompt, 4)
    calls = []
    monkeypatch.setattr(jaxnorm, "rms_norm_attention_input", lambda *a, **k: calls.append(
        1) or real(*a, **{**k, "impl": "interpret" if a[0].shape[-2] == 1 else "xla"}))
    jax.clear_caches()  # greedy_decode's jitted step was traced with the real op
    got = models.greedy_decode(model, prompt, 4)
    assert calls  # the decode steps (one row per sequence) ran the kernel
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    _, cache = model(prompt, cache=model.init_cache(2, 16))  # T = 5: the xla path
    got_logits, _ = model(want[:, :1], start=5, cache=cache)
    monkeypatch.setattr(jaxnorm, "rms_norm_attention_input", real)
    want_logits, _ = model(want[:, :1], start=5, cache=cache)
    np.testing.assert_allclose(np.asarray(got_logits, np.float32),
                               np.asarray(want_logits, np.float32), rtol=3e-2, atol=3e-2)


@pytest.mark.parametrize("name", ["llama", "gemma2"])
def test_left_padded_batch_decodes_like_each_prompt_alone(name):
    """Prompts of lengths 6, 3 and 5 left-padded into one batch: each row's greedy tokens
    and last prompt logits equal those of its prompt decoded alone."""
    model = models.Transformer(DECODING[name], rngs=nnx.Rngs(5))
    lengths, width, steps = (6, 3, 5), 6, 7
    rows = [_tokens(model.cfg, (1, n), seed=10 + n)[0] for n in lengths]
    prompt = jnp.stack([jnp.pad(r, (width - len(r), 0), constant_values=7) for r in rows])
    mask = jnp.arange(width)[None, :] >= jnp.asarray([width - n for n in lengths])[:, None]
    batched = models.greedy_decode(model, prompt, steps, prompt_mask=mask)
    for b, row in enumerate(rows):
        alone = models.greedy_decode(model, row[None], steps)
        np.testing.assert_array_equal(batched[b], alone[0])
    padded_logits, _ = model(prompt, pad=jnp.asarray([width - n for n in lengths]))
    alone_logits, _ = model(rows[1][None])
    np.testing.assert_allclose(padded_logits[1, -1], alone_logits[0, -1], rtol=1e-5, atol=1e-5)


def test_rows_stop_at_the_end_of_sequence_id():
    model = models.Transformer(models.llama(), rngs=nnx.Rngs(6))
    prompt = _tokens(model.cfg, (3, 4), seed=8)
    free = np.asarray(models.greedy_decode(model, prompt, 10))
    eos = int(free[0, 3])
    stopped = np.asarray(models.greedy_decode(model, prompt, 10, eos_id=eos))
    for row, out in zip(free, stopped):
        hits = np.flatnonzero(row == eos)
        end = hits[0] + 1 if hits.size else len(row)
        np.testing.assert_array_equal(out[:end], row[:end])
        assert np.all(out[end:] == eos)


def test_prompt_mask_is_checked():
    model = models.Transformer(models.llama(), rngs=nnx.Rngs(0))
    prompt = jnp.zeros((2, 3), jnp.int32)
    with pytest.raises(ValueError, match="left-padded"):
        models.greedy_decode(model, prompt, 2, prompt_mask=jnp.array([[1, 0, 1], [1, 1, 1]]))
    with pytest.raises(ValueError, match="shape"):
        models.greedy_decode(model, prompt, 2, prompt_mask=jnp.ones((2, 4)))
    with pytest.raises(ValueError, match="no tokens"):
        models.greedy_decode(model, prompt, 2, prompt_mask=jnp.array([[0, 0, 0], [1, 1, 1]]))
