"""torch.ops.kpool's scoring and selection against the independent reference
(reference.py), in both batch forms, every query dtype, with and without
rotation, writing into the caller's tensors."""

import math

import pytest
import torch

import kpool
import reference as ref
from conftest import Layer, ragged

QUERY_DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def ragged_case(layer):
    # A prefill chunk from 0, a continuation mid-pool, a decode row, and a
    # request whose rows see no complete pool yet.
    lengths, rows = [0, 37, 150, 0], [14, 6, 1, 2]
    row_offsets, cache_lengths = ragged(lengths, rows)
    table = layer.block_table(4, [1, 2, 5, 1])
    return row_offsets, cache_lengths, table, ref.row_positions(row_offsets, cache_lengths)


def check_scores(scores, exact, bound, rows, kpool_k):
    for t, (_, pos) in enumerate(rows):
        visible = ref.visible_pools(pos, kpool_k)
        got = scores[t].double()
        assert torch.all(torch.isinf(got[visible:]) & (got[visible:] < 0)), t
        if visible:
            diff = float((got[:visible] - exact[t, :visible]).abs().max())
            assert diff <= 1e-5 * float(bound[t]), (t, diff, float(bound[t]))


@pytest.mark.parametrize("dtype", QUERY_DTYPES)
@pytest.mark.parametrize("rotate", [False, True])
def test_ragged_score_and_selection_match_the_reference(layer, dtype, rotate):
    row_offsets, cache_lengths, table, rows = ragged_case(layer)
    q, w = layer.queries(len(rows), dtype)
    k = layer.kpool
    exact, bound = ref.reference_scores(q, w, layer.kv_cache, table, k, rows, rotate)

    scores = kpool.score(q, w, layer.kv_cache, table, k, row_offsets=row_offsets,
                         cache_lengths=cache_lengths, rotate=rotate)
    check_scores(scores, exact, bound, rows, k)

    for topk in (1, 5, 64):
        ids = kpool.score_select(q, w, topk, layer.kv_cache, table, k, row_offsets=row_offsets,
                                 cache_lengths=cache_lengths, rotate=rotate)
        for t, (_, pos) in enumerate(rows):
            visible = ref.visible_pools(pos, k)
            err = ref.check_selection(ids[t], exact[t], bound[t], visible, topk)
            assert err is None, (topk, t, err)
            # Bit for bit what KPool's own scores rank (ties to the lower id).
            assert ids[t, :min(topk, visible)].tolist() == \
                ref.rank(scores[t].tolist(), visible, topk), (topk, t)


@pytest.mark.parametrize("four_d", [False, True])
def test_decode_form_matches_the_ragged_form_and_the_reference(layer, four_d):
    next_n, requests = 3, 3
    context_lens = torch.tensor([9, 60, 157], dtype=torch.int32)
    positions = kpool.decode_positions(context_lens, next_n)
    assert positions.tolist()[0] == [6, 7, 8]
    table = layer.block_table(requests, [1, 2, 5])
    q, w = layer.queries(requests * next_n, torch.bfloat16)
    qd = q.reshape(requests, next_n, layer.heads, layer.head_dim) if four_d else q
    rows = ref.row_positions(positions=positions)
    k, topk = layer.kpool, 6
    exact, bound = ref.reference_scores(q, w, layer.kv_cache, table, k, rows, True)

    scores = kpool.score(qd, w, layer.kv_cache, table, k, positions=positions, rotate=True)
    check_scores(scores, exact, bound, rows, k)
    ids = kpool.score_select(qd, w, topk, layer.kv_cache, table, k, positions=positions,
                             rotate=True)
    # The same rows as a ragged batch: the same bits.
    row_offsets = torch.arange(0, requests * next_n + 1, next_n, dtype=torch.int32)
    ids_ragged = kpool.score_select(q, w, topk, layer.kv_cache, table, k,
                                    row_offsets=row_offsets, cache_lengths=positions[:, 0].contiguous(),
                                    rotate=True)
    assert torch.equal(ids, ids_ragged)
    for t, (_, pos) in enumerate(rows):
        err = ref.check_selection(ids[t], exact[t], bound[t], ref.visible_pools(pos, k), topk)
        assert err is None, (t, err)


def test_select_tokens_is_the_expanded_selection(layer):
    row_offsets, cache_lengths, table, rows = ragged_case(layer)
    q, w = layer.queries(len(rows))
    k, topk = layer.kpool, 7
    ids = kpool.score_select(q, w, topk, layer.kv_cache, table, k, row_offsets=row_offsets,
                             cache_lengths=cache_lengths)
    tokens = kpool.select_tokens(q, w, topk, layer.kv_cache, table, k,
                                 row_offsets=row_offsets, cache_lengths=cache_lengths)
    assert tokens.shape[1] == kpool.select_tokens_width(topk, k)
    expected = ref.expand_reference(ids, row_offsets, cache_lengths, k, True)
    assert torch.equal(tokens, expected)


@pytest.mark.parametrize("tail_always", [False, True])
def test_expand_topk_matches_the_spec(layer, tail_always):
    g = torch.Generator().manual_seed(3)
    row_offsets, cache_lengths = ragged([0, 13, 90], [5, 3, 2])
    # Ids in range, past the visible pools (stale), and -1.
    ids = torch.randint(-1, 30, (10, 6), generator=g, dtype=torch.int32)
    out = kpool.expand_topk(ids, tail_always, row_offsets, cache_lengths, layer.kv_cache,
                            layer.kpool)
    assert torch.equal(out, ref.expand_reference(ids, row_offsets, cache_lengths,
                                                 layer.kpool, tail_always))


def test_ops_write_into_the_callers_tensors_and_nothing_else(layer):
    row_offsets, cache_lengths, table, rows = ragged_case(layer)
    q, w = layer.queries(len(rows))
    k, topk = layer.kpool, 4
    # Two rows more than the batch has: rows past row_offsets[B] stay as they were.
    pool_ids = torch.full((len(rows) + 2, topk), -7, dtype=torch.int32)
    q_big = torch.cat([q, q[:2]])
    w_big = torch.cat([w, w[:2]])
    pointer = pool_ids.data_ptr()
    kv_before = layer.kv_cache.clone()
    q_before = q_big.clone()
    out = kpool.score_select(q_big, w_big, topk, layer.kv_cache, table, k,
                             row_offsets=row_offsets, cache_lengths=cache_lengths,
                             pool_ids=pool_ids)
    assert out is pool_ids and pool_ids.data_ptr() == pointer
    assert not torch.any(pool_ids[:len(rows)] == -7)
    assert torch.all(pool_ids[len(rows):] == -7)
    assert torch.equal(layer.kv_cache, kv_before) and torch.equal(q_big, q_before)

    scores = torch.full((len(rows), table.shape[1] * layer.block_pools + 3), 5.0)
    pointer = scores.data_ptr()
    kpool.ops.score(q, w, row_offsets, cache_lengths, None, layer.kv_cache, table, k, False,
                    scores, True)
    assert scores.data_ptr() == pointer
    # Row 13 is position 13 of request 0: 3 visible pools, then -inf to the
    # end of the row.
    assert not torch.any(torch.isinf(scores[13, :3])) and torch.all(scores[13, 3:] == -math.inf)


def test_a_views_offset_is_honoured(layer):
    # A contiguous slice that starts inside a larger buffer: the op reads
    # and writes at its data pointer, not at the storage's start.
    row_offsets, cache_lengths, table, rows = ragged_case(layer)
    q, w = layer.queries(len(rows))
    k, topk = layer.kpool, 5
    expected = kpool.score_select(q, w, topk, layer.kv_cache, table, k,
                                  row_offsets=row_offsets, cache_lengths=cache_lengths)
    big_q = torch.cat([torch.zeros_like(q[:1]), q])
    big_ids = torch.full((len(rows) + 1, topk), -9, dtype=torch.int32)
    kpool.score_select(big_q[1:], w, topk, layer.kv_cache, table, k, row_offsets=row_offsets,
                       cache_lengths=cache_lengths, pool_ids=big_ids[1:])
    assert torch.equal(big_ids[1:], expected)
    assert torch.all(big_ids[0] == -9)


def test_the_workspace_limit_chunks_the_rows_with_the_same_bits():
    layer = Layer(seed=11)
    row_offsets, cache_lengths, table, rows = ragged_case(layer)
    q, w = layer.queries(len(rows))
    k, topk = layer.kpool, 9
    # Room for the keys of 3 rows: the call selects in chunks of 3.
    visible = table.shape[1] * layer.block_pools
    kpool.set_workspace_limit(3 * 4 * visible)
    try:
        # A shape no call has had (H = 2): a fresh workspace, under the limit.
        q2, w2 = q[:, :2].contiguous(), w[:, :2].contiguous()
        small = kpool.score_select(q2, w2, topk, layer.kv_cache, table, k,
                                   row_offsets=row_offsets, cache_lengths=cache_lengths)
    finally:
        kpool.set_workspace_limit(256 << 20)
    whole2 = kpool.score_select(q2, w2, topk, layer.kv_cache, table, k,
                                row_offsets=row_offsets, cache_lengths=cache_lengths)
    assert torch.equal(small, whole2)
