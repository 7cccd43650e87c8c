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
    if (PyDict_Check(value)) {
        Py_ssize_t pos = 0;
        PyObject *key, *item;
        while (PyDict_Next(value, &pos, &key, &item)) {
            *sum += touch(key) + touch(item);
        }
    }
    else {
        *sum += touch(value);
    }
    Py_DECREF(value);
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
    size_t sum = 0;
    for (Py_ssize_t t = 0; t < PyList_GET_SIZE(traces); t++) {
        PyObject *trace = PyList_GET_ITEM(traces, t);
        if (!PyList_Check(trace)) {
            PyErr_SetString(PyExc_TypeError, "a trace must be a list");
            return NULL;
        }
        for (Py_ssize_t s = 0; s < PyList_GET_SIZE(trace); s++) {
            PyObject *span = PyList_GET_ITEM(trace, s);
            for (Py_ssize_t f = 0; f < PyTuple_GET_SIZE(names); f++) {
                if (read_field(span, PyTuple_GET_ITEM(names, f), &sum) < 0) {
                    return NULL;
                }
            }
        }
    }
    return PyLong_FromSize_t(sum);
}

static PyMethodDef methods[] = {
    {"read_traces", read_traces, METH_VARARGS, "read_traces(traces, names) -> int"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "readfloor", NULL, 0, methods};

PyMODINIT_FUNC
PyInit_readfloor(void)
{
    return PyModuleDef_Init(&module_def);
}
