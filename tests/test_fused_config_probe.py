"""bench/gpu/fused_config_probe.py checks each candidate config's output against XLA's before
timing it (here under the Pallas interpreter: the checks are real, the timings mean nothing)."""

import json

import pytest

from bench import gemm_candidates
from bench.gpu import fused_config_probe
from pallas_kernels import gated_matmul, gemm_config, hardware


@pytest.mark.parametrize("kind, n", [("gated", "128"), ("lazy", "128,64,64")])
def test_probe_checks_every_config_it_times(tmp_path, kind, n):
    out = tmp_path / "probe.json"
    fused_config_probe.main(["--kind", kind, "--rows", "136", "--k", "128", "--n", n,
                             "--max-configs", "2", "--interpret", "--out", str(out)])
    rows = json.loads(out.read_text())["rows"]
    assert len(rows) == 2 and all(r["kind"] == kind for r in rows)
    timed = [r for r in rows if "rel_err" in r]
    assert timed and all(r["status"] == "ok" and r["rel_err"] < 2e-2 for r in timed)


def test_candidates_start_with_the_pick_and_fit_the_smem():
    gated = fused_config_probe.candidates(4096, 1152, 6912)
    assert gated[0] == gated_matmul.gated_config(4096, 1152, 6912)
    assert all(gated_matmul.smem_bytes(c, 2) <= hardware.SMEM_BYTES_PER_CTA for c in gated)
    lazy = fused_config_probe.lazy_candidates(4096, 1152, (1024, 256, 256))
    assert lazy[0] == gemm_config.default_config(4096, 1152, (1024, 256, 256))
    assert all(gemm_candidates.fits(c) for c in lazy[1:])
    assert len(set(lazy)) == len(lazy) and len(set(gated)) == len(gated)
