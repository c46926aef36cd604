"""bench/gpu/timeline_probe.py: idle time between a call's kernels, charged to the kernel that
waited, from a synthetic profiler trace (the GPU's trace has the same event form)."""

import pytest

from bench.gpu import timeline_probe


def _trace(kernels, calls):
    meta = [{"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "/device:GPU:0"}},
            {"ph": "M", "name": "thread_name", "pid": 1, "tid": 7, "args": {"name": "Stream #7"}},
            {"ph": "M", "name": "thread_name", "pid": 1, "tid": 8, "args": {"name": "XLA Ops"}},
            {"ph": "M", "name": "process_name", "pid": 2, "args": {"name": "/host:CPU"}}]
    events = [{"ph": "X", "pid": 1, "tid": 7, "name": n, "ts": ts, "dur": d}
              for n, ts, d in kernels]
    events += [{"ph": "X", "pid": 1, "tid": 8, "name": "op " + n, "ts": ts, "dur": d}
               for n, ts, d in kernels]  # an ops line repeating the kernels: not counted
    events += [{"ph": "X", "pid": 2, "tid": 1, "name": n, "ts": ts, "dur": d}
               for n, ts, d in calls]
    return {"traceEvents": meta + events}


def test_gaps_are_charged_to_the_kernel_that_waited():
    kernels = [("fusion_1", 10.0, 5.0), ("anonymous_mosaic_gpu_kernel", 19.0, 10.0),
               ("fusion_2", 29.0, 3.0), ("fusion_3", 30.0, 1.0),  # overlaps: no gap
               ("fusion_4", 40.0, 2.0),
               ("fusion_5", 110.0, 5.0), ("nvjet_x", 121.0, 4.0)]
    calls = [("PjitFunction(fn)", 2.0, 50.0), ("PjitFunction(fn)", 3.0, 20.0),  # nested
             ("PjitFunction(fn)", 100.0, 30.0),
             ("Thunk::Initialize", 4.0, 3.0), ("Thunk::Initialize", 101.0, 20.0),
             ("cuGraphLaunch (CudaGraph:12)", 5.0, 4.0), ("cuGraphLaunch (CudaGraph:3)", 60.0, 1.0)]
    out = timeline_probe.summarize(_trace(kernels, calls))
    assert out["kernel_events"] == 7
    idle = {r["kernel"]: (r["gaps"], r["idle_us"]) for r in out["idle_by_next_kernel"]}
    # 15 -> 19 before the mosaic kernel; 32 -> 40 and 42 -> 110 before fusion; 115 -> 121.
    assert idle == {"anonymous_mosaic_gpu_kernel": (1, 4.0), "fusion": (2, 76.0),
                    "nvjet_x": (1, 6.0)}
    assert out["idle_us_total"] == pytest.approx(86.0)
    first, second = out["calls"]
    assert first == {"kernels": 5, "span_us": 32.0, "busy_us": 20.0, "idle_us": 12.0,
                     "dispatch_to_first_kernel_us": 8.0}
    assert second == {"kernels": 2, "span_us": 15.0, "busy_us": 9.0, "idle_us": 6.0,
                      "dispatch_to_first_kernel_us": 10.0}
    # Host events from each dispatch to its first kernel, clipped there, averaged per call:
    # Initialize 3 us (call 1) and 9 of its 20 (call 2); the dispatches 8 + 7 and 10.
    before = {r["event"]: (r["count"], r["us"]) for r in out["host_before_first_kernel"]}
    assert before == {"Thunk::Initialize": (1.0, 6.0), "PjitFunction(fn)": (1.5, 12.5),
                      "cuGraphLaunch (CudaGraph:12)": (0.5, 2.0)}
    # The first call's launches, from its dispatch (the one at 60 is after its end, 52).
    assert out["first_call_launches"] == [
        {"event": "cuGraphLaunch (CudaGraph:12)", "at_us": 3.0, "us": 4.0}]


def test_kernel_family_drops_numeric_suffixes():
    assert timeline_probe.kernel_family("loop_rsqrt_fusion_16") == "loop_rsqrt_fusion"
    assert timeline_probe.kernel_family("fusion.108") == "fusion"
    assert timeline_probe.kernel_family("nvjet_sm90_tst_176x128_64x5_1x2_h_bz_TNN") == \
        "nvjet_sm90_tst_176x128_64x5_1x2_h_bz_TNN"


def test_main_traces_variant_probes_variants_too(tmp_path):
    """CPU, the tiny model: a variant_probe variant ("gated declined") is traced beside the
    suite's; no GPU, so no kernel events (the code path only)."""
    import json

    timeline_probe.main(["--model", "tiny", "--phase", "prefill", "--calls", "1",
                         "--variants", "stock,gated declined", "--out", str(tmp_path)])
    payload = json.loads((tmp_path / "timeline-tiny-prefill.json").read_text())
    assert list(payload["variants"]) == ["stock", "gated declined"]
    assert all(len(v["wall_us_under_profiler"]) == 1 for v in payload["variants"].values())


def test_main_rejects_a_variant_it_does_not_know(tmp_path):
    with pytest.raises(SystemExit):
        timeline_probe.main(["--model", "tiny", "--variants", "stock,no such variant",
                             "--out", str(tmp_path)])
