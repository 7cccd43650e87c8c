"""OpenTelemetry SDK spans to Datadog agent payloads (``pip install 'spanpack[otel]'``).

``encode_spans(spans)`` maps finished ``ReadableSpan`` objects the way the
Datadog agent's OTLP receiver maps OTLP spans (its "v2" operation and
resource naming, default configuration), groups them by trace id and encodes
one payload; ``DatadogSpanExporter`` is an OpenTelemetry ``SpanExporter``
that hands the mapped traces to an :class:`spanpack.AgentWriter`.

The rules, each with the agent source it comes from, are in docs/otel.md.
What is worked out from a span's resource and instrumentation scope (service,
env, version, the resource's tags) is worked out once per batch for each
resource and scope object, not once per span.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, cast

from ._spanpack import _otel_group_traces, _otel_map_spans
from .encoder import TraceMsgPackEncoder
from .writer import AgentWriter

__all__ = ["DatadogSpanExporter", "encode_spans", "map_span", "map_spans"]

_log = logging.getLogger("spanpack.otel")

#: The agent's service when neither the span nor its resource names one.
DEFAULT_SERVICE = "otlpresourcenoservicename"
#: The metric the agent sets from ``analytics.event``.
EVENT_EXTRACTION_KEY = "_dd1.sr.eausr"
SAMPLING_PRIORITY_KEY = "_sampling_priority_v1"
#: The agent's chunk priority when no span of a trace says otherwise (AUTO_KEEP).
DEFAULT_PRIORITY = 1.0

# OTel semantic-convention attributes renamed to Datadog's HTTP tags.
_HTTP_TAGS = {
    "client.address": "http.client_ip",
    "http.response.body.size": "http.response.content_length",
    "http.response.status_code": "http.status_code",
    "http.request.body.size": "http.request.content_length",
    "http.request.header.referrer": "http.referrer",
    "http.request.method": "http.method",
    "http.route": "http.route",
    "network.protocol.version": "http.version",
    "server.address": "http.server_name",
    "url.full": "http.url",
    "user_agent.original": "http.useragent",
}
_HEADER_PREFIX = "http.request.header."
# Keys the agent sets only from its own rules (dropped as tags).
_CONVENTION_KEYS = frozenset(("service.name", "operation.name", "resource.name", "span.type"))
# Tags an attribute may not overwrite once they hold a non-empty value.
_GUARDED_KEYS = frozenset(("env", "version", "http.status_code", "error.message", "error.type", "error.stack"))
# datadog.* span attributes copied to meta when not empty, in this order.
_DATADOG_TAGS = (
    ("datadog.env", "env"),
    ("datadog.version", "version"),
    ("datadog.http_status_code", "http.status_code"),
    ("datadog.error.msg", "error.message"),
    ("datadog.error.type", "error.type"),
    ("datadog.error.stack", "error.stack"),
)
_EXCEPTION_TAGS = (
    ("exception.message", "error.message"),
    ("exception.type", "error.type"),
    ("exception.stacktrace", "error.stack"),
)
_ERROR_TAGS = ("error.message", "error.type", "error.stack")

_SQL = "sql"
_DB_SPAN_TYPES = {
    **dict.fromkeys(
        (
            "other_sql mssql mysql oracle db2 postgresql redshift cloudscape hsqldb maxdb ingres firstsql edb "
            "cache firebird derby informix mariadb sqlite sybase teradata vertica h2 coldfusion cockroachdb "
            "progress hanadb adabas filemaker instantdb interbase netezza pervasive pointbase clickhouse"
        ).split(),
        _SQL,
    ),
    "cassandra": "cassandra",
    "redis": "redis",
    "memcached": "memcached",
    "mongodb": "mongodb",
    "elasticsearch": "elasticsearch",
    "opensearch": "opensearch",
}

# SpanKind values (opentelemetry.trace.SpanKind) -> the agent's names.
_KIND_NAMES = {0: "internal", 1: "server", 2: "client", 3: "producer", 4: "consumer"}
_INTERNAL, _SERVER, _CLIENT, _PRODUCER, _CONSUMER = range(5)
# StatusCode values -> the OTLP names the agent writes.
_STATUS_NAMES = {0: "Unset", 1: "Ok", 2: "Error"}
_ERROR_STATUS = 2
_I64_LIMIT = 1 << 63
_U32_MAX = (1 << 32) - 1


# -- values as the agent writes them ------------------------------------------


def _float_text(value: float) -> str:
    """Shortest round-trip digits, never an exponent ("2", "1.2", "1e21" as digits)."""
    if value != value:
        return "NaN"
    if value in (float("inf"), float("-inf")):
        return "inf" if value > 0 else "-inf"
    if value == int(value) and abs(value) < 1e16:
        return str(int(value))
    text = repr(value)
    if "e" in text:
        from decimal import Decimal

        text = format(Decimal(text), "f")
    return text


def _scalar_text(value: Any, quote: bool) -> str:
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, float):
        return _float_text(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False) if quote else value
    return str(value)


def _text(value: Any) -> str:
    """An attribute value as a tag: strings as they are, bools true/false,
    numbers in their shortest digits, arrays as [a,b] (strings quoted)."""
    if value.__class__ is str:
        return value
    if isinstance(value, (tuple, list)):
        return "[" + ",".join(_scalar_text(item, True) for item in value) + "]"
    return _scalar_text(value, False)


def _event_value_text(value: Any) -> str:
    """An exception event's attribute as the error tag: arrays unquoted."""
    if isinstance(value, (tuple, list)):
        return "[" + ",".join(_scalar_text(item, False) for item in value) + "]"
    return _scalar_text(value, False)


def _number(value: Any) -> Optional[int]:
    """An attribute read as an integer: an int (not a bool) or a float with
    no fraction, within 64 bits signed."""
    if value.__class__ is float:
        if value == value and -_I64_LIMIT <= value < _I64_LIMIT and value == int(value):
            return int(value)
        return None
    if isinstance(value, int) and not isinstance(value, bool) and -_I64_LIMIT <= value < _I64_LIMIT:
        return int(value)
    return None


def _tag_key(key: str) -> str:
    """The Datadog tag an attribute becomes ("" when the agent sets it otherwise)."""
    mapped = _HTTP_TAGS.get(key)
    if mapped is not None:
        return mapped
    if key.startswith(_HEADER_PREFIX):
        return "http.request.headers." + key[len(_HEADER_PREFIX) :]
    if key in _CONVENTION_KEYS or key.startswith("datadog."):
        return ""
    return key


def _put_tag(meta: Dict[str, str], metrics: Dict[str, float], key: str, text: str) -> None:
    """A string attribute (span or resource) as a tag, after the key mapping."""
    if key in _GUARDED_KEYS and meta.get(key):
        return
    if key == "analytics.event":
        flag = text.lower()
        if flag == "true":
            metrics[EVENT_EXTRACTION_KEY] = 1.0
        elif flag == "false":
            metrics[EVENT_EXTRACTION_KEY] = 0.0
        return
    meta[key] = text


# -- per resource and per scope, once per batch -------------------------------

# Attributes that the naming rules read from the resource before the span.
_RESOURCE_FIRST = (
    "resource.name", "http.request.method", "http.method", "http.route", "messaging.operation.type",
    "messaging.operation", "messaging.destination", "messaging.destination.name", "rpc.method", "rpc.service",
    "graphql.operation.type", "graphql.operation.name", "db.system.name", "db.system", "db.statement",
    "db.query.text", "span.type", "datadog.env",
)  # fmt: skip


class _ResourceValues:
    """What a resource contributes to each of its spans."""

    __slots__ = ("resource", "service", "version", "env", "first", "meta", "metrics", "as_tuple")

    def __init__(self, resource: Any) -> None:
        self.resource = resource  # kept so that its id() is not reused within the batch
        attributes = dict(resource.attributes) if resource is not None else {}
        service = attributes.get("service.name")
        self.service = _text(service) if service is not None else ""
        version = attributes.get("service.version")
        self.version = _text(version) if version is not None else ""
        self.first = {}
        for key in _RESOURCE_FIRST:
            value = attributes.get(key)
            if value is not None:
                text = _text(value)
                if text:
                    self.first[key] = text
        env = ""
        for key in ("deployment.environment.name", "deployment.environment"):
            value = attributes.get(key)
            if value is not None and _text(value):
                env = _text(value)
                break
        self.env = env
        # The resource's tags, in the order the agent writes them: a span's
        # meta starts from these (the span's own attributes come after).
        meta: Dict[str, str] = {}
        metrics: Dict[str, float] = {}
        for key, value in attributes.items():
            mapped = _tag_key(key)
            if mapped:
                _put_tag(meta, metrics, mapped, _text(value))
        self.meta = meta
        self.metrics = metrics
        # the resource's tags that a datadog.* span attribute set first keeps
        # for ext/otel_map.c (its RES_* order)
        self.as_tuple = (self.service, self.version, self.env, self.first, meta, metrics)


class _ScopeValues:
    __slots__ = ("scope", "meta")

    def __init__(self, scope: Any) -> None:
        self.scope = scope
        meta: Dict[str, str] = {}
        if scope is not None:
            for key, value in (getattr(scope, "attributes", None) or {}).items():
                meta[key] = _text(value)
        self.meta = meta


class _ScopeTail:
    """The scope's name and version tags, written late in the span's meta."""

    __slots__ = ("tags",)

    def __init__(self, scope: Any) -> None:
        tags: Dict[str, str] = {}
        name = getattr(scope, "name", "") if scope is not None else ""
        version = getattr(scope, "version", "") if scope is not None else ""
        if name:
            tags["otel.scope.name"] = tags["otel.library.name"] = name
        if version:
            tags["otel.scope.version"] = tags["otel.library.version"] = version
        self.tags = tags


def _scope_values(scope: Any) -> Tuple[_ScopeValues, _ScopeTail]:
    return _ScopeValues(scope), _ScopeTail(scope)


# A resource's and a scope's values, kept from batch to batch by the object's
# identity, with the object (so that its id is not reused while its entry
# lives): a process has a few, the same objects in every batch, and working
# them out cost about 10 µs a batch, most of the time of an export of one
# span (SimpleSpanProcessor).  Only for the SDK's own Resource and
# InstrumentationScope whose attributes are an immutable BoundedAttributes of
# plain values (str, bool, int, float, tuples of them), and only while the
# object still holds the same attributes (and, a scope, name, version and
# schema URL) as when its values were made: code that swaps a resource's
# private _attributes (some plugins rename a service so) is seen at the next
# batch.  Any other object is read again in each batch.
_KEPT_PER_KIND = 64
_kept_resources: Dict[int, Tuple[Any, Any, Any]] = {}
_kept_scopes: Dict[int, Tuple[Any, Any, Any]] = {}
_PLAIN_TYPES = (str, bool, int, float)


def _plain_value(value: Any) -> bool:
    if type(value) is tuple:
        return all(type(item) in _PLAIN_TYPES for item in value)
    return type(value) in _PLAIN_TYPES


def _held_fields(obj: Any) -> Optional[Tuple[Any, ...]]:
    """What the kept values of ``obj`` (a Resource or an InstrumentationScope
    of the SDK) were made from, compared by identity at each batch; None
    when they may change behind an unchanged object (then nothing is kept)."""
    if obj is None:
        return ()
    attributes = getattr(obj, "_attributes", None)
    if type(attributes) is not _BOUNDED_ATTRIBUTES or getattr(attributes, "_immutable", None) is not True:
        return None
    if not all(_plain_value(value) for value in cast(Any, attributes).values()):
        return None
    return _held_fields_now(obj)


def _still_held(obj: Any, held: Tuple[Any, ...]) -> bool:
    """Does ``obj`` hold what ``_held_fields`` found (the same objects)?"""
    try:
        if obj is None:
            return True
        if len(held) == 1:
            return obj._attributes is held[0]  # type: ignore[no-any-return]
        return (obj._attributes is held[0] and obj._name is held[1] and obj._version is held[2]
                and obj._schema_url is held[3])  # fmt: skip
    except AttributeError:
        return False


def _held_fields_now(obj: Any) -> Tuple[Any, ...]:
    if obj is None:
        return ()
    fields = _RESOURCE_HELD if type(obj) is _IMMUTABLE_SDK_CLASSES[0] else _SCOPE_HELD
    return tuple(getattr(obj, name, None) for name in fields)


_RESOURCE_HELD = ("_attributes",)
_SCOPE_HELD = ("_attributes", "_name", "_version", "_schema_url")


def _kept_values(kept: Dict[int, Tuple[Any, Any, Any]], obj: Any, make: Callable[[Any], Any]) -> Any:
    if obj is not None and type(obj) not in _IMMUTABLE_SDK_CLASSES:
        return make(obj)
    entry = kept.get(id(obj))
    if entry is not None and entry[0] is obj and _still_held(obj, entry[1]):
        return entry[2]
    held_before = _held_fields(obj)
    values = make(obj)
    if held_before is not None:
        if len(kept) >= _KEPT_PER_KIND:
            kept.clear()
        kept[id(obj)] = (obj, held_before, values)
    return values


# Attribute key -> tag key, a function of the key alone, kept across batches
# in one dict that every batch fills (ext/otel_map.c too): an entry is only
# ever added (setdefault), never replaced or removed, so that a value a batch
# in C borrowed stays alive; past _TAG_KEYS_KEPT entries the next batch starts
# a new dict (the old one lives on with the batches that have it).
_TAG_KEYS_KEPT = 4096
# Only keys of up to this many characters are kept (attribute keys have no
# length limit; a header name may carry an id): ext/otel_map.c's
# TAG_KEY_KEPT_LENGTH.
_TAG_KEY_KEPT_LENGTH = 256
_shared_tag_keys: Dict[str, str] = {}


def _tag_keys_for_batch() -> Dict[str, str]:
    global _shared_tag_keys
    if len(_shared_tag_keys) >= _TAG_KEYS_KEPT:
        _shared_tag_keys = {}
    return _shared_tag_keys


class _BatchCache:
    """Resource and scope values by object identity, for one batch."""

    __slots__ = ("resources", "scopes", "readers", "tag_keys", "trace_hex", "bases")

    def __init__(self) -> None:
        self.resources: Dict[int, _ResourceValues] = {}
        self.scopes: Dict[int, Tuple[_ScopeValues, _ScopeTail]] = {}
        self.readers: Dict[type, Any] = {}
        self.tag_keys: Dict[str, str] = _tag_keys_for_batch()
        self.trace_hex: Dict[int, str] = {}  # a batch's spans share few trace ids
        self.bases: Dict[Tuple[int, int, int], Dict[str, str]] = {}

    def reader(self, cls: type) -> Any:
        found = self.readers.get(cls)
        if found is None:
            found = self.readers[cls] = _reader_for(cls)
        return found

    def base_meta(self, res: _ResourceValues, scope: _ScopeValues, tail: "_ScopeTail") -> Dict[str, str]:
        """The resource's tags, the scope's, then the scope's name and version
        (set again after the attributes): where each span's meta starts."""
        found = self.bases.get((id(res), id(scope), id(tail)))
        if found is None:
            found = self.bases[(id(res), id(scope), id(tail))] = {**res.meta, **scope.meta, **tail.tags}
        return found

    # The per-batch values in the forms ext/otel_map.c takes.
    def resource_tuple(self, resource: Any) -> Tuple[Any, ...]:
        return self.resource(resource).as_tuple

    def scope_tuple(self, scope: Any) -> Tuple[Dict[str, str], Dict[str, str]]:
        values, tail = self.scope(scope)
        return values.meta, tail.tags

    def resource(self, resource: Any) -> _ResourceValues:
        found = self.resources.get(id(resource))
        if found is None:
            found = self.resources[id(resource)] = _kept_values(_kept_resources, resource, _ResourceValues)
        return found

    def scope(self, scope: Any) -> Tuple[_ScopeValues, _ScopeTail]:
        found = self.scopes.get(id(scope))
        if found is None:
            found = self.scopes[id(scope)] = _kept_values(_kept_scopes, scope, _scope_values)
        return found


# -- naming rules ---------------------------------------------------------------


def _span_text(attributes: Mapping[str, Any], key: str) -> Optional[str]:
    value = attributes.get(key)
    return None if value is None else _text(value)


def _first_text(attributes: Mapping[str, Any], keys: Sequence[str]) -> str:
    """The first of keys the span has with a non-empty value."""
    for key in keys:
        value = attributes.get(key)
        if value is not None:
            text = _text(value)
            if text:
                return text
    return ""


def _resource_then_span(res: _ResourceValues, attributes: Mapping[str, Any], keys: Sequence[str]) -> str:
    """For each key: the resource's non-empty value, else the span's (even empty)."""
    first = res.first
    for key in keys:
        if first:
            text = first.get(key)
            if text:
                return text
        value = attributes.get(key)
        if value is not None:
            return value if value.__class__ is str else _text(value)
    return ""


def _operation_name(kind: int, name_attr: Optional[str], attributes: Mapping[str, Any]) -> str:
    if name_attr is not None:
        return name_attr
    is_client = kind == _CLIENT
    is_server = kind == _SERVER
    if "http.method" in attributes or "http.request.method" in attributes:
        if is_client:
            return "http.client.request"
        if is_server:
            return "http.server.request"
    db_system = _first_text(attributes, ("db.system", "db.system.name"))
    if db_system and is_client:
        return db_system.lower() + ".query"
    messaging_system = _span_text(attributes, "messaging.system") or ""
    messaging_operation = _first_text(attributes, ("messaging.operation", "messaging.operation.type"))
    if messaging_system and messaging_operation and kind != _INTERNAL:
        return (messaging_system + "." + messaging_operation).lower()
    rpc_system = _span_text(attributes, "rpc.system") or ""
    if is_client and rpc_system == "aws-api":
        rpc_service = _span_text(attributes, "rpc.service") or ""
        if rpc_service:
            return "aws." + rpc_service.lower() + ".request"
        return "aws.client.request"
    if rpc_system and is_client:
        return rpc_system.lower() + ".client.request"
    if rpc_system and is_server:
        return rpc_system.lower() + ".server.request"
    provider = _span_text(attributes, "faas.invoked_provider") or ""
    invoked = _span_text(attributes, "faas.invoked_name") or ""
    if is_client and provider and invoked:
        return (provider + "." + invoked + ".invoke").lower()
    trigger = _span_text(attributes, "faas.trigger") or ""
    if trigger and is_server:
        return trigger.lower() + ".invoke"
    if _span_text(attributes, "graphql.operation.type"):
        return "graphql.server.request"
    protocol = _span_text(attributes, "network.protocol.name") or ""
    if is_server:
        return protocol.lower() + ".server.request" if protocol else "server.request"
    if is_client:
        return protocol.lower() + ".client.request" if protocol else "client.request"
    return _KIND_NAMES[kind]


_RESOURCE_RULE_KEYS = frozenset(_RESOURCE_FIRST) - {"span.type", "datadog.env"}


def _resource_name(kind: int, span_name: str, res: _ResourceValues, attributes: Mapping[str, Any]) -> str:
    if not res.first and _RESOURCE_RULE_KEYS.isdisjoint(attributes):
        return span_name  # (the common case of a span with none of the keys: one look)
    found = _resource_then_span(res, attributes, ("resource.name",))
    if found:
        return found
    method = _resource_then_span(res, attributes, ("http.request.method", "http.method"))
    if method:
        if method == "_OTHER":
            method = "HTTP"
        if kind == _SERVER:
            route = _resource_then_span(res, attributes, ("http.route",))
            if route:
                return method + " " + route
        return method
    operation = _resource_then_span(res, attributes, ("messaging.operation.type", "messaging.operation"))
    if operation:
        destination = _resource_then_span(res, attributes, ("messaging.destination", "messaging.destination.name"))
        return operation + " " + destination if destination else operation
    method = _resource_then_span(res, attributes, ("rpc.method",))
    if method:
        service = _resource_then_span(res, attributes, ("rpc.service",))
        return method + " " + service if service else method
    operation = _resource_then_span(res, attributes, ("graphql.operation.type",))
    if operation:
        name = _resource_then_span(res, attributes, ("graphql.operation.name",))
        return operation + " " + name if name else operation
    if _resource_then_span(res, attributes, ("db.system.name", "db.system")):
        statement = _resource_then_span(res, attributes, ("db.statement",))
        if statement:
            return statement
        query = _resource_then_span(res, attributes, ("db.query.text",))
        if query:
            return query
    return span_name


def _span_type(kind: int, res: _ResourceValues, attributes: Mapping[str, Any]) -> str:
    if res.first or "span.type" in attributes:
        found = _resource_then_span(res, attributes, ("span.type",))
        if found:
            return found
    if kind == _SERVER:
        return "web"
    if kind == _CLIENT:
        db = _resource_then_span(res, attributes, ("db.system.name", "db.system"))
        return _DB_SPAN_TYPES.get(db, "db") if db else "http"
    return "custom"


# -- one span --------------------------------------------------------------------


def _plain(attributes: Any) -> Mapping[str, Any]:
    """An attributes mapping as a dict to iterate: the SDK's BoundedAttributes
    by the dict it keeps (its own items() goes through the Mapping ABC)."""
    if attributes is None:
        return {}
    if attributes.__class__ is _BOUNDED_ATTRIBUTES:
        return attributes._dict  # type: ignore[no-any-return]
    return attributes  # type: ignore[no-any-return]


def _links(links: Sequence[Any]) -> List[Dict[str, Any]]:
    out = []
    for link in links:
        context = link.context
        attributes = _plain(link.attributes)
        trace_state = context.trace_state
        out.append(
            {
                "trace_id": context.trace_id,
                "span_id": context.span_id,
                "attributes": {key: value if value.__class__ is str else _text(value)
                               for key, value in attributes.items()},
                "tracestate": trace_state.to_header() if trace_state else "",
                "flags": int(context.trace_flags),
            }
        )
    return out


def _events(events: Sequence[Any]) -> List[Dict[str, Any]]:
    out = []
    for event in events:
        attributes = _plain(event.attributes)
        fields: Dict[str, Any] = {"name": event.name, "time_unix_nano": max(event.timestamp, 0)}
        if attributes:
            # The encoder's event attributes take arrays as lists; the SDK keeps tuples.
            for value in attributes.values():
                if value.__class__ is tuple:
                    attributes = {k: list(v) if v.__class__ is tuple else v for k, v in attributes.items()}
                    break
            fields["attributes"] = dict(attributes)  # (a copy: the caller may change it)
        out.append(fields)
    return out


_DATADOG_KEYS = frozenset(
    ("datadog.service", "datadog.name", "datadog.resource", "datadog.type", "datadog.error", "datadog.span.kind",
     "datadog.http_status_code") + tuple(attribute for attribute, _ in _DATADOG_TAGS)
)  # fmt: skip
# Mapped keys that a plain assignment would get wrong.
_SPECIAL_TAGS = _GUARDED_KEYS | {"analytics.event", "sampling.priority"}


def _set_early(meta: Dict[str, str], key: str, text: str, res: _ResourceValues, scope: _ScopeValues) -> None:
    """A tag of rules 8-11 on a meta that holds the resource's and the
    scope's tags already: the agent sets it before those, so a scope tag of
    the key stands, and a resource tag of the key stands unless the key is
    guarded (rule 12: the earlier non-empty value is kept)."""
    if key in scope.meta:
        return
    if key in _GUARDED_KEYS or key not in res.meta:
        meta[key] = text


def _span_dict(span: Any, cache: _BatchCache) -> Dict[str, Any]:
    fields = _sdk_fields(span) if cache.reader(span.__class__) is _read_sdk_span else None
    if fields is not None:
        context, attributes, events, links, resource_object, scope_object, kind_member, status, parent = fields[:9]
        span_name, start, end = fields[9:]
        if attributes is None:
            attributes = {}
        elif attributes.__class__ is _BOUNDED_ATTRIBUTES:
            attributes = attributes._dict
        if events.__class__ is _BOUNDED_LIST:
            events = events._dq
        if links.__class__ is _BOUNDED_LIST:
            links = links._dq
        kind = _ENUM_VALUES[id(kind_member)]
        start = start or 0
        end = end or 0
    else:
        context = span.context
        attributes = span.attributes or {}
        events = span.events or ()
        links = span.links or ()
        resource_object = span.resource
        scope_object = span.instrumentation_scope
        kind = span.kind.value
        status = span.status
        parent = span.parent
        span_name = span.name
        start = span.start_time or 0
        end = span.end_time or 0
    res = cache.resource(resource_object)
    scope_values, scope_tail = cache.scope(scope_object)
    status_code = _ENUM_VALUES.get(id(status.status_code))
    if status_code is None:
        status_code = status.status_code.value
    get = attributes.get

    service = name = resource = span_type = ""
    error = None
    # The resource's tags, then the scope's, come first: what rules 8-11 set
    # is added after them, with the value the agent's order gives (_set_early).
    meta = cache.base_meta(res, scope_values, scope_tail).copy()
    metrics: Dict[str, float] = {}
    has_datadog = not _DATADOG_KEYS.isdisjoint(attributes)
    kind_tag = _KIND_NAMES[kind]
    if has_datadog:
        service = _span_text(attributes, "datadog.service") or ""
        name = _span_text(attributes, "datadog.name") or ""
        resource = _span_text(attributes, "datadog.resource") or ""
        span_type = _span_text(attributes, "datadog.type") or ""
        raw = get("datadog.error")
        if raw is not None:
            error = _number(raw)
        raw = get("datadog.span.kind")
        if raw is not None:
            kind_tag = _text(raw)
    _set_early(meta, "span.kind", kind_tag, res, scope_values)
    if error is None:
        error = 1 if status_code == _ERROR_STATUS else 0
    if not service:
        raw = get("service.name")
        service = (_text(raw) if raw is not None else "") or res.service or DEFAULT_SERVICE
    if not name:
        raw = get("operation.name")
        name = _operation_name(kind, _text(raw) if raw is not None else None, attributes)
    if not resource:
        resource = _resource_name(kind, span_name, res, attributes)
    if not span_type:
        span_type = _span_type(kind, res, attributes)
    code = None
    for key in ("datadog.http_status_code", "http.response.status_code", "http.status_code"):
        raw = get(key)
        if raw is not None:
            code = _number(raw)
            if code is not None and 0 <= code <= _U32_MAX:
                break
            code = None
            if key == "datadog.http_status_code":
                break  # the Datadog attribute decides even when it is no number
    if code:
        _set_early(meta, "http.status_code", str(code), res, scope_values)
    raw = get("_dd.measured")
    if (raw is not None and _number(raw) == 1) or kind == _CLIENT or kind == _PRODUCER:
        metrics["_dd.measured"] = 1.0

    if has_datadog:
        for attribute, tag in _DATADOG_TAGS:
            raw = get(attribute)
            if raw is not None:
                text = _text(raw)
                if text:
                    _set_early(meta, tag, text, res, scope_values)
    if res.metrics:
        metrics.update(res.metrics)
    trace_id = context.trace_id
    trace_hex = cache.trace_hex.get(trace_id)
    if trace_hex is None:
        trace_hex = cache.trace_hex[trace_id] = "%032x" % trace_id
    meta["otel.trace_id"] = trace_hex
    if "version" not in meta and res.version:
        meta["version"] = res.version

    tag_keys = cache.tag_keys
    for key, value in attributes.items():
        kept = type(key) is str and len(key) <= _TAG_KEY_KEPT_LENGTH
        mapped = tag_keys.get(key) if kept else None
        if mapped is None:
            mapped = _tag_key(key)
            if kept:  # (as ext/otel_map.c keeps them: never replaced)
                mapped = tag_keys.setdefault(key, mapped)
        if not mapped:
            continue
        cls = value.__class__
        if cls is str:
            if mapped in _SPECIAL_TAGS:
                _put_tag(meta, metrics, mapped, value)
            else:
                meta[mapped] = value
        elif cls is int or cls is float:
            if mapped in _SPECIAL_TAGS:
                if mapped in _GUARDED_KEYS and mapped in metrics:
                    continue
                if mapped == "sampling.priority":
                    mapped = SAMPLING_PRIORITY_KEY
            metrics[mapped] = float(value)
        else:
            _put_tag(meta, metrics, mapped, _text(value))

    if "env" not in meta:
        env = _resource_then_span(res, attributes, ("datadog.env",)) or res.env
        if env:
            meta["env"] = env

    if events:
        for event in events:
            if event.name == "exception":
                meta["_dd.span_events.has_exception"] = "true"
                break
    trace_state = context.trace_state
    if trace_state:
        header = trace_state.to_header()
        if header:
            meta["w3c.tracestate"] = header
    if scope_tail.tags:
        meta.update(scope_tail.tags)  # (in meta from the base already: over what the attributes set)
    meta["otel.status_code"] = _STATUS_NAMES[status_code]
    description = status.description
    if status_code == _ERROR_STATUS:
        if description:
            meta["otel.status_description"] = description
        if "error.message" not in meta or "error.type" not in meta or "error.stack" not in meta:
            error = _status_to_error(status_code, description, events, meta)
    elif "error.message" not in meta or "error.type" not in meta or "error.stack" not in meta:
        error = 0

    dd_span = {
        "trace_id": trace_id,
        "span_id": context.span_id,
        "parent_id": parent.span_id if parent is not None else 0,
        "service": service,
        "name": name,
        "resource": resource,
        "span_type": span_type,
        "start_ns": start,
        "duration_ns": end - start if end > start else 0,
        "error": error,
        "meta": meta,
        "metrics": metrics,
    }
    if links:
        dd_span["links"] = _links(links)
    if events:
        dd_span["events"] = _events(events)
    return dd_span


def _sdk_fields(span: Any) -> Optional[Tuple[Any, ...]]:
    """The fields the SDK's ReadableSpan keeps behind its properties, or None
    when this span lacks one (another SDK release: read the properties)."""
    try:
        return (span._context, span._attributes, span._events, span._links, span._resource,
                span._instrumentation_scope, span._kind, span._status, span._parent, span._name,
                span._start_time, span._end_time)  # fmt: skip
    except AttributeError:
        return None


def _read_sdk_span() -> None:
    """(A marker: spans of this class are read through the SDK's own fields.)"""


def _read_properties() -> None:
    """(A marker: spans of this class are read through ReadableSpan's properties.)"""


def _status_to_error(status_code: int, description: Optional[str], events: Sequence[Any], meta: Dict[str, str]) -> int:
    if status_code != _ERROR_STATUS:
        return 0
    for event in events or ():
        if event.name.lower() != "exception":
            continue
        attributes = _plain(event.attributes)
        for attribute, tag in _EXCEPTION_TAGS:
            value = attributes.get(attribute)
            if value is not None:
                meta[tag] = _event_value_text(value)
    if "error.message" not in meta:
        if description:
            meta["error.message"] = description
        else:
            for key in ("http.response.status_code", "http.status_code"):
                code = meta.get(key)
                if code is None:
                    continue
                text = meta.get("http.status_text")
                meta["error.message"] = code + " " + text if text is not None else code
                break
    return 1


_SDK_PROPERTIES = ("context", "attributes", "events", "links", "resource", "instrumentation_scope", "kind",
                   "status", "parent", "name", "start_time", "end_time")  # fmt: skip

try:
    from opentelemetry.attributes import BoundedAttributes as _BoundedAttributes
    from opentelemetry.sdk.trace import Event as _Event
    from opentelemetry.sdk.trace import ReadableSpan as _ReadableSpan
    from opentelemetry.sdk.util import BoundedList as _BoundedList
    from opentelemetry.trace import Link as _Link
    from opentelemetry.trace import SpanContext as _SpanContext
    from opentelemetry.trace import SpanKind as _SpanKind
    from opentelemetry.trace import StatusCode as _StatusCode
    from opentelemetry.trace import TraceState as _TraceState
    from opentelemetry.sdk.resources import Resource as _Resource
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope as _InstrumentationScope

    # Enum members by identity: reading .value runs a descriptor (about 0.3 µs).
    _ENUM_VALUES: Dict[int, int] = {id(member): member.value for member in (*_SpanKind, *_StatusCode)}
    _IMMUTABLE_SDK_CLASSES: Tuple[type, ...] = (_Resource, _InstrumentationScope)
except ImportError:  # no SDK: every span is read through its properties
    _ReadableSpan = _BoundedAttributes = _BoundedList = None  # type: ignore[assignment,misc]
    _IMMUTABLE_SDK_CLASSES = ()
    _ENUM_VALUES = {}


class _NoItem:
    """(A class no link or event has: ext/otel_map.c reads none in place.)"""


_LINK_PROPERTIES = ("context", "attributes")
_EVENT_PROPERTIES = ("name", "timestamp", "attributes")


def _class_attribute(cls: type, name: str) -> Any:
    """What an attribute lookup on an instance of ``cls`` finds on its
    class for ``name`` (as ext/otel_map.c compares it), else None."""
    for klass in cls.__mro__:
        if name in vars(klass):
            return vars(klass)[name]
    return None


def _items_read_from_fields() -> Tuple[type, type]:
    """The SDK's Link and Event, for ext/otel_map.c to read from the fields
    their properties return (``_context``, ``_attributes``; ``_name``,
    ``_timestamp``, ``_attributes``), once shown on instances made here; a
    class whose properties return anything else is read through them."""
    context = _SpanContext(1, 2, False)
    attributes = {"probe": 1}
    link = _Link(context, attributes)
    event = _Event("probe", attributes, 3)
    try:
        link_fields = link._context is link.context and link._attributes is link.attributes
        event_fields = (event._name is event.name and event._timestamp is event.timestamp
                        and event._attributes is event.attributes)  # fmt: skip
    except AttributeError:
        link_fields = event_fields = False
    return (_Link if link_fields else _NoItem), (_Event if event_fields else _NoItem)


# What ext/otel_map.c's plan holds besides the batch's own values (its PLAN_* order).
_C_PLAN_PARTS: Optional[Tuple[Any, ...]] = None
if _ReadableSpan is not None and not os.environ.get("SPANPACK_OTEL_PYTHON"):
    _C_PLAN_PARTS = (
        tuple(sorted(_SpanKind, key=lambda member: member.value)),
        tuple(sorted(_StatusCode, key=lambda member: member.value)),
        _tag_key,
        _text,
        _DB_SPAN_TYPES,
        _GUARDED_KEYS,
        _SPECIAL_TAGS,
        _BoundedAttributes,
        _BoundedList,
        _event_value_text,
        # the classes whose links and events ext/otel_map.c makes itself, and
        # the properties of Link and Event it reads the fields of while the
        # classes keep them
        (_SpanContext, *_items_read_from_fields(), _TraceState),
        tuple(_class_attribute(_Link, name) for name in _LINK_PROPERTIES)
        + tuple(_class_attribute(_Event, name) for name in _EVENT_PROPERTIES),
        _links,
        _events,
    )

# ReadableSpan, the properties whose fields are read and those properties as
# ReadableSpan had them at import, for ext/otel_map.c to make _reader_for's
# check itself (sdk_span_class, without a Python call per batch).
_OBJECT_GETATTRIBUTE = vars(object)["__getattribute__"]
_SDK_PROPERTY_OBJECTS: Tuple[Any, ...] = ()
if _ReadableSpan is not None:
    _SDK_PROPERTY_OBJECTS = tuple(_class_attribute(_ReadableSpan, name) for name in _SDK_PROPERTIES)
_SDK_SPAN: Tuple[Any, Tuple[str, ...], Tuple[Any, ...]] = (_ReadableSpan, _SDK_PROPERTIES, _SDK_PROPERTY_OBJECTS)

# (typed Any: the fields read through them are the SDK's own, not its API)
_BOUNDED_LIST: Any = _BoundedList
_BOUNDED_ATTRIBUTES: Any = _BoundedAttributes


def _reader_for(cls: type) -> Any:
    """The SDK's ReadableSpan (and its _Span) keep each value in a field that
    its property returns (attributes, events and links as copies or views):
    such a class is read from those fields, saving the copies.  A class that
    finds any of those properties other than as ReadableSpan had them at
    import (overridden, or patched since), or that looks its attributes up
    in its own way (``__getattribute__``, ``__getattr__``), is read through
    them.  ext/otel_map.c's sdk_span_class asks the same."""
    if _ReadableSpan is None or _ReadableSpan not in cls.__mro__:
        return _read_properties
    if (_class_attribute(cls, "__getattribute__") is not _OBJECT_GETATTRIBUTE
            or _class_attribute(cls, "__getattr__") is not None):  # fmt: skip
        return _read_properties
    for name, found in zip(_SDK_PROPERTIES, _SDK_PROPERTY_OBJECTS):
        if _class_attribute(cls, name) is not found:
            return _read_properties
    return _read_sdk_span


# -- batches ---------------------------------------------------------------------


def map_span(span: Any) -> Dict[str, Any]:
    """One ``ReadableSpan`` as the Datadog span the agent would make of it
    (a dict span as spanpack's encoder takes it)."""
    return _span_dict(span, _BatchCache())


def map_spans(spans: Iterable[Any]) -> List[List[Dict[str, Any]]]:
    """Spans grouped by trace id into traces (in order of first appearance),
    each span mapped; a trace's local root carries its sampling priority."""
    return _mapped_traces(spans, as_objects=False)


def _mapped_traces(spans: Iterable[Any], as_objects: bool) -> List[List[Any]]:
    """map_spans' traces; with ``as_objects`` the spans mapped in C are
    ext/otel_span.c's read-only OtelSpan objects (the same fields, read by the
    encoder from their slots) instead of dict spans: encode_spans' form."""
    cache = _BatchCache()
    if not isinstance(spans, (list, tuple)):
        spans = list(spans)
    mapped = _map_in_c(spans, cache, as_objects)
    if None in mapped:
        dd_spans = [_span_dict(span, cache) if dd_span is None else dd_span for span, dd_span in zip(spans, mapped)]
    else:
        dd_spans = cast("List[Any]", mapped)  # (C's list, every span mapped)
    if _C_PLAN_PARTS is None:
        return _group_traces(dd_spans)
    return _otel_group_traces(dd_spans, SAMPLING_PRIORITY_KEY, DEFAULT_PRIORITY)


def _group_traces(dd_spans: List[Dict[str, Any]]) -> List[List[Dict[str, Any]]]:
    """Dict spans grouped by trace id (in order of first appearance), each
    trace's local root carrying its sampling priority (the rules in Python:
    ext/otel_map.c's _otel_group_traces does the same)."""
    traces: Dict[int, List[Dict[str, Any]]] = {}
    for dd_span in dd_spans:
        trace = traces.get(dd_span["trace_id"])
        if trace is None:
            traces[dd_span["trace_id"]] = [dd_span]
        else:
            trace.append(dd_span)
    for trace in traces.values():
        _set_priority(trace)
    return list(traces.values())


def _map_in_c(spans: Sequence[Any], cache: _BatchCache, as_objects: bool = False) -> Sequence[Optional[Any]]:
    """ext/otel_map.c's dict spans (OtelSpans: ``as_objects``), None for each span the rules here map
    (another class, events or links); all None without the SDK, or with
    SPANPACK_OTEL_PYTHON=1 in the environment at import (for comparing)."""
    if _C_PLAN_PARTS is None:
        return [None] * len(spans)
    plan = (
        *_C_PLAN_PARTS[:2],
        _SDK_SPAN,
        cache.resource_tuple,
        cache.scope_tuple,
        cache.tag_keys,
        *_C_PLAN_PARTS[2:],
    )
    return _otel_map_spans(spans, plan, as_objects)


def _set_priority(trace: List[Dict[str, Any]]) -> None:
    """The agent takes a trace's priority from the last of its spans with a
    ``sampling.priority`` attribute, else keeps it (AUTO_KEEP); a v0.4/v0.5
    payload says so on one span of the trace."""
    priority = DEFAULT_PRIORITY
    for dd_span in trace:
        found = dd_span["metrics"].get(SAMPLING_PRIORITY_KEY)
        if found is not None:
            priority = found
    trace[_local_root(trace)]["metrics"][SAMPLING_PRIORITY_KEY] = priority


def _local_root(trace: List[Dict[str, Any]]) -> int:
    """The first span whose parent is not in the batch (as ddtrace puts the
    priority on its local root), else the first span."""
    if len(trace) > 1:
        ids = {dd_span["span_id"] for dd_span in trace}
        for position, dd_span in enumerate(trace):
            if dd_span["parent_id"] not in ids:
                return position
    return 0


def _encoder_options(version: str, options: Dict[str, Any]) -> Dict[str, Any]:
    if version == "v0.4":
        options.setdefault("native_span_events", True)
    return options


# Encoders made by encode_spans, kept per thread (an encoder's one-shot calls
# may run Python code, the links and events converters, so one encoder is
# never shared between threads) and per version and options, when these are
# plain values: making one costs about as much as encoding 100 spans' tags.
_encoders = threading.local()
_KEPT_ENCODERS = 8


def _encoder_for(version: str, options: Dict[str, Any]) -> TraceMsgPackEncoder:
    options = _encoder_options(version, options)
    try:
        key: Any = (version, tuple(sorted(options.items())))
        hash(key)
    except TypeError:  # a dict of default tags: made for this call
        return TraceMsgPackEncoder(version, **options)
    kept: Optional[Dict[Any, TraceMsgPackEncoder]] = getattr(_encoders, "kept", None)
    if kept is None:
        kept = _encoders.kept = {}
    encoder = kept.get(key)
    if encoder is None:
        encoder = TraceMsgPackEncoder(version, **options)  # bad options raise here, never kept
        if len(kept) >= _KEPT_ENCODERS:
            kept.clear()
        kept[key] = encoder
    return encoder


def encode_spans(spans: Iterable[Any], version: str = "v0.4", **encoder_options: Any) -> bytes:
    """One payload for ``version`` ("v0.4", "v0.5" or "v1.0") holding the
    spans, grouped by trace id.  ``encoder_options`` go to
    :class:`spanpack.TraceMsgPackEncoder` (v0.4 writes span events natively
    unless ``native_span_events=False``)."""
    encoder = _encoder_for(version, dict(encoder_options))
    # OtelSpans are read by their fields' protocol names, which fields= would rename.
    return encoder.encode_traces(_mapped_traces(spans, as_objects="fields" not in encoder_options))


# -- the exporter ----------------------------------------------------------------

try:
    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
except ImportError:  # the [otel] extra is not installed: encode_spans still works on look-alike spans
    SpanExporter = object  # type: ignore[assignment,misc]
    SpanExportResult = None  # type: ignore[assignment,misc]


class DatadogSpanExporter(SpanExporter):  # type: ignore[misc,valid-type]
    """An OpenTelemetry ``SpanExporter`` sending to a Datadog agent through
    :class:`spanpack.AgentWriter` (``writer=`` one of your own, else one made
    from ``writer_options``, the agent found as ``AgentWriter`` finds it:
    ``DD_TRACE_AGENT_URL``, ``DD_AGENT_HOST``/``DD_TRACE_AGENT_PORT``...).

    ``export()`` returns ``SUCCESS`` only when the writer took every trace of
    the batch into its buffer (``write()`` never raises for a trace: the
    writer's counts say whether it was taken); a trace it refused (buffer
    full, stopped, bad input) makes it ``FAILURE``.  Delivery to the agent
    happens later, on the writer's thread; ``force_flush()`` waits for it,
    at most ``timeout_millis``.  ``shutdown()`` stops the writer within
    ``shutdown_timeout`` seconds.
    """

    def __init__(
        self,
        writer: Optional[AgentWriter] = None,
        *,
        shutdown_timeout: float = 5.0,
        **writer_options: Any,
    ) -> None:
        if SpanExportResult is None:
            raise ImportError("DatadogSpanExporter needs opentelemetry-sdk: pip install 'spanpack[otel]'")
        if writer is not None and writer_options:
            raise TypeError("give writer= or writer options, not both")
        if writer is None:
            writer_options.setdefault("native_span_events", True)
            writer = AgentWriter(**writer_options)
        self.writer = writer
        # OtelSpans for AgentWriter's own write() (which only encodes them),
        # unless its encoders rename fields (fields=); dict spans for any
        # other writer, whose write() may read or change them as dicts.
        options = getattr(writer, "_encoder_options", None)
        self._takes_objects = (
            getattr(type(writer), "write", None) is AgentWriter.write
            and isinstance(options, dict)
            and "fields" not in options
        )
        self.shutdown_timeout = float(shutdown_timeout)
        self._shut_down = False
        self._lock = threading.Lock()

    def export(self, spans: Sequence[Any]) -> "SpanExportResult":
        if self._shut_down:
            return SpanExportResult.FAILURE
        try:
            traces = _mapped_traces(spans, as_objects=self._takes_objects)
        except Exception:
            # A batch the mapping cannot read is lost: said, with the reason.
            _log.warning("spanpack.otel: %d spans not exported", len(spans), exc_info=True)
            return SpanExportResult.FAILURE
        writer = self.writer
        # write() never raises for a trace it refuses: it counts the refusal
        # (buffer full, too large, bad input, stopped).  Those counts only
        # grow, and only write() moves them, so a batch was taken whole
        # exactly when they did not move while it was written (the lock keeps
        # this exporter's concurrent exports apart; a writer shared with other
        # code may make a batch look refused, never look taken).
        with self._lock:
            refused_before = sum(writer._intake_totals()[1:])
            for trace in traces:
                writer.write(trace)
            refused = sum(writer._intake_totals()[1:]) - refused_before
        return SpanExportResult.FAILURE if refused else SpanExportResult.SUCCESS

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.writer.flush(timeout=max(0.0, timeout_millis / 1000.0))

    def shutdown(self) -> None:
        if self._shut_down:
            return
        self._shut_down = True
        self.writer.stop(timeout=self.shutdown_timeout)

