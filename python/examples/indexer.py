"""A k-pooled sparse-attention indexer layer as a serving engine writes it,
on torch.ops.kpool alone (docs/torch.md).

``KPooledIndexer`` is an ``nn.Module``: it projects the hidden states to
the indexer's keys, gate scores, queries and head weights, then calls
``kpool.ops.step`` (the pools of the step's tokens, written into the
layer's fp8 cache in the engines' fused layout) and ``kpool.ops.select_tokens``
(every query token's best pools, expanded to the token positions sparse
attention reads). The ring, the cache and the step output are the module's
buffers: KPool writes them in place.

Run as a program, it serves the schedule of the C++ model loop
(example/kpool_model_loop.cpp): three sequences prefilled in chunks of 16
tokens, then speculative rounds of the next token and 2 drafts, the
rejected drafts re-sent the next round. With ``--stand-ins`` its layers
take the model loop's stand-in values instead of projections, and
``--selections FILE`` writes every selection the way
``kpool_model_loop --selections FILE`` does, so the two can be compared
(python/tests/test_example.py does).

    PYTHONPATH=build/python python3 python/examples/indexer.py --stand-ins
"""

import argparse
import sys

import torch
from torch import nn

import kpool

K, D, H, TOPK = 4, 128, 8, 3     # tokens a pool, channels, query heads, pools selected
DRAFTS = 2                       # drafts a decode row sends besides the next token
NEXT_N = 1 + DRAFTS
CHUNK = 16                       # prefill tokens a sequence sends a step
MAX_BATCH, MAX_CONTEXT, BLOCK_POOLS = 3, 96, 4
BLOCKS_PER_SEQ = MAX_CONTEXT // K // BLOCK_POOLS
ROUNDS = 5


def ring_length(kpool_k, drafts):
    """Ring::serving_length: K * next_pow2(ceil((K + S) / K))."""
    pools = (kpool_k + drafts + kpool_k - 1) // kpool_k
    p2 = 1
    while p2 < pools:
        p2 *= 2
    return p2 * kpool_k


class Batch:
    """One call's rows: positions [start, start + count) of a sequence, the
    first `right` of them its own tokens, the rest rejected drafts."""

    def __init__(self, decode, rows):
        self.decode, self.rows = decode, rows   # rows: (seq, start, count, right)
        self.row_offsets = torch.tensor([0] + list(_cumsum([r[2] for r in rows])),
                                        dtype=torch.int32)
        self.cache_lengths = torch.tensor([r[1] for r in rows], dtype=torch.int32)
        self.slot_idx = torch.tensor([r[0] for r in rows], dtype=torch.int32)
        self.block_table = torch.tensor(
            [[r[0] * BLOCKS_PER_SEQ + b for b in range(BLOCKS_PER_SEQ)] for r in rows],
            dtype=torch.int32)
        self.positions = torch.tensor([[r[1] + i for i in range(NEXT_N)] for r in rows],
                                      dtype=torch.int32) if decode else None
        # Each query row's (sequence, position, rejected).
        self.tokens = [(r[0], r[1] + i, i >= r[3]) for r in rows for i in range(r[2])]


def _cumsum(values):
    total = 0
    for v in values:
        total += v
        yield total


class KPooledIndexer(nn.Module):
    """One layer's indexer: projections, then pool -> cache -> score ->
    select -> expand through torch.ops.kpool."""

    def __init__(self, hidden, layer=0, dtype=torch.bfloat16):
        super().__init__()
        self.layer, self.dtype = layer, dtype
        self.wk = nn.Linear(hidden, D, bias=False)
        self.wg = nn.Linear(hidden, D, bias=False)
        self.wq = nn.Linear(hidden, H * D, bias=False)
        self.ww = nn.Linear(hidden, H, bias=False)
        self.ape = nn.Parameter(torch.zeros(K, D), requires_grad=False)
        r = ring_length(K, DRAFTS)
        self.register_buffer("ring_tail", torch.zeros(MAX_BATCH, 2, r, D, dtype=dtype))
        self.register_buffer("ring_state", torch.zeros(MAX_BATCH, 3, dtype=torch.int32))
        num_blocks = MAX_BATCH * BLOCKS_PER_SEQ
        self.register_buffer("kv_cache",
                             torch.zeros(num_blocks, BLOCK_POOLS, D + 4, dtype=torch.uint8))
        capacity = MAX_BATCH * CHUNK // K + MAX_BATCH
        self.register_buffer("pooled", torch.empty(capacity, D, dtype=dtype))
        self.register_buffer("batch_row", torch.empty(capacity, dtype=torch.int32))
        self.register_buffer("pool_id", torch.empty(capacity, dtype=torch.int32))
        self.register_buffer("offsets", torch.zeros(MAX_BATCH + 1, dtype=torch.int32))

    def project(self, hidden, batch):
        """key, gate [T, D], q [T, H, D] in the layer's dtype; weights [T, H] f32."""
        key = self.wk(hidden).to(self.dtype)
        gate = self.wg(hidden).to(self.dtype)
        q = self.wq(hidden).reshape(-1, H, D).to(self.dtype)
        return key, gate, q, self.ww(hidden).float()

    @torch.no_grad()
    def forward(self, hidden, batch):
        key, gate, q, weights = self.project(hidden, batch)
        b = len(batch.rows)
        if batch.decode:   # a decode batch: key and gate [B, next_n, D]
            key = key.reshape(b, NEXT_N, D)
            gate = gate.reshape(b, NEXT_N, D)
            forms = dict(row_offsets=None, cache_lengths=None, positions=batch.positions)
        else:
            forms = dict(row_offsets=batch.row_offsets, cache_lengths=batch.cache_lengths,
                         positions=None)
        kpool.ops.step(self.ring_tail, self.ring_state, key.contiguous(), gate.contiguous(),
                       self.ape, forms["row_offsets"], forms["cache_lengths"],
                       forms["positions"], batch.slot_idx, self.kv_cache, batch.block_table,
                       True, self.pooled, self.batch_row, self.pool_id, self.offsets)
        return kpool.select_tokens(q.contiguous(), weights.contiguous(), TOPK, self.kv_cache,
                                   batch.block_table, K, row_offsets=forms["row_offsets"],
                                   cache_lengths=forms["cache_lengths"],
                                   positions=forms["positions"], rotate=True)


# ---------------------------------------------------------------------------
# The model loop's stand-in values (example/kpool_model_loop.cpp,
# model_value): u64 arithmetic on int64 tensors.

_U64 = (1 << 64) - 1


def _i64(u):
    u &= _U64
    return u - (1 << 64) if u >= (1 << 63) else u


def _srl(x, k):
    return (x >> k) & ((1 << (64 - k)) - 1)


def model_values(layer, tokens, width, kind):
    """model_value(layer, seq, pos, i, kind, rejected) for each token
    (seq, pos, rejected) and i < width: [T, width] float32."""
    seq = torch.tensor([t[0] for t in tokens], dtype=torch.int64).reshape(-1, 1)
    pos = torch.tensor([t[1] for t in tokens], dtype=torch.int64).reshape(-1, 1)
    rej = torch.tensor([int(t[2]) for t in tokens], dtype=torch.int64).reshape(-1, 1)
    i = torch.arange(width, dtype=torch.int64).reshape(1, -1)
    x = (torch.tensor(_i64((layer + 1) << 56), dtype=torch.int64) ^ ((seq + 1) << 48) ^
         ((pos + 1) << 24) ^ (i << 4) ^ (kind << 1) ^ rej)
    for _ in range(2):
        x = x ^ _srl(x, 33)
        x = x * _i64(0xFF51AFD7ED558CCD)
        x = x ^ _srl(x, 29)
    return _srl(x, 40).to(torch.float32) / 8388608.0 - 1.0


class StandInIndexer(KPooledIndexer):
    """The layer with the model loop's stand-ins for its projections."""

    def __init__(self, layer):
        super().__init__(hidden=1, layer=layer)
        m = torch.arange(K)
        self.ape.copy_(0.5 * model_values(layer, [(0, int(p), False) for p in m], D, 4))

    def project(self, hidden, batch):
        t = batch.tokens
        key = model_values(self.layer, t, D, 0).to(self.dtype)
        gate = model_values(self.layer, t, D, 1).to(self.dtype)
        q = model_values(self.layer, t, H * D, 2).reshape(-1, H, D).to(self.dtype)
        return key, gate, q, model_values(self.layer, t, H, 3)


def serve(layers, hidden_size=None, out=None):
    """The model loop's schedule through `layers`; every selection written
    to `out` as 'layer L seq S pos P tokens...' lines, in call order."""
    lengths, prompts = [0, 0, 0], [29, 11, 42]
    calls = []
    while True:
        rows = [(s, lengths[s], min(CHUNK, prompts[s] - lengths[s]),
                 min(CHUNK, prompts[s] - lengths[s]))
                for s in range(3) if prompts[s] > lengths[s]]
        if not rows:
            break
        calls.append(Batch(False, rows))
        for s, _, n, _ in rows:
            lengths[s] += n
    lines = []

    def run(batch):
        hidden = None if hidden_size is None else torch.randn(len(batch.tokens), hidden_size)
        for layer in layers:
            tokens = layer(hidden, batch)
            for (seq, pos, _), row in zip(batch.tokens, tokens.tolist()):
                lines.append("layer %d seq %d pos %d %s" % (layer.layer, seq, pos,
                                                             " ".join(map(str, row))))

    for batch in calls:
        run(batch)
    for rnd in range(1, ROUNDS + 1):
        rows = []
        for s in range(3):
            accepted = (rnd + s) % 3
            rows.append((s, lengths[s], NEXT_N, 1 + accepted))
        run(Batch(True, rows))
        for s, _, _, right in rows:
            lengths[s] += right
    if out is not None:
        out.write("\n".join(lines) + "\n")
    return lines


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--stand-ins", action="store_true",
                        help="the model loop's stand-in values instead of projections")
    parser.add_argument("--selections", help="write every selection to this file")
    args = parser.parse_args()
    if args.stand_ins:
        layers = [StandInIndexer(l) for l in range(args.layers)]
        hidden = None
    else:
        torch.manual_seed(0)
        hidden = 256
        layers = [KPooledIndexer(hidden, l) for l in range(args.layers)]
    out = open(args.selections, "w") if args.selections else None
    lines = serve(layers, hidden, out)
    if out:
        out.close()
    print("%d layers, %d selections; last: %s" % (args.layers, len(lines), lines[-1][:80]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
