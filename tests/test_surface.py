"""The user's surface: the doctor, fallback reasons, scalar and bad-input handling, CLI help."""

import argparse
import re

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import jaxnorm
from jaxnorm import dispatch, doctor
from verify import check_op
from verify import references as ref
from verify import tolerances as tol

OPS = doctor.OPS


def _rows(m, k, seed=0, dtype=np.float32):
    return np.random.default_rng(seed).standard_normal((m, k)).astype(dtype)


# ------------------------------------------------------------------ fallback reasons


def test_fallback_reasons_name_the_device_after_automatic_calls_on_cpu():
    """On this CPU every impl=None call runs xla; fallback_reasons says why, per op."""
    x, w = _rows(8, 64), _rows(64, 32, seed=1)
    calls = {
        "rms_norm": lambda: jaxnorm.rms_norm(x),
        "layer_norm": lambda: jaxnorm.layer_norm(x),
        "rms_norm_dense": lambda: jaxnorm.rms_norm_dense(x, None, w),
        "layer_norm_dense": lambda: jaxnorm.layer_norm_dense(x, None, None, w),
        "dense_rms_norm": lambda: jaxnorm.dense_rms_norm(x, w, None, None),
        "dense_layer_norm": lambda: jaxnorm.dense_layer_norm(x, w, None, None, None),
    }
    for op, run in calls.items():
        run()
        reason = jaxnorm.fallback_reasons()[op]
        assert "the default device is cpu" in reason and "compute capability >= 9.0" in reason
        assert dispatch.last_automatic_choice(op) == ("xla", reason)


def test_fallback_reasons_are_a_copy():
    jaxnorm.rms_norm(_rows(2, 8))
    jaxnorm.fallback_reasons().clear()
    assert "rms_norm" in jaxnorm.fallback_reasons()


# ------------------------------------------------------------------ eps and bad inputs


@pytest.mark.parametrize("eps", [np.float64(1e-2), np.float32(1e-2), jnp.float32(1e-2),
                                 jnp.asarray(1e-2, jnp.bfloat16), np.array(1e-2), np.int32(0)],
                         ids=["np.float64", "np.float32", "jnp.float32", "jax-bf16-0d",
                              "np-0d", "np.int32"])
def test_eps_as_numpy_or_jax_scalar_equals_the_python_float(eps):
    """A real 0-d eps acts as float(eps): the same output as the Python float, bit for bit,
    and that output is within verify's tolerance of the float64 reference at float(eps)."""
    x, scale = _rows(6, 40, seed=2), _rows(1, 40, seed=3)[0]
    y = jaxnorm.rms_norm(x, scale, eps=eps, scale_offset=np.float32(1.0))
    np.testing.assert_array_equal(y, jaxnorm.rms_norm(x, scale, eps=float(eps), scale_offset=1.0))
    assert check_op("rms_norm", "xla", x=x, scale=scale, eps=float(eps), scale_offset=1.0) <= 1.0
    want = ref.rms_norm(x, scale, eps=float(eps), scale_offset=1.0)
    assert np.all(np.abs(np.asarray(y, np.float64) - want) <= tol.norm_tolerance(want, want,
                                                                                  x.dtype))


def test_eps_scalar_in_the_dense_ops_and_the_gradient():
    x, w = _rows(5, 32, seed=4), _rows(32, 16, seed=5)
    eps = jnp.float32(1e-3)
    assert check_op("layer_norm_dense", "xla", x=x, scale=None, kernel=w, eps=float(eps)) <= 1.0
    got = jaxnorm.layer_norm_dense(x, None, None, w, eps=eps)
    np.testing.assert_array_equal(got, jaxnorm.layer_norm_dense(x, None, None, w, eps=float(eps)))
    y, h = jaxnorm.dense_rms_norm(x, w, None, None, eps=np.float64(1e-3), residual=_rows(5, 16))
    y_ref, _ = ref.dense_rms_norm(x, w, None, None, eps=1e-3, residual=_rows(5, 16))
    np.testing.assert_allclose(y, y_ref, rtol=1e-4, atol=1e-4)
    grad = jax.grad(lambda a: jnp.sum(jaxnorm.rms_norm(a, eps=eps) ** 2))(x)
    assert np.all(np.isfinite(grad))


@pytest.mark.parametrize("eps, match", [
    ("1e-6", "eps must be a real scalar"), (np.ones(2), r"eps must be a real scalar.*\(2,\)"),
    (True, "eps must be a real scalar"), (1j, "eps must be a real scalar"),
])
def test_eps_that_is_not_a_real_scalar_is_refused_by_name(eps, match):
    with pytest.raises(TypeError, match=match):
        jaxnorm.rms_norm(_rows(2, 8), eps=eps)


def test_traced_eps_is_a_clear_error():
    with pytest.raises(TypeError, match="eps must be concrete.*static_argnames='eps'"):
        jax.jit(lambda x, e: jaxnorm.rms_norm(x, eps=e))(_rows(2, 8), 1e-5)
    # Closing over it works (as would a static argument):
    x, eps = _rows(2, 8), jnp.float32(1e-2)
    y = jax.jit(lambda x: jaxnorm.rms_norm(x, eps=eps))(x)
    want = ref.rms_norm(x, eps=float(eps))
    assert np.all(np.abs(np.asarray(y, np.float64) - want) <= tol.norm_tolerance(want, want,
                                                                                  x.dtype))


def test_bad_scale_offset_is_refused_by_name():
    with pytest.raises(TypeError, match="scale_offset must be a real scalar"):
        jaxnorm.layer_norm(_rows(2, 8), scale_offset=np.ones(3))
    with pytest.raises(ValueError, match="scale_offset must be finite"):
        jaxnorm.layer_norm(_rows(2, 8), scale_offset=float("inf"))


X8, W = _rows(2, 8), _rows(8, 4, seed=1)


@pytest.mark.parametrize("call, name", [
    (lambda: jaxnorm.rms_norm([[1.0, 2.0], [3.0, 4.0]]), "x"),
    (lambda: jaxnorm.layer_norm(X8, [1.0] * 8), "scale"),
    (lambda: jaxnorm.layer_norm(X8, None, [0.0] * 8), "bias"),
    (lambda: jaxnorm.rms_norm_dense(X8.tolist(), None, W), "x"),
    (lambda: jaxnorm.rms_norm_dense(X8, None, W.tolist()), r"kernel\[0\]"),
    (lambda: jaxnorm.dense_rms_norm(X8, W, None, None, residual=[[0.0] * 4] * 2), "residual"),
    (lambda: jaxnorm.dense_layer_norm(X8, W, None, None, (0.0,) * 4), "norm_bias"),
])
def test_a_python_list_is_refused_naming_the_argument(call, name):
    with pytest.raises(TypeError, match=rf"^{name} must be an array .*got (list|tuple)"):
        call()


# ------------------------------------------------------------------ the doctor


def test_doctor_prints_versions_devices_and_a_decision_per_op(capsys):
    assert doctor.main(["--shape", "32x256x128+64", "--shape", "16x128x256"]) == 0
    out = capsys.readouterr().out
    assert re.search(rf"jax {re.escape(jax.__version__)}\b", out)
    assert "jaxlib " in out and "0: cpu" in out
    assert "Mosaic GPU kernels: cannot run here: the default device is cpu" in out
    for shape in ("32x256x128+64", "16x128x256", *(str(s) for s in doctor.MODEL_SHAPES)):
        block = out.split(f"  {shape}  (")[1]
        block = block[:m.start()] if (m := re.search(r"\n  \S", block)) else block
        for op in OPS:
            line = re.search(rf"^\s+{op}\s+(.*)$", block, re.M)
            assert line, (shape, op)
            several = "+" in shape and op.startswith("dense_")
            assert line.group(1).startswith("n/a" if several else "xla"), (shape, op, line)
        backward = re.search(r"^\s+rms_norm backward\s+xla\s+this device cannot run", block,
                             re.M)
        assert backward, (shape, block)


def test_doctor_reports_what_dispatch_decides(monkeypatch):
    """As on a Hopper GPU (the device check patched, as tests/test_ops_xla.py does): the
    doctor's pick and reason per op are those a real impl=None call records."""
    monkeypatch.setattr(dispatch, "hopper_or_newer", lambda: True)
    bf16 = ml_dtypes.bfloat16
    shape = doctor.Shape(16, 256, (128,))
    x, w = _rows(16, 256, dtype=bf16), _rows(256, 128, seed=1, dtype=bf16)
    r = _rows(16, 128, seed=2, dtype=bf16)
    calls = {
        "rms_norm": lambda: jaxnorm.rms_norm(x, np.ones(256, np.float32)),
        "layer_norm": lambda: jaxnorm.layer_norm(x, np.ones(256, np.float32)),
        "rms_norm_dense": lambda: jaxnorm.rms_norm_dense(x, np.ones(256, np.float32), [w]),
        "layer_norm_dense": lambda: jaxnorm.layer_norm_dense(x, None, None, [w]),
        "dense_rms_norm": lambda: jaxnorm.dense_rms_norm(x, w, None, None, residual=r),
        "dense_layer_norm": lambda: jaxnorm.dense_layer_norm(x, w, None, None, None,
                                                             residual=r),
    }
    for op, run in calls.items():
        impl, reason = doctor.automatic_choice(op, shape, jnp.bfloat16)
        monkeypatch.setattr(dispatch, "_CHOICES", {})  # the real call records afresh
        run()
        assert (impl, reason) == dispatch.last_automatic_choice(op)
        assert impl == "xla" and "measured" in reason, (op, reason)  # 16 rows: declined
    # A training step's norm backward: no GPU measurement in the table yet.
    impl, reason = doctor.automatic_backward_choice(shape, jnp.bfloat16)
    assert impl == "xla" and "no measured shape within 2x of 16x256" in reason, reason


def test_doctor_kernel_check_judges_each_op_under_the_interpreter():
    from pallas_kernels.interpreter_flags import use_interpreter_safe_xla_flags

    use_interpreter_safe_xla_flags()
    results = doctor.kernel_check("interpret", ops=("rms_norm", "rms_norm_dense"))
    assert all(v.startswith("ok (worst error/tolerance") for v in results.values()), results


@pytest.mark.parametrize("text", ["4096x4096", "axbxc", "0x64x64", "8x8x"])
def test_doctor_refuses_a_malformed_shape(text):
    with pytest.raises(argparse.ArgumentTypeError, match="--shape"):
        doctor.parse_shape(text)


# ------------------------------------------------------------------ CLI help


def _flags(parser: argparse.ArgumentParser) -> dict[str, str | None]:
    return {action.option_strings[-1]: action.help for action in parser._actions
            if action.option_strings and action.option_strings[-1] != "--help"}


def _parser_of(main, monkeypatch) -> argparse.ArgumentParser:
    """The ArgumentParser `main` builds, caught when it parses."""
    caught = {}

    def catch(self, *args, **kwargs):
        caught["parser"] = self
        raise SystemExit(0)

    with monkeypatch.context() as patch:
        patch.setattr(argparse.ArgumentParser, "parse_args", catch)
        with pytest.raises(SystemExit):
            main([])
    return caught["parser"]


@pytest.mark.parametrize("module", ["verify.__main__", "bench.__main__", "jaxnorm.doctor"])
def test_every_cli_flag_has_help_text_shown_by_help(module, capsys, monkeypatch):
    import importlib

    entry = importlib.import_module(module).main
    flags = _flags(_parser_of(entry, monkeypatch))
    assert flags and all(help_text for help_text in flags.values()), flags
    with pytest.raises(SystemExit):
        entry(["--help"])
    shown = capsys.readouterr().out
    for flag in flags:
        assert flag in shown, flag


def test_bench_help_says_where_out_goes(capsys):
    from bench.__main__ import parse_args

    with pytest.raises(SystemExit):
        parse_args(["--help"])
    shown = " ".join(capsys.readouterr().out.split())
    assert "outside the tracked tree" in shown and "bench/results/<name> to publish" in shown


def test_verify_help_explains_worst_err_tol(capsys):
    from verify.__main__ import main

    with pytest.raises(SystemExit):
        main(["--help"])
    assert '"worst err/tol" is the largest |output - float64 reference| / tolerance' in " ".join(
        capsys.readouterr().out.split())


# ------------------------------------------------------------------ plots and test progress


def test_hidden_plot_draws_from_the_rows(tmp_path):
    from bench import report

    def row(impl, us, case="llama qkv"):
        return {"status": "ok", "label": case, "shape": "1x64x64", "impl": impl, "best_us": us}

    rows = [row("xla", 50.0), row("xla-dot", 47.0), row("jaxnorm", 95.0)]
    hidden = report.hidden_fractions(rows)
    assert hidden == {"llama qkv 1x64x64": pytest.approx((50.0 - 95.0) / 3.0)}
    report.plot_hidden(rows, tmp_path / "x-hidden.png")
    assert (tmp_path / "x-hidden.png").stat().st_size > 0
    assert "t_xla - t_xla_dot" in report.HIDDEN_CAPTION


def test_make_test_progress_names_each_file(tmp_path):
    """tests/file_progress.py under xdist (as `make test` runs it): one line per file."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    for name, body in (("test_one.py", "def test_a():\n    pass\n\ndef test_b():\n    pass\n"),
                       ("test_two.py", "import pytest\n\n@pytest.mark.skip\ndef test_c():\n"
                                       "    pass\n")):
        (tmp_path / name).write_text(body)
    here = Path(__file__).parent
    env = {**os.environ, "PYTHONPATH": str(here)}
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-n", "2", "--dist", "loadfile", "-p",
         "file_progress", "-p", "no:cacheprovider", str(tmp_path)],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300).stdout
    assert re.search(r"^test_one\.py: 2 passed in [\d.]+ s \[gw\d\]$", out, re.M), out
    assert re.search(r"^test_two\.py: 1 skipped in [\d.]+ s \[gw\d\]$", out, re.M), out


def test_import_leaves_the_mosaic_kernels_unloaded():
    """`import jaxnorm` loads no Mosaic GPU kernel module: dispatch imports them the first
    time a kernel is asked for, so the xla path (CPU, other GPUs) never pays for them."""
    import subprocess
    import sys
    from pathlib import Path

    probe = ("import sys, jaxnorm; print(sorted(m for m in sys.modules if m in "
             "('jax.experimental.pallas.mosaic_gpu', 'pallas_kernels.rms_norm_backward')))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         cwd=Path(__file__).resolve().parents[1], timeout=300, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


# ------------------------------------------------------------------ docs/guide.md


def test_guide_snippets_run():
    from pathlib import Path

    guide = Path(__file__).resolve().parents[1] / "docs" / "guide.md"
    blocks = re.findall(r"```python\n(.*?)```", guide.read_text(), re.S)
    assert len(blocks) >= 5
    namespace: dict = {}
    exec(compile("\n".join(blocks), str(guide), "exec"), namespace)
    assert [a.shape[-1] for a in (namespace["q"], namespace["k"])] == [64, 64]
    assert [a.shape for a in (namespace["q_rot"], namespace["k_rot"], namespace["v_rot"])] == [
        (2, 16, 256), (2, 16, 128), (2, 16, 128)]
    assert namespace["y_dot"].shape == (4, 64)


def test_forward_mode_raises_and_the_transposed_vjp_is_the_jvp():
    """The guide's claims: jax.jvp fails on every op; the transpose of the VJP is the JVP,
    checked against verify's float64 VJP through <J t, c> = <t, J^T c>."""
    from verify import gradients

    x, w, t = _rows(4, 32, seed=7), _rows(32, 8, seed=8), _rows(4, 32, seed=9)
    c = _rows(4, 8, seed=10)
    f = lambda a: jaxnorm.rms_norm_dense(a, None, w, impl="xla")  # noqa: E731
    with pytest.raises(TypeError, match="forward-mode autodiff"):
        jax.jvp(f, (x,), (t,))
    y, pullback = jax.vjp(f, x)
    (y_dot,) = jax.linear_transpose(lambda ct: pullback(ct)[0], y)(jnp.asarray(t))
    dx64 = gradients.norm_dense_vjp("rms", x, None, None, w, None, c, eps=1e-6)["x"]
    lhs, rhs = float(np.sum(np.asarray(y_dot, np.float64) * c)), float(np.sum(t * dx64))
    assert abs(lhs - rhs) <= 1e-5 * (np.sum(np.abs(t * dx64)) + 1.0), (lhs, rhs)
