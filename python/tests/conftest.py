import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import kpool  # noqa: E402  (after the path: the package comes from PYTHONPATH)
import reference as ref  # noqa: E402


class Layer:
    """A serving-profile fused fp8 cache with random codes and power-of-two
    scales, a shuffled block table (unassigned blocks -1), and queries."""

    def __init__(self, seed, heads=4, head_dim=32, kpool=4, block_pools=8, num_blocks=12,
                 max_blocks=5, rows_per_request=4, zero_pools=0.25):
        g = torch.Generator().manual_seed(seed)
        self.kpool, self.heads, self.head_dim = kpool, heads, head_dim
        self.block_pools, self.num_blocks, self.max_blocks = block_pools, num_blocks, max_blocks
        codes = torch.randint(0, 0x7F, (num_blocks, block_pools, head_dim), generator=g)
        codes = codes + 0x80 * torch.randint(0, 2, codes.shape, generator=g)
        # Pools of zeros score exactly 0: ties at the cut.
        zero = torch.rand((num_blocks, block_pools), generator=g) < zero_pools
        codes[zero] = 0
        scales = 2.0 ** torch.randint(-8, 3, (num_blocks, block_pools), generator=g).float()
        self.kv_cache = ref.fused_cache(codes.to(torch.uint8), scales)
        self.generator = g

    def block_table(self, requests, assigned):
        """Each request's first assigned[r] blocks, drawn without repeats."""
        perm = torch.randperm(self.num_blocks, generator=self.generator)
        table = torch.full((requests, self.max_blocks), -1, dtype=torch.int32)
        for r in range(requests):
            for b in range(assigned[r]):
                table[r, b] = int(perm[(r * 3 + b) % self.num_blocks])
        return table

    def queries(self, rows, dtype=torch.float32):
        q = torch.randn((rows, self.heads, self.head_dim), generator=self.generator).to(dtype)
        w = torch.randn((rows, self.heads), generator=self.generator)
        return q, w


@pytest.fixture
def layer():
    return Layer(seed=7)


def ragged(lengths, rows):
    """int32 row_offsets and cache_lengths for requests of `rows[r]` query
    rows at positions lengths[r], lengths[r] + 1, ..."""
    offsets = [0]
    for n in rows:
        offsets.append(offsets[-1] + n)
    return (torch.tensor(offsets, dtype=torch.int32),
            torch.tensor(lengths, dtype=torch.int32))
