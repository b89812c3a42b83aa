"""A serving trace (docs/trace.md, versions 1 and 2) replayed through
torch.ops.kpool alone, printing what kpool_replay prints. Only the traces
the ops take: a pool cache fp8_serving (the engines' fused layout), or
none. The trace's inputs are generated here from its seed, in PyTorch,
with the u64 arithmetic of docs/trace.md."""

import torch

import kpool
import reference as ref

# ---------------------------------------------------------------------------
# Inputs: docs/trace.md's value(seq, pos, c, which), u64 arithmetic wrapping,
# on int64 tensors (the same bits; right shifts made logical).

_U64 = (1 << 64) - 1


def _i64(u):
    u &= _U64
    return u - (1 << 64) if u >= (1 << 63) else u


def _srl(x, k):
    return (x >> k) & ((1 << (64 - k)) - 1)


def _mix(z):
    z = (z ^ _srl(z, 30)) * _i64(0xBF58476D1CE4E5B9)
    z = (z ^ _srl(z, 27)) * _i64(0x94D049BB133111EB)
    return z ^ _srl(z, 31)


def values(seed, seq, pos, channels, which):
    """value(seq, pos[i], c, which[i]) for every pos (a [P] int64 tensor,
    which alike or an int) and c < channels: [P, channels] float32."""
    pos = torch.as_tensor(pos, dtype=torch.int64).reshape(-1, 1)
    which = torch.as_tensor(which, dtype=torch.int64).reshape(-1, 1)
    c = torch.arange(channels, dtype=torch.int64).reshape(1, -1)
    x = _mix(torch.tensor(_i64(seed ^ ((seq * 0x9E3779B97F4A7C15) & _U64)), dtype=torch.int64))
    x = _mix(x ^ (pos * _i64(0xC2B2AE3D27D4EB4F)))
    x = _mix(x ^ (c * _i64(0x165667B19E3779F9) + which))
    v = (_srl(x, 40) & 0xFFFFFF).to(torch.float32)
    return v / 16777216.0 * 4.0 - 2.0


DTYPES = {"f32": torch.float32, "f64": torch.float64, "bf16": torch.bfloat16,
          "f16": torch.float16}

# ---------------------------------------------------------------------------
# The trace.


class Trace:
    def __init__(self, text):
        self.version, self.ring, self.heads, self.topk = 1, 0, 0, 0
        self.pool_cache, self.rotate = "native", False
        self.blocks = []
        block = None
        for raw in text.splitlines():
            f = raw.split("#", 1)[0].split()
            if not f:
                continue
            if block is not None:
                if f[0] == "end":
                    self.blocks.append(block)
                    block = None
                else:
                    assert f[0] == "row", raw
                    block[2].append([int(x) for x in f[1:]])
                continue
            key = f[0]
            if key == "kpool-trace":
                self.version = int(f[1])
            elif key == "head_dim":
                self.head_dim = int(f[1])
            elif key == "kpool":
                self.kpool = int(f[1])
            elif key == "dtype":
                self.dtype = DTYPES[f[1]]
            elif key == "slots":
                self.slots = int(f[1])
            elif key == "seed":
                self.seed = int(f[1])
            elif key == "ring":
                self.ring = int(f[1])
            elif key == "index_heads":
                self.heads = int(f[1])
            elif key == "index_topk":
                self.topk = int(f[1])
            elif key == "pool_cache":
                self.pool_cache = f[1]
            elif key == "rotate":
                self.rotate = f[1] == "1"
            elif key in ("step", "select"):
                block = (key, 0, [])
            elif key == "decode":
                block = (key, int(f[1]), [])
            else:
                raise ValueError("unknown directive: " + raw)
        self.ring = self.ring or self.kpool


# ---------------------------------------------------------------------------
# The replay.


def replay(text, block_pools=16):
    t = Trace(text)
    if t.pool_cache not in ("native", "fp8_serving"):
        raise ValueError("the ops take the fp8_serving cache only, not " + t.pool_cache)
    cached = t.pool_cache == "fp8_serving"
    K, D, dt = t.kpool, t.head_dim, t.dtype
    ape = values(t.seed, 0, torch.arange(K), D, 2)

    # The most positions any sequence reaches: its cache blocks.
    high = {}
    for kind, _, rows in t.blocks:
        for row in rows:
            if kind == "step":
                end = row[2] + row[3]
            elif kind == "decode":
                real = [p for p in row[2:] if p >= 0]
                end = max(real) + 1 if real else 0
            else:
                continue
            high[row[0]] = max(high.get(row[0], 0), end)
    blocks_of, next_block = {}, 0
    for seq in sorted(high):
        n = (high[seq] // K + block_pools - 1) // block_pools
        blocks_of[seq] = list(range(next_block, next_block + n))
        next_block += n
    kv_cache = torch.zeros((max(next_block, 1), block_pools, D + 4), dtype=torch.uint8)

    ring_tail = torch.zeros((t.slots, 2, t.ring, D), dtype=dt)
    ring_state = torch.zeros((t.slots, 3), dtype=torch.int32)
    sends, fed = {}, {}
    emitted, selections = [], []

    def table(seqs):
        width = max([1] + [len(blocks_of.get(s, [])) for s in seqs])
        tb = torch.full((len(seqs), width), -1, dtype=torch.int32)
        for r, s in enumerate(seqs):
            have = blocks_of.get(s, [])
            tb[r, :len(have)] = torch.tensor(have, dtype=torch.int32)
        return tb

    def send(seq, positions):
        """The revision each position is sent with, counting the sending."""
        count = sends.setdefault(seq, {})
        rev = []
        for p in positions:
            rev.append(count.get(p, 0))
            count[p] = count.get(p, 0) + 1
        return rev

    def inputs(seq, positions, revisions):
        pos = torch.tensor(positions, dtype=torch.int64)
        rev = torch.tensor(revisions, dtype=torch.int64)
        key = values(t.seed, seq, pos, D, 0 + 8 * rev).to(dt)
        gate = values(t.seed, seq, pos, D, 1 + 8 * rev).to(dt)
        return key, gate

    def run_step(batch_rows, seqs, key, gate, capacity, **batch):
        b = len(seqs)
        capacity = max(capacity, 1)
        pooled = torch.empty((capacity, D), dtype=dt)
        batch_row = torch.empty(capacity, dtype=torch.int32)
        pool_id = torch.empty(capacity, dtype=torch.int32)
        offsets = torch.zeros(max(b, 1) + 1, dtype=torch.int32)
        slot_idx = torch.tensor([r[1] for r in batch_rows], dtype=torch.int32)
        kpool.ops.step(ring_tail, ring_state, key, gate, ape, batch.get("row_offsets"),
                       batch.get("cache_lengths"), batch.get("positions"), slot_idx,
                       kv_cache if cached else None, table(seqs) if cached else None,
                       t.rotate, pooled, batch_row, pool_id, offsets, True)
        for o in range(int(offsets[b])):
            emitted.append((seqs[int(batch_row[o])], int(pool_id[o]),
                            pooled[o].float().tolist()))

    for kind, next_n, rows in t.blocks:
        seqs = [r[0] for r in rows]
        if kind == "step":
            keys, gates, offsets, lengths = [], [], [0], []
            for seq, _, cache_len, n in rows:
                positions = list(range(cache_len, cache_len + n))
                k, g = inputs(seq, positions, send(seq, positions))
                keys.append(k)
                gates.append(g)
                offsets.append(offsets[-1] + n)
                lengths.append(cache_len)
                fed[seq] = cache_len + n
            key = torch.cat(keys) if keys else torch.empty((0, D), dtype=dt)
            gate = torch.cat(gates) if gates else torch.empty((0, D), dtype=dt)
            run_step(rows, seqs, key.contiguous(), gate.contiguous(),
                     offsets[-1] // K + len(rows),
                     row_offsets=torch.tensor(offsets, dtype=torch.int32),
                     cache_lengths=torch.tensor(lengths, dtype=torch.int32))
        elif kind == "decode":
            key = torch.zeros((len(rows), next_n, D), dtype=dt)
            gate = torch.zeros((len(rows), next_n, D), dtype=dt)
            positions = torch.tensor([r[2:] for r in rows], dtype=torch.int32)
            for i, row in enumerate(rows):
                real = [(j, p) for j, p in enumerate(row[2:]) if p >= 0]
                if not real:
                    continue
                k, g = inputs(row[0], [p for _, p in real], send(row[0], [p for _, p in real]))
                for n, (j, _) in enumerate(real):
                    key[i, j], gate[i, j] = k[n], g[n]
                fed[row[0]] = real[-1][1] + 1
            run_step(rows, seqs, key, gate, len(rows) * ((next_n + K - 1) // K),
                     positions=positions)
        elif rows:
            qs, ws, offsets, lengths, where = [], [], [0], [], []
            for seq, first, n in rows:
                positions = list(range(first, first + n))
                rev = torch.tensor([sends[seq][p] - 1 for p in positions], dtype=torch.int64)
                pos = torch.tensor(positions, dtype=torch.int64)
                qs.append(values(t.seed, seq, pos, t.heads * D, 3 + 8 * rev)
                          .reshape(n, t.heads, D).to(dt))
                ws.append(values(t.seed, seq, pos, t.heads, 4 + 8 * rev))
                offsets.append(offsets[-1] + n)
                lengths.append(first)
                where += [(seq, p) for p in positions]
            q = torch.cat(qs).contiguous()
            w = torch.cat(ws).contiguous()
            ids = kpool.score_select(q, w, t.topk, kv_cache, table(seqs), K,
                                     row_offsets=torch.tensor(offsets, dtype=torch.int32),
                                     cache_lengths=torch.tensor(lengths, dtype=torch.int32),
                                     rotate=t.rotate)
            for (seq, p), row in zip(where, ids.tolist()):
                selections.append((seq, p, [i for i in row if i >= 0]))
    return format_output(t, emitted, selections, kv_cache, blocks_of, block_pools, fed)


def _g(v):
    return "%.9g" % v


def format_output(t, emitted, selections, kv_cache, blocks_of, block_pools, fed):
    lines = []
    if t.version == 1:
        for seq, pid, vals in sorted(emitted, key=lambda e: (e[0], e[1])):
            lines.append("pool %d %d " % (seq, pid) + " ".join(_g(v) for v in vals))
        lines.append("pools %d" % len(emitted))
        return "\n".join(lines) + "\n"
    last = {}
    for seq, pid, vals in emitted:
        last[(seq, pid)] = vals
    printed = [k for k in sorted(last) if 0 <= k[1] < fed.get(k[0], 0) // t.kpool]
    for k in printed:
        lines.append("pool %d %d " % k + " ".join(_g(v) for v in last[k]))
    lines.append("pools %d" % len(printed))
    lines.append("emitted %d" % len(emitted))
    if t.pool_cache == "fp8_serving":
        codes, scales = ref.split_cache(kv_cache)
        for seq, pid in printed:
            block = blocks_of[seq][pid // block_pools]
            entry = pid % block_pools
            vals = ref.decode_e4m3(codes[block, entry]).tolist()
            lines.append("cache %d %d %s " % (seq, pid, _g(float(scales[block, entry]))) +
                         " ".join(_g(v) for v in vals))
    order = sorted(range(len(selections)), key=lambda i: (selections[i][0], selections[i][1]))
    for i in order:
        seq, p, ids = selections[i]
        lines.append(" ".join(["select", str(seq), str(p)] + [str(x) for x in ids]))
    lines.append("selects %d" % len(selections))
    return "\n".join(lines) + "\n"
