"""What spanpack.otel keeps from one batch to the next: a resource's and a
scope's values (for the SDK's own immutable Resource and
InstrumentationScope objects, by identity) and the attribute key mapping
(exact str keys only, entries never replaced).  Each batch must map as a
batch of its own would, in C and in Python."""

from __future__ import annotations

from typing import Any, List

import pytest

pytest.importorskip("opentelemetry.sdk")

from opentelemetry.attributes import BoundedAttributes  # noqa: E402
from opentelemetry.sdk.resources import Resource  # noqa: E402
from opentelemetry.sdk.util.instrumentation import InstrumentationScope  # noqa: E402

from spanpack import otel  # noqa: E402
from tests.otel.spans import make_span  # noqa: E402


def span_of(resource: Any = None, scope: Any = None, attributes: Any = (), span_id: int = 2) -> Any:
    return make_span(trace_id=1, span_id=span_id, name="op", attributes=attributes,
                     resource_object=resource, scope_object=scope)  # fmt: skip


def mapped_both_ways(spans: List[Any]) -> List[Any]:
    """The batch's dict spans from ext/otel_map.c, checked equal to the
    Python rules' (each given the batch afresh)."""
    in_c = otel._map_in_c(spans, otel._BatchCache())
    in_python = [otel._span_dict(one, otel._BatchCache()) for one in spans]
    assert in_c == in_python
    return in_c


def test_a_resource_and_a_scope_are_worked_out_once_for_many_batches(monkeypatch):
    made = {"resource": 0, "scope": 0}
    resource_values, scope_values = otel._ResourceValues, otel._scope_values

    def counting_resource(resource: Any) -> Any:
        made["resource"] += 1
        return resource_values(resource)

    def counting_scope(scope: Any) -> Any:
        made["scope"] += 1
        return scope_values(scope)

    monkeypatch.setattr(otel, "_ResourceValues", counting_resource)
    monkeypatch.setattr(otel, "_scope_values", counting_scope)
    monkeypatch.setattr(otel, "_kept_resources", {})
    monkeypatch.setattr(otel, "_kept_scopes", {})
    resource = Resource({"service.name": "checkout", "deployment.environment.name": "prod"})
    scope = InstrumentationScope("lib", "1.0")
    for batch in range(5):
        (trace,) = otel.map_spans([span_of(resource, scope, span_id=batch + 2)])
        assert trace[0]["service"] == "checkout" and trace[0]["meta"]["env"] == "prod"
        assert trace[0]["meta"]["otel.scope.name"] == "lib"
    assert made == {"resource": 1, "scope": 1}


class ChangingResource(Resource):
    """A Resource subclass whose attributes change: read again in each batch."""

    service = "first"

    @property
    def attributes(self) -> Any:
        return {"service.name": ChangingResource.service}


def test_resources_of_other_classes_are_read_in_each_batch():
    resource = ChangingResource({})
    assert otel.map_spans([span_of(resource)])[0][0]["service"] == "first"
    ChangingResource.service = "second"
    try:
        assert otel.map_spans([span_of(resource, span_id=3)])[0][0]["service"] == "second"
    finally:
        ChangingResource.service = "first"


def test_many_resources_each_mapped_as_its_own(monkeypatch):
    monkeypatch.setattr(otel, "_KEPT_PER_KIND", 4)
    resources = [Resource({"service.name": "service-%d" % i}) for i in range(10)]
    for round_number in range(3):
        for i, resource in enumerate(resources):
            (trace,) = otel.map_spans([span_of(resource, span_id=2 + i)])
            assert trace[0]["service"] == "service-%d" % i
    assert len(otel._kept_resources) <= 4


class EqualToEveryKey(str):
    """A str subclass key that says it equals any key of its hash (that of
    "foo.bar"), whatever its own text."""

    def __eq__(self, other: object) -> bool:
        return True

    def __hash__(self) -> int:
        return hash("foo.bar")


def test_a_str_subclass_key_is_never_kept_for_other_batches(monkeypatch):
    monkeypatch.setattr(otel, "_shared_tag_keys", {})
    odd_key = EqualToEveryKey("custom.key")
    first = mapped_both_ways([span_of(attributes=[(odd_key, "x")])])
    assert [(str.__str__(key), value) for key, value in first[0]["meta"].items()
            if type(key) is EqualToEveryKey] == [("custom.key", "x")]  # fmt: skip
    assert all(type(key) is str for key in otel._shared_tag_keys)
    # a later batch's "foo.bar" is its own key, not the odd key it would
    # have found kept
    later = mapped_both_ways([span_of(attributes=[("foo.bar", "y")], span_id=3)])
    assert [(type(key), key, value) for key, value in later[0]["meta"].items() if value == "y"] == [
        (str, "foo.bar", "y")
    ]


def test_the_shared_key_mapping_starts_again_when_full(monkeypatch):
    monkeypatch.setattr(otel, "_TAG_KEYS_KEPT", 8)
    monkeypatch.setattr(otel, "_shared_tag_keys", {})
    seen = []
    for batch in range(6):
        keys = [("key.%d.%d" % (batch, i), "v") for i in range(5)] + [("http.request.method", "PUT")]
        (dd_span,) = mapped_both_ways([span_of(attributes=keys, span_id=batch + 2)])
        assert dd_span["meta"]["http.method"] == "PUT"
        assert all(dd_span["meta"][key] == "v" for key, _ in keys[:-1])
        seen.append(id(otel._shared_tag_keys))
        assert len(otel._shared_tag_keys) <= 8 + 6
    assert len(set(seen)) > 1


def test_a_resource_whose_attributes_were_swapped_is_read_again():
    # (some plugins rename a service by replacing the private field)
    resource = Resource({"service.name": "before"})
    assert otel.map_spans([span_of(resource)])[0][0]["service"] == "before"
    resource._attributes = BoundedAttributes(attributes={"service.name": "after"}, immutable=True)
    assert otel.map_spans([span_of(resource, span_id=3)])[0][0]["service"] == "after"


def test_a_resource_with_mutable_attributes_is_never_kept():
    resource = Resource({})
    resource._attributes = {"service.name": "a", "deployment.environment.name": "dev"}
    assert otel.map_spans([span_of(resource)])[0][0]["service"] == "a"
    resource._attributes["service.name"] = "b"
    resource._attributes["deployment.environment.name"] = "prod"
    (trace,) = otel.map_spans([span_of(resource, span_id=3)])
    assert (trace[0]["service"], trace[0]["meta"]["env"]) == ("b", "prod")
    assert id(resource) not in otel._kept_resources


class Counter(int):
    """An int whose text changes each time it is written."""

    written = 0

    def __str__(self) -> str:
        Counter.written += 1
        return "written-%d" % Counter.written

    __repr__ = __str__


def test_a_resource_with_values_of_other_classes_is_never_kept():
    resource = Resource({"service.name": "s", "build": Counter(1)})
    first = otel.map_spans([span_of(resource)])[0][0]["meta"]["build"]
    later = otel.map_spans([span_of(resource, span_id=3)])[0][0]["meta"]["build"]
    assert first != later


def test_a_scope_whose_version_changed_is_read_again():
    scope = InstrumentationScope("lib", "1.0")
    assert otel.map_spans([span_of(scope=scope)])[0][0]["meta"]["otel.scope.version"] == "1.0"
    scope._version = "2.0"
    assert otel.map_spans([span_of(scope=scope, span_id=3)])[0][0]["meta"]["otel.scope.version"] == "2.0"


def test_long_attribute_keys_are_not_kept(monkeypatch):
    monkeypatch.setattr(otel, "_shared_tag_keys", {})
    short, long_key = "custom.short", "http.request.header." + "x" * otel._TAG_KEY_KEPT_LENGTH
    (dd_span,) = mapped_both_ways([span_of(attributes=[(short, "a"), (long_key, "b")])])
    assert dd_span["meta"][short] == "a"
    assert dd_span["meta"]["http.request.headers." + "x" * otel._TAG_KEY_KEPT_LENGTH] == "b"
    assert short in otel._shared_tag_keys and long_key not in otel._shared_tag_keys


class MapsAgain(int):
    """A value whose text maps other batches (code run by a batch), each of
    them filling and replacing the shared key mapping and the kept values."""

    def __str__(self) -> str:
        for n in range(3):
            keys = [("inner.%d.%d" % (n, i), "v") for i in range(20)]
            otel.encode_spans([span_of(Resource({"service.name": "inner-%d" % i}), attributes=keys)
                               for i in range(4)])  # fmt: skip
        return "outer-value"

    __repr__ = __str__


def test_batches_mapped_by_code_a_batch_runs(monkeypatch):
    monkeypatch.setattr(otel, "_TAG_KEYS_KEPT", 16)
    monkeypatch.setattr(otel, "_KEPT_PER_KIND", 2)
    resource = Resource({"service.name": "outer"})
    attributes = [pair for i in range(4) for pair in (("plain.%d" % i, "x"), ("odd.%d" % i, MapsAgain(5)))]
    spans = [span_of(resource, attributes=attributes, span_id=i + 2) for i in range(3)]
    cache = otel._BatchCache()
    made = otel._map_in_c(spans, cache)
    assert otel._shared_tag_keys is not cache.tag_keys  # replaced while the batch ran
    for dd_span in made:
        assert dd_span["service"] == "outer"
        assert all(dd_span["meta"]["odd.%d" % i] == "outer-value" for i in range(4))
        assert all(dd_span["meta"]["plain.%d" % i] == "x" for i in range(4))
