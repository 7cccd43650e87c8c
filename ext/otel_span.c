/* spanpack._spanpack.OtelSpan, OtelLink and OtelEvent: see otel_span.h. */
#include "otel_span.h"

#include <stddef.h>

#if PY_VERSION_HEX < 0x030C0000
#include <structmember.h>
#define OS_T_OBJECT_EX T_OBJECT_EX
#define OS_READONLY READONLY
#else
#define OS_T_OBJECT_EX Py_T_OBJECT_EX
#define OS_READONLY Py_READONLY
#endif

PyObject *
otel_span_new(SpanpackState *state, PyObject *const *values)
{
    OtelSpanObject *span = PyObject_GC_New(OtelSpanObject, state->otel_span_type);
    if (span == NULL) {
        return NULL;
    }
    for (int i = 0; i < OS_FIELD_COUNT; i++) {
        span->fields[i] = Py_XNewRef(values[i]);
    }
    PyObject_GC_Track(span);
    return (PyObject *)span;
}

static int
otel_span_traverse(OtelSpanObject *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    for (int i = 0; i < OS_FIELD_COUNT; i++) {
        Py_VISIT(self->fields[i]);
    }
    return 0;
}

static int
otel_span_clear(OtelSpanObject *self)
{
    for (int i = 0; i < OS_FIELD_COUNT; i++) {
        Py_CLEAR(self->fields[i]);
    }
    return 0;
}

static void
otel_span_dealloc(OtelSpanObject *self)
{
    PyTypeObject *type = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    otel_span_clear(self);
    type->tp_free((PyObject *)self);
    Py_DECREF(type);
}

/* (Every type's tp_new here: only the mapping makes them.) */
static PyObject *
otel_span_new_from_python(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    (void)args;
    (void)kwargs;
    PyErr_Format(PyExc_TypeError,
                 "cannot create '%.200s' instances; spanpack.otel.encode_spans makes them",
                 type->tp_name);
    return NULL;
}

#define OS_MEMBER_ENTRY(constant, name)                                                            \
    {name, OS_T_OBJECT_EX, offsetof(OtelSpanObject, fields) + (constant) * sizeof(PyObject *),     \
     OS_READONLY, NULL},
static PyMemberDef otel_span_members[] = {
    OTEL_SPAN_FIELDS(OS_MEMBER_ENTRY){NULL, 0, 0, 0, NULL},
};
#undef OS_MEMBER_ENTRY

static PyType_Slot otel_span_slots[] = {
    {Py_tp_doc, "A Datadog span mapped from an OpenTelemetry span by spanpack.otel (read-only)."},
    {Py_tp_new, otel_span_new_from_python},
    {Py_tp_dealloc, otel_span_dealloc},
    {Py_tp_traverse, otel_span_traverse},
    {Py_tp_clear, otel_span_clear},
    {Py_tp_members, otel_span_members},
    {0, NULL},
};

/* Immutable where CPython can make a heap type so (3.10+): a class attribute
 * set on it (a meta_struct, a replaced descriptor) would be read by the
 * encoder for every span. */
#ifdef Py_TPFLAGS_IMMUTABLETYPE
#define OS_TYPE_FLAGS (Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_IMMUTABLETYPE)
#else
#define OS_TYPE_FLAGS (Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC)
#endif

static PyType_Spec otel_span_spec = {
    .name = "spanpack._spanpack.OtelSpan",
    .basicsize = sizeof(OtelSpanObject),
    .flags = OS_TYPE_FLAGS,
    .slots = otel_span_slots,
};

/* ---------------------------------------------------------------------------
 * OtelLink */

PyObject *
otel_link_new(SpanpackState *state, const LinkValues *values)
{
    OtelLinkObject *link = PyObject_GC_New(OtelLinkObject, state->otel_link_type);
    if (link == NULL) {
        return NULL;
    }
    link->values = *values;
    Py_XINCREF(link->values.attributes);
    Py_XINCREF(link->values.tracestate);
    Py_XINCREF(link->values.flags);
    PyObject_GC_Track(link);
    return (PyObject *)link;
}

/* No tp_clear, so that its objects are set for the link's whole life (the
 * writers read them): a cycle through it can only pass through its
 * attributes dict (reachable from Python by gc.get_referents alone), whose
 * own tp_clear breaks it. */
static int
otel_link_traverse(OtelLinkObject *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(self->values.attributes);
    Py_VISIT(self->values.tracestate);
    Py_VISIT(self->values.flags);
    return 0;
}

static void
otel_link_dealloc(OtelLinkObject *self)
{
    PyTypeObject *type = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    link_values_clear(&self->values);
    type->tp_free((PyObject *)self);
    Py_DECREF(type);
}

/* What spanpack._extras reads of a link that has to_dict(): its attributes
 * a copy (the link keeps its own). */
static PyObject *
otel_link_to_dict(PyObject *self, PyObject *Py_UNUSED(ignored))
{
    SpanpackState *state = spanpack_state_from_type(Py_TYPE(self));
    return state == NULL ? NULL : link_values_dict(state, &((OtelLinkObject *)self)->values, 1);
}

static PyMethodDef otel_link_methods[] = {
    {"to_dict", otel_link_to_dict, METH_NOARGS,
     "The link's fields as ddtrace's SpanLink.to_dict() gives them (a new dict)."},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot otel_link_slots[] = {
    {Py_tp_doc, "A span link mapped from an OpenTelemetry link by spanpack.otel."},
    {Py_tp_new, otel_span_new_from_python},
    {Py_tp_dealloc, otel_link_dealloc},
    {Py_tp_traverse, otel_link_traverse},
    {Py_tp_methods, otel_link_methods},
    {0, NULL},
};

static PyType_Spec otel_link_spec = {
    .name = "spanpack._spanpack.OtelLink",
    .basicsize = sizeof(OtelLinkObject),
    .flags = OS_TYPE_FLAGS,
    .slots = otel_link_slots,
};

/* ---------------------------------------------------------------------------
 * OtelEvent */

PyObject *
otel_event_new(SpanpackState *state, PyObject *name, PyObject *time_unix_nano, PyObject *attributes)
{
    OtelEventObject *event = PyObject_GC_New(OtelEventObject, state->otel_event_type);
    if (event == NULL) {
        return NULL;
    }
    event->name = Py_NewRef(name);
    event->time_unix_nano = Py_NewRef(time_unix_nano);
    event->attributes = Py_NewRef(attributes != NULL ? attributes : Py_None);
    PyObject_GC_Track(event);
    return (PyObject *)event;
}

/* No tp_clear, as OtelLink: its fields are set for its whole life. */
static int
otel_event_traverse(OtelEventObject *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(self->name);
    Py_VISIT(self->time_unix_nano);
    Py_VISIT(self->attributes);
    return 0;
}

static void
otel_event_dealloc(OtelEventObject *self)
{
    PyTypeObject *type = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    Py_CLEAR(self->name);
    Py_CLEAR(self->time_unix_nano);
    Py_CLEAR(self->attributes);
    type->tp_free((PyObject *)self);
    Py_DECREF(type);
}

static PyMemberDef otel_event_members[] = {
    {"name", OS_T_OBJECT_EX, offsetof(OtelEventObject, name), OS_READONLY, NULL},
    {"time_unix_nano", OS_T_OBJECT_EX, offsetof(OtelEventObject, time_unix_nano), OS_READONLY,
     NULL},
    {"attributes", OS_T_OBJECT_EX, offsetof(OtelEventObject, attributes), OS_READONLY, NULL},
    {NULL, 0, 0, 0, NULL},
};

static PyType_Slot otel_event_slots[] = {
    {Py_tp_doc, "A span event mapped from an OpenTelemetry event by spanpack.otel (read-only)."},
    {Py_tp_new, otel_span_new_from_python},
    {Py_tp_dealloc, otel_event_dealloc},
    {Py_tp_traverse, otel_event_traverse},
    {Py_tp_members, otel_event_members},
    {0, NULL},
};

static PyType_Spec otel_event_spec = {
    .name = "spanpack._spanpack.OtelEvent",
    .basicsize = sizeof(OtelEventObject),
    .flags = OS_TYPE_FLAGS,
    .slots = otel_event_slots,
};

int
otel_span_module_init(PyObject *module, SpanpackState *state)
{
    state->otel_span_type = (PyTypeObject *)PyType_FromModuleAndSpec(module, &otel_span_spec, NULL);
    if (state->otel_span_type == NULL) {
        return -1;
    }
    state->otel_link_type = (PyTypeObject *)PyType_FromModuleAndSpec(module, &otel_link_spec, NULL);
    if (state->otel_link_type == NULL) {
        return -1;
    }
    state->otel_event_type =
        (PyTypeObject *)PyType_FromModuleAndSpec(module, &otel_event_spec, NULL);
    return state->otel_event_type == NULL ? -1 : 0;
}
