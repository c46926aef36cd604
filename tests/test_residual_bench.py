"""bench/residual_gemm.py on a CPU: its cases, ledgers and builders (kernels interpreted).

The suite itself needs an H200 (`python -m bench --suite residual-gemm`); here every
builder runs at a small shape and the rows of one case are checked to compute the same
thing, judged by verify against float64.
"""

import numpy as np
import pytest

from bench import residual_gemm as rg
from bench import suites
from bench.impls import EPS, REGISTRY
from kernel_checks import assert_race_free
from verify import residual as vr
from verify.checks import check_outputs


def test_suite_sweeps_both_ops_at_the_issue_shapes():
    cases = suites.select_cases("residual-gemm", suites.Options())
    assert {(c.op, c.m, c.k, c.ns[0]) for c in cases} == {
        (op, 8192, k, n) for op in (rg.RESIDUAL, rg.GIVEN) for k, n in rg.KNS}
    assert len(suites.select_cases("residual-gemm", suites.Options(quick=True))) == 4
    for case in cases:
        fused = case.ledger_ops(fused=True)
        assert fused[0].cost.flops == 8192 * case.ns[0] * (2 * case.k - 1)


@pytest.fixture
def interpreted(monkeypatch):
    monkeypatch.setattr(rg, "KERNEL_IMPL", "interpret")


def test_residual_rows_compute_h(interpreted):
    case = rg.ResidualCase(rg.RESIDUAL, 130, 128, (256,))
    x, w, r = case.inputs(0)
    inputs = dict(x=x, kernel=w, residual=r, bias=None)
    h, stats = REGISTRY[rg.RESIDUAL]["jaxnorm"].build(case)(x, w, r)
    assert_race_free()
    assert max(vr._ratio(j) for j in vr.judge_residual(h, stats, "float32", **inputs)) <= 1.0
    h_xla = REGISTRY[rg.RESIDUAL]["xla"].build(case)(x, w, r)
    judged = vr.judge_residual(h_xla, stats, "float32", **inputs)
    assert vr._ratio(judged[0]) <= 1.0  # the same h as XLA's, within rounding


def test_given_statistics_rows_compute_the_pre_norm_gemm(interpreted):
    case = rg.ResidualCase(rg.GIVEN, 64, 256, (128,))
    h, scale, w, mean, m2 = args = case.inputs(1)
    np.testing.assert_allclose(np.asarray(mean), np.asarray(h, np.float64).mean(1), atol=1e-5)
    inputs = dict(x=h, scale=scale, kernel=w, eps=EPS)
    for name in ("jaxnorm", "jaxnorm-gain-in-mainloop", "xla"):
        y = REGISTRY[rg.GIVEN][name].build(case)(*args)
        assert check_outputs("rms_norm_dense", (y,), **inputs) <= 1.0
    assert REGISTRY[rg.GIVEN]["xla-dot"].gemm_only
