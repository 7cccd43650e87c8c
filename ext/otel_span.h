/* The Datadog span the OpenTelemetry mapping makes (otel_map.c), as a C
 * object: what spanpack.otel.encode_spans hands the encoder instead of a
 * dict span (its links and events: OtelLink and OtelEvent, below).  Its
 * fields are read-only object slots named as the span protocol's fields, so
 * the encoder reads it as any __slots__ class (each member found once at
 * its offset, spanfields.c), with no dict made, filled and looked up per
 * span. */
#ifndef SPANPACK_OTEL_SPAN_H
#define SPANPACK_OTEL_SPAN_H

#include "links_events.h"
#include "state.h"

/* Its fields, in slot order (an empty slot is a field the span lacks). */
#define OTEL_SPAN_FIELDS(X)                                                                        \
    X(OS_TRACE_ID, "trace_id")                                                                     \
    X(OS_SPAN_ID, "span_id")                                                                       \
    X(OS_PARENT_ID, "parent_id")                                                                   \
    X(OS_SERVICE, "service")                                                                       \
    X(OS_NAME, "name")                                                                             \
    X(OS_RESOURCE, "resource")                                                                     \
    X(OS_SPAN_TYPE, "span_type")                                                                   \
    X(OS_START_NS, "start_ns")                                                                     \
    X(OS_DURATION_NS, "duration_ns")                                                               \
    X(OS_ERROR, "error")                                                                           \
    X(OS_META, "meta")                                                                             \
    X(OS_METRICS, "metrics")                                                                       \
    X(OS_LINKS, "links")                                                                           \
    X(OS_EVENTS, "events")

#define OS_ENUM_ENTRY(constant, name) constant,
typedef enum { OTEL_SPAN_FIELDS(OS_ENUM_ENTRY) OS_FIELD_COUNT } OtelSpanField;
#undef OS_ENUM_ENTRY

typedef struct {
    PyObject_HEAD
    PyObject *fields[OS_FIELD_COUNT];
} OtelSpanObject;

/* A new span holding `values` (OS_FIELD_COUNT of them, each borrowed; NULL
 * leaves a field out); NULL with an exception set. */
PyObject *otel_span_new(SpanpackState *state, PyObject *const *values);

/* Borrowed: the span's `field`, NULL when it lacks it. */
static inline PyObject *
otel_span_field(PyObject *span, OtelSpanField field)
{
    return ((OtelSpanObject *)span)->fields[field];
}

/* A span link the mapping made, as OtelLink: the values of its to_dict()
 * form (LinkValues, links_events.h), which the link writers read as they
 * read any link's; to_dict() makes that form for Python code.  Immutable:
 * only the mapping sets them. */
typedef struct {
    PyObject_HEAD
    LinkValues values;
} OtelLinkObject;

/* A new link holding `values` (its objects borrowed: the link takes
 * references of its own; `values->attributes` no other code changes
 * afterwards); NULL with an exception set. */
PyObject *otel_link_new(SpanpackState *state, const LinkValues *values);

/* A span event the mapping made, as OtelEvent: the fields the event
 * writers read of any event (links_events.c), here read from the object's
 * own slots instead of a dict made, filled and looked up per event; Python
 * code (spanpack._extras) reads them as its attributes.  Immutable: only the
 * mapping sets them. */
typedef struct {
    PyObject_HEAD
    PyObject *name;
    PyObject *time_unix_nano;
    PyObject *attributes; /* None when the event has none */
} OtelEventObject;

/* A new event holding the three (borrowed: the event takes references of
 * its own; `attributes` NULL for none, else a dict); NULL with an exception
 * set. */
PyObject *otel_event_new(SpanpackState *state, PyObject *name, PyObject *time_unix_nano,
                         PyObject *attributes);

/* Called from module exec: creates state->otel_span_type,
 * state->otel_link_type and state->otel_event_type. */
int otel_span_module_init(PyObject *module, SpanpackState *state);

#endif /* SPANPACK_OTEL_SPAN_H */
