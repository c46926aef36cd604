"""bench/multi_gpu.py --quick on 8 host devices: its rows say what moved, and values hold.

Run by tests/test_sharding.py in a child process.
"""

import json

from test_sharding import requires_host_devices

from bench import multi_gpu

pytestmark = requires_host_devices()


def test_quick_run_writes_rows_with_collectives_and_checked_values(tmp_path):
    rows = multi_gpu.main(["--quick", "--layouts", "tensor", "--out", str(tmp_path)])
    saved = json.loads((tmp_path / "multi-gpu.json").read_text())
    assert saved["devices"] == 8 and len(saved["rows"]) == len(rows)
    assert "jaxnorm / stock" in (tmp_path / "multi-gpu.md").read_text()
    train = [r for r in rows if r["part"] == "train"]
    assert {r["variant"] for r in train} == {"stock", "jaxnorm"}
    assert all(r["loss_matches"] and r["wall_us"] > 0 for r in train)
    assert all(r["collectives"]["bytes"] > 0 for r in train)  # tensor parallel all-reduces
    row = {r["variant"]: r for r in rows if r["part"] == "row_parallel"}
    assert all(r["within_tolerance"] for r in row.values())
    kinds = {name: set(r["collectives"]["by_kind"]) for name, r in row.items()}
    assert kinds == {"row_parallel": {"all-reduce"}, "all_gather_x": {"all-gather"}}
    stats = row["row_parallel"]
    assert stats["statistics_bytes"] == stats["m"] * 4  # RMSNorm: one float per row
    gathered = row["all_gather_x"]["collectives"]["by_kind"]["all-gather"]["bytes"]
    assert gathered >= stats["x_all_gather_bytes"]  # x, and the gain with it
