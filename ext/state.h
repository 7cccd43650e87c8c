/* Per-module state, shared by every C file of the extension.
 *
 * Nothing here is a C global: each (sub)interpreter that imports spanpack gets
 * its own state, reached from a module object or from one of its heap types. */
#ifndef SPANPACK_STATE_H
#define SPANPACK_STATE_H

#include "compat.h"
#include "layout_probes.h"
#include "wire.h"

/* Every object the state holds, in one list per kind, so that the struct,
 * module exec, traverse and clear cannot drift apart.  Adding an object is
 * adding one line here (and, for a made object, the code that makes it). */

/* Types defined in C, created by packer_module_init, trace_encoder_module_init
 * and otel_span_module_init. */
#define SPANPACK_STATE_TYPES(X)                                                                    \
    X(packer_type)                                                                                 \
    X(trace_encoder_type)                                                                          \
    X(encoded_part_type)                                                                           \
    X(otel_span_type)                                                                              \
    X(otel_link_type)                                                                              \
    X(otel_event_type)

/* Attributes of Python modules, looked up by module exec: X(member, module,
 * attribute). */
#define SPANPACK_STATE_IMPORTS(X)                                                                  \
    /* Classes checked by the Packer. */                                                           \
    X(ext_type, "spanpack._ext", "ExtType")                                                        \
    X(timestamp_type, "spanpack._ext", "Timestamp")                                                \
    /* datetime support for Packer(datetime=True). */                                              \
    X(datetime_type, "datetime", "datetime")                                                       \
    X(timedelta_type, "datetime", "timedelta")                                                     \
    /* Converters for span links and events. */                                                    \
    X(links_for_v04, "spanpack._extras", "links_for_v04")                                          \
    X(links_json, "spanpack._extras", "links_json")                                                \
    X(events_for_v04, "spanpack._extras", "events_for_v04")                                        \
    X(events_json, "spanpack._extras", "events_json")                                              \
    X(links_for_v10, "spanpack._extras", "links_for_v10")                                          \
    X(events_for_v10, "spanpack._extras", "events_for_v10")                                        \
    /* The SDK's BoundedList keeps a deque: its items read by otel_map.c's batch_warm. */          \
    X(deque_type, "collections", "deque")

/* Objects made by module exec or a type's module init. */
#define SPANPACK_STATE_MADE(X)                                                                     \
    X(epoch) /* datetime(1970, 1, 1, tzinfo=timezone.utc): module exec */                          \
    /* Exceptions raised by the buffered trace encoder (trace_encoder.c). */                       \
    X(buffer_full_error)                                                                           \
    X(buffer_item_too_large_error)                                                                 \
    /* spanpack.SpanFieldWarning, a field kept under another name: module exec. */                 \
    X(span_field_warning)                                                                          \
    /* The interned names of the OpenTelemetry mapping and its rule attributes' index              \
     * (otel_map.c). */                                                                            \
    X(otel_names)                                                                                  \
    X(otel_rule_index)

/* Interned str: X(member, text). */
#define SPANPACK_STATE_STRINGS(X)                                                                  \
    /* Attribute names the Packer looks up. */                                                     \
    X(str_items, "items")                                                                          \
    X(str_code, "code")                                                                            \
    X(str_data, "data")                                                                            \
    X(str_seconds, "seconds")                                                                      \
    X(str_nanoseconds, "nanoseconds")                                                              \
    X(str_tzinfo, "tzinfo")                                                                        \
    X(str_days, "days")                                                                            \
    X(str_microseconds, "microseconds")                                                            \
    /* Span payload strings. */                                                                    \
    X(str_empty, "")                                                                               \
    X(str_origin_key, ORIGIN_KEY)                                                                  \
    X(str_trace_id_high_key, TRACE_ID_HIGH_KEY)                                                    \
    X(str_span_links_key, SPAN_LINKS_KEY)                                                          \
    X(str_events_key, SPAN_EVENTS_KEY)                                                             \
    /* The fields of span links and events (links_events.c). */                                    \
    X(str_to_dict, "to_dict")                                                                      \
    X(str_name, "name")                                                                            \
    X(str_time_unix_nano, "time_unix_nano")                                                        \
    X(str_attributes, "attributes")                                                                \
    X(str_trace_id, "trace_id")                                                                    \
    X(str_span_id, "span_id")                                                                      \
    X(str_dropped_attributes_count, "dropped_attributes_count")                                    \
    X(str_dropped_attributes, "_dropped_attributes")                                               \
    X(str_tracestate, "tracestate")                                                                \
    X(str_flags, "flags")

typedef struct {
#define SP_STATE_TYPE_MEMBER(member) PyTypeObject *member;
#define SP_STATE_IMPORT_MEMBER(member, module, attribute) PyObject *member;
#define SP_STATE_MADE_MEMBER(member) PyObject *member;
#define SP_STATE_STRING_MEMBER(member, text) PyObject *member;
    SPANPACK_STATE_TYPES(SP_STATE_TYPE_MEMBER)
    SPANPACK_STATE_IMPORTS(SP_STATE_IMPORT_MEMBER)
    SPANPACK_STATE_MADE(SP_STATE_MADE_MEMBER)
    SPANPACK_STATE_STRINGS(SP_STATE_STRING_MEMBER)
    /* The in-place readers proven at module exec (layout_probes.h). */
    SpFastPaths fast_paths;
    /* The key of every string table's hash (intern.h's text_hash). */
    uint64_t text_hash_key[2];
#undef SP_STATE_TYPE_MEMBER
#undef SP_STATE_IMPORT_MEMBER
#undef SP_STATE_MADE_MEMBER
#undef SP_STATE_STRING_MEMBER
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

/* A tuple of `count` interned str made from `texts` (new reference; NULL
 * with an exception set): names module exec makes once. */
PyObject *interned_tuple(const char *const *texts, Py_ssize_t count);

/* Called from module exec to create the C types. */
int packer_module_init(PyObject *module, SpanpackState *state);
int trace_encoder_module_init(PyObject *module, SpanpackState *state);

#endif /* SPANPACK_STATE_H */
