"""Every malformed argument raises a RuntimeError that names it, and nothing
is written: the output keeps its sentinel."""

import pytest
import torch

import kpool
from conftest import Layer, ragged

TOPK = 4


def good_arguments():
    layer = Layer(seed=5)
    row_offsets, cache_lengths = ragged([0, 21], [6, 2])
    table = layer.block_table(2, [1, 1])
    q, w = layer.queries(8)
    return dict(q=q, weights=w, topk=TOPK, row_offsets=row_offsets,
                cache_lengths=cache_lengths, positions=None, kv_cache=layer.kv_cache,
                block_table=table, kpool=layer.kpool, rotate=False,
                pool_ids=torch.full((8, TOPK), -7, dtype=torch.int32))


def call(a):
    kpool.ops.score_select(a["q"], a["weights"], a["topk"], a["row_offsets"],
                           a["cache_lengths"], a["positions"], a["kv_cache"],
                           a["block_table"], a["kpool"], a["rotate"], a["pool_ids"], True)


def with_(name, value):
    def change(a):
        a[name] = value(a) if callable(value) else value
    return change


# (case, the argument the message must name, how to break the arguments)
CASES = [
    ("q float64", "q", with_("q", lambda a: a["q"].double())),
    ("q int", "q", with_("q", lambda a: a["q"].int())),
    ("q not contiguous", "q", with_("q", lambda a: a["q"].transpose(0, 1).contiguous()
                                    .transpose(0, 1))),
    ("q 2-D", "q", with_("q", lambda a: a["q"].reshape(8, -1))),
    ("q D not the cache's", "q", with_("q", lambda a: a["q"][..., :16].contiguous())),
    ("q on another device", "q", with_("q", lambda a: a["q"].to("meta"))),
    ("weights float64", "weights", with_("weights", lambda a: a["weights"].double())),
    ("weights rows", "weights", with_("weights", lambda a: a["weights"][:7].contiguous())),
    ("weights heads", "weights", with_("weights", lambda a: a["weights"][:, :3].contiguous())),
    ("row_offsets int64", "row_offsets", with_("row_offsets", lambda a: a["row_offsets"].long())),
    ("cache_lengths missing", "cache_lengths", with_("cache_lengths", None)),
    ("cache_lengths length", "cache_lengths",
     with_("cache_lengths", lambda a: torch.zeros(3, dtype=torch.int32))),
    ("both forms", "positions",
     with_("positions", lambda a: torch.zeros((2, 1), dtype=torch.int32))),
    ("no form", "positions", lambda a: a.update(row_offsets=None, cache_lengths=None)),
    ("kv_cache float32", "kv_cache", with_("kv_cache", lambda a: a["kv_cache"].float())),
    ("kv_cache 2-D", "kv_cache",
     with_("kv_cache", lambda a: a["kv_cache"].reshape(a["kv_cache"].shape[0], -1))),
    ("block_table int64", "block_table", with_("block_table", lambda a: a["block_table"].long())),
    ("block_table rows", "block_table", with_("block_table", lambda a: a["block_table"][:1])),
    ("kpool 0", "kpool", with_("kpool", 0)),
    ("topk 0", "topk", with_("topk", 0)),
    ("pool_ids width", "pool_ids",
     with_("pool_ids", lambda a: torch.full((8, TOPK + 1), -7, dtype=torch.int32))),
    ("pool_ids int64", "pool_ids",
     with_("pool_ids", lambda a: torch.full((8, TOPK), -7, dtype=torch.int64))),
    # Data, refused by KPool's validation (the message is KPool's own).
    ("a negative cache length", "cache_lengths",
     with_("cache_lengths", lambda a: torch.tensor([0, -3], dtype=torch.int32))),
    ("row_offsets decreasing", "row_offsets",
     with_("row_offsets", lambda a: torch.tensor([0, 6, 5], dtype=torch.int32))),
    ("a visible pool's block unassigned", "block_table",
     with_("block_table", lambda a: torch.full_like(a["block_table"], -1))),
    ("a visible pool's block past the cache", "block_table",
     with_("block_table", lambda a: torch.full_like(a["block_table"], 1000))),
    ("rotation with D not a power of two", "head_dim",
     lambda a: a.update(rotate=True,
                        kv_cache=torch.zeros((4, 8, 24 + 4), dtype=torch.uint8),
                        q=a["q"][..., :24].contiguous())),
]


def test_the_good_arguments_are_taken():
    a = good_arguments()
    call(a)
    assert not torch.any(a["pool_ids"] == -7)


@pytest.mark.parametrize("case,name,change", CASES, ids=[c[0] for c in CASES])
def test_a_malformed_argument_is_named_and_nothing_written(case, name, change):
    a = good_arguments()
    change(a)
    out = a["pool_ids"]
    before = out.clone() if out.device.type == "cpu" else None
    kv_before = a["kv_cache"].clone() if a["kv_cache"].device.type == "cpu" else None
    with pytest.raises(RuntimeError) as error:
        call(a)
    message = str(error.value)
    assert "argument '%s'" % name in message, message
    assert "\n" not in message.strip() or "Exception raised" not in message, message
    if before is not None:
        assert torch.equal(out, before), case
    if kv_before is not None:
        assert torch.equal(a["kv_cache"], kv_before), case


def test_expand_topk_refuses_a_wrong_width():
    layer = Layer(seed=5)
    row_offsets, cache_lengths = ragged([0], [3])
    ids = torch.zeros((3, 2), dtype=torch.int32)
    out = torch.full((3, 9), -7, dtype=torch.int32)
    with pytest.raises(RuntimeError, match="argument 'out'"):
        kpool.ops.expand_topk(ids, False, row_offsets, cache_lengths, layer.kv_cache,
                              layer.kpool, out, True)
    assert torch.all(out == -7)


def test_kpools_own_error_keeps_its_message():
    a = good_arguments()
    a["cache_lengths"] = torch.tensor([0, -3], dtype=torch.int32)
    with pytest.raises(RuntimeError) as error:
        call(a)
    # The op, then KPool's InvalidArgument text: entry point, argument, row, value.
    assert str(error.value).startswith(
        "kpool.score_select: KPool::score_select: argument 'cache_lengths', row 1: value "), \
        str(error.value)
