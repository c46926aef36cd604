"""bench.kernel_diff: kernels of two variants matched by what they compute, not by name."""

from __future__ import annotations

import json

from bench import kernel_diff as kd

# Two optimized programs as XLA writes them: the same row statistic, numbered and shaped
# differently ([2, 1024, 1152] in one, flattened to [2048, 1152] in the other), and a
# standalone reduction only the second has.
STOCK = """
%fused_reduce.83 (param_0.1: f32[2,1024,1152]) -> f32[2,1024] {
  %param_0.1 = f32[2,1024,1152]{2,1,0} parameter(0)
  %multiply.1 = f32[2,1024,1152]{2,1,0} multiply(%param_0.1, %param_0.1)
  %constant.1 = f32[] constant(0)
  ROOT %reduce.1 = f32[2,1024]{1,0} reduce(%multiply.1, %constant.1), dimensions={2}
}

ENTRY %main.1 (p: f32[2,1024,1152]) -> f32[2,1024] {
  %p = f32[2,1024,1152]{2,1,0} parameter(0)
  ROOT %input_reduce_fusion.83 = f32[2,1024]{1,0} fusion(%p), kind=kInput, calls=%fused_reduce.83
}
"""
JAXNORM = """
%fused_reduce.9 (param_0.7: f32[2048,1152]) -> f32[2048] {
  %param_0.7 = f32[2048,1152]{1,0} parameter(0)
  %multiply.4 = f32[2048,1152]{1,0} multiply(%param_0.7, %param_0.7)
  %constant.2 = f32[] constant(0)
  ROOT %reduce.2 = f32[2048]{0} reduce(%multiply.4, %constant.2), dimensions={1}
}

%fused_convert (param_0.2: bf16[2048,1152]) -> f32[2048] {
  %param_0.2 = bf16[2048,1152]{1,0} parameter(0)
  %convert.3 = f32[2048,1152]{1,0} convert(%param_0.2)
  %constant.3 = f32[] constant(0)
  ROOT %reduce.3 = f32[2048]{0} reduce(%convert.3, %constant.3), dimensions={1}
}

ENTRY %main.2 (p: f32[2048,1152], q: bf16[2048,1152]) -> f32[2048] {
  %p = f32[2048,1152]{1,0} parameter(0)
  %q = bf16[2048,1152]{1,0} parameter(1)
  %input_reduce_fusion.9 = f32[2048]{0} fusion(%p), kind=kInput, calls=%fused_reduce.9
  ROOT %input_convert_reduce_fusion = f32[2048]{0} fusion(%q), kind=kInput, calls=%fused_convert
}
"""


def _write(folder, label, hlo, kernels):
    (folder / f"{label}.hlo.txt").write_text(hlo)
    (folder / f"{label}.kernels.json").write_text(json.dumps({"kernels": kernels}))


def test_same_fusion_under_other_names_and_shapes_is_one_signature(tmp_path):
    _write(tmp_path, "a", STOCK, [["input_reduce_fusion_83", 12, 30.0],
                                  ["nvjet_sm90_tst_128x128", 6, 500.0]])
    _write(tmp_path, "b", JAXNORM, [["input_reduce_fusion_9", 19, 54.5],
                                    ["input_convert_reduce_fusion", 5, 14.0],
                                    ["nvjet_sm90_tst_128x128", 6, 490.0]])
    a, b = kd.load(tmp_path, "a"), kd.load(tmp_path, "b")
    shared = set(a) & set(b)
    assert len(shared) == 2  # the statistic and the library GEMM
    statistic = next(k for k in shared if k[0] == "fusion")
    assert (a[statistic].launches, b[statistic].launches) == (12, 19)
    assert b[statistic].us - a[statistic].us == 54.5 - 30.0
    only_b = set(b) - set(a)
    assert [b[k].names for k in only_b] == [["input_convert_reduce_fusion"]]

    text = kd.report(a, b, ("stock", "jaxnorm"), kd.model_families(1152, 6912, 256, 262144))
    first = text.splitlines()[1]  # the largest |difference| first: the statistic, +24.5
    assert first.split()[0] == "24.5" and "reduce:f32[2,1024]" in first  # as a names it
    rows = {line.split()[0]: line.split() for line in text.splitlines()
            if line.startswith(("model rows", "library gemm"))}
    assert rows["model"][-1] == "38.5"  # 24.5 + 14.0, both over d_model rows
    assert rows["library"][-1] == "-10.0"


def test_a_kernel_the_program_does_not_name_is_kept_by_name():
    program = kd.Program.parse(STOCK)
    assert program.signature("memcpy32_post")[0] == ("?", "memcpy32_post")
    assert program.signature("anonymous_mosaic_gpu_kernel")[0] == (
        "lib", "anonymous_mosaic_gpu_kernel")
