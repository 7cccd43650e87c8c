"""Instructions per span under callgrind: one mixed tags dict against two.

    python benchmarks/callgrind_mixed_tags.py

The same 1,000 slotted spans (6 str and 3 number tags each) encoded with
their tags as two dicts (`meta`, `metrics`) and as one mixed dict read with
``fields={"meta": "tags", "metrics": "tags"}`` (docs/wire-format.md, "One
mixed tags mapping"), each version's ``encode_traces`` called three times; as
benchmarks/callgrind_user_spans.py, collection is on only inside the C entry
point and the last (warm) call is reported, divided by the span count.
"""

import json
import os
import sys
import tempfile
from types import SimpleNamespace

from callgrind_per_span import callgrind_driver  # the script's folder is on sys.path

CALLS = 3
SPANS = 1000
VERSIONS = ("v0.4", "v0.5", "v1.0")
FORMS = ("two dicts", "one mixed dict")


class TagSpan:
    __slots__ = ("trace_id", "span_id", "parent_id", "service", "name", "resource", "start_ns",
                 "duration_ns", "meta", "metrics", "tags")


def make_trace(mixed):
    trace = []
    for i in range(SPANS):
        span = TagSpan()
        span.trace_id, span.span_id, span.parent_id = 7, i + 1, 1
        span.service, span.name, span.resource = "svc", "web.request", "GET /cart"
        span.start_ns, span.duration_ns = 1_700_000_000_000_000_000 + i, 1000 + i
        meta = {"http.method": "GET", "http.url": "/cart/%d" % i, "component": "web",
                "span.kind": "server", "peer.service": "db", "env": "prod"}
        metrics = {"_sampling_priority_v1": 1, "http.status_code": 200, "db.rows": float(i)}
        if mixed:
            span.tags = {**meta, **metrics}
        else:
            span.meta, span.metrics = meta, metrics
        trace.append(span)
    return trace


def driver(spec_path):
    import gc

    import spanpack

    order = []
    gc.disable()
    for form in FORMS:
        mixed = form == "one mixed dict"
        trace = make_trace(mixed)
        for version in VERSIONS:
            encoder = spanpack.TraceMsgPackEncoder(version, {"meta": "tags", "metrics": "tags"} if mixed else None)
            for _ in range(CALLS):
                encoder.encode_traces([trace])
                order.append((form, version))
    with open(spec_path) as f:
        plan_path = json.load(f)["plan"]
    with open(plan_path, "w") as f:
        json.dump(order, f)


def main():
    if sys.argv[1:2] == ["--driver"]:
        driver(sys.argv[2])
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        order, counts = callgrind_driver(
            SimpleNamespace(valgrind="valgrind"), sys.executable, __file__, tmp,
            "trace_encoder_encode_traces", {"plan": os.path.join(tmp, "plan.json")},
            dict(os.environ, PYTHONMALLOC="malloc"), "mixed tags", lambda line: None)
    if len(counts) != len(order):
        raise SystemExit("expected %d dumps, found %d" % (len(order), len(counts)))
    results = {tuple(key): count / SPANS for key, count in zip(order, counts)}  # the last call wins
    print("instructions per span (encode_traces, warm, callgrind; 6 str and 3 number tags)")
    print("%-16s" % "tags" + "".join("%10s" % version for version in VERSIONS))
    for form in FORMS:
        print("%-16s" % form + "".join("%10.0f" % results[(form, version)] for version in VERSIONS))
    return 0


if __name__ == "__main__":
    sys.exit(main())
