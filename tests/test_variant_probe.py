"""bench/gpu/variant_probe.py measures the model it says: every variant computes stock's loss."""

import jax
import numpy as np
from flax import nnx

from bench import model_suite
from bench.gpu import variant_probe
from jaxnorm import dispatch, models


def test_probe_variants_compute_the_stock_loss_and_swap_what_they_say():
    shape = model_suite.QUICK
    labels = ["stock", "jaxnorm", *variant_probe.EXTRA]
    case = lambda m: model_suite.train_case(m, shape, 1)
    variants = variant_probe.probe_variants(shape, case, labels)
    (state, opt_state, tokens), = case(variants["stock"][0])[1]
    reference = float(variants["stock"][1](state, opt_state, tokens)[0])
    for label in labels[1:]:
        if label == model_suite.BOUNDED:
            continue  # another network: tested below
        model, fn = variants[label]
        loss = float(jax.jit(fn)(*case(model)[1][0])[0])
        np.testing.assert_allclose(loss, reference, rtol=2e-2, err_msg=label)
    q_norm = variants["stock QK-norm"][0].layers[0].attn.q_norm
    assert type(q_norm) is nnx.RMSNorm
    assert type(variants["jaxnorm"][0].layers[0].attn.q_norm) is not nnx.RMSNorm


def test_kernels_declined_patches_dispatch_only_while_tracing():
    seen = []
    probe = variant_probe.traced_with(lambda: seen.append(dispatch.hopper_or_newer()),
                                      lambda: variant_probe._patched(
                                          dispatch, "hopper_or_newer", lambda: True))
    probe()
    assert seen == [True]
    assert dispatch.hopper_or_newer() is False  # this host has no Hopper GPU


def test_norm_backward_kernel_variant_takes_the_kernel_only_while_tracing():
    import jax.numpy as jnp
    from pallas_kernels import hardware

    x = jnp.ones((4096, 2048), jnp.bfloat16)

    def choice() -> str:
        with jax.sharding.use_abstract_mesh(hardware.h200_mesh()):
            return dispatch.resolve("rms_norm_backward", None, x, x, None, eps=1e-6,
                                    scale_offset=0.0)

    seen = []
    variant_probe.traced_with(lambda: seen.append(choice()),
                              lambda: variant_probe._kernel_everywhere("rms_norm_backward"))()
    assert seen == ["mosaic"]
    assert choice() == "xla"  # the measured table (empty) decides again


def test_residual_gemm_variant_takes_the_kernel_only_while_tracing():
    import jax.numpy as jnp
    from pallas_kernels import hardware

    x, w = jnp.ones((2048, 1024), jnp.bfloat16), jnp.ones((1024, 1024), jnp.bfloat16)

    def choice() -> str:
        with jax.sharding.use_abstract_mesh(hardware.h200_mesh()):
            return dispatch.resolve("residual_dense", None, x, w, None, x)

    seen = []
    variant_probe.traced_with(lambda: seen.append(choice()),
                              lambda: variant_probe._kernel_everywhere("residual_dense"))()
    assert seen == ["mosaic"]
    assert choice() == "xla"


def test_post_norm_kernel_variant_takes_gemmas_post_norms_only_while_tracing():
    """Gemma-3-1B's post-attention norm, r + Norm(x @ W) at 4096 x 1024 x 1152: declined as
    unmeasured, taken (a grid group of 9 CTAs a row) under the variant."""
    import jax.numpy as jnp
    from pallas_kernels import hardware

    x, w = jnp.ones((4096, 1024), jnp.bfloat16), jnp.ones((1024, 1152), jnp.bfloat16)
    g, r = jnp.ones((1152,), jnp.bfloat16), jnp.ones((4096, 1152), jnp.bfloat16)

    def choice() -> str:
        with jax.sharding.use_abstract_mesh(hardware.h200_mesh()):
            return dispatch.resolve("dense_rms_norm", None, x, w, None, g, r, eps=1e-6,
                                    pre_norm_sum=False, residual_after=True)

    seen = []
    variant_probe.traced_with(lambda: seen.append(choice()),
                              lambda: variant_probe._kernel_everywhere("dense_rms_norm"))()
    assert seen == ["mosaic"]
    assert choice() == "xla"


def test_scaled_norm_free_keeps_every_norms_output_at_unit_scale():
    shape = model_suite.QUICK
    stock = models.Transformer(shape.cfg.replace(fused=False), rngs=nnx.Rngs(5))
    tokens = model_suite._tokens(jax.random.key(2), 2, 16, shape.cfg.vocab_size)
    scaled = model_suite.with_scaled_norms(models.load_params(stock, fused=False), tokens)
    assert not any(isinstance(m, nnx.RMSNorm) for _, m in nnx.iter_modules(scaled))
    outputs = []
    original = model_suite.ConstantScale.__call__

    def recording(self, x):
        y = original(self, x)
        outputs.append(float(jax.numpy.mean(jax.numpy.square(y.astype("float32")))))
        return y

    model_suite.ConstantScale.__call__ = recording
    try:
        logits, _ = scaled(tokens)
    finally:
        model_suite.ConstantScale.__call__ = original
    n_norms = sum(isinstance(m, nnx.RMSNorm) for _, m in nnx.iter_modules(stock))
    assert len(outputs) == n_norms
    np.testing.assert_allclose(outputs, 1.0, rtol=2e-2)
    assert np.isfinite(np.asarray(logits, np.float32)).all()


def test_gain_in_the_mainloop_variant_moves_the_gain_into_the_kernel():
    """Under the variant the lazy GEMM takes its gain in the mainloop (interpreter): the same
    products as scaling outside, one column-gain vector among the kernel's inputs."""
    import jax.numpy as jnp
    from pallas_kernels import lazy_norm_matmul

    keys = jax.random.split(jax.random.key(3), 3)
    x = jax.random.normal(keys[0], (136, 128), jnp.bfloat16)
    w = (jax.random.normal(keys[1], (128, 128)) / 12).astype(jnp.bfloat16)
    gain = jax.random.uniform(keys[2], (128,), jnp.float32, 0.5, 1.5).astype(jnp.bfloat16)
    call = lambda: lazy_norm_matmul.lazy_rms_matmul(x, [w], scale=gain, interpret=True)[0]
    outside = call()
    seen = []
    original = lazy_norm_matmul._run
    with variant_probe._patched(lazy_norm_matmul, "_run",
                                lambda *a, **k: seen.append(k["column_gain"]) or original(*a, **k)):
        with variant_probe._gain_in_mainloop():
            inside = call()
        call()
    assert seen[0] is not None and seen[1] is None  # only under the variant
    want = np.asarray(outside, np.float32)
    np.testing.assert_allclose(np.asarray(inside, np.float32), want,
                               atol=2e-2 * np.abs(want).max())


def test_summary_pairs_each_wall_sample_with_stocks_from_its_pass():
    rows = [{"round": 1, "variant": "stock", "best_us": 100, "wall_samples_us": [10, 20, 30]},
            {"round": 1, "variant": "jaxnorm", "best_us": 90, "wall_samples_us": [11, 18, 60]}]
    summary = variant_probe.summarize_rows(rows, ["stock", "jaxnorm"], 1)
    assert summary["jaxnorm"] == {"vs_stock": [0.9], "median": 0.9,
                                  "wall_paired_vs_stock": [1.1]}  # median of 1.1, 0.9, 2.0
    assert summary["stock"]["wall_paired_vs_stock"] == [1.0]


def test_main_writes_every_rounds_rows_with_their_wall_samples(tmp_path):
    """CPU, the tiny model: the code path (timings mean nothing)."""
    import json

    variant_probe.main(["--model", "tiny", "--phase", "prefill", "--rounds", "2", "--repeats",
                        "2", "--variants", "stock,jaxnorm", "--out", str(tmp_path)])
    payload = json.loads((tmp_path / "probe-tiny-prefill.json").read_text())
    assert [(r["round"], r["variant"]) for r in payload["rows"]] == [
        (1, "stock"), (1, "jaxnorm"), (2, "jaxnorm"), (2, "stock")]
    assert all(len(r["wall_samples_us"]) == 2 for r in payload["rows"])
    assert len(payload["summary"]["jaxnorm"]["wall_paired_vs_stock"]) == 2


def test_statistics_kernel_in_training_variant_runs_the_kernel_forward_under_grad(monkeypatch):
    """Under the variant a training step's forward traces the given-statistics kernel
    (interpreted here), which jaxnorm's default replaces by stock's forward; the gradient is
    the same VJP of stock's graph either way (against float64 in tests/test_residual.py)."""
    import jax.numpy as jnp
    import jaxnorm
    from graph_checks import primitive_counts

    monkeypatch.setattr(dispatch, "hopper_or_newer", lambda: True)
    resolve = dispatch.resolve
    monkeypatch.setattr(dispatch, "resolve", lambda op, impl, *a, **k: (
        "interpret" if (c := resolve(op, impl, *a, **k)) == "mosaic" else c))
    keys = jax.random.split(jax.random.key(5), 4)
    h = jax.random.normal(keys[0], (1024, 128), jnp.bfloat16)
    w = (jax.random.normal(keys[1], (128, 256)) / 11).astype(jnp.bfloat16)
    scale = jax.random.uniform(keys[2], (128,), jnp.float32, 0.5, 1.5)
    _, stats = jaxnorm.residual_dense(h, jnp.eye(128, dtype=jnp.bfloat16), jnp.zeros_like(h))
    dy = jax.random.normal(keys[3], (1024, 256), jnp.float32)
    loss = lambda h: jnp.sum(dy * jaxnorm.rms_norm_dense(h, scale, w, statistics=stats))
    grad = jax.value_and_grad(loss)
    # A new function per trace (JAX caches traces by function, not by what dispatch says);
    # an interpreted Mosaic kernel traces as one `mpmd_map`.
    kernels = lambda: primitive_counts(lambda h: grad(h), h)["mpmd_map"]
    assert kernels() == 0
    with variant_probe._statistics_kernel_in_training():
        assert kernels() == 1
        kernel_dh = grad(h)[1]
    np.testing.assert_array_equal(np.asarray(kernel_dh), np.asarray(grad(h)[1]))  # one VJP


def test_an_op_declined_variant_keeps_that_op_on_xla_only_while_tracing(monkeypatch):
    """"gated declined": the gated MLP input answers xla under the variant (its kernel at
    4096 rows otherwise, Hopper faked) and chooses as before once it ends."""
    import jax.numpy as jnp

    monkeypatch.setattr(dispatch, "hopper_or_newer", lambda: True)
    x, w = jnp.ones((4096, 1024), jnp.bfloat16), jnp.ones((1024, 4096), jnp.bfloat16)
    gated = lambda: dispatch.decide("rms_norm_gated_dense", x, None, w, w, None, None, None,
                                    activation="silu", eps=1e-6, scale_offset=0.0)
    before = gated()
    assert before == ("mosaic", None)
    with variant_probe._declined(variant_probe.DECLINED_OPS["gated declined"]):
        assert gated() == ("xla", "declined by bench/gpu/variant_probe.py")
    assert gated() == before


def test_gated_kernel_variant_takes_the_geglu_kernel_dispatch_declines(monkeypatch):
    """"gated kernel": at 4096 rows with GeGLU (Gemma) automatic dispatch answers xla, and
    under the variant the kernel; silu at the same rows takes the kernel either way."""
    import jax.numpy as jnp

    monkeypatch.setattr(dispatch, "hopper_or_newer", lambda: True)
    x, w = jnp.ones((4096, 1024), jnp.bfloat16), jnp.ones((1024, 4096), jnp.bfloat16)
    gated = lambda act: dispatch.decide("rms_norm_gated_dense", x, None, w, w, None, None,
                                        None, activation=act, eps=1e-6, scale_offset=0.0)
    impl, reason = gated("gelu_tanh")
    assert impl == "xla" and "'gelu_tanh'" in reason and "docs/measurements.md" in reason
    assert gated("silu") == ("mosaic", None)
    with variant_probe._kernel_everywhere("rms_norm_gated_dense"):
        assert gated("gelu_tanh") == ("mosaic", None)
    assert gated("gelu_tanh")[0] == "xla"
