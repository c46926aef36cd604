"""Row partials stored with their round's tag in one 64-bit word, polled by the readers.

The "tagged" transport of `cluster_exchange` (GPU only), after NCCL's
low-latency protocol: a party stores each row's partial together with a tag
(its exchange round + 1) as one naturally aligned 64-bit word, which the PTX
memory model makes single-copy atomic. A reader that loads the word and sees
the tag it expects therefore sees the value stored with it. So there is no
release fence, no signal and no counter: a round costs one store and, once
the peers have stored, one load per word, where the counter took a fence that
waits for the partials to reach L2, an atomic, a poll and then the loads.

The words live in a global semaphore array, which jax zero-fills before every
call (jax 0.11.2: `pallas_call_registration`), so no tag of an earlier call can
match. Rounds alternate between two slots by parity: a party stores round
r + 2 only after it has read round r + 1, which every peer stored only after
reading round r, so no word is overwritten while a peer may still need it.
Loads and stores are `.relaxed.gpu`: they go to L2, never a stale L1 line.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.experimental.pallas as pl
import jax.experimental.pallas.mosaic_gpu as plgpu
import jax.numpy as jnp
import numpy as np
from jax.experimental.mosaic import gpu as mgpu
from jax.experimental.mosaic.gpu import utils as mgpu_utils
from jax._src.lib.mlir import ir
from jax._src.lib.mlir.dialects import arith, scf, vector

ROW_LAYOUT = plgpu.Layout.WGMMA.reduce(1)

# A word's store: (value bits, tag) packed low to high into one 64-bit store.
_STORE = ("{ .reg .b64 w; mov.b64 w, {$1, $2}; "
          "st.relaxed.gpu.global.b64 [$0], w; }")
# Two neighbouring words (two partials of a row) in one 16-byte load; each 64-bit element
# is loaded atomically on its own, which is all a word needs.
_LOAD_PAIR = ("{ .reg .b64 a, b; ld.relaxed.gpu.global.v2.b64 {a, b}, [$4]; "
              "mov.b64 {$0, $1}, a; mov.b64 {$2, $3}, b; }")


def words(num_groups: int, num_stats: int, rows: int, num_partials: int) -> Any:
    """The zero-filled word array (call inside the kernel):
    [group, round parity, stat, row, 2 x partial] 32-bit halves, (value, tag) per word."""
    return pl.get_global(plgpu.SemaphoreType.REGULAR(
        (num_groups, 2, num_stats, rows, 2 * num_partials)))


def _row_tags(tag: jax.Array, rows: int) -> jax.Array:
    # inline_mgpu takes arrays, not scalars: the tag rides along as a row vector.
    return plgpu.layout_cast(jnp.full((rows,), tag, jnp.int32), ROW_LAYOUT)


def _scalar(fragments: Any) -> ir.Value:
    return vector.extract(fragments.registers.flat[0], [], [0])


def _bits(value: ir.Value) -> ir.Value:
    return arith.bitcast(ir.IntegerType.get_signless(32), value)


def _word_ptr(ref: ir.Value, indices: Sequence[ir.Value]) -> ir.Value:
    """The address of ref[indices] (a 32-bit element) in a strided global memref."""
    i64 = ir.IntegerType.get_signless(64)
    strides, _ = ir.MemRefType(ref.type).get_strides_and_offset()
    offset = None
    for index, stride in zip(indices, strides):
        term = arith.muli(arith.index_cast(i64, index), mgpu_utils.c(stride, i64))
        offset = term if offset is None else arith.addi(offset, term)
    return mgpu_utils.getelementptr(mgpu_utils.memref_ptr(ref), [offset],
                                    ir.IntegerType.get_signless(32))


def store(ref: Any, partials: Sequence[jax.Array], tag: jax.Array) -> None:
    """ref[j, row, 0:2] = (partials[j][row], tag) for every stat j and row, each as one word.

    ref: [stats, rows, 2] (this party's column pair of its group's slot); partials are
    [rows] float32 in the WGMMA row layout (the four threads holding a row store the
    same word).
    """
    rows = partials[0].shape[0]

    @plgpu.inline_mgpu(arg_types=(plgpu.RefType(), ROW_LAYOUT,
                                  *(ROW_LAYOUT for _ in partials)))
    def emit(_ctx, ref, tags, *values):
        tag_bits = _scalar(tags)
        index = ir.IndexType.get()
        for j, value in enumerate(values):
            stat = arith.constant(index, j)
            for register, (row,) in zip(value.registers.flat,
                                        value.layout.thread_idxs(value.shape)):
                ptr = _word_ptr(ref, (stat, row, arith.constant(index, 0)))
                mgpu_utils.inline_ptx(_STORE, ptr, _bits(vector.extract(register, [], [0])),
                                      tag_bits, has_side_effects=True)

    emit(ref, _row_tags(tag, rows), *partials)


def load_matrix(ref: Any, tag: jax.Array, rows: int, num_partials: int) -> jax.Array:
    """Every party's partial of one stat as a [rows, partials] float32 matrix in the WGMMA
    layout, once each word carries `tag`.

    ref: [>= rows, 2 x partials] (one stat of a group's slot). Each thread loads the
    words it holds (two neighbouring partials of a row per 16-byte load) all at once,
    and loads them all again until every tag matches.
    """
    if num_partials % 8:
        raise ValueError(f"the WGMMA layout takes 8 columns at a time; got {num_partials}")
    shape = (rows, num_partials)

    @plgpu.inline_mgpu(arg_types=(plgpu.RefType(), ROW_LAYOUT),
                       return_type=plgpu.ShapeDtypeStruct(shape, jnp.float32,
                                                          layout=plgpu.Layout.WGMMA))
    def emit(_ctx, ref, tags):
        i32 = ir.IntegerType.get_signless(32)
        f32 = ir.F32Type.get()
        index = ir.IndexType.get()
        tag_bits = _scalar(tags)
        layout = mgpu.WGMMA_LAYOUT
        registers_shape = layout.registers_shape(shape)
        ptrs = []
        for row, col in layout.thread_idxs(shape):  # col is even: (col, col + 1) per register
            word = arith.muli(col, arith.constant(index, 2))
            ptrs.append(_word_ptr(ref, (row, word)))
        zero = mgpu_utils.c(0, i32)
        loop = scf.WhileOp([i32] * (2 * len(ptrs)), [zero] * (2 * len(ptrs)))
        before = loop.before.blocks.append(*([i32] * (2 * len(ptrs))))
        with ir.InsertionPoint(before):
            values, ready = [], None
            for ptr in ptrs:
                v0, t0, v1, t1 = mgpu_utils.inline_ptx(
                    _LOAD_PAIR, ptr, result_types=[i32] * 4, has_side_effects=True)
                values += [v0, v1]
                pair_ready = arith.andi(
                    arith.cmpi(arith.CmpIPredicate.eq, t0, tag_bits),
                    arith.cmpi(arith.CmpIPredicate.eq, t1, tag_bits))
                ready = pair_ready if ready is None else arith.andi(ready, pair_ready)
            not_ready = arith.xori(ready, mgpu_utils.c(1, ir.IntegerType.get_signless(1)))
            scf.condition(not_ready, values)
        after = loop.after.blocks.append(*([i32] * (2 * len(ptrs))))
        with ir.InsertionPoint(after):
            scf.yield_(list(after.arguments))
        pair_ty = ir.VectorType.get((2,), f32)
        results = list(loop.results)
        registers = np.empty(registers_shape, dtype=object)
        for i, idx in enumerate(np.ndindex(registers_shape)):
            v0, v1 = (arith.bitcast(f32, r) for r in results[2 * i:2 * i + 2])
            registers[idx] = vector.from_elements(pair_ty, [v0, v1])
        return mgpu.FragmentedArray(_registers=registers, _layout=layout, _is_signed=None)

    return emit(ref, _row_tags(tag, rows))
