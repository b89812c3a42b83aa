"""The nn.Module example (python/examples/indexer.py): on the C++ model
loop's stand-in inputs, its layers select exactly what
example/kpool_model_loop.cpp's KPool::Layer objects select, every token of
every layer of every call; with its own projections it runs the same
schedule through."""

import importlib.util
import os
import subprocess

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLE = os.path.join(os.path.dirname(HERE), "examples", "indexer.py")
MODEL_LOOP = os.path.join(os.environ.get("KPOOL_BUILD_DIR", ""), "example", "kpool_model_loop")


def load_example():
    spec = importlib.util.spec_from_file_location("kpool_indexer_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(not os.access(MODEL_LOOP, os.X_OK),
                    reason="needs kpool_model_loop (KPool_ENABLE_EXAMPLES, KPOOL_BUILD_DIR)")
def test_the_module_selects_what_the_cpp_model_loop_selects(tmp_path):
    layers = 2
    expected_file = tmp_path / "cpp.txt"
    env = dict(os.environ, OMP_PROC_BIND="false")
    subprocess.run([MODEL_LOOP, str(layers), "--selections", str(expected_file)], check=True,
                   capture_output=True, env=env)
    expected = expected_file.read_text().splitlines()
    example = load_example()
    got = example.serve([example.StandInIndexer(l) for l in range(layers)])
    assert len(got) == len(expected) and len(got) > 100
    for n, (a, b) in enumerate(zip(got, expected)):
        assert a == b, "selection %d: module %s, model loop %s" % (n, a, b)


def test_the_module_with_projections_serves_the_schedule():
    import torch
    example = load_example()
    torch.manual_seed(1)
    lines = example.serve([example.KPooledIndexer(64, l) for l in range(2)], hidden_size=64)
    # 3 prefill calls of 29 + 11 + 42 tokens and 5 rounds of 3 x 3, 2 layers.
    assert len(lines) == 2 * (29 + 11 + 42 + 5 * 9)
    for line in lines:
        f = line.split()
        pos, tokens = int(f[5]), [int(x) for x in f[6:]]
        visible = (pos + 1) // example.K
        pools = [t // example.K for t in tokens[:example.TOPK * example.K:example.K] if t >= 0]
        assert len(pools) == min(example.TOPK, visible)
        assert pools == sorted(set(pools)) and all(p < visible for p in pools)
