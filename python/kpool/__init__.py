"""KPool from PyTorch: the k-pooled indexer's selection stage as torch.ops.kpool.

``import kpool`` loads ``libkpool_torch.so`` (built beside this file in
``<build>/python/kpool``; ``KPOOL_TORCH_LIBRARY`` names another), which
registers the operators ``torch.ops.kpool.*`` (docs/torch.md). The
operators write into the caller's tensors; the functions here are thin
conveniences over them that allocate an output when none is given.

Kokkos is initialized on the first operator call (it reads
``OMP_NUM_THREADS`` through the OpenMP runtime PyTorch shares) and
finalized at interpreter exit.
"""

import atexit
import os

import torch

__all__ = [
    "ops",
    "score",
    "score_select",
    "select_tokens",
    "expand_topk",
    "select_tokens_width",
    "expand_topk_width",
    "decode_positions",
    "set_workspace_limit",
]


def _library_path():
    explicit = os.environ.get("KPOOL_TORCH_LIBRARY")
    if explicit:
        return explicit
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "libkpool_torch.so")


_path = _library_path()
if not os.path.exists(_path):
    raise ImportError(
        "kpool: %s is missing: build KPool with PyTorch found (KPool_ENABLE_TORCH, "
        "docs/torch.md) and put <build>/python on PYTHONPATH, or set KPOOL_TORCH_LIBRARY"
        % _path
    )
torch.ops.load_library(_path)

#: The raw operators, ``torch.ops.kpool``.
ops = torch.ops.kpool


def _finalize():
    ops._finalize()


atexit.register(_finalize)


def select_tokens_width(topk, kpool):
    """Columns of select_tokens' output: ``topk * K + K - 1``."""
    return topk * kpool + kpool - 1


def expand_topk_width(pool_topk, kpool, tail_always):
    """Columns of expand_topk's output: ``pool_topk * K``, plus ``K - 1`` with the tail."""
    return pool_topk * kpool + (kpool - 1 if tail_always else 0)


def decode_positions(context_lens, next_n):
    """A decode batch's positions ``[B, next_n]`` (int32) from the engines'
    context lengths ``[B]`` (each sequence's length with this step's tokens):
    row r's tokens are at ``context_lens[r] - next_n + i``."""
    base = context_lens.to(torch.int32).reshape(-1, 1) - next_n
    return base + torch.arange(next_n, dtype=torch.int32, device=context_lens.device)


def _rows(q, positions):
    if positions is not None and q.dim() == 4:
        return q.shape[0] * q.shape[1]
    return q.shape[0]


def score(q, weights, kv_cache, block_table, kpool, *, row_offsets=None, cache_lengths=None,
          positions=None, rotate=False, scores=None, validate=True):
    """Every visible pool's score, ``[T, max_blocks * block_pools]`` float32,
    ``-inf`` past a row's visible pools (DeepGEMM's paged logits' shape)."""
    if scores is None:
        width = block_table.shape[1] * kv_cache.shape[1]
        scores = torch.empty((_rows(q, positions), width), dtype=torch.float32, device=q.device)
    ops.score(q, weights, row_offsets, cache_lengths, positions, kv_cache, block_table, kpool,
              rotate, scores, validate)
    return scores


def score_select(q, weights, topk, kv_cache, block_table, kpool, *, row_offsets=None,
                 cache_lengths=None, positions=None, rotate=False, pool_ids=None,
                 validate=True):
    """Each query row's best ``topk`` visible pools, ascending, then -1."""
    if pool_ids is None:
        pool_ids = torch.empty((_rows(q, positions), topk), dtype=torch.int32, device=q.device)
    ops.score_select(q, weights, topk, row_offsets, cache_lengths, positions, kv_cache,
                     block_table, kpool, rotate, pool_ids, validate)
    return pool_ids


def select_tokens(q, weights, topk, kv_cache, block_table, kpool, *, row_offsets=None,
                  cache_lengths=None, positions=None, rotate=False, tokens=None,
                  validate=True):
    """score_select expanded to token positions, with the always-selected tail."""
    if tokens is None:
        tokens = torch.empty((_rows(q, positions), select_tokens_width(topk, kpool)),
                             dtype=torch.int32, device=q.device)
    ops.select_tokens(q, weights, topk, row_offsets, cache_lengths, positions, kv_cache,
                      block_table, kpool, rotate, tokens, validate)
    return tokens


def expand_topk(pool_ids, tail_always, row_offsets, cache_lengths, kv_cache, kpool, *,
                out=None, validate=True):
    """Selected pool ids to token positions (ragged batch)."""
    if out is None:
        width = expand_topk_width(pool_ids.shape[1], kpool, tail_always)
        out = torch.empty((pool_ids.shape[0], width), dtype=torch.int32,
                          device=pool_ids.device)
    ops.expand_topk(pool_ids, tail_always, row_offsets, cache_lengths, kv_cache, kpool, out,
                    validate)
    return out


def set_workspace_limit(nbytes):
    """The most bytes of score keys a selection workspace holds (default
    256 MiB): a call with more query rows selects in chunks of that many."""
    ops.set_workspace_limit(nbytes)
