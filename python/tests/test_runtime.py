"""Kokkos inside the Python process: started on the first op with
OMP_NUM_THREADS threads, sharing PyTorch's OpenMP runtime, finalized at
interpreter exit without a crash; an op after that is refused, not a crash."""

import os
import subprocess
import sys

import pytest

PROGRAM = r"""
import sys, torch, kpool
sys.path.insert(0, %r)
from conftest import Layer, ragged
layer = Layer(seed=3)
row_offsets, cache_lengths = ragged([0, 40], [9, 5])
table = layer.block_table(2, [2, 3])
q, w = layer.queries(14)
def select():
    return kpool.score_select(q, w, 6, layer.kv_cache, table, layer.kpool,
                              row_offsets=row_offsets, cache_lengths=cache_lengths)
ids = select()          # Kokkos starts here, with OMP_NUM_THREADS threads
threads = kpool.ops.concurrency()
torch.set_num_threads(2)
x = torch.randn(512, 512) @ torch.randn(512, 512)   # PyTorch's own OpenMP threads
assert torch.equal(select(), ids)
print(threads, ids.flatten().tolist())
"""


def run(threads, extra=""):
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), OMP_PROC_BIND="false")
    here = os.path.dirname(os.path.abspath(__file__))
    return subprocess.run([sys.executable, "-c", PROGRAM % here + extra], env=env,
                          capture_output=True, text=True, timeout=120)


def test_threads_follow_omp_num_threads_and_the_bits_do_not():
    one, two = run(1), run(2)
    assert one.returncode == 0, one.stderr
    assert two.returncode == 0, two.stderr
    c1, ids1 = one.stdout.split(" ", 1)
    c2, ids2 = two.stdout.split(" ", 1)
    assert (int(c1), int(c2)) == (1, 2)
    assert ids1 == ids2


def test_exit_finalizes_cleanly_and_a_later_op_is_refused():
    done = run(2, "\nimport atexit\nkpool._finalize()\n"
                  "try:\n    kpool.ops.concurrency()\nexcept RuntimeError as e:\n"
                  "    print('refused:', str(e).splitlines()[0])\n")
    assert done.returncode == 0, done.stderr
    assert "refused: kpool: Kokkos was finalized" in done.stdout, done.stdout
    assert "Segmentation" not in done.stderr and "terminate" not in done.stderr, done.stderr
