/* The spanpack._spanpack module: per-interpreter state, multi-phase
 * initialisation (PEP 489) and the module-level functions. */
#include "mpwrite.h"
#include "packer.h"
#include "state.h"

SpanpackState *
spanpack_state_from_type(PyTypeObject *type)
{
    /* Walk the MRO so that Python subclasses of our heap types find the state
     * of the module that defined their C base. */
    PyObject *mro = type->tp_mro;
    if (mro != NULL) {
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(mro); i++) {
            PyTypeObject *base = (PyTypeObject *)PyTuple_GET_ITEM(mro, i);
            if (!(base->tp_flags & Py_TPFLAGS_HEAPTYPE)) {
                continue;
            }
            PyObject *module = ((PyHeapTypeObject *)base)->ht_module;
            if (module != NULL && PyModule_GetDef(module) == &spanpack_module_def) {
                return spanpack_state_from_module(module);
            }
        }
    }
    PyErr_Format(PyExc_TypeError, "%.200s is not a spanpack type", type->tp_name);
    return NULL;
}

static int
intern_names(SpanpackState *state)
{
    struct {
        PyObject **slot;
        const char *text;
    } names[] = {
        {&state->str_items, "items"},
        {&state->str_code, "code"},
        {&state->str_data, "data"},
        {&state->str_seconds, "seconds"},
        {&state->str_nanoseconds, "nanoseconds"},
        {&state->str_tzinfo, "tzinfo"},
        {&state->str_days, "days"},
        {&state->str_microseconds, "microseconds"},
        {&state->str_empty, ""},
        {&state->str_origin_key, "_dd.origin"},
        {&state->str_trace_id_high_key, "_dd.p.tid"},
        {&state->str_span_links_key, "_dd.span_links"},
        {&state->str_events_key, "events"},
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        *names[i].slot = PyUnicode_InternFromString(names[i].text);
        if (*names[i].slot == NULL) {
            return -1;
        }
    }
    return 0;
}

/* Look up module_name.attribute into *slot (a new reference). */
static int
import_attribute(const char *module_name, const char *attribute, PyObject **slot)
{
    PyObject *module = PyImport_ImportModule(module_name);
    if (module == NULL) {
        return -1;
    }
    *slot = PyObject_GetAttrString(module, attribute);
    Py_DECREF(module);
    return *slot == NULL ? -1 : 0;
}

static int
init_datetime_support(SpanpackState *state)
{
    PyObject *utc = NULL;
    int result = -1;
    if (import_attribute("datetime", "datetime", &state->datetime_type) < 0 ||
        import_attribute("datetime", "timedelta", &state->timedelta_type) < 0) {
        goto error;
    }
    PyObject *timezone = NULL;
    if (import_attribute("datetime", "timezone", &timezone) < 0) {
        goto error;
    }
    utc = PyObject_GetAttrString(timezone, "utc");
    Py_DECREF(timezone);
    if (utc == NULL) {
        goto error;
    }
    state->epoch =
        PyObject_CallFunction(state->datetime_type, "iiiiiiiO", 1970, 1, 1, 0, 0, 0, 0, utc);
    if (state->epoch == NULL) {
        goto error;
    }
    result = 0;
error:
    Py_XDECREF(utc);
    return result;
}

static int
spanpack_exec(PyObject *module)
{
    SpanpackState *state = spanpack_state_from_module(module);
    if (intern_names(state) < 0 || init_datetime_support(state) < 0 ||
        import_attribute("spanpack._ext", "ExtType", &state->ext_type) < 0 ||
        import_attribute("spanpack._ext", "Timestamp", &state->timestamp_type) < 0 ||
        import_attribute("spanpack._extras", "links_for_v04", &state->links_for_v04) < 0 ||
        import_attribute("spanpack._extras", "links_json", &state->links_json) < 0 ||
        import_attribute("spanpack._extras", "events_for_v04", &state->events_for_v04) < 0 ||
        import_attribute("spanpack._extras", "events_json", &state->events_json) < 0 ||
        import_attribute("spanpack._extras", "links_for_v10", &state->links_for_v10) < 0 ||
        import_attribute("spanpack._extras", "events_for_v10", &state->events_for_v10) < 0) {
        return -1;
    }
    if (!PyType_Check(state->ext_type) || !PyType_Check(state->timestamp_type)) {
        PyErr_SetString(PyExc_TypeError, "spanpack._ext.ExtType and Timestamp must be classes");
        return -1;
    }
    if (packer_module_init(module, state) < 0 || trace_encoder_module_init(module, state) < 0) {
        return -1;
    }
    return 0;
}

/* Every PyObject * in the state, for traverse and clear. */
#define SPANPACK_STATE_OBJECTS(X)                                                                  \
    X(packer_type)                                                                                 \
    X(trace_encoder_type)                                                                          \
    X(encoded_part_type)                                                                           \
    X(ext_type)                                                                                    \
    X(timestamp_type)                                                                              \
    X(datetime_type)                                                                               \
    X(timedelta_type)                                                                              \
    X(epoch)                                                                                       \
    X(buffer_full_error)                                                                           \
    X(buffer_item_too_large_error)                                                                 \
    X(links_for_v04)                                                                               \
    X(links_json)                                                                                  \
    X(events_for_v04)                                                                              \
    X(events_json)                                                                                 \
    X(links_for_v10)                                                                               \
    X(events_for_v10)                                                                              \
    X(str_items)                                                                                   \
    X(str_code)                                                                                    \
    X(str_data)                                                                                    \
    X(str_seconds)                                                                                 \
    X(str_nanoseconds)                                                                             \
    X(str_tzinfo)                                                                                  \
    X(str_days)                                                                                    \
    X(str_microseconds)                                                                            \
    X(str_empty)                                                                                   \
    X(str_origin_key)                                                                              \
    X(str_trace_id_high_key)                                                                       \
    X(str_span_links_key)                                                                          \
    X(str_events_key)

static int
spanpack_traverse(PyObject *module, visitproc visit, void *arg)
{
    SpanpackState *state = spanpack_state_from_module(module);
    if (state == NULL) {
        return 0;
    }
#define VISIT_FIELD(name) Py_VISIT(state->name);
    SPANPACK_STATE_OBJECTS(VISIT_FIELD)
#undef VISIT_FIELD
    return 0;
}

static int
spanpack_clear(PyObject *module)
{
    SpanpackState *state = spanpack_state_from_module(module);
    if (state == NULL) {
        return 0;
    }
#define CLEAR_FIELD(name) Py_CLEAR(state->name);
    SPANPACK_STATE_OBJECTS(CLEAR_FIELD)
#undef CLEAR_FIELD
    return 0;
}

static void
spanpack_free(void *module)
{
    spanpack_clear((PyObject *)module);
}

/* Test hook: the length check every msgpack header writer applies, callable
 * with lengths that would take gigabytes to reach through real data. */
static PyObject *
spanpack_check_msgpack_length(PyObject *module, PyObject *arg)
{
    (void)module;
    long long length = PyLong_AsLongLong(arg);
    if (length == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (mp_check_length(length, "length") < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyMethodDef spanpack_functions[] = {
    {"packb", (PyCFunction)(void (*)(void))spanpack_packb, METH_FASTCALL | METH_KEYWORDS,
     "packb($module, obj, /, *, default=None, use_single_float=False, autoreset=True, "
     "use_bin_type=True, strict_types=False, datetime=False, unicode_errors=None, "
     "buf_size=None)\n--\n\nPack obj with Packer(**options): bytes, or None with "
     "autoreset=False."},
    {"_check_msgpack_length", spanpack_check_msgpack_length, METH_O,
     "_check_msgpack_length($module, length, /)\n--\n\nRaise ValueError unless length fits a "
     "msgpack header (a test hook)."},
    {NULL, NULL, 0, NULL},
};

static PyModuleDef_Slot spanpack_slots[] = {
    {Py_mod_exec, spanpack_exec},
#if PY_VERSION_HEX >= 0x030C0000
    {Py_mod_multiple_interpreters, Py_MOD_PER_INTERPRETER_GIL_SUPPORTED},
#endif
    {0, NULL},
};

PyModuleDef spanpack_module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "spanpack._spanpack",
    .m_doc = "C core of spanpack: msgpack Packer and Datadog trace payload encoders.",
    .m_size = sizeof(SpanpackState),
    .m_methods = spanpack_functions,
    .m_slots = spanpack_slots,
    .m_traverse = spanpack_traverse,
    .m_clear = spanpack_clear,
    .m_free = spanpack_free,
};

PyMODINIT_FUNC
PyInit__spanpack(void)
{
    return PyModuleDef_Init(&spanpack_module_def);
}
