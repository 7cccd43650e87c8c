/* The read floor: what any encoder of these spans must at least do, and
 * nothing more.  For every span it reads each protocol field through the
 * C API's generic attribute lookup (or the dict's own lookup for dict
 * spans) and, for dict-valued fields, every entry's key and value (their
 * length or value), and writes nothing.  Built only for the benchmarks
 * (see build.py); never part of spanpack. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* Touch a leaf the way an encoder must: its size or its number. */
static size_t
touch(PyObject *value)
{
    if (PyUnicode_Check(value)) {
        return (size_t)PyUnicode_GET_LENGTH(value);
    }
    if (PyLong_Check(value)) {
        return (size_t)PyLong_AsUnsignedLongLongMask(value);
    }
    if (PyFloat_Check(value)) {
        return (size_t)PyFloat_AS_DOUBLE(value);
    }
    return (size_t)(uintptr_t)value;
}

/* Touch a field's value: every entry of a dict, else the value itself. */
static size_t
touch_field(PyObject *value)
{
    size_t sum = 0;
    if (PyDict_Check(value)) {
        Py_ssize_t pos = 0;
        PyObject *key, *item;
        while (PyDict_Next(value, &pos, &key, &item)) {
            sum += touch(key) + touch(item);
        }
        return sum;
    }
    return touch(value);
}

static int
read_field(PyObject *span, PyObject *name, size_t *sum)
{
    PyObject *value = NULL;
    if (PyDict_Check(span)) {
        value = Py_XNewRef(PyDict_GetItemWithError(span, name));
        if (value == NULL && PyErr_Occurred()) {
            return -1;
        }
    }
    else {
#if PY_VERSION_HEX >= 0x030D0000
        if (PyObject_GetOptionalAttr(span, name, &value) < 0) {
            return -1;
        }
#else
        if (_PyObject_LookupAttr(span, name, &value) < 0) {
            return -1;
        }
#endif
    }
    if (value == NULL) {
        return 0;
    }
    *sum += touch_field(value);
    Py_DECREF(value);
    return 0;
}

/* Call read(span, context, &sum) for every span of `traces` (a list of
 * lists); the checksum, or NULL with an error. */
static PyObject *
for_each_span(PyObject *traces, int (*read)(PyObject *, void *, size_t *), void *context)
{
    if (!PyList_Check(traces)) {
        PyErr_SetString(PyExc_TypeError, "traces must be a list");
        return NULL;
    }
    size_t sum = 0;
    for (Py_ssize_t t = 0; t < PyList_GET_SIZE(traces); t++) {
        PyObject *trace = PyList_GET_ITEM(traces, t);
        if (!PyList_Check(trace)) {
            PyErr_SetString(PyExc_TypeError, "a trace must be a list");
            return NULL;
        }
        for (Py_ssize_t s = 0; s < PyList_GET_SIZE(trace); s++) {
            if (read(PyList_GET_ITEM(trace, s), context, &sum) < 0) {
                return NULL;
            }
        }
    }
    return PyLong_FromSize_t(sum);
}

static int
read_named_fields(PyObject *span, void *names, size_t *sum)
{
    for (Py_ssize_t f = 0; f < PyTuple_GET_SIZE((PyObject *)names); f++) {
        if (read_field(span, PyTuple_GET_ITEM((PyObject *)names, f), sum) < 0) {
            return -1;
        }
    }
    return 0;
}

/* read_traces(traces, names) -> int: a checksum, so nothing is optimised out. */
static PyObject *
read_traces(PyObject *module, PyObject *args)
{
    PyObject *traces, *names;
    (void)module;
    if (!PyArg_ParseTuple(args, "O!O!", &PyList_Type, &traces, &PyTuple_Type, &names)) {
        return NULL;
    }
    return for_each_span(traces, read_named_fields, names);
}

/* ddtrace's native spans (4.9 and later): what its own encoder reads, by the
 * cheapest path there is.  The ten fields are getset descriptors of the
 * native SpanData, called through their C getters (looked up once per
 * class); the tags come from the accessors, C methods without arguments
 * called through their C functions, each entry touched; links, events and
 * struct tags only after their _has_ method said yes. */
static const char *const DDTRACE_FIELDS[] = {"trace_id", "span_id", "parent_id", "service",
                                             "name", "resource", "span_type", "start_ns",
                                             "duration_ns", "error"};
#define DDTRACE_FIELD_COUNT 10
static const char *const DDTRACE_ACCESSORS[][2] = {
    {NULL, "_get_str_attributes"},
    {NULL, "_get_numeric_attributes"},
    {"_has_meta_structs", "_get_meta_structs"},
    {"_has_links", "_get_links"},
    {"_has_events", "_get_events"},
};
#define DDTRACE_ACCESSOR_COUNT 5

typedef struct {
    PyTypeObject *type; /* borrowed: the traces hold their spans, and so their classes */
    PyGetSetDef *getter[DDTRACE_FIELD_COUNT];
    PyCFunction method[DDTRACE_ACCESSOR_COUNT][2];
} DdtraceClass;

static int
resolve_ddtrace_class(PyTypeObject *type, DdtraceClass *resolved)
{
    resolved->type = type;
    for (int i = 0; i < DDTRACE_FIELD_COUNT; i++) {
        PyObject *found = PyObject_GetAttrString((PyObject *)type, DDTRACE_FIELDS[i]);
        if (found == NULL) {
            return -1;
        }
        int ok = Py_IS_TYPE(found, &PyGetSetDescr_Type);
        resolved->getter[i] = ok ? ((PyGetSetDescrObject *)found)->d_getset : NULL;
        Py_DECREF(found);
        if (!ok) {
            PyErr_Format(PyExc_TypeError, "%s is not a native getter", DDTRACE_FIELDS[i]);
            return -1;
        }
    }
    for (int k = 0; k < DDTRACE_ACCESSOR_COUNT; k++) {
        for (int j = 0; j < 2; j++) {
            resolved->method[k][j] = NULL;
            if (DDTRACE_ACCESSORS[k][j] == NULL) {
                continue;
            }
            PyObject *found = PyObject_GetAttrString((PyObject *)type, DDTRACE_ACCESSORS[k][j]);
            if (found == NULL) {
                return -1;
            }
            int ok = Py_IS_TYPE(found, &PyMethodDescr_Type) &&
                     ((PyMethodDescrObject *)found)->d_method->ml_flags == METH_NOARGS;
            resolved->method[k][j] = ok ? ((PyMethodDescrObject *)found)->d_method->ml_meth : NULL;
            Py_DECREF(found);
            if (!ok) {
                PyErr_Format(PyExc_TypeError, "%s is not a native method", DDTRACE_ACCESSORS[k][j]);
                return -1;
            }
        }
    }
    return 0;
}

static int
read_ddtrace_span(const DdtraceClass *resolved, PyObject *span, size_t *sum)
{
    for (int i = 0; i < DDTRACE_FIELD_COUNT; i++) {
        PyObject *value = resolved->getter[i]->get(span, resolved->getter[i]->closure);
        if (value == NULL) {
            return -1;
        }
        *sum += touch(value);
        Py_DECREF(value);
    }
    for (int k = 0; k < DDTRACE_ACCESSOR_COUNT; k++) {
        if (resolved->method[k][0] != NULL) {
            PyObject *any = resolved->method[k][0](span, NULL);
            int truth = any != NULL ? PyObject_IsTrue(any) : -1;
            Py_XDECREF(any);
            if (truth <= 0) {
                if (truth < 0) {
                    return -1;
                }
                continue;
            }
        }
        PyObject *value = resolved->method[k][1](span, NULL);
        if (value == NULL) {
            return -1;
        }
        *sum += touch_field(value);
        Py_DECREF(value);
    }
    return 0;
}

static int
read_ddtrace_span_resolving(PyObject *span, void *resolved, size_t *sum)
{
    DdtraceClass *known = resolved;
    if (Py_TYPE(span) != known->type && resolve_ddtrace_class(Py_TYPE(span), known) < 0) {
        return -1;
    }
    return read_ddtrace_span(known, span, sum);
}

/* read_ddtrace_native(traces) -> int: a checksum, so nothing is optimised out. */
static PyObject *
read_ddtrace_native(PyObject *module, PyObject *traces)
{
    (void)module;
    DdtraceClass resolved = {NULL, {NULL}, {{NULL}}};
    return for_each_span(traces, read_ddtrace_span_resolving, &resolved);
}

static PyMethodDef methods[] = {
    {"read_traces", read_traces, METH_VARARGS, "read_traces(traces, names) -> int"},
    {"read_ddtrace_native", read_ddtrace_native, METH_O, "read_ddtrace_native(traces) -> int"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "readfloor", NULL, 0, methods};

PyMODINIT_FUNC
PyInit_readfloor(void)
{
    return PyModuleDef_Init(&module_def);
}
