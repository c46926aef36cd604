"""`python -m verify` prints its table and its exit code says pass or fail."""

import jaxnorm
from verify.__main__ import main


def test_report_passes_and_prints_table(capsys):
    code = main(["--examples", "2", "--ops", "rms_norm", "--max-k", "256"])
    out = capsys.readouterr().out
    assert code == 0
    assert "identity: lazy LayerNorm" in out and "grad rms_norm" in out and "bfloat16" in out


def test_report_fails_on_a_wrong_implementation(monkeypatch, capsys):
    real = jaxnorm.layer_norm
    monkeypatch.setattr(jaxnorm, "layer_norm", lambda *a, **k: real(*a, **k) * 1.01)
    code = main(["--examples", "2", "--ops", "layer_norm", "--max-k", "64", "--no-identities"])
    out = capsys.readouterr().out
    assert code == 1 and "FAIL layer_norm" in out


def test_report_runs_the_kernels_under_the_interpreter(capsys):
    """The same properties, impl="interpret": the Mosaic kernel with race detection."""
    code = main(["--impl", "interpret", "--examples", "2", "--ops", "rms_norm_dense",
                 "--max-k", "128", "--no-identities"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "rms_norm_dense" in out and "NOT RUN" not in out
