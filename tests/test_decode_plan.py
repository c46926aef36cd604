"""bench.decode_plan: a decode step lowered for "cuda" on CPU, dispatched as on the H200."""

import jax
import jax.numpy as jnp
from jax.sharding import AbstractDevice, AbstractMesh

import jaxnorm
from bench import decode_plan, model_suite
from jaxnorm import dispatch

_LOWERED = '''
    %1 = stablehlo.custom_call @mosaic_gpu_v2(%0) {api_version = 4 : i32} : (tensor<1xf32>) -> tensor<1xf32> loc(#loc9)
    %2 = stablehlo.custom_call @xla_ffi_python_gpu_callback(%1) : (tensor<1xf32>) -> tensor<1xf32> loc(#loc3)
    %3 = "stablehlo.outfeed"(%2) : (tensor<1xf32>) -> !stablehlo.token loc(#loc3)
#loc3 = loc("x")
#loc7 = loc("decode_gated"(loc("/r/pallas_kernels/decode_gated.py":1:1)))
#loc8 = loc("_decode"(loc("/r/jaxnorm/backends/mosaic_gated.py":2:2)))
#loc6 = loc("rms_norm_gated_dense"(loc("/r/jaxnorm/backends/mosaic_gated.py":3:3)))
#loc9 = loc("jit(fn)/pallas_call"(loc(callsite(#loc7 at loc(callsite(#loc8 at #loc6))))))
'''


def test_read_lowered_names_each_launch_and_flags_host_work():
    read = decode_plan.read_lowered(_LOWERED)
    assert read["mosaic"] == {"rms_norm_gated_dense (decode_gated)": 1}
    assert read["other_custom_calls"] == {"xla_ffi_python_gpu_callback": 1}
    assert read["host_work"] == ["outfeed", "xla_ffi_python_gpu_callback"]


def test_an_abstract_mesh_of_a_hopper_gpu_plans_for_it():
    assert not dispatch.hopper_or_newer()  # the CPU host itself
    for kind, hopper in (("H200", True), ("NVIDIA H100 80GB HBM3", True), ("A100", False)):
        mesh = AbstractMesh((), (), abstract_device=AbstractDevice(
            device_kind=kind, platform="gpu", num_cores=None))
        with jax.sharding.use_abstract_mesh(mesh):
            assert dispatch.hopper_or_newer() is hopper, kind


def test_recorded_choices_hold_only_the_decisions_inside_the_block():
    jaxnorm.rms_norm(jnp.ones((4, 8)))  # recorded globally, before the block
    with dispatch.recorded_choices() as choices:
        assert choices == {}
        jaxnorm.layer_norm(jnp.ones((4, 8)))
        jaxnorm.layer_norm(jnp.ones((8, 8)))  # the same decision: recorded once
    assert list(choices) == ["layer_norm"] and len(choices["layer_norm"]) == 1
    assert choices["layer_norm"][0][0] == "xla"
    assert "rms_norm" in dispatch.fallback_reasons()


def test_qwen3_decode_at_batch_1_runs_four_mosaic_launches_a_layer_and_nothing_on_the_host():
    """As the H200 model suite measured it: attention input, gated MLP input, and the o and
    down projections' residual GEMMs on the decode kernels; no host work in either model."""
    plan = decode_plan.plan(model_suite.SHAPES["qwen3-0.6b"], 1)
    layers = plan["layers"]
    assert plan["mosaic"] == {"rms_norm_attention_input (decode_attention_input)": layers,
                              "rms_norm_gated_dense (decode_gated)": layers,
                              "residual_dense (decode_matmul)": 2 * layers}
    assert plan["mosaic_per_layer"] == 4
    assert plan["host_work"] == {"jaxnorm": [], "stock": []}
    assert plan["other_custom_calls"]["stock"] == {}


def test_llama3_8b_decode_at_batch_8_runs_no_launch_on_the_decode_gemm():
    """At M = 8 no launch of Llama-3-8B's measured faster than cuBLAS as a model runs it:
    q/k/v 1.04x XLA's merged GEMM alone (0.821x with the output slices a model fuses away),
    o, down and the head 1.09, 1.04, 1.01x; so every op is on XLA with its measured reason
    and none for want of one."""
    plan = decode_plan.plan(model_suite.SHAPES["llama3-8b"], 8)
    assert plan["mosaic_per_step"] == 0
    assert plan["unmeasured"] == []
    assert len(plan["fallbacks"]["residual_dense"]) == 2  # o's reason and down's
    reasons = plan["fallbacks"]["rms_norm_dense"]
    assert any("32768" in reason for reason in reasons)  # head
    assert any("4096+1024+1024" in reason for reason in reasons)  # q/k/v
    assert plan["host_work"] == {"jaxnorm": [], "stock": []}
