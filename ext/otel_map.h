/* OpenTelemetry SDK spans mapped to Datadog dict spans (otel_map.c). */
#ifndef SPANPACK_OTEL_MAP_H
#define SPANPACK_OTEL_MAP_H

#include "compat.h"

#include "state.h"

/* Module exec: the interned names the mapping uses (state->otel_names). */
int otel_map_module_init(SpanpackState *state);

/* _spanpack._otel_map_spans(spans, plan) -> [dict span or None, ...]. */
PyObject *otel_map_spans(PyObject *module, PyObject *const *args, Py_ssize_t nargs);

#endif /* SPANPACK_OTEL_MAP_H */
