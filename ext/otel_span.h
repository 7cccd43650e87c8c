/* The Datadog span the OpenTelemetry mapping makes (otel_map.c), as a C
 * object: what spanpack.otel.encode_spans hands the encoder instead of a
 * dict span (and its links: OtelLink, below).  Its fields are read-only object slots named as the
 * span protocol's fields, so the encoder reads it as any __slots__ class (each member found once at
 * its offset, spanfields.c), with no dict made, filled and looked up per span. */
#ifndef SPANPACK_OTEL_SPAN_H
#define SPANPACK_OTEL_SPAN_H

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
 * form (hex ids, attributes as text, tracestate when not empty, flags) as
 * links_events.c writes them, held as C values so that v0.4 writes them
 * without making that form; to_dict() (and otel_link_fields_dict for the
 * writers of text) makes it.  Immutable: only the mapping sets them. */
typedef struct {
    PyObject_HEAD
    uint64_t trace_high, trace_low, span_id;
    PyObject *attributes; /* an exact dict, exact str keys and values; NULL: none */
    PyObject *tracestate; /* an exact, non-empty str; NULL: none */
    PyObject *flags;      /* an exact int */
} OtelLinkObject;

/* A new link of these values (each object borrowed; `attributes` no other
 * code holds or changes afterwards); NULL with an exception set. */
PyObject *otel_link_new(SpanpackState *state, uint64_t trace_high, uint64_t trace_low,
                        uint64_t span_id, PyObject *attributes, PyObject *tracestate,
                        PyObject *flags);

/* The link's to_dict() form: a new dict (its attributes the link's own dict,
 * or a copy with `copy_attributes`); NULL with an exception set. */
PyObject *otel_link_fields_dict(SpanpackState *state, PyObject *link, int copy_attributes);

/* Called from module exec: creates state->otel_span_type and
 * state->otel_link_type. */
int otel_span_module_init(PyObject *module, SpanpackState *state);

#endif /* SPANPACK_OTEL_SPAN_H */
