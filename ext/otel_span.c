/* spanpack._spanpack.OtelSpan: see otel_span.h. */
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

static PyType_Spec otel_span_spec = {
    .name = "spanpack._spanpack.OtelSpan",
    .basicsize = sizeof(OtelSpanObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .slots = otel_span_slots,
};

int
otel_span_module_init(PyObject *module, SpanpackState *state)
{
    state->otel_span_type =
        (PyTypeObject *)PyType_FromModuleAndSpec(module, &otel_span_spec, NULL);
    return state->otel_span_type == NULL ? -1 : 0;
}
