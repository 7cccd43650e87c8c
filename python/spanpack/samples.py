"""Deterministic sample traces for benchmarks, in every span input form.

Each *shape* is a recipe for a list of traces.  A shape is first built as
*records*: plain dicts holding the span protocol fields (``trace_id``,
``span_id``, ``parent_id``, ``service``, ``name``, ``resource``,
``span_type``, ``start_ns``, ``duration_ns``, ``error``, ``meta``,
``metrics`` and, on a trace's first span only, ``origin``).  The records are
then turned into one of three input forms with the same logical content:

* :func:`as_slotted`: :class:`SampleSpan` objects (a class with ``__slots__``,
  read by spanpack's slot fast path);
* :func:`as_dicts`: dict spans with the protocol keys;
* :func:`as_ddtrace`: ``ddtrace`` Span objects (only when ddtrace is
  importable; encode them with ``fields="ddtrace"``).

Every form encodes to the same payload (see ``python -m spanpack bench``,
which checks this before timing anything).

The first six shapes follow ddtrace's own encoder benchmark (1000-span traces
with no tags, 1 tag, 100 tags of 16 characters, 48 int metrics, 100 traces,
and a trace origin).  ``web`` is a realistic request trace: a root span and 50
SQL/HTTP children with about ten tags and four metrics each.  ``span_1`` and
``spans_50`` are small traces, where per-call overhead shows.

Usage::

    from spanpack import samples
    records = samples.build("web")            # list of traces of record dicts
    traces = samples.as_slotted(records)      # or as_dicts / as_ddtrace
    fresh = samples.refresher(records)        # for timed calls on spans of their own:
    traces = samples.as_slotted(fresh())      # new objects, new str objects for per-span values
"""

from __future__ import annotations

import random
import string
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional

from ._spanpack import ORIGIN_KEY, SPAN_FIELDS, TRACE_ID_HIGH_KEY

__all__ = [
    "SHAPES",
    "SampleSpan",
    "Shape",
    "as_ddtrace",
    "as_dicts",
    "as_slotted",
    "build",
    "ddtrace_available",
    "refresher",
    "shape_names",
    "span_count",
    "web_traces",
]

Record = Dict[str, Any]
Traces = List[List[Any]]

FIELDS = SPAN_FIELDS


class SampleSpan:
    """A span in spanpack's default protocol, stored in ``__slots__``.

    All sixteen protocol fields are slots (``meta_struct``, ``links`` and
    ``events`` are None here), so the encoder reads every field straight from
    the instance and never falls back to a failing ``getattr``.
    """

    __slots__ = FIELDS

    def __init__(self, **fields: Any) -> None:
        for name in FIELDS:
            setattr(self, name, fields.get(name))

    def __repr__(self) -> str:
        return "SampleSpan(span_id=%r, name=%r)" % (self.span_id, self.name)


@dataclass(frozen=True)
class Shape:
    name: str
    description: str
    build: Callable[[bool], List[List[Record]]]


# Base for start times: 2023-11-14T22:13:20Z in nanoseconds.
_EPOCH_NS = 1_700_000_000_000_000_000
_ALPHABET = string.ascii_uppercase + string.digits


def _words(rng: random.Random, count: int, size: int) -> List[str]:
    """`count` distinct random strings of `size` characters."""
    seen: Dict[str, None] = {}
    while len(seen) < count:
        seen["".join(rng.choice(_ALPHABET) for _ in range(size))] = None
    return list(seen)


def _ids(rng: random.Random) -> int:
    """A random non-zero 64-bit id."""
    return rng.getrandbits(64) or 1


def _fresh(text: str) -> str:
    """An equal str that is a new object (not interned, not shared)."""
    return "".join([text[:1], text[1:]])


def _ddtrace_like(
    ntraces: int,
    nspans: int,
    ntags: int = 0,
    ltags: int = 0,
    nmetrics: int = 0,
    origin: bool = False,
    seed: int = 1,
    keys_per_span: bool = False,
    float_metrics: bool = False,
) -> List[List[Record]]:
    """Traces shaped like ddtrace's encoder benchmark (benchmarks/encoder).

    Names come from a pool of 256 16-character strings, services from a pool
    of 16; each resource is one of 256 such strings with an id of its own
    (``"<word>/<id>"``, a str object per span); the tag keys are shared by every span and each tag value
    is a fresh random string of `ltags` characters; metric values are random
    ints in [0, 2**16].  The first span of a trace is the root, every other
    span is its child.  Trace ids are 64-bit, so no ``_dd.p.tid`` is involved.
    With `keys_per_span` every span's tag and metric keys are str objects of
    their own (equal text, built at run time as f-strings and decoded headers
    are); with `float_metrics` metric values are floats.
    """
    rng = random.Random(seed)
    names = _words(rng, 256, 16)
    resources = _words(rng, 256, 16)
    services = _words(rng, 16, 16)
    tag_keys = _words(rng, ntags, 16)
    metric_keys = _words(rng, nmetrics, 16)
    origins = ["synthetics", "ciapp-test"]
    traces = []
    clock = _EPOCH_NS
    for _ in range(ntraces):
        trace_id = _ids(rng)
        root_id = _ids(rng)
        trace = []
        for i in range(nspans):
            clock += 1000 + rng.randrange(5000)
            record = {
                "trace_id": trace_id,
                "span_id": root_id if i == 0 else _ids(rng),
                "parent_id": None if i == 0 else root_id,
                "service": rng.choice(services),
                "name": rng.choice(names),
                # A resource with an id in it, formatted per span as tracers do.
                "resource": "%s/%d" % (rng.choice(resources), rng.randrange(1_000_000)),
                "span_type": None,
                "start_ns": clock,
                "duration_ns": 10_000 + rng.randrange(1_000_000),
                "error": 0,
                "meta": {
                    (_fresh(key) if keys_per_span else key): "".join(
                        rng.choice(_ALPHABET) for _ in range(ltags)
                    )
                    for key in tag_keys
                },
                "metrics": {
                    (_fresh(key) if keys_per_span else key): (
                        rng.random() * 2**16 if float_metrics else rng.randint(0, 2**16)
                    )
                    for key in metric_keys
                },
            }
            if i == 0 and origin:
                record["origin"] = rng.choice(origins)
            trace.append(record)
        traces.append(trace)
    return traces


_SQL = [
    "SELECT id, email, created_at FROM users WHERE id = ?",
    "SELECT o.id, o.total, o.status FROM orders o WHERE o.customer_id = ? ORDER BY o.created_at DESC LIMIT ?",
    "UPDATE carts SET updated_at = ?, item_count = ? WHERE id = ?",
    "INSERT INTO audit_log (actor, action, target, at) VALUES (?, ?, ?, ?)",
    "SELECT p.sku, p.price, i.quantity FROM products p JOIN inventory i ON i.sku = p.sku WHERE p.sku IN (?)",
]
_HTTP = [
    ("GET", "payments.internal", "/v2/accounts/{account_id}/balance", 200),
    ("POST", "fraud-score.internal", "/score", 200),
    ("GET", "catalog.internal", "/items/{sku}", 200),
    ("POST", "notifications.internal", "/v1/email", 202),
    ("GET", "catalog.internal", "/items/{sku}/reviews", 404),
]


def _client_tags(component: str) -> Dict[str, str]:
    """The first tags of a web trace's client span (a fresh dict, in this order)."""
    return {"env": "prod", "version": "2024.11.3", "component": component, "span.kind": "client"}


def _web(ntraces: int = 1, children: int = 50, seed: int = 7) -> List[List[Record]]:
    """Request traces: a Django-style root span and `children` SQL/HTTP spans.

    About ten tags and four metrics per span, 128-bit trace ids with
    ``_dd.p.tid`` on the root (as the tracer's trace-tags processor sets it),
    every 13th child an error with the usual error tags.  Per span: the
    root's URL (an order id), an HTTP child's URL (an account id or SKU) and
    resource, a SQL child's database host (one of 8 shards), each a str
    object of the span's own; the other tags are shared constants.
    """
    rng = random.Random(seed)
    runtime_id = "%032x" % rng.getrandbits(128)
    traces = []
    clock = _EPOCH_NS
    for t in range(ntraces):
        trace_id = rng.getrandbits(128) | (1 << 100)
        root_id = _ids(rng)
        clock += 50_000_000
        route = "/api/v1/orders/<int:order_id>"
        url = "https://shop.example.com/api/v1/orders/%d" % (100000 + t)
        root = {
            "trace_id": trace_id,
            "span_id": root_id,
            "parent_id": None,
            "service": "shop-web",
            "name": "django.request",
            "resource": "GET " + route,
            "span_type": "web",
            "start_ns": clock,
            "duration_ns": 48_000_000 + rng.randrange(10_000_000),
            "error": 0,
            "meta": {
                TRACE_ID_HIGH_KEY: "%016x" % (trace_id >> 64),
                "_dd.p.dm": "-0",
                "env": "prod",
                "version": "2024.11.3",
                "language": "python",
                "runtime-id": runtime_id,
                "component": "django",
                "span.kind": "server",
                "http.method": "GET",
                "http.route": route,
                "http.url": url,
                "http.status_code": "200",
                "http.useragent": "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36",
            },
            "metrics": {
                "_dd.top_level": 1,
                "_sampling_priority_v1": 1,
                "process_id": 4242,
                "_dd.tracer_kr": 1.0,
            },
        }
        trace = [root]
        start = clock + 200_000
        for i in range(children):
            start += 100_000 + rng.randrange(800_000)
            span_id = _ids(rng)
            error = 1 if i % 13 == 12 else 0
            if i % 3 != 2:
                query = _SQL[(i + t) % len(_SQL)]
                host = "pg-%d.db.internal" % (i % 8)  # the shard's host: a str of this span's
                duration = 200_000 + rng.randrange(3_000_000)
                meta = {
                    **_client_tags("psycopg"),
                    "db.system": "postgresql",
                    "db.name": "shop",
                    "db.user": "shop_rw",
                    "out.host": host,
                    "server.address": host,
                    "db.application": "shop-web",
                }
                metrics = {
                    "_dd.measured": 1,
                    "db.row_count": rng.randrange(0, 500),
                    "network.destination.port": 5432,
                    "_dd.agent_psr": 1.0,
                }
                record = {
                    "service": "shop-postgres",
                    "name": "postgres.query",
                    "resource": query,
                    "span_type": "sql",
                }
            else:
                method, host, path, status = _HTTP[(i + t) % len(_HTTP)]
                duration = 1_000_000 + rng.randrange(9_000_000)
                meta = {
                    **_client_tags("requests"),
                    "http.method": method,
                    "http.url": "http://%s%s" % (host, path.format(account_id=rng.randrange(10**6),
                                                                   sku=rng.randrange(10**6))),
                    "http.status_code": str(status),
                    "out.host": host,
                    "peer.service": host.split(".")[0],
                    "_dd.peer.service.source": "out.host",
                }
                metrics = {
                    "_dd.measured": 1,
                    "network.destination.port": 80,
                    "http.response.content_length": rng.randrange(100, 20000),
                    "_dd.agent_psr": 1.0,
                }
                record = {
                    "service": "shop-requests",
                    "name": "requests.request",
                    "resource": "%s %s" % (method, path),
                    "span_type": "http",
                }
            if error:
                meta["error.type"] = "psycopg.errors.LockNotAvailable"
                meta["error.message"] = "could not obtain lock on row in relation \"carts\""
                meta["error.stack"] = (
                    'Traceback (most recent call last):\n  File "shop/carts.py", line 88, in update\n'
                    "    cursor.execute(query, params)\npsycopg.errors.LockNotAvailable: could not obtain lock\n"
                )
            record.update(
                {
                    "trace_id": trace_id,
                    "span_id": span_id,
                    "parent_id": root_id,
                    "start_ns": start,
                    "duration_ns": duration,
                    "error": error,
                    "meta": meta,
                    "metrics": metrics,
                }
            )
            trace.append(record)
        traces.append(trace)
    return traces


SHAPES: Dict[str, Shape] = {}


def _shape(name: str, description: str, build: Callable[[bool], List[List[Record]]]) -> None:
    SHAPES[name] = Shape(name, description, build)


_shape("no_tags", "1 trace x 1000 spans, no tags", lambda quick: _ddtrace_like(1, 1000))
_shape(
    "one_tag",
    "1 trace x 1000 spans, 1 tag (16 chars)",
    lambda quick: _ddtrace_like(1, 1000, ntags=1, ltags=16),
)
_shape(
    "many_tags",
    "1 trace x 1000 spans, 100 tags (16 chars)",
    lambda quick: _ddtrace_like(1, 1000, ntags=100, ltags=16),
)
_shape(
    "int_metrics",
    "1 trace x 1000 spans, 48 int metrics",
    lambda quick: _ddtrace_like(1, 1000, nmetrics=48),
)
_shape(
    "many_traces",
    "100 traces x 1000 spans (10 x 1000 with --quick)",
    lambda quick: _ddtrace_like(10 if quick else 100, 1000),
)
_shape(
    "origin",
    "1 trace x 1000 spans, trace origin (_dd.origin)",
    lambda quick: _ddtrace_like(1, 1000, origin=True),
)
_shape(
    "keys_per_span",
    "1 trace x 1000 spans, 10 tags + 3 metrics whose keys are built per span",
    lambda quick: _ddtrace_like(1, 1000, ntags=10, ltags=16, nmetrics=3, keys_per_span=True),
)
_shape(
    "float_metrics",
    "1 trace x 1000 spans, 10 float metrics",
    lambda quick: _ddtrace_like(1, 1000, nmetrics=10, float_metrics=True),
)
_shape("web", "1 request trace: root + 50 SQL/HTTP children, ~10 tags, 4 metrics", lambda quick: _web())
_shape("span_1", "1 trace x 1 span (the web root)", lambda quick: [_web(children=0)[0]])
_shape("spans_50", "1 trace x 50 spans (web-like)", lambda quick: [_web(children=49)[0]])


def web_traces(ntraces: int, children: int = 50, seed: int = 7) -> List[List[Record]]:
    """`ntraces` web request traces (the ``web`` shape's recipe), as records."""
    return _web(ntraces, children, seed)


def shape_names() -> List[str]:
    return list(SHAPES)


def build(shape: str, quick: bool = False) -> List[List[Record]]:
    """The records of `shape` (a fresh copy every call)."""
    try:
        recipe = SHAPES[shape]
    except KeyError:
        raise ValueError("unknown shape %r; known: %s" % (shape, ", ".join(SHAPES))) from None
    return recipe.build(quick)


def span_count(traces: Traces) -> int:
    return sum(len(trace) for trace in traces)


_TEXT_FIELDS = ("service", "name", "resource", "span_type", "origin")


def _span_texts(record: Record) -> List[Any]:
    """The str objects a record holds: its text fields, tag keys and values, metric keys."""
    texts = [record.get(name) for name in _TEXT_FIELDS]
    texts += [t for item in record["meta"].items() for t in item]
    texts += list(record["metrics"])
    return [t for t in texts if type(t) is str]


def refresher(records: List[List[Record]]) -> Callable[[], List[List[Record]]]:
    """A function returning a copy of `records` with new str objects for the
    values that are the span's own, the same text every call.

    A str object held by one span only (a resource with an id, a random tag
    value, a URL, a key built per span) was made for that span, so every
    copy makes it anew, as a tracer formats it for every span; a str object
    shared by several spans (a service, an operation name, most tag keys) is
    a constant of the tracer's and stays shared.  For timed calls that each
    get spans of their own: ``as_slotted(refresher(records)())``.
    """
    seen: Dict[int, int] = {}
    for trace in records:
        for record in trace:
            for key in {id(t) for t in _span_texts(record)}:
                seen[key] = seen.get(key, 0) + 1
    own = {key for key, count in seen.items() if count == 1}

    def text(value: Any) -> Any:
        return _fresh(value) if id(value) in own else value

    def copy() -> List[List[Record]]:
        out = []
        for trace in records:
            spans = []
            for record in trace:
                span = dict(record)
                for name in _TEXT_FIELDS:
                    value = record.get(name)
                    if value is not None and id(value) in own:
                        span[name] = _fresh(value)
                span["meta"] = {text(k): text(v) for k, v in record["meta"].items()}
                span["metrics"] = {text(k): v for k, v in record["metrics"].items()}
                spans.append(span)
            out.append(spans)
        return out

    return copy


def as_slotted(records: List[List[Record]]) -> List[List[SampleSpan]]:
    """The records as :class:`SampleSpan` objects (own meta/metrics dicts)."""
    return [
        [
            SampleSpan(**dict(r, meta=dict(r["meta"]), metrics=dict(r["metrics"])))
            for r in trace
        ]
        for trace in records
    ]


def as_dicts(records: List[List[Record]]) -> List[List[Record]]:
    """The records as dict spans (fresh dicts; the origin key only where set)."""
    out = []
    for trace in records:
        spans = []
        for r in trace:
            span = {k: v for k, v in r.items() if k != "origin" or v is not None}
            span["meta"] = dict(r["meta"])
            span["metrics"] = dict(r["metrics"])
            spans.append(span)
        out.append(spans)
    return out


def ddtrace_available() -> bool:
    try:
        import ddtrace._trace.span  # noqa: F401
    except Exception:  # ImportError, or a broken install
        return False
    return True


def ddtrace_keeps_tags_natively() -> bool:
    """Does the installed ddtrace keep a span's tags in native code (4.9
    and later), behind accessors, rather than in `_meta`/`_metrics`?"""
    from ddtrace._trace.span import Span

    return not hasattr(Span, "_meta")


def as_ddtrace(records: List[List[Record]]) -> List[List[Any]]:
    """The records as ddtrace ``Span`` objects (raises ImportError without ddtrace).

    Fields are assigned directly (``_meta``/``_metrics`` dicts, or on a
    ddtrace whose spans keep tags natively ``_set_attributes``, ``start_ns``,
    ``duration_ns``, ``error``), so no tag normalisation changes the content;
    the origin goes on the first span's context, where ddtrace's encoder
    looks for it.  The spans are finished (duration set) but never reach a
    tracer or processor.
    """
    from ddtrace._trace.span import Span

    out = []
    for trace in records:
        spans = []
        for r in trace:
            span = Span(
                r["name"],
                service=r["service"],
                resource=r["resource"],
                span_type=r["span_type"],
                trace_id=r["trace_id"],
                span_id=r["span_id"],
                parent_id=r["parent_id"],
            )
            span.resource = r["resource"]  # Span() replaces a falsy resource by the name
            span.span_id = r["span_id"]
            span.start_ns = r["start_ns"]
            span.duration_ns = r["duration_ns"]
            span.error = r["error"]
            if ddtrace_keeps_tags_natively():
                span._set_attributes({**r["meta"], **r["metrics"]})
            else:
                span._meta = dict(r["meta"])
                span._metrics = dict(r["metrics"])
            origin: Optional[str] = r.get("origin")
            if origin is not None:
                span.context.dd_origin = origin
            spans.append(span)
        out.append(spans)
    return out
