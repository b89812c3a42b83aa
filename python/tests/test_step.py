"""torch.ops.kpool.step and store_pools: the ring, the step output and the
cache are the caller's tensors, written in place; store_pools writes what
the step's own cache write writes; bad arguments are named, nothing
written (the ring and its state included). The pools' values themselves
are checked against kpool_replay in test_trace.py."""

import pytest
import torch

import kpool
import reference as ref

K, D, SLOTS, R = 4, 16, 4, 8
BLOCK_POOLS = 4


class World:
    def __init__(self, seed=1, dtype=torch.bfloat16):
        g = torch.Generator().manual_seed(seed)
        self.dtype = dtype
        self.ring_tail = torch.zeros((SLOTS, 2, R, D), dtype=dtype)
        self.ring_state = torch.zeros((SLOTS, 3), dtype=torch.int32)
        self.ape = torch.randn((K, D), generator=g)
        self.kv_cache = torch.zeros((8, BLOCK_POOLS, D + 4), dtype=torch.uint8)
        self.block_table = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32)
        # Request 0: 13 new tokens at 0 (slot 1); request 1: 6 at 0 (slot 3).
        self.row_offsets = torch.tensor([0, 13, 19], dtype=torch.int32)
        self.cache_lengths = torch.tensor([0, 0], dtype=torch.int32)
        self.slot_idx = torch.tensor([1, 3], dtype=torch.int32)
        self.key = torch.randn((19, D), generator=g).to(dtype)
        self.gate = torch.randn((19, D), generator=g).to(dtype)
        cap = 19 // K + 2
        self.pooled = torch.full((cap, D), 7.0, dtype=dtype)
        self.batch_row = torch.full((cap,), -7, dtype=torch.int32)
        self.pool_id = torch.full((cap,), -7, dtype=torch.int32)
        self.offsets = torch.full((3,), 77, dtype=torch.int32)

    def args(self, **change):
        a = dict(ring_tail=self.ring_tail, ring_state=self.ring_state, key=self.key,
                 gate=self.gate, ape=self.ape, row_offsets=self.row_offsets,
                 cache_lengths=self.cache_lengths, positions=None, slot_idx=self.slot_idx,
                 kv_cache=self.kv_cache, block_table=self.block_table, rotate=True,
                 pooled=self.pooled, batch_row=self.batch_row, pool_id=self.pool_id,
                 offsets=self.offsets, validate=True)
        a.update(change)
        return a

    def written(self):
        return [t.clone() for t in (self.ring_tail, self.ring_state, self.kv_cache, self.pooled,
                                    self.batch_row, self.pool_id, self.offsets)]


def step(a):
    kpool.ops.step(*a.values())


def test_the_step_writes_the_callers_ring_output_and_cache_in_place():
    w = World()
    pointers = [t.data_ptr() for t in (w.ring_tail, w.ring_state, w.pooled, w.kv_cache)]
    step(w.args())
    assert [t.data_ptr() for t in (w.ring_tail, w.ring_state, w.pooled, w.kv_cache)] == pointers
    # 3 pools of request 0, 1 of request 1.
    assert w.offsets.tolist() == [0, 3, 4]
    assert w.batch_row[:4].tolist() == [0, 0, 0, 1]
    assert w.pool_id[:4].tolist() == [0, 1, 2, 0]
    # Each slot's state: start, L, H (docs/ring.md).
    assert w.ring_state[1].tolist()[1:] == [13, 13] and w.ring_state[3].tolist()[1:] == [6, 6]
    assert torch.all(w.ring_state[0] == 0) and torch.all(w.ring_state[2] == 0)
    # Slot 1 holds position 12 (13 % K = 1 pending member) at ring entry 12 % R.
    assert torch.equal(w.ring_tail[1, 0, 12 % R], w.key[12])
    # The cache holds the pools at their blocks, with pow2 scales.
    codes, scales = ref.split_cache(w.kv_cache)
    for block, entry in [(0, 0), (0, 1), (0, 2), (2, 0)]:
        s = float(scales[block, entry])
        assert s > 0 and s == 2.0 ** round(torch.log2(torch.tensor(s)).item())
    assert torch.all(scales[1] == 0) and torch.all(scales[3] == 0)

    # A decode step continues both sequences: positions 13, 14 and 6, 7.
    key = torch.randn((2, 2, D)).to(w.dtype)
    positions = torch.tensor([[13, 14], [6, 7]], dtype=torch.int32)
    step(w.args(key=key, gate=key.clone(), positions=positions, row_offsets=None,
                cache_lengths=None))
    assert w.offsets.tolist() == [0, 0, 1]
    assert w.pool_id[0].item() == 1 and w.batch_row[0].item() == 1
    assert w.ring_state[1].tolist()[1:] == [15, 15] and w.ring_state[3].tolist()[1:] == [8, 8]


def test_store_pools_writes_what_the_steps_cache_write_writes():
    with_cache, without = World(seed=4), World(seed=4)
    step(with_cache.args())
    step(without.args(kv_cache=None, block_table=None))
    assert torch.equal(with_cache.pooled[:4], without.pooled[:4])
    assert torch.all(without.kv_cache == 0)
    kpool.ops.store_pools(without.pooled, without.batch_row, without.pool_id, without.offsets,
                          without.row_offsets, without.cache_lengths, None, without.kv_cache,
                          without.block_table, K, True, True)
    assert torch.equal(without.kv_cache, with_cache.kv_cache)


def test_a_start_past_what_the_slot_holds_is_refused_and_nothing_written():
    # The gap check (docs/ring.md, "No gaps"): slot 1 holds positions
    # [0, 13); a row starting at 17 would build its pool from stale entries.
    w = World()
    step(w.args())
    before = w.written()
    key = torch.randn((3, D)).to(w.dtype)
    with pytest.raises(RuntimeError, match="argument 'cache_lengths', row 0"):
        step(w.args(key=key, gate=key.clone(),
                    row_offsets=torch.tensor([0, 3, 3], dtype=torch.int32),
                    cache_lengths=torch.tensor([17, 6], dtype=torch.int32)))
    for a, b in zip(before, w.written()):
        assert torch.equal(a, b)


STEP_CASES = [
    ("key float64", "key", lambda w: dict(key=w.key.double())),
    ("gate dtype", "gate", lambda w: dict(gate=w.gate.float())),
    ("gate shape", "gate", lambda w: dict(gate=w.gate[:18].contiguous())),
    ("key 3-D for a ragged batch", "key", lambda w: dict(key=w.key.reshape(19, 1, D))),
    ("ape float64", "ape", lambda w: dict(ape=w.ape.double())),
    ("ape D", "key", lambda w: dict(ape=torch.zeros((K, D + 1)))),
    ("ring_tail dtype", "ring_tail", lambda w: dict(ring_tail=w.ring_tail.float())),
    ("ring_tail R not a multiple of K", "tail",
     lambda w: dict(ring_tail=torch.zeros((SLOTS, 2, 6, D), dtype=w.dtype))),
    ("ring_state shape", "ring_state",
     lambda w: dict(ring_state=torch.zeros((SLOTS, 2), dtype=torch.int32))),
    ("ring_state slots", "state",
     lambda w: dict(ring_state=torch.zeros((SLOTS + 1, 3), dtype=torch.int32))),
    ("slot_idx length", "slot_idx", lambda w: dict(slot_idx=w.slot_idx[:1].contiguous())),
    ("a slot out of range", "slot_idx",
     lambda w: dict(slot_idx=torch.tensor([1, SLOTS], dtype=torch.int32))),
    ("one slot twice", "slot_idx", lambda w: dict(slot_idx=torch.tensor([2, 2], dtype=torch.int32))),
    ("kv_cache without block_table", "block_table", lambda w: dict(block_table=None)),
    ("pooled dtype", "pooled", lambda w: dict(pooled=w.pooled.float())),
    ("pooled too small", "out", lambda w: dict(pooled=torch.zeros((2, D), dtype=w.dtype),
                                               batch_row=w.batch_row[:2].clone(),
                                               pool_id=w.pool_id[:2].clone())),
    ("batch_row length", "batch_row", lambda w: dict(batch_row=w.batch_row[:3].clone())),
    ("offsets too short", "offsets", lambda w: dict(offsets=w.offsets[:2].clone())),
    ("a pool's block unassigned", "block_table",
     lambda w: dict(block_table=torch.tensor([[-1, 1], [2, 3]], dtype=torch.int32))),
    ("a decode row's positions not consecutive", "positions",
     lambda w: dict(positions=torch.tensor([[0, 2], [0, 1]], dtype=torch.int32),
                    row_offsets=None, cache_lengths=None,
                    key=torch.zeros((2, 2, D), dtype=w.dtype),
                    gate=torch.zeros((2, 2, D), dtype=w.dtype))),
]


@pytest.mark.parametrize("case,name,change", STEP_CASES, ids=[c[0] for c in STEP_CASES])
def test_a_malformed_step_argument_is_named_and_nothing_written(case, name, change):
    w = World()
    before = w.written()
    with pytest.raises(RuntimeError) as error:
        step(w.args(**change(w)))
    assert "argument '%s'" % name in str(error.value), str(error.value)
    for a, b in zip(before, w.written()):
        assert torch.equal(a, b), case
