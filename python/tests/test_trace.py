"""Serving traces replayed through torch.ops.kpool alone (trace_replay.py)
print exactly what kpool_replay prints: every pool, the fp8 serving cache's
entries and every selection, byte for byte. The traces come from
kpool_tracegen, and one is the repository's decode-shaped trace; the two
programs are the build's (KPOOL_BUILD_DIR)."""

import os
import subprocess

import pytest

import trace_replay

BUILD = os.environ.get("KPOOL_BUILD_DIR", "")
EXAMPLES = os.path.join(BUILD, "example")
SOURCE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOOLS = [os.path.join(EXAMPLES, name) for name in ("kpool_tracegen", "kpool_replay")]

pytestmark = pytest.mark.skipif(
    not all(os.access(p, os.X_OK) for p in TOOLS),
    reason="needs kpool_tracegen and kpool_replay (KPool_ENABLE_EXAMPLES, KPOOL_BUILD_DIR)")

SERVING = ["--pool-cache", "fp8_serving", "--index-heads", "4", "--index-topk", "8",
           "--head-dim", "32", "--kpool", "4", "--dtype", "bf16"]

TRACES = {
    # The serving profile, rotated: prefill chunks, continuations, decodes,
    # select blocks.
    "serving": SERVING + ["--rotate", "1", "--seed", "5", "--sequences", "8", "--calls", "24"],
    # Speculative rounds of 3 drafts, rejected ones re-sent (rewinds), K = 3.
    "rewinds": ["--pool-cache", "fp8_serving", "--index-heads", "2", "--index-topk", "6",
                "--head-dim", "16", "--kpool", "3", "--dtype", "f16", "--drafts", "3",
                "--seed", "9", "--sequences", "7", "--calls", "30"],
    # f32 keys, no rotation, larger chunks.
    "unrotated": SERVING[:-1] + ["f32", "--seed", "13", "--max-chunk", "40", "--calls", "16"],
}


def generated(args):
    return subprocess.run([TOOLS[0]] + args, check=True, capture_output=True,
                          text=True).stdout


def replayed(text):
    env = dict(os.environ, OMP_PROC_BIND="false")
    return subprocess.run([TOOLS[1], "-"], input=text, check=True, capture_output=True,
                          text=True, env=env).stdout


def count(output, what):
    return int(next(l for l in output.splitlines() if l.startswith(what + " ")).split()[1])


def assert_same(text):
    expected = replayed(text)
    got = trace_replay.replay(text)
    assert "select " in expected and "cache " in expected
    if got != expected:
        for n, (a, b) in enumerate(zip(got.splitlines(), expected.splitlines())):
            assert a == b, "line %d differs:\n ops:          %s\n kpool_replay: %s" % (
                n + 1, a[:200], b[:200])
        assert len(got) == len(expected), "different lengths"


@pytest.mark.parametrize("name", sorted(TRACES))
def test_a_generated_trace_through_the_ops_prints_what_kpool_replay_prints(name):
    text = generated(TRACES[name])
    assert_same(text)
    if name == "rewinds":
        # Re-sent drafts: pools emitted again.
        out = replayed(text)
        assert count(out, "emitted") > count(out, "pools")


def test_the_decode_trace_through_the_ops_prints_what_kpool_replay_prints():
    with open(os.path.join(SOURCE, "unit_tests", "trace", "decode_8x8192.trace")) as f:
        assert_same(f.read())
