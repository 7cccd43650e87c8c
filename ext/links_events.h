/* Span links and span events in the reference tracer's shapes: the v0.4
 * "span_links" and native "span_events" values, and the JSON text that v0.5
 * (and v0.4 for events that are not native) carries in meta. */
#ifndef SPANPACK_LINKS_EVENTS_H
#define SPANPACK_LINKS_EVENTS_H

#include "tracewrite.h"

/* The value of the v0.4 "span_links" key (its key already written). */
int v04_write_links(SpanWriter *w, PyObject *links);

/* The value of the v0.4 "span_events" key (its key already written). */
int v04_write_events(SpanWriter *w, PyObject *events);

/* The JSON text of meta "_dd.span_links" and meta "events", new str. */
PyObject *links_json(SpanWriter *w, PyObject *links);
PyObject *events_json(SpanWriter *w, PyObject *events);

#endif /* SPANPACK_LINKS_EVENTS_H */
