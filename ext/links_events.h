/* Span links and span events in the reference tracer's shapes: the v0.4
 * "span_links" and native "span_events" values, and the JSON text that v0.5
 * (and v0.4 for events that are not native) carries in meta. */
#ifndef SPANPACK_LINKS_EVENTS_H
#define SPANPACK_LINKS_EVENTS_H

#include "tracewrite.h"

/* A link's fields by spanpack._extras' _link_dict rules (its to_dict()
 * form), held as values: the ids as 64-bit halves (the form's hex text),
 * the attributes flattened to text (a dict of exact str to exact str, held;
 * NULL when there are none), the dropped attribute count (0: none), the
 * tracestate (a non-empty exact str, held; NULL: none) and the flags (an
 * exact int, held; NULL: none).  v0.4 writes links from these; the text
 * forms from link_values_dict. */
typedef struct {
    uint64_t trace_high, trace_low, span_id;
    PyObject *attributes;
    uint64_t dropped;
    PyObject *tracestate;
    PyObject *flags;
} LinkValues;

/* Releases the objects `values` holds (and forgets them). */
void link_values_clear(LinkValues *values);

/* The to_dict() form of `values` (hex ids; its attributes the same dict,
 * or a copy with `copy_attributes`): a new dict, or NULL with an error. */
PyObject *link_values_dict(SpanpackState *state, const LinkValues *values, int copy_attributes);

/* The value of the v0.4 "span_links" key (its key already written). */
int v04_write_links(SpanWriter *w, PyObject *links);

/* The value of the v0.4 "span_events" key (its key already written). */
int v04_write_events(SpanWriter *w, PyObject *events);

/* The JSON text of meta "_dd.span_links" and meta "events", new str. */
PyObject *links_json(SpanWriter *w, PyObject *links);
PyObject *events_json(SpanWriter *w, PyObject *events);

#endif /* SPANPACK_LINKS_EVENTS_H */
