/* Per-module state, shared by every C file of the extension.
 *
 * Nothing here is a C global: each (sub)interpreter that imports spanpack gets
 * its own state, reached from a module object or from one of its heap types. */
#ifndef SPANPACK_STATE_H
#define SPANPACK_STATE_H

#include "compat.h"

typedef struct {
    /* Types defined in C. */
    PyTypeObject *packer_type;
    PyTypeObject *trace_encoder_type;
    PyTypeObject *encoded_part_type;

    /* Classes defined in spanpack/_ext.py, checked by the Packer. */
    PyObject *ext_type;
    PyObject *timestamp_type;

    /* datetime support for Packer(datetime=True). */
    PyObject *datetime_type;
    PyObject *timedelta_type;
    PyObject *epoch; /* datetime(1970, 1, 1, tzinfo=timezone.utc) */

    /* Exceptions raised by the buffered trace encoder. */
    PyObject *buffer_full_error;
    PyObject *buffer_item_too_large_error;

    /* Converters for span links and events (spanpack/_extras.py). */
    PyObject *links_for_v04;
    PyObject *links_json;
    PyObject *events_for_v04;
    PyObject *events_json;
    PyObject *links_for_v10;
    PyObject *events_for_v10;

    /* Interned attribute names. */
    PyObject *str_items;
    PyObject *str_code;
    PyObject *str_data;
    PyObject *str_seconds;
    PyObject *str_nanoseconds;
    PyObject *str_tzinfo;
    PyObject *str_days;
    PyObject *str_microseconds;
    /* Span payload strings. */
    PyObject *str_empty;
    PyObject *str_origin_key;
    PyObject *str_trace_id_high_key;
    PyObject *str_span_links_key;
    PyObject *str_events_key;
} SpanpackState;

extern PyModuleDef spanpack_module_def;

/* The state of the module that defined `type` or one of its bases; sets an
 * exception and returns NULL when there is none. */
SpanpackState *spanpack_state_from_type(PyTypeObject *type);

static inline SpanpackState *
spanpack_state_from_module(PyObject *module)
{
    return (SpanpackState *)PyModule_GetState(module);
}

/* Called from module exec to create the C types. */
int packer_module_init(PyObject *module, SpanpackState *state);
int trace_encoder_module_init(PyObject *module, SpanpackState *state);

#endif /* SPANPACK_STATE_H */
