/* OpenTelemetry SDK spans mapped to Datadog spans (otel_map.c): dict spans,
 * or OtelSpans (otel_span.h). */
#ifndef SPANPACK_OTEL_MAP_H
#define SPANPACK_OTEL_MAP_H

#include "compat.h"

#include "state.h"

/* Module exec: the interned names the mapping uses (state->otel_names). */
int otel_map_module_init(SpanpackState *state);

/* _spanpack._otel_map_spans(spans, plan, as_objects=False) -> [dict span (an
 * OtelSpan: as_objects) or None, ...]. */
PyObject *otel_map_spans(PyObject *module, PyObject *const *args, Py_ssize_t nargs);

/* _spanpack._otel_group_traces(dd_spans, priority_key, default_priority) ->
 * [trace, ...]: spanpack.otel.map_spans' grouping by trace id, each trace's
 * local root carrying its sampling priority. */
PyObject *otel_group_traces(PyObject *module, PyObject *const *args, Py_ssize_t nargs);

#endif /* SPANPACK_OTEL_MAP_H */
