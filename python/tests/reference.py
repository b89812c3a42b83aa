"""An independent reference of the serving profile's scoring and selection
(docs/indexer.md, "The serving profile"; spec INDEXER.md) and of
expand_topk (spec SEMANTICS.md), in plain PyTorch, written from the spec
and sharing no code with KPool. Scores are f64 sums of the exact f32 E4M3
products, so they differ from KPool's f32 sums by rounding only."""

import math

import torch

# ---------------------------------------------------------------------------
# OCP FP8 E4M3FN: 1 sign bit, 4 exponent bits (bias 7), 3 mantissa bits,
# subnormals, max finite 448, NaN S.1111.111, no infinity.


def e4m3_value(code):
    """The value of an E4M3FN byte (NaN for 0x7F and 0xFF)."""
    sign = -1.0 if code & 0x80 else 1.0
    e = (code >> 3) & 0xF
    m = code & 0x7
    if e == 0xF and m == 0x7:
        return float("nan")
    if e == 0:
        return sign * (m / 8.0) * 2.0 ** -6
    return sign * (1.0 + m / 8.0) * 2.0 ** (e - 7)


E4M3_TABLE = torch.tensor([e4m3_value(c) for c in range(256)], dtype=torch.float64)
# The 127 non-negative finite codes' values, increasing with the code.
_POSITIVE = E4M3_TABLE[:127].clone()


def decode_e4m3(codes):
    return E4M3_TABLE[codes.long()]


def encode_e4m3(values):
    """Round f32 values in [-448, 448] to nearest even E4M3FN codes."""
    v = values.double()
    a = v.abs().clamp(max=448.0)
    hi = torch.searchsorted(_POSITIVE, a).clamp(max=126)
    lo = (hi - 1).clamp(min=0)
    dlo = a - _POSITIVE[lo]
    dhi = _POSITIVE[hi] - a
    pick_hi = (dhi < dlo) | ((dhi == dlo) & (hi % 2 == 0))
    code = torch.where(pick_hi, hi, lo)
    code = torch.where(a == _POSITIVE[hi], hi, code)
    sign = (v < 0) & (code != 0)
    return (code + sign.long() * 0x80).to(torch.uint8)


# ---------------------------------------------------------------------------
# The serving profile's quantization of one row of D values.


def ceil_ue8m0(x):
    """DeepGEMM's ceil_to_ue8m0 of f32 values: the exponent field plus one
    when the mantissa is not zero, clamped to [1, 254], mantissa cleared."""
    bits = x.float().contiguous().view(torch.int32)
    exponent = (bits >> 23) & 0xFF
    exponent = exponent + ((bits & 0x7FFFFF) != 0).int()
    exponent = exponent.clamp(1, 254)
    return (exponent << 23).view(torch.float32)


def rotate(x):
    """The orthonormal Walsh-Hadamard transform of the last dimension, as the
    spec orders it: f32 butterflies for h = 1, 2, ..., D/2, then times the
    f32 nearest 1/sqrt(D)."""
    x = x.float().clone()
    d = x.shape[-1]
    h = 1
    while h < d:
        y = x.reshape(*x.shape[:-1], d // (2 * h), 2, h)
        a, b = y[..., 0, :].clone(), y[..., 1, :].clone()
        y[..., 0, :] = a + b
        y[..., 1, :] = a - b
        x = y.reshape(*x.shape[:-1], d)
        h *= 2
    return x * torch.tensor(1.0 / math.sqrt(d), dtype=torch.float32)


def quantize_rows(x, rotated):
    """Serving-profile quantization of rows of D values: (codes, scales)."""
    v = rotate(x) if rotated else x.float()
    v = v.to(torch.bfloat16).float()
    finite = torch.where(torch.isfinite(v), v.abs(), torch.zeros_like(v))
    amax = torch.clamp(finite.amax(dim=-1), min=torch.tensor(1e-4, dtype=torch.float32))
    scale = ceil_ue8m0(amax * torch.tensor(1.0 / 448.0, dtype=torch.float32))
    quotient = (v / scale.unsqueeze(-1)).clamp(-448.0, 448.0)
    return encode_e4m3(quotient), scale


# ---------------------------------------------------------------------------
# The engines' fused cache: uint8 [num_blocks, block_pools, D + 4], block b's
# block_pools * D codes, then its block_pools f32 scales.


def fused_cache(codes, scales):
    """codes [num_blocks, block_pools, D] uint8, scales [num_blocks,
    block_pools] f32 -> the fused buffer [num_blocks, block_pools, D + 4]."""
    nb, bp, d = codes.shape
    flat = torch.empty((nb, bp * (d + 4)), dtype=torch.uint8)
    flat[:, : bp * d] = codes.reshape(nb, bp * d)
    flat[:, bp * d:] = scales.float().contiguous().view(torch.uint8).reshape(nb, bp * 4)
    return flat.reshape(nb, bp, d + 4)


def split_cache(kv_cache):
    nb, bp, d4 = kv_cache.shape[0], kv_cache.shape[1], kv_cache.shape[-1]
    d = d4 - 4
    flat = kv_cache.reshape(nb, bp * d4)
    codes = flat[:, : bp * d].reshape(nb, bp, d)
    scales = flat[:, bp * d:].contiguous().view(torch.float32).reshape(nb, bp)
    return codes, scales


# ---------------------------------------------------------------------------
# Scores and the selection rule.


def row_positions(row_offsets=None, cache_lengths=None, positions=None):
    """(request, position) of every query row, in row order."""
    rows = []
    if positions is not None:
        for r in range(positions.shape[0]):
            real = [int(p) for p in positions[r] if p >= 0]
            first_i = next(i for i in range(positions.shape[1]) if positions[r, i] >= 0)
            base = real[0] - first_i
            for i in range(positions.shape[1]):
                rows.append((r, base + i))
        return rows
    for r in range(len(cache_lengths)):
        for i in range(int(row_offsets[r + 1] - row_offsets[r])):
            rows.append((r, int(cache_lengths[r]) + i))
    return rows


def reference_scores(q, weights, kv_cache, block_table, kpool, rows, rotated):
    """f64 scores [T, max_blocks * block_pools] (-inf past the visible pools)
    and each row's S (the tolerance's scale)."""
    codes, kscale = split_cache(kv_cache)
    bp = codes.shape[1]
    width = block_table.shape[1] * bp
    t_rows = q.shape[0]
    heads, d = q.shape[-2], q.shape[-1]
    q8, qscale = quantize_rows(q.reshape(t_rows, heads, d), rotated)
    qv = decode_e4m3(q8)
    out = torch.full((t_rows, width), float("-inf"), dtype=torch.float64)
    bound = torch.zeros(t_rows, dtype=torch.float64)
    for t, (r, pos) in enumerate(rows):
        visible = (pos + 1) // kpool
        for p in range(visible):
            block = int(block_table[r, p // bp])
            k = decode_e4m3(codes[block, p % bp])
            dots = qv[t] @ k
            w = weights[t].double() * qscale[t].double()
            s = float(kscale[block, p % bp])
            out[t, p] = s * float((w * dots.clamp(min=0)).sum())
            mag = s * float((weights[t].double().abs() * qscale[t].double() *
                             (qv[t].abs() @ k.abs())).sum())
            bound[t] = max(float(bound[t]), mag)
    return out, bound


def visible_pools(pos, kpool):
    return (pos + 1) // kpool


def check_selection(ids, exact, bound, visible, topk):
    """The spec's rule for one row: the first min(topk, visible) ids, ascending,
    then -1; every selected pool's exact score at least every unselected
    visible pool's minus 1e-5 * S. Returns an error string or None."""
    n = min(topk, visible)
    chosen = [int(i) for i in ids[:n]]
    if any(int(i) != -1 for i in ids[n:]):
        return "columns past min(topk, visible) are not -1: %s" % ids.tolist()
    if chosen != sorted(set(chosen)) or any(c < 0 or c >= visible for c in chosen):
        return "ids are not distinct ascending visible pools: %s" % chosen
    rest = [p for p in range(visible) if p not in set(chosen)]
    if chosen and rest:
        low = min(float(exact[c]) for c in chosen)
        high = max(float(exact[p]) for p in rest)
        if low < high - 1e-5 * float(bound):
            return "selected %.9g below unselected %.9g (S = %g)" % (low, high, bound)
    return None


def rank(scores_row, visible, topk):
    """KPool's ranking of its own scores: higher first, ties to the lower id,
    NaN last; the first min(topk, visible), ascending."""
    order = sorted(range(visible),
                   key=lambda p: (math.isnan(scores_row[p]), -scores_row[p]
                                  if not math.isnan(scores_row[p]) else 0.0, p))
    return sorted(order[:min(topk, visible)])


def expand_reference(pool_ids, row_offsets, cache_lengths, kpool, tail_always):
    """SEMANTICS.md's expand_topk on a ragged batch."""
    t_rows, topk = pool_ids.shape
    width = topk * kpool + (kpool - 1 if tail_always else 0)
    out = torch.full((t_rows, width), -1, dtype=torch.int32)
    for r in range(len(cache_lengths)):
        for i in range(int(row_offsets[r + 1] - row_offsets[r])):
            t = int(row_offsets[r]) + i
            visible = int(cache_lengths[r]) + i + 1
            for j in range(topk * kpool):
                pid = int(pool_ids[t, j // kpool])
                if pid >= 0 and (pid + 1) * kpool <= visible:
                    out[t, j] = pid * kpool + j % kpool
            if tail_always:
                for j in range(kpool - 1):
                    if j < visible % kpool:
                        out[t, topk * kpool + j] = visible - visible % kpool + j
    return out
