/* The spanpack._spanpack module: per-interpreter state, multi-phase
 * initialisation (PEP 489) and the module-level functions. */
#include "intern.h"
#include "layout_probes.h"
#include "mpwrite.h"
#include "otel_map.h"
#include "otel_span.h"
#include "packer.h"
#include "spanfields.h"
#include "state.h"

#include <stdlib.h>

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
#define INTERN_STRING(member, text)                                                                \
    if ((state->member = PyUnicode_InternFromString(text)) == NULL) {                              \
        return -1;                                                                                 \
    }
    SPANPACK_STATE_STRINGS(INTERN_STRING)
#undef INTERN_STRING
    return 0;
}

/* The wire constants (wire.h) and the span field names as module constants,
 * for the Python side to import instead of restating them.  Added before
 * spanpack._extras is imported, which imports some of them. */
PyObject *
interned_tuple(const char *const *texts, Py_ssize_t count)
{
    PyObject *names = PyTuple_New(count);
    if (names == NULL) {
        return NULL;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *name = PyUnicode_InternFromString(texts[i]);
        if (name == NULL) {
            Py_DECREF(names);
            return NULL;
        }
        PyTuple_SET_ITEM(names, i, name);
    }
    return names;
}

static int
add_constants(PyObject *module)
{
    PyObject *names = interned_tuple(span_field_names, SF_COUNT);
    if (names == NULL) {
        return -1;
    }
    int result = PyModule_AddObjectRef(module, "SPAN_FIELDS", names);
    Py_DECREF(names);
    if (result < 0 || PyModule_AddIntConstant(module, "MAX_TEXT_LEN", MAX_TEXT_LEN) < 0 ||
        PyModule_AddIntConstant(module, "TRUNCATED_PREFIX_LEN", TRUNCATED_PREFIX_LEN) < 0 ||
        PyModule_AddStringConstant(module, "TRUNCATION_SUFFIX", TRUNCATION_SUFFIX) < 0 ||
        PyModule_AddStringConstant(module, "ORIGIN_KEY", ORIGIN_KEY) < 0 ||
        PyModule_AddStringConstant(module, "TRACE_ID_HIGH_KEY", TRACE_ID_HIGH_KEY) < 0 ||
        PyModule_AddStringConstant(module, "SPAN_LINKS_KEY", SPAN_LINKS_KEY) < 0 ||
        PyModule_AddStringConstant(module, "SPAN_EVENTS_KEY", SPAN_EVENTS_KEY) < 0) {
        return -1;
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

/* The state's SPANPACK_STATE_IMPORTS. */
static int
import_attributes(SpanpackState *state)
{
#define IMPORT_ATTRIBUTE(member, module, attribute)                                                \
    if (import_attribute(module, attribute, &state->member) < 0) {                                 \
        return -1;                                                                                 \
    }
    SPANPACK_STATE_IMPORTS(IMPORT_ATTRIBUTE)
#undef IMPORT_ATTRIBUTE
    return 0;
}

/* state->epoch (after import_attributes). */
static int
init_epoch(SpanpackState *state)
{
    PyObject *timezone = NULL, *utc = NULL;
    if (import_attribute("datetime", "timezone", &timezone) == 0) {
        utc = PyObject_GetAttrString(timezone, "utc");
        Py_DECREF(timezone);
    }
    if (utc == NULL) {
        return -1;
    }
    state->epoch =
        PyObject_CallFunction(state->datetime_type, "iiiiiiiO", 1970, 1, 1, 0, 0, 0, 0, utc);
    Py_DECREF(utc);
    return state->epoch == NULL ? -1 : 0;
}

/* state->fast_paths, proven on this interpreter (layout_probes.c), and
 * their names as the private `_fast_paths`.  SPANPACK_DISABLE_FAST_PATHS
 * (tests, benchmarks) switches readers off by name. */
static int
init_fast_paths(PyObject *module, SpanpackState *state)
{
    if (layout_probes_run(&state->fast_paths, getenv("SPANPACK_DISABLE_FAST_PATHS")) < 0) {
        return -1;
    }
    PyObject *names = layout_probes_names(&state->fast_paths);
    if (names == NULL) {
        return -1;
    }
    int result = PyModule_AddObjectRef(module, "_fast_paths", names);
    Py_DECREF(names);
    return result;
}

/* state->text_hash_key (intern.h's text_hash): CPython's hashes of two
 * constant strs, so it is as secret as the process's hash secret, and fixed
 * under PYTHONHASHSEED=0 as str hashes are. */
static int
init_text_hash_key(SpanpackState *state)
{
    const char *const texts[] = {"spanpack string table", "spanpack string table key"};
    for (size_t i = 0; i < 2; i++) {
        PyObject *text = PyUnicode_FromString(texts[i]);
        Py_hash_t hash = text != NULL ? PyObject_Hash(text) : -1;
        Py_XDECREF(text);
        if (hash == -1) {
            return -1;
        }
        /* (Spread over 64 bits where Py_hash_t has 32.) */
        state->text_hash_key[i] = (uint64_t)hash * TEXT_HASH_MIX;
    }
    return 0;
}

static int
spanpack_exec(PyObject *module)
{
    SpanpackState *state = spanpack_state_from_module(module);
    if (intern_names(state) < 0 || add_constants(module) < 0 || import_attributes(state) < 0 ||
        init_epoch(state) < 0 || init_fast_paths(module, state) < 0 ||
        init_text_hash_key(state) < 0) {
        return -1;
    }
    if (!PyType_Check(state->ext_type) || !PyType_Check(state->timestamp_type)) {
        PyErr_SetString(PyExc_TypeError, "spanpack._ext.ExtType and Timestamp must be classes");
        return -1;
    }
    state->span_field_warning = PyErr_NewExceptionWithDoc(
        "spanpack.SpanFieldWarning",
        "A span class keeps a field under another common name (tags for meta, duration for "
        "duration_ns, ...), which is not written; issued once per class, at its first span. "
        "Map the field with fields= to read it or to silence the warning.",
        PyExc_UserWarning, NULL);
    if (state->span_field_warning == NULL ||
        PyModule_AddObjectRef(module, "SpanFieldWarning", state->span_field_warning) < 0) {
        return -1;
    }
    if (packer_module_init(module, state) < 0 || trace_encoder_module_init(module, state) < 0 ||
        otel_span_module_init(module, state) < 0 || otel_map_module_init(state) < 0) {
        return -1;
    }
    return 0;
}

/* Every object of the state, each as ON_OBJECT(member), for traverse and
 * clear (the caller defines ON_OBJECT). */
#define FOR_EACH_STATE_OBJECT                                                                      \
    SPANPACK_STATE_TYPES(ON_OBJECT)                                                                \
    SPANPACK_STATE_IMPORTS(ON_IMPORTED_OBJECT)                                                     \
    SPANPACK_STATE_MADE(ON_OBJECT)                                                                 \
    SPANPACK_STATE_STRINGS(ON_STRING_OBJECT)
#define ON_IMPORTED_OBJECT(member, module, attribute) ON_OBJECT(member)
#define ON_STRING_OBJECT(member, text) ON_OBJECT(member)

static int
spanpack_traverse(PyObject *module, visitproc visit, void *arg)
{
    SpanpackState *state = spanpack_state_from_module(module);
    if (state == NULL) {
        return 0;
    }
#define ON_OBJECT(member) Py_VISIT(state->member);
    FOR_EACH_STATE_OBJECT
#undef ON_OBJECT
    return 0;
}

static int
spanpack_clear(PyObject *module)
{
    SpanpackState *state = spanpack_state_from_module(module);
    if (state == NULL) {
        return 0;
    }
#define ON_OBJECT(member) Py_CLEAR(state->member);
    FOR_EACH_STATE_OBJECT
#undef ON_OBJECT
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
    {"_otel_map_spans", (PyCFunction)(void (*)(void))otel_map_spans, METH_FASTCALL,
     "_otel_map_spans($module, spans, plan, as_objects=False, /)\n--\n\nOpenTelemetry SDK spans "
     "as dict spans (OtelSpans: as_objects), None for each one spanpack.otel maps in Python (its "
     "plan: spanpack.otel._c_plan)."},
    {"_otel_group_traces", (PyCFunction)(void (*)(void))otel_group_traces, METH_FASTCALL,
     "_otel_group_traces($module, dd_spans, priority_key, default_priority, /)\n--\n\nMapped "
     "spans (dict spans, OtelSpans) grouped by trace id, each trace's local root carrying its "
     "sampling priority "
     "(spanpack.otel.map_spans)."},
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
