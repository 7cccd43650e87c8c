"""Fuzz harness for spanpack.TraceMsgPackEncoder.

Each input becomes an encoder configuration (v0.4 / v0.5 / v1.0, field
mapping, lenient, intern, native span events, size limits, v1.0 payload
fields), a list of traces and an
entry point (encode_traces, put + encode, encode_trace + join_encoded, or put
while another thread mutates the traces).  Spans are dicts, plain objects,
slotted objects, objects whose properties raise or mutate the trace / meta /
their own class while being read, objects with a side-effecting
``__getattr__``, and carry str / int / float / dict subclasses, huge ints,
NaN / inf metrics, lone surrogates, invalid UTF-8, long strings, and links /
events of odd shapes.  Checks:

* no crash (run under ASan/UBSan);
* every payload decodes with msgpack.unpackb(strict_map_key=False) (strings
  as UTF-8) into the right shape for its version, with the right trace count;
  a v1.0 payload also passes the strict decoder tests/v10_decoder.py;
* for inputs without side effects, every entry point and every span form
  (dict, object, slotted object) gives the same bytes;
* a failed put() leaves size, len() and dropped_tags as they were, and after
  any failure the encoder's next payload for a known-good trace equals that
  of a fresh encoder;
* for clean v1.0 inputs, the payload (strictly decoded) says what v0.4's
  payload for the same traces says: span fields, tags and metrics (with the
  tags v1.0 moves put back), meta_struct, trace id, chunk fields, span kind.

    python fuzz/fuzz_spans.py --random 0 --seconds 600 --seed 1
    python fuzz/fuzz_spans.py -max_total_time=1800 corpus_dir     # atheris

See fuzz/README.md.
"""

from __future__ import annotations

import math
import os
import random
import sys
import threading
import time

import msgpack

import spanpack

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from fuzz_packer import Input, run_main, run_random  # noqa: E402  (shared by both harnesses)

# The strict v1.0 decoder lives in tests/; the repository root is found from
# this file's location, like fuzz_packer above.
_ROOT = os.path.dirname(HERE)
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)
from tests.v10_decoder import DecodeError as V10DecodeError  # noqa: E402
from tests.v10_decoder import decode as v10_decode  # noqa: E402

# See fuzz_packer.py: constructs behind fixed bugs, on unless FUZZ_INCLUDE_KNOWN=0.
INCLUDE_KNOWN = os.environ.get("FUZZ_INCLUDE_KNOWN", "1") != "0"
STATS: dict = {}


CURRENT = {"version": ""}  # the scenario's version, for per-version counts


def stat(name):
    name = f"{CURRENT['version']} {name}"
    STATS[name] = STATS.get(name, 0) + 1

FIELDS = ["trace_id", "span_id", "parent_id", "service", "name", "resource", "span_type",
          "start_ns", "duration_ns", "error", "meta", "metrics", "meta_struct", "links",
          "events", "origin"]
V04_KEYS = {"trace_id", "span_id", "parent_id", "service", "resource", "name", "start",
            "duration", "error", "type", "meta", "metrics", "meta_struct", "span_links",
            "span_events"}

IDS = [0, 1, 2**32, 2**63 - 1, 2**63, 2**64 - 1, 2**64, -1, 2**127, 2**128 - 1, 2**128,
       -(2**63)]
TEXTS = ["", "svc", "web", "é€", "\U0001f600", "\ud800", "a\udfffb", "\x00", "x" * 40,
         "y" * 25001, "é" * 25001]
BAD_BYTES = [b"ok", b"\xff", b"\xc3", b"caf\xc3\xa9", bytes(range(256))[:40],
             b"\xe2\x82" + b"a" * 25000, "é".encode() * 13000,
             # the text of good strings: v1.0 streams equal text once, whatever its type
             b"svc0", b"op1", "é0".encode(), b""]
VERSIONS = ["v0.4", "v0.5", "v1.0"]
# Tags and metrics that v1.0 moves out of the attributes (span keys 13-16, the
# chunk's trace id high half, origin, priority and mechanism), with values
# that do and do not qualify.
SPECIAL_META = {
    "env": ["prod", "", "svc0"],
    "version": ["1.2", "é"],
    "component": ["flask", "op1"],
    "span.kind": ["server", "client", "producer", "consumer", "internal", "SERVER", ""],
    "_dd.p.tid": ["%016x" % 5, "0000000000000000", "ffffffffffffffff", "%016X" % 0xABC,
                  "abc", "x" * 16, "%017x" % 5, ""],
    "_dd.p.dm": ["-4", "-0", "-1", "-4294967295", "-4294967296", "4", "-", "--1", "-01", ""],
    "_dd.origin": ["synthetics", "", "rum"],
    "_dd.p.other": ["v"],
}
SPECIAL_METRICS = {
    "_sampling_priority_v1": [1, 0, -1, 2, 2**31 - 1, 2**31, -(2**31), -(2**31) - 1, 1.0, 2.5,
                              True, 2**64 - 1],
    "_dd.measured": [1, 1.5],
}


class StrSub(str):
    pass


class IntSub(int):
    pass


class FloatSub(float):
    pass


class DictSub(dict):
    pass


class Plain:
    """Fields in the instance __dict__."""


class Slotted:
    __slots__ = FIELDS + ["tags", "ctx"]


class SlottedChild(Slotted):
    __slots__ = ()


class Ctx:
    def __init__(self, origin):
        self.origin = origin


class Link:
    def __init__(self, **fields):
        self.__dict__.update(fields)


class LinkToDictRaises:
    trace_id = 1
    span_id = 2

    def to_dict(self):
        raise KeyError("to_dict failed")


class LinkReplacingSpanFields:
    """A link whose to_dict() replaces the fields of the span it belongs to
    (every slot of a __slots__ span, whose fields the writer read without
    references and must own before converting links) and churns memory."""

    trace_id = 1
    span_id = 2

    def __init__(self):
        self.span = None

    def to_dict(self):
        span = self.span
        if span is not None:
            tag = str(id(self))
            for name, value in (("service", "svc-" + tag), ("name", "name-" + tag),
                                ("resource", "res-" + tag), ("meta", {"k-" + tag: "v-" + tag}),
                                ("metrics", {"m-" + tag: 1.5}), ("start_ns", 10**15 + len(tag)),
                                ("duration_ns", 10**9 + len(tag))):
                if isinstance(span, dict):
                    span[name] = value
                else:
                    setattr(span, name, value)
            garbage = [tag * 3 for _ in range(2000)]
            del garbage
        return {"trace_id": "%032x" % 1, "span_id": "%016x" % 2}


class SpanBuilder:
    def __init__(self, inp: Input, mapping: bool):
        self.inp = inp
        self.mapping = mapping  # fields={"meta": "tags", "origin": "ctx.origin"}
        self.dirty = False      # side effects: outputs cannot be compared
        self.traces = []
        self.encoder = None     # set before encoding, for re-entrant calls
        self.log = []

    # -- values -----------------------------------------------------------
    def ident(self, good=True):
        inp = self.inp
        if good or inp.below(4):
            return inp.uint(8) if inp.flag() else inp.below(1000)
        value = inp.pick(IDS)
        if inp.below(5) == 0:
            value = IntSub(value)
        elif inp.below(8) == 0:
            value = inp.pick([1.0, "7", None, True, float("nan")])
        return value

    def text(self, good=True):
        inp = self.inp
        if good or inp.below(3):
            return inp.pick(["svc", "op", "res", "web", "", "é"]) + str(inp.below(4))
        kind = inp.below(6)
        if kind == 0:
            return inp.pick(TEXTS)
        if kind == 1:
            return StrSub(inp.pick(TEXTS[:9]))
        if kind == 2:
            value = inp.pick(BAD_BYTES)
            return bytearray(value) if inp.flag() else value
        if kind == 3:
            return "".join(chr(inp.uint(3) % 0x110000) for _ in range(inp.below(10)))
        if kind == 4:
            return inp.pick([None, 5, 1.5, ["x"], object()])
        return inp.raw(inp.below(12)).decode("utf-8", "surrogateescape")

    def metric(self):
        inp = self.inp
        kind = inp.below(8)
        if kind < 3:
            return inp.below(1000) * (1 if inp.flag() else -1)
        if kind == 3:
            return inp.pick([float("nan"), float("inf"), float("-inf"), -0.0, 1e308, 5e-324])
        if kind == 4:
            return inp.pick([2**63 - 1, 2**63, 2**64 - 1, 2**64, -(2**63), -(2**63) - 1, True])
        if kind == 5:
            return FloatSub(1.25) if inp.flag() else IntSub(-3)
        if kind == 6:
            return inp.pick(["1", None, b"2", [1], complex(1, 2)])
        return inp.below(100) / 7

    def mapping_of(self, kind, size):
        inp = self.inp
        result = {}
        for _ in range(size):
            if kind != "meta_struct" and inp.below(4) == 0:
                # a tag v1.0 treats specially; sometimes as bytes / a str subclass
                special = SPECIAL_META if kind == "meta" else SPECIAL_METRICS
                key = inp.pick(sorted(special))
                value = inp.pick(special[key])
                shape = inp.below(8)
                if shape == 0:
                    key = key.encode()
                elif shape == 1:
                    key = StrSub(key)
                elif shape == 2 and kind == "meta":
                    value = value.encode()
                result[key] = value
                continue
            good = inp.below(6) != 0
            key = self.text(good) if good or inp.flag() else inp.pick([1, None, (1,), b"k"])
            if kind == "meta":
                value = self.text(good)
            elif kind == "metrics":
                value = self.metric()
            else:
                value = self.struct_value(0)
            try:
                result[key] = value
            except TypeError:  # unhashable key
                pass
        if inp.below(10) == 0:
            result = DictSub(result)
        return result

    def struct_value(self, depth):
        inp = self.inp
        kind = inp.below(9 if depth < 3 else 6)
        if kind == 0:
            return inp.pick([None, True, 1, -1, 2**64 - 1, 1.5, float("nan")])
        if kind == 1:
            return self.text(inp.flag())
        if kind == 2:
            return inp.raw(inp.below(8))
        if kind == 3:
            return inp.pick([2**64, object(), {1, 2}, "\udc80"])  # unpackable
        if kind == 4:
            return spanpack.ExtType(inp.below(128), inp.raw(inp.below(5)))
        if kind == 5:
            return spanpack.Timestamp(inp.below(2**34), inp.below(10**9))
        if kind == 6:
            return [self.struct_value(depth + 1) for _ in range(inp.below(4))]
        if kind == 7:
            return {self.text(True): self.struct_value(depth + 1) for _ in range(inp.below(4))}
        value = []
        value.append(value)  # recursive: ValueError from the nesting limit
        return value

    def item_list(self, item, wrong_values, tuple_too):
        """The links or events field: None or [] (4 times in 10), else 1 to 3
        values from `item()` as a list, as a tuple (kind 8, when `tuple_too`),
        or instead one of `wrong_values(items)` (kind 9)."""
        inp = self.inp
        kind = inp.below(10)
        if kind < 4:
            return None if kind == 0 else []
        items = [item() for _ in range(inp.below(3) + 1)]
        if kind == 8 and tuple_too:
            return tuple(items)
        if kind == 9:
            return inp.pick(wrong_values(items))
        return items

    def link(self):
        inp = self.inp
        shape = inp.below(7)
        fields = {"trace_id": self.ident(inp.below(4) != 0), "span_id": self.ident(True)}
        if inp.flag():
            fields["attributes"] = {"a": inp.pick(["x", 1, True, [1, ["n"]], 1.5, None])}
        if inp.flag():
            fields["tracestate"] = self.text(inp.flag())
        if inp.flag():
            fields["flags"] = inp.pick([0, 1, 2**31, -1, "x"])
        if inp.flag():
            fields["dropped_attributes_count"] = inp.pick([0, 2, -1])
        if shape == 1:
            return Link(**fields)
        if shape == 2:
            return LinkToDictRaises()
        if shape == 3:
            return inp.pick([None, 5, "link", (1, 2)])
        if shape == 4:
            self.dirty = True
            return LinkReplacingSpanFields()
        return fields

    def links(self):
        return self.item_list(self.link, lambda items: [5, "links", {"a": 1}, iter(items)], tuple_too=True)

    def event(self):
        inp = self.inp
        event = {"name": self.text(inp.below(4) != 0),
                 "time_unix_nano": inp.pick([0, 1, 2**64 - 1, 2**64, -1, 1.5, True])}
        if inp.flag():
            event["attributes"] = {
                "k": inp.pick(["v", True, 3, 2**70, 1.5, [1, 2], [[1]], None, {"x": 1}])}
        return event if inp.below(5) else Link(**event)

    def events(self):
        return self.item_list(self.event, lambda items: [5, "events", {"a": 1}], tuple_too=False)

    # -- spans ------------------------------------------------------------
    def abstract_span(self, first):
        inp = self.inp
        good = inp.below(8) != 0
        span = {
            "trace_id": self.ident(good or not first) if first else self.ident(True),
            "span_id": self.ident(good),
            "parent_id": None if inp.flag() else self.ident(good),
            "service": self.text(good),
            "name": self.text(good),
            "resource": self.text(good),
            "span_type": None if inp.flag() else self.text(good),
            "start_ns": inp.uint(8) >> 1 if good else self.ident(False),
            "duration_ns": inp.below(10**6) if good else inp.pick([None, -1, 2**63, 1.5, 2**64]),
            "error": inp.pick([0, 1, 0, 0, True, 2, 2**40, "1", None]) if not good else inp.below(2),
            "meta": self.mapping_of("meta", inp.below(6)),
            "metrics": self.mapping_of("metrics", inp.below(5)),
        }
        if inp.below(4) == 0:
            span["meta_struct"] = self.mapping_of("meta_struct", inp.below(3))
        if inp.below(3) == 0:
            span["links"] = self.links()
        if inp.below(3) == 0:
            span["events"] = self.events()
        if first and inp.below(3) == 0:
            span["origin"] = inp.pick(["synthetics", "", None, "\ud800", 5, StrSub("rum"), "é"])
        if inp.below(12) == 0:
            del span[inp.pick(FIELDS[:12])]
        if inp.below(12) == 0:
            span[inp.pick(["meta", "metrics"])] = inp.pick([None, [], "x", DictSub()])
        return span

    def set_field(self, obj, key, value):
        """One abstract span field on a span object, where the encoder's
        fields= reads it (with the mapping: meta as tags, origin as
        ctx.origin)."""
        if self.mapping and key == "meta":
            key = "tags"
        if self.mapping and key == "origin":
            obj.ctx = Ctx(value)
            return
        setattr(obj, key, value)

    def render(self, span, form):
        """Turn an abstract span into one of the input forms."""
        if form == "dict":
            obj = dict(span)
        else:
            obj = Plain() if form == "obj" else (Slotted() if form == "slots" else SlottedChild())
            for key, value in span.items():
                self.set_field(obj, key, value)
        links = span.get("links")
        if isinstance(links, (list, tuple)):
            for link in links:
                if isinstance(link, LinkReplacingSpanFields):
                    link.span = obj
        return obj

    def side_effect(self, trace, span_values, kind):
        """What a property does besides returning its value."""
        inp = self.inp
        if kind == 0:
            raise inp.pick([ValueError, KeyError, AttributeError, RuntimeError])("property")
        if kind == 1:
            span_values.setdefault("meta", {})
            meta = span_values["meta"]
            if isinstance(meta, dict):
                meta["added.%d" % len(meta)] = "x"
        elif kind == 2:
            meta = span_values.get("meta")
            if isinstance(meta, dict):
                meta.clear()
        elif kind == 3:
            trace.append(trace[0]) if len(trace) < 50 else None
        elif kind == 4:
            if trace:
                trace.pop()
        elif kind == 5:
            # Change a class the layout cache may know: a slot becomes a property.
            name = inp.pick(["meta", "service", "metrics", "name"])
            setattr(SlottedChild, name, property(lambda self: {} if name in ("meta", "metrics") else "p"))
        elif kind == 6:
            for name in ("meta", "service", "metrics", "name"):
                if name in SlottedChild.__dict__:
                    delattr(SlottedChild, name)
        elif kind == 7 and self.encoder is not None:
            # Re-entrant use of the same encoder.
            try:
                choice = inp.below(3)
                if choice == 0:
                    self.encoder.encode_traces([good_trace()])
                elif choice == 1:
                    self.encoder.put(good_trace())
                else:
                    self.encoder.encode()
            except Exception:  # noqa: BLE001
                pass
        elif kind == 8 and INCLUDE_KNOWN and self.encoder is not None:
            self.encoder.__init__(inp.pick(VERSIONS), intern=inp.flag())  # bug 1
        elif kind == 9 and INCLUDE_KNOWN:
            del self.traces[:]  # bug 2 (encode_traces)
        elif kind == 10:
            Slotted.extra_attribute = len(self.log)  # class mutation, new version tag
        self.log.append(kind)

    def tricky_span(self, trace, span, form):
        """A span whose reads run Python code."""
        inp = self.inp
        self.dirty = True
        values = dict(span)
        tricky_fields = {inp.pick(FIELDS) for _ in range(inp.below(3) + 1)}
        effects = {name: inp.below(11) for name in tricky_fields}
        builder = self

        if form == "getattr":
            class Dynamic:
                def __getattr__(self, name):
                    if self.__class__ is not Dynamic:
                        raise AttributeError(name)
                    if name in effects:
                        builder.side_effect(trace, values, effects[name])
                    if name == "tags" and builder.mapping:
                        name = "meta"
                    if name == "ctx" and builder.mapping:
                        return Ctx(values.get("origin"))
                    try:
                        return values[name]
                    except KeyError:
                        raise AttributeError(name) from None
            return Dynamic()

        namespace = {}
        for name in tricky_fields:
            attr = name
            if builder.mapping and name == "meta":
                attr = "tags"
            if builder.mapping and name == "origin":
                continue

            def getter(self, name=name):
                builder.side_effect(trace, values, effects[name])
                if name not in values:
                    raise AttributeError(name)
                return values[name]

            namespace[attr] = property(getter)
        cls = type("Tricky", (Plain,), namespace)
        obj = cls()
        for key, value in values.items():
            if key not in tricky_fields:
                self.set_field(obj, key, value)
        if inp.below(4) == 0:
            # __class__ flips between calls: the first read sees one class,
            # later reads another.
            other = type("Other", (Plain,), {})
            original = cls

            def flip(self):
                self.__class__ = other if self.__class__ is original else original
                return values.get("span_type")

            cls.span_type = property(flip)
        return obj

    def trace(self, forms, form_override=None):
        inp = self.inp
        count = inp.below(5) if inp.below(6) else inp.pick([0, 16, 17])
        trace = []
        for index in range(count):
            span = self.abstract_span(index == 0)
            form = inp.pick(forms)  # always consumes one byte: rebuilds stay in step
            if form_override is not None:
                form = form_override
            if form in ("props", "getattr"):
                trace.append(self.tricky_span(trace, span, form))
            else:
                trace.append(self.render(span, form))
        if inp.below(15) == 0:
            self.dirty = True
            return inp.pick([tuple(trace), None, "trace", {"a": 1}, iter(trace)])
        return trace


def good_trace():
    return [{"trace_id": (1 << 64) | 5, "span_id": 2, "parent_id": None, "service": "svc",
             "name": "op", "resource": "res", "span_type": "web", "start_ns": 10,
             "duration_ns": 5, "error": 0, "meta": {"k": "v"}, "metrics": {"m": 1.5, "n": 2}}]


# ---------------------------------------------------------------------------
# Payload checks

class PayloadError(AssertionError):
    pass


def check_payload(payload, version, expected_traces=None):
    if not isinstance(payload, bytes):
        raise PayloadError(f"payload is {type(payload)}")
    if version == "v1.0":
        traces = check_v10_payload(payload)
        if expected_traces is not None and len(traces) != expected_traces:
            raise PayloadError(f"{len(traces)} traces, expected {expected_traces}")
        return traces
    try:
        data = msgpack.unpackb(payload, strict_map_key=False, raw=False)
    except Exception as error:  # noqa: BLE001
        raise PayloadError(f"payload does not decode: {error!r}: {payload[:200]!r}") from error
    if version == "v0.4":
        traces = data
        if not isinstance(traces, list):
            raise PayloadError("v0.4 payload is not an array")
        for trace in traces:
            for span in trace:
                check_v04_span(span)
    else:
        if not (isinstance(data, list) and len(data) == 2):
            raise PayloadError("v0.5 payload is not [strings, traces]")
        strings, traces = data
        if strings[:2] != ["", "_dd.origin"]:
            raise PayloadError(f"v0.5 table starts {strings[:2]!r}")
        for trace in traces:
            for span in trace:
                check_v05_span(span, len(strings))
    if expected_traces is not None and len(traces) != expected_traces:
        raise PayloadError(f"{len(traces)} traces, expected {expected_traces}")
    return traces


def check_v10_payload(payload):
    """The strict decoder accepts it (which implies msgpack-python does too);
    returns the chunks."""
    try:
        data = v10_decode(payload)
    except V10DecodeError as error:
        raise PayloadError(f"v1.0 payload refused by the strict decoder: {error}: "
                           f"{payload[:300]!r}") from error
    try:
        msgpack.unpackb(payload, strict_map_key=False, raw=False)
    except Exception as error:  # noqa: BLE001
        raise PayloadError(f"v1.0 payload does not decode: {error!r}") from error
    chunks = data.get(11, [])
    for chunk in chunks:
        # (an empty trace is a chunk of no spans and no trace id: there is
        # no first span to take it from)
        if 4 not in chunk or (chunk[4] and 6 not in chunk):
            raise PayloadError(f"v1.0 chunk lacks its trace id or spans: {chunk!r:.300}")
        for span in chunk[4]:
            if 4 not in span or 6 not in span:
                raise PayloadError(f"v1.0 span lacks its id or start: {span!r:.300}")
    return chunks


def check_v04_span(span):
    if not isinstance(span, dict) or not set(span) <= V04_KEYS:
        raise PayloadError(f"bad v0.4 span {span!r:.300}")
    for key in ("trace_id", "span_id", "service", "resource", "name", "start", "duration"):
        if key not in span:
            raise PayloadError(f"v0.4 span lacks {key}")
    for key in ("trace_id", "span_id"):
        if not (isinstance(span[key], int) and 0 <= span[key] < 2**64):
            raise PayloadError(f"v0.4 {key} {span[key]!r}")
    meta = span.get("meta", {})
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in meta.items()):
        raise PayloadError(f"v0.4 meta {meta!r:.300}")
    metrics = span.get("metrics", {})
    if not all(isinstance(k, str) and isinstance(v, (int, float)) for k, v in metrics.items()):
        raise PayloadError(f"v0.4 metrics {metrics!r:.300}")
    for key, document in span.get("meta_struct", {}).items():
        if not isinstance(document, bytes):
            raise PayloadError("v0.4 meta_struct value is not bin")
        msgpack.unpackb(document, strict_map_key=False)


def check_v05_span(span, table_size):
    if not (isinstance(span, list) and len(span) == 12):
        raise PayloadError(f"bad v0.5 span {span!r:.300}")
    for position in (0, 1, 2, 11):
        if not (isinstance(span[position], int) and 0 <= span[position] < table_size):
            raise PayloadError(f"v0.5 string index {span[position]!r} / {table_size}")
    for position in (3, 4, 5):
        if not (isinstance(span[position], int) and 0 <= span[position] < 2**64):
            raise PayloadError(f"v0.5 id {span[position]!r}")
    for position in (6, 7):
        if not (isinstance(span[position], int) and 0 <= span[position] < 2**63):
            raise PayloadError(f"v0.5 time {span[position]!r}")
    if not all(0 <= k < table_size and 0 <= v < table_size for k, v in span[9].items()):
        raise PayloadError(f"v0.5 meta indexes {span[9]!r:.300}")
    if not all(0 <= k < table_size and isinstance(v, (int, float)) for k, v in span[10].items()):
        raise PayloadError(f"v0.5 metrics {span[10]!r:.300}")


def same_payload_bytes(a, b):
    """Byte equality, with NaN-safe fallback (equal bytes are equal anyway)."""
    return a == b


# ---------------------------------------------------------------------------
# Scenarios

def make_config(inp):
    inp.mode = inp.below(5)  # entry point, drawn first so short inputs reach every mode
    version = inp.pick(VERSIONS)
    mapping = inp.below(4) == 0
    kwargs = {
        "lenient": inp.flag(),
        "intern": inp.below(4) != 0,
        "native_span_events": inp.flag(),
    }
    if inp.below(4) == 0:
        kwargs["max_size"] = inp.pick([64, 300, 2000, 1 << 20])
    if inp.below(4) == 0:
        kwargs["max_item_size"] = inp.pick([50, 300, 5000])
    if inp.below(3) == 0:
        kwargs["max_payload_size"] = inp.pick([40, 200, 600, 5000])
    fields = {"meta": "tags", "origin": "ctx.origin"} if mapping else inp.pick([None, None, None])
    if version == "v1.0" and inp.below(3) == 0:
        kwargs.update(payload_fields(inp))
    if version != "v1.0" and inp.below(4) == 0:
        kwargs.update(default_tags(inp))
    return version, fields, mapping, kwargs


def default_tags(inp):
    """v0.4/v0.5 default tags: keys the spans also use (their own value must
    win, never written twice), new ones, now and then a value the encoder
    refuses when it is made."""
    out = {}
    if inp.flag():
        out["default_meta"] = {
            inp.pick(["env", "svc0", "version", "k", "é", "_dd.p.dm"]):
                inp.pick(["prod", "v", "", "é", "x" * 25001, StrSub("s"), "\ud800", 5])
            for _ in range(inp.below(3) + 1)}
    if inp.flag() or not out:
        out["default_metrics"] = {
            inp.pick(["m0", "_sampling_priority_v1", "svc0", "x"]):
                inp.pick([1, 0.5, -1, 2**63, IntSub(3), FloatSub(2.5), True, "1"])
            for _ in range(inp.below(3) + 1)}
    return out


# Encoder options that change every span's bytes, so a second encoder that
# must write the same payload needs them too.
SPAN_OPTIONS = ("lenient", "intern", "native_span_events", "default_meta", "default_metrics")


def check_default_tags(payload, version, kwargs):
    """Every span of a v0.4/v0.5 payload has each default key, once."""
    meta_keys, metric_keys = set(kwargs.get("default_meta") or ()), set(kwargs.get("default_metrics") or ())
    if version == "v1.0" or not (meta_keys or metric_keys):
        return
    twice = set()

    def note_keys_written_twice(pairs):
        keys = [key for key, _ in pairs]
        twice.update(key for key in keys if isinstance(key, str) and keys.count(key) > 1)
        return dict(pairs)

    data = msgpack.unpackb(payload, strict_map_key=False, raw=False,
                           object_pairs_hook=note_keys_written_twice)
    # (a span's own str and bytes keys of one text are both written; only a
    # default key must never be)
    if twice & (meta_keys | metric_keys):
        raise PayloadError(f"default keys written twice: {sorted(twice & (meta_keys | metric_keys))}")
    stat("default tags checked")
    if version == "v0.4":
        spans = [(span.get("meta", {}), span.get("metrics", {})) for trace in data for span in trace]
    else:
        strings, traces = data
        spans = [({strings[k]: strings[v] for k, v in span[9].items()},
                  {strings[k]: v for k, v in span[10].items()}) for trace in traces for span in trace]
    for meta, metrics in spans:
        if not meta_keys <= set(meta) or not metric_keys <= set(metrics):
            raise PayloadError(f"a span lacks a default tag: meta {sorted(meta)!r:.200}, metrics "
                               f"{sorted(metrics)!r:.200}; defaults {sorted(meta_keys)}, {sorted(metric_keys)}")


PAYLOAD_TEXT_FIELDS = ["language_name", "language_version", "tracer_version", "runtime_id",
                       "env", "hostname", "app_version", "container_id"]


def payload_fields(inp):
    """v1.0 payload fields (keys 2-10): texts shared with span strings, empty,
    long, invalid; attributes of every accepted type and some refused ones."""
    out = {}
    for _ in range(inp.below(4) + 1):
        name = inp.pick(PAYLOAD_TEXT_FIELDS)
        out[name] = inp.pick(["svc0", "op1", "", "python", "é", "prod", "x" * 25001,
                              "\ud800", StrSub("web1"), 5])
    if inp.flag():
        attributes = {}
        for _ in range(inp.below(3) + 1):
            key = inp.pick(["k", "svc0", "env", "", "é"])
            attributes[key] = inp.pick(["v", "svc0", True, False, 0, -1, 2**63 - 1, 2**63,
                                        1.5, 1.0, float("nan"), None, b"x"])
        out["payload_attributes"] = attributes
    return out


def check_v10_payload_fields(payload, kwargs):
    """Keys 2-10 of a v1.0 payload say what the encoder was given (or the
    defaults), cut at 25,000 characters like every string."""
    import platform

    data = v10_decode(payload)
    keys = [2, 3, 4, 5, 6, 7, 8, 9]
    names = ["container_id", "language_name", "language_version", "tracer_version",
             "runtime_id", "env", "hostname", "app_version"]
    defaults = {"language_name": "python", "language_version": platform.python_version(),
                "tracer_version": f"spanpack-{spanpack.__version__}"}
    for key, name in zip(keys, names):
        value = kwargs.get(name)
        if value is None:
            value = defaults.get(name, "")
        expected = value[:2486] + "<truncated>..." if len(value) > 25000 else str(value)
        if data.get(key, "") != expected:
            raise PayloadError(f"v1.0 payload key {key} ({name}) is {data.get(key)!r:.100}, "
                               f"given {value!r:.100}")
    attributes = kwargs.get("payload_attributes") or {}
    expected = []
    for key, value in attributes.items():
        kind = (1 if isinstance(value, str) else 2 if isinstance(value, bool)
                else 4 if isinstance(value, int) else 3)
        expected.append((key, kind, value))
    got = data.get(10, [])
    if len(got) != len(expected) or not all(
            a[:2] == b[:2] and (a[2] == b[2] or same_number(a[2], b[2]) if b[1] == 3 else
                                a[2] == b[2]) for a, b in zip(got, expected)):
        raise PayloadError(f"v1.0 payload attributes {got!r:.300}, given {expected!r:.300}")


# Options a second encoder must share to join the same parts into the same bytes.
PAYLOAD_OPTIONS = set(PAYLOAD_TEXT_FIELDS) | {"payload_attributes"}


def new_encoder(version, fields, kwargs):
    return spanpack.TraceMsgPackEncoder(version, fields, **kwargs)


def check_recovers(encoder, version, fields, kwargs):
    """After a failure the next payload equals a fresh encoder's."""
    fresh = new_encoder(version, fields, kwargs)
    a = encoder.encode_traces([good_trace()])
    b = fresh.encode_traces([good_trace()])
    if a != b:
        raise AssertionError(f"encode_traces after a failure differs:\n{a!r}\n{b!r}")
    encoder.encode()  # flush what is buffered
    fresh.encode()
    ok_a = ok_b = True
    try:
        encoder.put(good_trace())
    except (spanpack.BufferFull, spanpack.BufferItemTooLarge):
        ok_a = False
    try:
        fresh.put(good_trace())
    except (spanpack.BufferFull, spanpack.BufferItemTooLarge):
        ok_b = False
    if ok_a != ok_b:
        raise AssertionError("put() of a good trace after a failure behaves differently")
    if encoder.size != fresh.size or len(encoder) != len(fresh):
        raise AssertionError(f"size/len after a failure: {encoder.size}/{len(encoder)} vs "
                             f"{fresh.size}/{len(fresh)}")
    a, b = encoder.encode(), fresh.encode()
    if a != b:
        raise AssertionError(f"encode() after a failure differs:\n{a!r}\n{b!r}")


FORMS_CLEAN = ["dict", "obj", "slots", "slots_child"]
FORMS_ALL = FORMS_CLEAN + ["props", "getattr"]


def build(data, forms, form_override=None):
    inp = Input(data)
    version, fields, mapping, kwargs = make_config(inp)
    builder = SpanBuilder(inp, mapping)
    count = inp.below(4) + 1
    traces = [builder.trace(forms, form_override) for _ in range(count)]
    builder.traces = traces
    mode = inp.mode
    return version, fields, kwargs, builder, traces, mode


def scenario(data):
    clean = data[0] & 3 == 0
    forms = FORMS_CLEAN if clean else FORMS_ALL
    version, fields, kwargs, builder, traces, mode = build(data[1:], forms)
    try:
        encoder = new_encoder(version, fields, kwargs)
    except (ValueError, TypeError):
        return
    builder.encoder = encoder
    CURRENT["version"] = version
    failed = False

    if mode in (0, 1):
        try:
            payload = encoder.encode_traces(traces)
        except (spanpack.BufferFull, spanpack.BufferItemTooLarge):
            raise AssertionError("encode_traces raised a buffer error")
        except Exception as error:  # noqa: BLE001 - any input error is fine, a crash is not
            stat(f"encode_traces {type(error).__name__}")
            failed = True
        else:
            stat("encode_traces ok")
            check_payload(payload, version, None if builder.dirty else len(traces))
            if not builder.log:
                check_default_tags(payload, version, kwargs)
            if version == "v1.0":
                check_v10_payload_fields(payload, kwargs)
            if not builder.dirty:
                stat("clean comparison")
                compare_forms_and_entry_points(data, payload, version, fields, kwargs)
                if version == "v1.0":
                    compare_v10_with_v04(data, payload, fields, kwargs)
    elif mode == 2:
        parts = []
        for trace in list(traces):
            try:
                parts.append(encoder.encode_trace(trace))
                stat("encode_trace ok")
            except Exception as error:  # noqa: BLE001
                stat(f"encode_trace {type(error).__name__}")
                failed = True
        try:
            payload = encoder.join_encoded(parts)
        except ValueError:
            if INCLUDE_KNOWN and 8 in builder.log:
                return  # a span re-initialised the encoder to the other version
            raise
        check_payload(payload, version, None if builder.dirty else len(parts))
        if not builder.log:
            check_default_tags(payload, version, kwargs)
        # Parts joined twice, or in another encoder of the same version.
        other = new_encoder(version, None,
                            {k: v for k, v in kwargs.items() if k in PAYLOAD_OPTIONS})
        if other.join_encoded(parts) != payload:
            raise AssertionError("join_encoded differs between encoders")
    else:
        threaded = mode == 4
        stop = threading.Event()
        mutator = None
        if threaded:
            builder.dirty = True
            mutator = threading.Thread(target=mutate_traces, args=(traces, stop, data))
            old_interval = sys.getswitchinterval()
            sys.setswitchinterval(1e-6)
            mutator.start()
        puts = 0
        try:
            for trace in list(traces):
                size, length, dropped = encoder.size, len(encoder), encoder.dropped_tags
                try:
                    encoder.put(trace)
                    puts += 1
                    stat("put ok")
                except Exception as error:  # noqa: BLE001
                    stat(f"put {type(error).__name__}")
                    failed = True
                    if not threaded and builder.log == [] and (
                        encoder.size != size or len(encoder) != length
                        or encoder.dropped_tags != dropped
                    ):
                        raise AssertionError(
                            f"failed put() changed the buffer: size {size}->{encoder.size}, "
                            f"len {length}->{len(encoder)}, dropped {dropped}->{encoder.dropped_tags}")
        finally:
            if mutator is not None:
                stop.set()
                mutator.join()
                sys.setswitchinterval(old_interval)
        expected = len(encoder)
        size = encoder.size
        payloads = encoder.encode()
        total = 0
        for payload, count in payloads:
            # (encoder.version: span code read by the mutator thread between
            # two puts may have re-initialised the encoder to the other version)
            traces_out = check_payload(payload, encoder.version, count)
            total += len(traces_out)
            if not builder.log:
                check_default_tags(payload, version, kwargs)
        if payloads and not builder.log and sum(len(p) for p, _ in payloads) != size:
            raise AssertionError(f"size {size} but encode() returned "
                                 f"{sum(len(p) for p, _ in payloads)} bytes")
        if total != expected or (not builder.log and expected != puts):
            raise AssertionError(f"{total} traces encoded, len() said {expected}, {puts} puts")
    if failed and 8 not in builder.log:  # (8: the encoder was re-initialised)
        stat("recovery check")
        check_recovers(encoder, version, fields, kwargs)


def mutate_traces(traces, stop, data):
    rng = random.Random(data)
    for step in range(2000):
        if stop.is_set():
            return
        try:
            trace = rng.choice(traces)  # (span code may empty `traces` meanwhile)
        except IndexError:
            return
        if not isinstance(trace, list):
            continue
        choice = rng.randrange(6)
        try:
            if choice == 0 and trace:
                trace.append(trace[0]) if len(trace) < 40 else trace.pop()
            elif choice == 1 and trace:
                trace.pop()
            elif choice == 2 and trace:
                span = rng.choice(trace)
                meta = span.get("meta") if isinstance(span, dict) else getattr(span, "meta", None)
                if isinstance(meta, dict):
                    if rng.random() < 0.5:
                        meta["t%d" % rng.randrange(50)] = "v"
                    elif meta:
                        meta.pop(next(iter(meta)), None)
            elif choice == 3 and trace:
                span = rng.choice(trace)
                if isinstance(span, dict):
                    span["metrics"] = {"x": rng.random()}
                else:
                    try:
                        span.metrics = {"x": rng.random()}
                    except AttributeError:
                        pass
            elif choice == 4:
                trace[:] = trace[:1]
            else:
                time.sleep(0)
        except Exception:  # noqa: BLE001 - span properties raise on purpose
            pass


def compare_forms_and_entry_points(data, payload, version, fields, kwargs):
    """Clean inputs: every span form and every entry point gives `payload`."""
    if kwargs.get("lenient"):
        pass
    for form in FORMS_CLEAN:
        _, _, _, builder, traces, _ = build(data[1:], FORMS_CLEAN, form)
        encoder = new_encoder(version, fields, kwargs)
        other = encoder.encode_traces(traces)
        if other != payload and not has_nan(payload):
            raise AssertionError(f"form {form} gives other bytes:\n{other!r:.400}\n{payload!r:.400}")
        parts = [encoder.encode_trace(trace) for trace in traces]
        joined = encoder.join_encoded(parts)
        if joined != payload:
            raise AssertionError(f"join_encoded differs from encode_traces ({form}):\n"
                                 f"{joined!r:.400}\n{payload!r:.400}")
    # The buffered path, when nothing limits it: one payload with every trace.
    plain = {k: v for k, v in kwargs.items() if k in SPAN_OPTIONS or k in PAYLOAD_OPTIONS}
    encoder = new_encoder(version, fields, plain)
    _, _, _, builder, traces, _ = build(data[1:], FORMS_CLEAN, "dict")
    for trace in traces:
        encoder.put(trace)
    size = encoder.size
    out = encoder.encode()
    if len(out) != 1 or out[0][0] != payload or out[0][1] != len(traces) or size != len(payload):
        raise AssertionError(f"put/encode differs from encode_traces: {out!r:.400} vs {payload!r:.400}")


# ---------------------------------------------------------------------------
# v1.0 against v0.4: the same clean traces must say the same things

# Tags whose v1.0 place depends on the trace (compared apart, or not at all:
# events and links are converted differently by each version).
V10_UNCOMPARED_META = {"span.kind", "_dd.p.tid", "_dd.origin", "events", "_dd.span_links"}
SPAN_KINDS = {"internal": 1, "server": 2, "client": 3, "producer": 4, "consumer": 5}


class _Duplicates:
    """msgpack object_pairs_hook noting maps with a key twice (a str and a
    bytes key of the same text: a decoded dict would lose one)."""

    def __init__(self):
        self.found = False

    def __call__(self, pairs):
        result = dict(pairs)
        if len(result) != len(pairs):
            self.found = True
        return result


def same_number(a, b):
    if isinstance(a, float) or isinstance(b, float):
        a, b = float(a), float(b)
        return a == b or (math.isnan(a) and math.isnan(b))
    return a == b


def compare_v10_with_v04(data, payload, fields, kwargs):
    """Clean v1.0 inputs: the payload decoded by the strict decoder says what
    v0.4's payload for the same traces says (span fields, tags, metrics,
    meta_struct, trace id, chunk origin, priority, mechanism, span kind)."""
    plain = {k: v for k, v in kwargs.items() if k in ("lenient", "intern", "native_span_events")}
    _, _, _, _, traces, _ = build(data[1:], FORMS_CLEAN, "dict")
    try:
        v04 = new_encoder("v0.4", fields, plain).encode_traces(traces)
    except Exception:  # noqa: BLE001 - v0.4 refuses some inputs v1.0 takes
        stat("v1.0/v0.4 comparison skipped")
        return
    duplicates = _Duplicates()
    traces04 = msgpack.unpackb(v04, strict_map_key=False, raw=False,
                               object_pairs_hook=duplicates)
    if duplicates.found:
        stat("v1.0/v0.4 comparison skipped")
        return
    chunks = v10_decode(payload).get(11, [])
    if len(chunks) != len(traces04):
        raise AssertionError(f"v1.0 has {len(chunks)} chunks, v0.4 {len(traces04)} traces")
    stat("v1.0/v0.4 comparison")
    for chunk, trace04 in zip(chunks, traces04):
        spans = chunk[4]
        if len(spans) != len(trace04):
            raise AssertionError(f"v1.0 chunk of {len(spans)} spans, v0.4 {len(trace04)}")
        for index, (span, span04) in enumerate(zip(spans, trace04)):
            compare_v10_span(chunk, index, span, span04)


def compare_v10_span(chunk, index, span, span04):
    def differ(what, mine, theirs):
        raise AssertionError(f"v1.0 span {index} {what}: {mine!r:.200} but v0.4 "
                             f"{theirs!r:.200}\nv1.0 chunk {chunk!r:.600}\nv0.4 span "
                             f"{span04!r:.600}")

    for key, name in ((1, "service"), (2, "name"), (3, "resource"), (10, "type")):
        if span.get(key, "") != (span04.get(name) or ""):
            differ(name, span.get(key), span04.get(name))
    for key, name in ((4, "span_id"), (5, "parent_id"), (6, "start"), (7, "duration")):
        # (v0.4 writes a negative time as given, v1.0 as 0: docs/wire-format.md)
        if span.get(key, 0) != max(span04.get(name) or 0, 0):
            differ(name, span.get(key), span04.get(name))
    if span.get(8, False) != bool(span04.get("error", 0)):
        differ("error", span.get(8), span04.get("error"))
    meta04 = dict(span04.get("meta", {}))
    metrics04 = dict(span04.get("metrics", {}))
    struct04 = dict(span04.get("meta_struct", {}))
    if index == 0:
        if 6 in chunk:
            trace_id = int.from_bytes(chunk[6], "big")
            if trace_id & (2**64 - 1) != span04["trace_id"]:
                differ("trace id low half", chunk[6].hex(), span04["trace_id"])
            high = trace_id >> 64
            tid = meta04.get("_dd.p.tid")
            if high and tid is not None and len(tid) == 16 and int(tid, 16) != high:
                differ("trace id high half", chunk[6].hex(), tid)
        if 2 in chunk and meta04.get("_dd.origin") != chunk[2]:
            differ("origin", chunk[2], meta04.get("_dd.origin"))
        if 7 in chunk:
            dm = meta04.pop("_dd.p.dm", None)
            if dm is None or int(dm[1:]) != chunk[7]:
                differ("mechanism", chunk[7], dm)
        if 1 in chunk:
            priority = metrics04.pop("_sampling_priority_v1", None)
            if priority != chunk[1] or not isinstance(priority, int):
                differ("priority", chunk[1], priority)
    # The five kinds are key 16; other text stays an attribute (checked below).
    kind = meta04.get("span.kind")
    kind_number = SPAN_KINDS.get(kind) if isinstance(kind, str) else None
    if span.get(16) != kind_number:
        differ("kind", span.get(16), kind)
    meta, metrics, struct = {}, {}, {}
    attributes = span.get(9, [])
    if len({key for key, _, _ in attributes}) != len(attributes):
        stat("v1.0/v0.4 span with a key twice (meta and metrics)")
        return
    for key, kind_, value in attributes:
        {1: meta, 3: metrics, 4: metrics, 5: struct}[kind_][key] = value
    for key, name in ((13, "env"), (14, "version"), (15, "component")):
        if key in span:
            if name in meta:
                differ(f"{name} both a field and an attribute", span[key], meta[name])
            meta[name] = span[key]
    if isinstance(kind, str) and kind_number is None and meta.get("span.kind") != kind:
        differ("span.kind attribute", meta.get("span.kind"), kind)
    for name in V10_UNCOMPARED_META:
        meta.pop(name, None)
        meta04.pop(name, None)
    if meta != meta04:
        differ("meta", meta, meta04)
    if set(metrics) != set(metrics04) or not all(
            same_number(metrics[k], metrics04[k]) for k in metrics):
        differ("metrics", metrics, metrics04)
    if struct != struct04:
        differ("meta_struct", struct, struct04)


def has_nan(payload):
    return False


def reset_classes():
    """Undo class changes made by an earlier input's side effects."""
    for name in ("meta", "service", "metrics", "name"):
        if name in SlottedChild.__dict__:
            delattr(SlottedChild, name)
    if "extra_attribute" in Slotted.__dict__:
        del Slotted.extra_attribute


def TestOneInput(data: bytes) -> None:
    if len(data) < 2:
        return
    reset_classes()
    try:
        scenario(data)
    except RecursionError:
        pass


def random_driver(iterations: int, seed: int, seconds: float = 0) -> int:
    """Feed TestOneInput seeded random inputs; returns the executions done."""
    return run_random(TestOneInput, iterations, seed, (64, 256, 512, 1024, 2048), 2, seconds)


def report_stats() -> None:
    if os.environ.get("FUZZ_STATS"):
        for name, count in sorted(STATS.items()):
            print(f"  {name}: {count}")


def main(argv) -> None:
    run_main(argv, TestOneInput, random_driver, report_stats)


if __name__ == "__main__":
    main(sys.argv)
