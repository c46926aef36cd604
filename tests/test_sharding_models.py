"""`jaxnorm.models` trains sharded (examples/train_sharded.py) on 8 host devices.

Each layout's jitted step, fused and stock, against the same step on one
device: equal losses step after step (float32; only the order of the sums
differs), parameters still sharded as placed. Run by tests/test_sharding.py.
"""

import jax
import numpy as np
import pytest
from test_sharding import requires_host_devices

from examples import train_sharded
from jaxnorm import models

pytestmark = requires_host_devices()

LOSS_RTOL = 1e-4  # as examples/demo.py's two float32 computations of one network
CFG = dict(n_heads=4, n_kv_heads=4, d_ff=128, n_layers=1)


def losses(layout: str, fused: bool, devices=None, steps: int = 3) -> tuple[list, dict]:
    mesh = train_sharded.make_mesh(layout, tp=4 if devices is None else 1, devices=devices)
    step, (params, opt_state, tokens) = train_sharded.sharded_train_step(
        models.llama(fused=fused, **CFG), mesh, layout, batch=8, seq_len=16)
    out = []
    for _ in range(steps):
        loss, params, opt_state = step(params, opt_state, tokens)
        out.append(float(loss))
    return out, params


@pytest.mark.parametrize("layout", train_sharded.LAYOUTS)
@pytest.mark.parametrize("fused", [True, False], ids=["jaxnorm", "stock"])
def test_sharded_training_matches_one_device(layout, fused):
    sharded, params = losses(layout, fused)
    single, _ = losses(layout, fused, devices=jax.devices()[:1])
    np.testing.assert_allclose(sharded, single, rtol=LOSS_RTOL)
    assert sharded[-1] < sharded[0]
    q = params["layers"][0]["attn_in"]["q"]["kernel"].get_value()
    down = params["layers"][0]["down"]["kernel"].get_value()
    expected = ((None, "model"), ("model",)) if layout == "tensor" else ((), ())
    assert (tuple(q.sharding.spec), tuple(down.sharding.spec)) == expected


def test_jaxnorm_and_stock_train_alike_sharded():
    fused, _ = losses("tensor", True)
    stock, _ = losses("tensor", False)
    np.testing.assert_allclose(fused, stock, rtol=LOSS_RTOL)


def test_example_runs():
    steps = train_sharded.main(["--layout", "tensor", "--tp", "2", "--steps", "2"])
    assert len(steps) == 2
