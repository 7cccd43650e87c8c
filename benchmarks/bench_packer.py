"""spanpack's general Packer against msgpack-python's, input by input.

    pip install -e '.[bench]'
    pytest benchmarks/ --benchmark-only
    python benchmarks/ratios.py          # the same run, summarised as msgpack/spanpack ratios

Each input is its own benchmark group, so pytest-benchmark prints the four
contenders for it side by side:

    spanpack.packb          module-level function, a fresh buffer per call
    spanpack.Packer.pack    one Packer made outside the timed loop, reused
    msgpack.packb           likewise for msgpack-python
    msgpack.Packer.pack

Before timing, every contender's output is decoded with msgpack.unpackb and
must give back the input, so a fast wrong answer cannot win.
"""

import msgpack
import pytest

import spanpack


def _span(i):
    """A dict shaped like a Datadog span: ~10 meta tags and 4 metrics."""
    return {
        "trace_id": 0x5B6A7C8D9E0F1A2B + i,
        "span_id": 0x1000000000000000 + 7919 * i,
        "parent_id": 0x1000000000000000 + 7919 * (i - 1) if i else 0,
        "service": "checkout-api",
        "name": "postgres.query" if i % 3 else "http.request",
        "resource": "SELECT * FROM orders WHERE customer_id = ? AND status = ?",
        "type": "sql" if i % 3 else "web",
        "start": 1700000000000000000 + 1000 * i,
        "duration": 1500000 + 37 * i,
        "error": 1 if i % 17 == 0 else 0,
        "meta": {
            "env": "prod",
            "version": "4.12.0",
            "component": "psycopg",
            "span.kind": "client",
            "db.system": "postgresql",
            "db.name": "orders",
            "db.user": "checkout",
            "out.host": "db-primary.internal",
            "runtime-id": "2f1e4cf0a1b34c4a9a0b7f5d6e3c2b1a",
            "_dd.p.dm": "-0",
        },
        "metrics": {
            "_dd.top_level": 1,
            "_sampling_priority_v1": 1,
            "_dd.measured": 1,
            "process_id": 4242.0 + i,
        },
    }


INPUTS = {
    "small_int": 42,
    "float": 3.141592653589793,
    "str_ascii": "GET /api/v2/orders/{id}/items",
    "str_non_ascii": "créer_commande → ☃ 注文を作成",
    "bytes_64": bytes(range(64)),
    "list_1000_mixed": [
        [i, -i * 1000003, i / 7.0, "item-%d" % i, b"\x00\x01" * (i % 5), None, i % 2 == 0][i % 7]
        for i in range(1000)
    ],
    "dict_100_str_str": {"key-%03d" % i: "value number %d" % i for i in range(100)},
    "spans_50": [_span(i) for i in range(50)],
}


def _contenders():
    sp_packer = spanpack.Packer()
    mp_packer = msgpack.Packer()
    return {
        "spanpack.packb": spanpack.packb,
        "spanpack.Packer.pack": sp_packer.pack,
        "msgpack.packb": msgpack.packb,
        "msgpack.Packer.pack": mp_packer.pack,
    }


CONTENDERS = ["spanpack.packb", "spanpack.Packer.pack", "msgpack.packb", "msgpack.Packer.pack"]


@pytest.mark.parametrize("contender", CONTENDERS)
@pytest.mark.parametrize("case", list(INPUTS))
def test_pack(benchmark, case, contender):
    value = INPUTS[case]
    pack = _contenders()[contender]

    out = pack(value)
    assert msgpack.unpackb(out, raw=False, strict_map_key=False) == value, contender

    benchmark.group = case
    benchmark.extra_info["case"] = case
    benchmark.extra_info["contender"] = contender
    benchmark(pack, value)
