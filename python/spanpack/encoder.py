"""TraceMsgPackEncoder: the Python face of the C trace encoder."""

from __future__ import annotations

import platform
from typing import Any, Dict, List, Mapping, Optional, Tuple

from ._extras import _I64_MAX, _I64_MIN, _truncate
from ._spanpack import TraceEncoder, packb

CONTENT_TYPE = "application/msgpack"

# v1.0 payload keys of the fields in front of the chunks, in the order they
# are written (docs/wire-format-v1.md).
_V10_PAYLOAD_TEXT_FIELDS = (
    (2, "container_id"),
    (3, "language_name"),
    (4, "language_version"),
    (5, "tracer_version"),
    (6, "runtime_id"),
    (7, "env"),
    (8, "hostname"),
    (9, "app_version"),
)
_V10_PAYLOAD_ATTRIBUTES = 10
# Attribute value types.
_V10_STRING, _V10_BOOL, _V10_DOUBLE, _V10_INT = 1, 2, 3, 4


class TraceMsgPackEncoder(TraceEncoder):
    """Encode traces (lists of spans) into Datadog agent payloads.

    ``TraceMsgPackEncoder(version="v0.4", fields=None, *, max_size=20 MiB,
    max_item_size=None, max_payload_size=None, lenient=False, intern=False,
    native_span_events=False, default_meta=None, default_metrics=None,
    strict=False)``;
    ``version`` is ``"v0.4"``, ``"v0.5"`` or ``"v1.0"``.  v0.4 and v0.5 take
    default tags: ``default_meta`` (str -> str) and ``default_metrics``
    (str -> int or float) go on every span that lacks the key itself.  For v1.0 the payload fields may be given too:
    ``language_name="python"``, ``language_version`` (this interpreter's),
    ``tracer_version`` (spanpack's), ``runtime_id``, ``env``, ``hostname``,
    ``app_version``, ``container_id`` (each left out of the payload when
    empty) and ``payload_attributes`` (str -> str, bool, int or float).
    ``fields`` maps protocol fields to attribute names; ``{"meta": "tags",
    "metrics": "tags"}`` (one attribute for both) reads one mixed tags
    mapping, split by value type: str to meta, bool to meta as
    ``"true"``/``"false"``, int and float to metrics (a dict span does the
    same with one mapping under both keys).
    ``strict=True`` refuses (TypeError) a span that carries what is not
    written: a dict key that is no span field, an object's slot holding a
    value or instance attribute that no field reads.

    One-shot: :meth:`encode_traces`, or :meth:`encode_trace` + :meth:`join_encoded`.
    Buffered (for a writer thread): :meth:`put` from any thread, :meth:`encode`
    from the flusher.  See docs/encoding.md for the span input forms and the rules.
    """

    content_type = CONTENT_TYPE

    def __init__(
        self,
        version: str = "v0.4",
        fields: Any = None,
        *,
        max_size: Optional[int] = None,
        max_item_size: Optional[int] = None,
        max_payload_size: Optional[int] = None,
        lenient: bool = False,
        intern: bool = False,
        native_span_events: bool = False,
        default_meta: Optional[Mapping[str, str]] = None,
        default_metrics: Optional[Mapping[str, float]] = None,
        strict: bool = False,
        language_name: Optional[str] = None,
        language_version: Optional[str] = None,
        tracer_version: Optional[str] = None,
        runtime_id: Optional[str] = None,
        env: Optional[str] = None,
        hostname: Optional[str] = None,
        app_version: Optional[str] = None,
        container_id: Optional[str] = None,
        payload_attributes: Optional[Mapping[str, Any]] = None,
    ) -> None:
        payload_fields = {
            "container_id": container_id,
            "language_name": language_name,
            "language_version": language_version,
            "tracer_version": tracer_version,
            "runtime_id": runtime_id,
            "env": env,
            "hostname": hostname,
            "app_version": app_version,
        }
        given = [name for name, value in payload_fields.items() if value is not None]
        if payload_attributes is not None:
            given.append("payload_attributes")
        preamble = None
        if version == "v1.0":
            from . import __version__

            defaults = {
                "language_name": "python",
                "language_version": platform.python_version(),
                "tracer_version": f"spanpack-{__version__}",
            }
            for name, value in defaults.items():
                if payload_fields[name] is None:
                    payload_fields[name] = value
            preamble = v10_preamble(payload_fields, payload_attributes or {})
        elif given:
            raise TypeError(f"{', '.join(given)}: payload fields are for version \"v1.0\" only")
        super().__init__(
            version,
            fields,
            max_size=max_size,
            max_item_size=max_item_size,
            max_payload_size=max_payload_size,
            lenient=lenient,
            intern=intern,
            native_span_events=native_span_events,
            default_meta=default_meta,
            default_metrics=default_metrics,
            strict=strict,
            _preamble=preamble,  # type: ignore[call-arg]  # private: kept out of the public stub
        )

    @property
    def endpoint(self) -> str:
        """The agent path this encoder's payloads go to, e.g. ``/v0.4/traces``."""
        return f"/{self.version}/traces"

    def headers(self, trace_count: int, tracer_version: str = "") -> Dict[str, str]:
        """HTTP headers for sending one payload of ``trace_count`` traces."""
        return payload_headers(trace_count, tracer_version)


def v10_preamble(
    fields: Mapping[str, Optional[str]], attributes: Mapping[str, Any]
) -> Tuple[bytes, int, Tuple[str, ...]]:
    """The v1.0 payload fields in front of the chunks, as the C encoder takes
    them: (their encoded map entries, how many, the strings they stream in
    order).  Strings are streamed like all others: the first use of a string
    is the str, later uses its id (1, 2, ... in order of first use)."""
    streamed: Dict[str, int] = {"": 0}
    parts: List[bytes] = []

    def stream(text: Any, what: str) -> bytes:
        if not isinstance(text, str):
            raise TypeError(f"{what} must be str, not {type(text).__name__}")
        if type(text) is not str:
            text = str.__str__(text)  # a subclass (a StrEnum member) as its text
        text = _truncate(text)  # the truncation of every span string
        text.encode("utf-8")  # a lone surrogate raises here
        if text in streamed:
            return packb(streamed[text])
        streamed[text] = len(streamed)
        return packb(text)

    count = 0
    for key, name in _V10_PAYLOAD_TEXT_FIELDS:
        value = fields.get(name)
        if value:
            parts.append(packb(key) + stream(value, name))
            count += 1
    if attributes:
        triplets: List[bytes] = []
        for name, value in attributes.items():
            triplets.append(stream(name, "payload_attributes keys"))
            if isinstance(value, str):
                triplets.append(packb(_V10_STRING) + stream(value, "payload_attributes values"))
            elif isinstance(value, bool):
                triplets.append(packb(_V10_BOOL) + packb(value))
            elif isinstance(value, int):
                if not _I64_MIN <= value <= _I64_MAX:
                    raise ValueError(f"payload_attributes[{name!r}] does not fit in int64")
                triplets.append(packb(_V10_INT) + packb(value))
            elif isinstance(value, float):
                triplets.append(packb(_V10_DOUBLE) + packb(value))
            else:
                raise TypeError(
                    f"payload_attributes[{name!r}] must be str, bool, int or float, "
                    f"not {type(value).__name__}"
                )
        header = packb([None] * (3 * len(attributes)))[: -3 * len(attributes)]
        parts.append(packb(_V10_PAYLOAD_ATTRIBUTES) + header + b"".join(triplets))
        count += 1
    strings = tuple(text for text in streamed if text)
    return b"".join(parts), count, strings


def agent_versions(info: Mapping[str, Any]) -> List[str]:
    """The payload versions an agent accepts, best first, from its ``GET
    /info`` reply (a dict): any of ``"v1.0"``, ``"v0.5"``, ``"v0.4"``.  An
    agent serves v1.0 only when configured to, and says so by listing
    ``/v1.0/traces`` among its endpoints."""
    endpoints = info.get("endpoints") if isinstance(info, Mapping) else None
    if not isinstance(endpoints, (list, tuple)):
        return []
    listed = {str(endpoint).rstrip("/") for endpoint in endpoints}
    return [v for v in ("v1.0", "v0.5", "v0.4") if f"/{v}/traces" in listed]


def payload_headers(trace_count: int, tracer_version: str = "") -> Dict[str, str]:
    """The headers a tracer sends with a trace payload."""
    from . import __version__

    return {
        "Content-Type": CONTENT_TYPE,
        "X-Datadog-Trace-Count": str(trace_count),
        "Datadog-Meta-Lang": "python",
        "Datadog-Meta-Lang-Version": platform.python_version(),
        "Datadog-Meta-Lang-Interpreter": platform.python_implementation(),
        "Datadog-Meta-Tracer-Version": tracer_version or f"spanpack-{__version__}",
    }
