#!/usr/bin/env python3
"""Writes fuzz/corpus/sequence/: fuzz_sequence's seeds, one a rule of the
slot contract (docs/ring.md) and a call path, in the harness's input layout
(fuzz/fuzz_sequence.cpp, fuzz/README.md). K = 4, R = 4 or 8.

    python3 fuzz/make_sequence_seeds.py fuzz/corpus/sequence
"""
import os
import sys

FUSED, UNFUSED, DECODE, WRITERS, TAIL_UPDATE, RESET, SEED = range(7)
PATHS = {"fused": FUSED, "unfused": UNFUSED, "decode": DECODE, "writers": WRITERS,
         "tail_update": TAIL_UPDATE}
# start_for's kinds
CONTINUE, REWIND, GAP, ZERO, BOUNDARY, ANY = range(6)
K = 4


def call(path, how, d, n, validate=True, slot=0, at=0):
    """One call of one row on `slot`: its start (`how`, `d`; `at` for a
    pool boundary, at * K, or any position, at) and n tokens. A decode
    call takes next_n = n (no padding)."""
    b = [path, 1 if validate else 0]
    if path in (DECODE, TAIL_UPDATE):
        b.append(max(n, 1) - 1)      # next_n = 1 + pick(2K)
    b += [0, slot, how, d]           # B = 1, first slot, how, d
    if how in (BOUNDARY, ANY):
        b.append(at)
    b.append(n)
    if path in (DECODE, TAIL_UPDATE):
        b.append(0)                  # no padding
    return b


def send(path, n, slot=0):
    """Continue the slot's sequence by n tokens."""
    return call(path, CONTINUE, 0, n, slot=slot)


def prefill(path, total, slot=0):
    """Positions [0, total) in calls of at most 2K + 1 (ragged) or 2K (decode)."""
    most = 2 * K if path in (DECODE, TAIL_UPDATE) else 2 * K + 1
    b = call(path, ZERO, 0, min(total, most), slot=slot)
    total -= min(total, most)
    while total > 0:
        b += send(path, min(total, most), slot)
        total -= min(total, most)
    return b


def seeds():
    out = {}
    for name, path in PATHS.items():
        head = [K - 1, 0, 7]  # K = 4, R = 4, values seed 7
        # A gap: 40 sent, then c = 42 (L + 2), refused; then the continuation.
        out[f"gap_{name}"] = head + prefill(path, 40) + call(path, GAP, 1, 2) + send(path, 4)
        # A mid-pool start in a reset slot, refused; a seeded one accepted.
        out[f"fresh_mid_pool_{name}"] = (
            head + prefill(path, 12) + [RESET, 0, 0] + call(path, ANY, 0, 2, at=102) +
            [SEED, 1, 0, 1, 25, 2] + send(path, 2))
        # Before the slot's start: start at 100, rewind to 98 (within the
        # depth of R = 8: 102 - 96 <= 8).
        out[f"before_start_{name}"] = (
            [K - 1, 1, 7] + [RESET, 0, 0] + call(path, BOUNDARY, 0, 2, at=25) +
            call(path, REWIND, 3, 3))
        # Too deep: 13 sent, a rewind to 7 (13 - 4 > R = 4) refused.
        out[f"too_deep_{name}"] = head + prefill(path, 13) + call(path, REWIND, 5, 2)
        # The same without validation: the sanitizers hold it, the slot resets.
        out[f"unvalidated_{name}"] = (head + prefill(path, 13) +
                                      call(path, REWIND, 5, 2, validate=False) +
                                      call(path, GAP, 3, 2, validate=False) + prefill(path, 9))
        # Speculative rounds on R = 8: the next token and 3 drafts, 2 rejected.
        spec = [K - 1, 1, 9] + prefill(path, 6)
        for _ in range(4):
            spec += send(path, 4) + call(path, REWIND, 1, 4)
        out[f"speculative_{name}"] = spec
    # Three slots at once, mixed paths.
    mixed = [K - 1, 1, 3]
    mixed += [FUSED, 1, 2, 0, ZERO, 0, 9, ZERO, 0, 5, ZERO, 0, 7]
    mixed += [DECODE, 1, 3, 2, 0, CONTINUE, 0, 4, 0, CONTINUE, 0, 3, 1, CONTINUE, 0, 4, 0]
    mixed += [WRITERS, 1, 2, 1, CONTINUE, 0, 9, CONTINUE, 0, 2, REWIND, 2, 5]
    mixed += [TAIL_UPDATE, 1, 1, 1, 0, CONTINUE, 0, 2, 0, CONTINUE, 0, 2, 0]
    out["mixed_slots"] = mixed
    return out


def main():
    folder = sys.argv[1] if len(sys.argv) > 1 else "fuzz/corpus/sequence"
    os.makedirs(folder, exist_ok=True)
    for name, data in seeds().items():
        with open(os.path.join(folder, name), "wb") as f:
            f.write(bytes(x & 0xFF for x in data))


if __name__ == "__main__":
    main()
