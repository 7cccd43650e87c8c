/* Floors for the benchmarks: what any encoder of these spans must at least
 * do, and nothing more.  Built only for the benchmarks (see build.py); never
 * part of spanpack.
 *
 * - read_cheapest(traces): every field read the cheapest way spanpack
 *   could (a slot at its offset, an instance's values array in place, a
 *   property through the attribute lookup), every text's UTF-8 data and
 *   length, every int's 64 bits, every tag entry (a dict's entries in place):
 *   spanpack's own in-place readers (ext/pydict.h, pyinstance.h, pyint.h),
 *   switched on only once ext/layout_probes.c has proven them here.  Nothing
 *   is written.
 * - extract(traces) then write_v04(extracted): the v0.4 payload spanpack
 *   writes for these spans (byte for byte), from values extracted into C
 *   arrays beforehand (no CPython call per field): the cost of the writing
 *   alone.
 * - read_ddtrace_native(traces): ddtrace's native spans by their C getters. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#include "layout_probes.h"
#include "pydict.h"
#include "pyinstance.h"
#include "pyint.h"
#include "mpwrite.h"

#include <stdint.h>
#include <string.h>

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

/* ddtrace's native spans (4.9 and later): what its own encoder reads, by the
 * cheapest path there is.  The ten fields are getset descriptors of the
 * native SpanData, called through their C getters (looked up once per
 * class); the tags come from the accessors, C methods without arguments
 * called through their C functions, each entry touched; links, events and
 * struct tags only after their _has_ method said yes. */
static const char *const DDTRACE_FIELDS[] = {"trace_id",    "span_id",  "parent_id", "service",
                                             "name",        "resource", "span_type", "start_ns",
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

/* ---------------------------------------------------------------------------
 * read_cheapest: each field as spanpack could read it at best */

/* The twelve core fields, in the order of the names tuple given. */
#define CORE_FIELDS 12
enum {
    F_TRACE_ID,
    F_SPAN_ID,
    F_PARENT_ID,
    F_SERVICE,
    F_NAME,
    F_RESOURCE,
    F_SPAN_TYPE,
    F_START,
    F_DURATION,
    F_ERROR,
    F_META,
    F_METRICS
};
static const char *const CORE_NAMES[CORE_FIELDS] = {
    "trace_id",  "span_id",  "parent_id",   "service", "name", "resource",
    "span_type", "start_ns", "duration_ns", "error",   "meta", "metrics"};

typedef enum { READ_SLOT, READ_VALUES, READ_LOOKUP } ReadKind;

typedef struct {
    PyTypeObject *type; /* borrowed: the traces hold their spans, and so their classes */
    const SpDictKeys *keys;
    ReadKind kind[CORE_FIELDS];
    Py_ssize_t where[CORE_FIELDS]; /* slot offset or values position */
    PyObject *names[CORE_FIELDS];  /* borrowed from the module state */
} CheapClass;

typedef struct {
    SpFastPaths fast;
    PyObject *names[CORE_FIELDS];
} FloorState;

static int
resolve_cheap_class(FloorState *state, PyTypeObject *type, CheapClass *resolved)
{
    resolved->type = type;
    resolved->keys = NULL;
#ifdef SP_INSTANCE_VALUES_IN_PLACE
    resolved->keys = pyinstance_shared_keys(&state->fast, type);
#endif
    for (int i = 0; i < CORE_FIELDS; i++) {
        PyObject *name = state->names[i];
        resolved->names[i] = name;
        resolved->kind[i] = READ_LOOKUP;
        PyObject *descr = _PyType_Lookup(type, name); /* borrowed */
        if (descr != NULL && Py_IS_TYPE(descr, &PyMemberDescr_Type)) {
            PyMemberDef *member = ((PyMemberDescrObject *)descr)->d_member;
            if (member->type == T_OBJECT_EX && !(member->flags & READONLY)) {
                resolved->kind[i] = READ_SLOT;
                resolved->where[i] = member->offset;
            }
            continue;
        }
        if (descr != NULL && Py_TYPE(descr)->tp_descr_set != NULL) {
            continue; /* a data descriptor (a property): the lookup runs it */
        }
#ifdef SP_INSTANCE_VALUES_IN_PLACE
        if (resolved->keys != NULL) {
            Py_ssize_t position = pyinstance_position(resolved->keys, name);
            if (position >= 0) {
                resolved->kind[i] = READ_VALUES;
                resolved->where[i] = position;
            }
        }
#endif
    }
    return 0;
}

/* Text as a writer needs it: its UTF-8 data and size. */
static int
touch_text(PyObject *value, size_t *sum)
{
    if (SP_LIKELY(PyUnicode_IS_COMPACT_ASCII(value))) {
        *sum += (size_t)PyUnicode_GET_LENGTH(value) + *(const unsigned char *)PyUnicode_DATA(value);
        return 0;
    }
    Py_ssize_t size;
    const char *utf8 = PyUnicode_AsUTF8AndSize(value, &size);
    if (utf8 == NULL) {
        return -1;
    }
    *sum += (size_t)size;
    return 0;
}

/* A leaf as a writer needs it: text, 64 bits of an int, a double. */
static int
touch_leaf(const SpFastPaths *fast, PyObject *value, size_t *sum)
{
    uint64_t u;
    if (PyUnicode_Check(value)) {
        return touch_text(value, sum);
    }
    if (PyLong_Check(value)) {
        /* pyint_as_u64 answers for every int (1: negative or too wide,
         * which these spans never hold) */
        *sum += pyint_as_u64(fast, value, &u) == 0 ? (size_t)u : 1;
        return 0;
    }
    if (PyFloat_Check(value)) {
        *sum += (size_t)PyFloat_AS_DOUBLE(value);
        return 0;
    }
    *sum += (size_t)(uintptr_t)value;
    return 0;
}

static int
touch_tags(const SpFastPaths *fast, PyObject *dict, size_t *sum)
{
    DictEntries entries;
    if (pydict_entries(fast, dict, &entries)) {
        PyObject *const *entry = entries.keys;
        for (Py_ssize_t i = 0; i < entries.count; i++, entry += entries.stride) {
            if (entry[1] != NULL &&
                (touch_leaf(fast, entry[0], sum) < 0 || touch_leaf(fast, entry[1], sum) < 0)) {
                return -1;
            }
        }
        return 0;
    }
    Py_ssize_t pos = 0;
    PyObject *key, *item;
    while (PyDict_Next(dict, &pos, &key, &item)) {
        if (touch_leaf(fast, key, sum) < 0 || touch_leaf(fast, item, sum) < 0) {
            return -1;
        }
    }
    return 0;
}

static int
touch_value(const SpFastPaths *fast, PyObject *value, size_t *sum)
{
    return PyDict_Check(value) ? touch_tags(fast, value, sum) : touch_leaf(fast, value, sum);
}

typedef struct {
    FloorState *state;
    CheapClass known;
} CheapReader;

static int
read_cheap_span(PyObject *span, void *context, size_t *sum)
{
    CheapReader *reader = context;
    CheapClass *known = &reader->known;
    const SpFastPaths *fast = &reader->state->fast;
    if (Py_TYPE(span) != known->type &&
        resolve_cheap_class(reader->state, Py_TYPE(span), known) < 0) {
        return -1;
    }
    PyObject *const *values = NULL;
#ifdef SP_INSTANCE_VALUES_IN_PLACE
    Py_ssize_t capacity = 0;
    if (known->keys != NULL) {
        values = pyinstance_values(span, known->keys, &capacity);
    }
#endif
    for (int i = 0; i < CORE_FIELDS; i++) {
        PyObject *value = NULL;
        int owned = 0;
        if (known->kind[i] == READ_SLOT) {
            value = *(PyObject **)((char *)span + known->where[i]);
        }
#ifdef SP_INSTANCE_VALUES_IN_PLACE
        else if (known->kind[i] == READ_VALUES && values != NULL && known->where[i] < capacity) {
            value = values[known->where[i]];
        }
#endif
        else {
            value = PyObject_GetAttr(span, known->names[i]);
            if (value == NULL) {
                return -1;
            }
            owned = 1;
        }
        if (value == NULL) {
            PyErr_Format(PyExc_AttributeError, "span has no %s", CORE_NAMES[i]);
            return -1;
        }
        int result = touch_value(fast, value, sum);
        if (owned) {
            Py_DECREF(value);
        }
        if (result < 0) {
            return -1;
        }
    }
    return 0;
}

/* read_cheapest(traces) -> int: a checksum, so nothing is optimised out. */
static PyObject *
read_cheapest(PyObject *module, PyObject *traces)
{
    CheapReader reader = {PyModule_GetState(module), {NULL}};
    return for_each_span(traces, read_cheap_span, &reader);
}

/* ---------------------------------------------------------------------------
 * extract + write_v04: the writing alone */

typedef struct {
    size_t offset; /* into the text arena */
    uint32_t size;
} Text;

typedef enum { NUMBER_UINT, NUMBER_INT, NUMBER_DOUBLE } NumberKind;

typedef struct {
    Text key;
    NumberKind kind; /* metrics only */
    union {
        Text text;
        uint64_t u;
        int64_t i;
        double d;
    } value;
} Entry;

typedef struct {
    uint64_t span_id, parent_id;
    int64_t start, duration;
    Text service, resource, name, type;
    size_t first_meta, meta_count, first_metric, metric_count;
    unsigned char has_parent, has_error, has_type;
} FlatSpan;

typedef struct {
    uint64_t trace_id;
    size_t first_span, span_count;
} FlatTrace;

/* Growable arrays of everything, owned by the capsule. */
typedef struct {
    FlatTrace *traces;
    size_t trace_count, trace_capacity;
    FlatSpan *spans;
    size_t span_count, span_capacity;
    Entry *entries;
    size_t entry_count, entry_capacity;
    char *arena;
    size_t arena_size, arena_capacity;
    size_t bound; /* bytes the payload takes at most */
} Extracted;

static void
extracted_free(Extracted *x)
{
    if (x == NULL) {
        return;
    }
    PyMem_Free(x->traces);
    PyMem_Free(x->spans);
    PyMem_Free(x->entries);
    PyMem_Free(x->arena);
    PyMem_Free(x);
}

static void
extracted_capsule_free(PyObject *capsule)
{
    extracted_free(PyCapsule_GetPointer(capsule, "readfloor.extracted"));
}

/* Room for one more element of `size` bytes in *array (count, capacity). */
static int
grow(void **array, size_t count, size_t *capacity, size_t size, size_t more)
{
    if (count + more <= *capacity) {
        return 0;
    }
    size_t wanted = (*capacity ? *capacity * 2 : 64) + more;
    void *grown = PyMem_Realloc(*array, wanted * size);
    if (grown == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    *array = grown;
    *capacity = wanted;
    return 0;
}

static int
extract_text(Extracted *x, PyObject *value, const char *what, Text *out)
{
    if (!PyUnicode_Check(value)) {
        PyErr_Format(PyExc_TypeError, "%s: expected str, not %.200s", what,
                     Py_TYPE(value)->tp_name);
        return -1;
    }
    Py_ssize_t size;
    const char *utf8 = PyUnicode_AsUTF8AndSize(value, &size);
    if (utf8 == NULL) {
        return -1;
    }
    if (size > (Py_ssize_t)UINT32_MAX) {
        PyErr_Format(PyExc_ValueError, "%s: too long", what);
        return -1;
    }
    if (grow((void **)&x->arena, x->arena_size, &x->arena_capacity, 1, (size_t)size) < 0) {
        return -1;
    }
    memcpy(x->arena + x->arena_size, utf8, (size_t)size);
    out->offset = x->arena_size;
    out->size = (uint32_t)size;
    x->arena_size += (size_t)size;
    x->bound += 5 + (size_t)size;
    return 0;
}

static int
extract_u64(PyObject *value, const char *what, uint64_t *out)
{
    if (!PyLong_Check(value)) {
        PyErr_Format(PyExc_TypeError, "%s: expected int", what);
        return -1;
    }
    *out = PyLong_AsUnsignedLongLong(value);
    return *out == (uint64_t)-1 && PyErr_Occurred() ? -1 : 0;
}

static int
extract_i64(PyObject *value, const char *what, int64_t *out)
{
    if (!PyLong_Check(value)) {
        PyErr_Format(PyExc_TypeError, "%s: expected int", what);
        return -1;
    }
    *out = PyLong_AsLongLong(value);
    return *out == -1 && PyErr_Occurred() ? -1 : 0;
}

static int
extract_tags(Extracted *x, PyObject *dict, int metrics, size_t *first, size_t *count)
{
    const char *what = metrics ? "metrics" : "meta";
    if (!PyDict_Check(dict)) {
        PyErr_Format(PyExc_TypeError, "%s: expected dict", what);
        return -1;
    }
    *first = x->entry_count;
    *count = (size_t)PyDict_GET_SIZE(dict);
    if (grow((void **)&x->entries, x->entry_count, &x->entry_capacity, sizeof(Entry), *count) < 0) {
        return -1;
    }
    x->bound += 5;
    Py_ssize_t pos = 0;
    PyObject *key, *value;
    while (PyDict_Next(dict, &pos, &key, &value)) {
        Entry *entry = &x->entries[x->entry_count++];
        if (extract_text(x, key, what, &entry->key) < 0) {
            return -1;
        }
        if (!metrics) {
            if (extract_text(x, value, what, &entry->value.text) < 0) {
                return -1;
            }
            continue;
        }
        x->bound += 9;
        if (PyFloat_Check(value)) {
            entry->kind = NUMBER_DOUBLE;
            entry->value.d = PyFloat_AS_DOUBLE(value);
        }
        else if (PyLong_Check(value) && !(PyObject_RichCompareBool(value, Py_False, Py_LT) > 0)) {
            entry->kind = NUMBER_UINT;
            if (extract_u64(value, what, &entry->value.u) < 0) {
                return -1;
            }
        }
        else {
            entry->kind = NUMBER_INT;
            if (extract_i64(value, what, &entry->value.i) < 0) {
                return -1;
            }
        }
    }
    return PyErr_Occurred() ? -1 : 0;
}

/* A span's fields into x: what spanpack's v0.4 writer writes of the user
 * classes' spans (64-bit trace ids, no origin, links, events or struct
 * tags); anything else is refused. */
static int
extract_span(Extracted *x, PyObject *span, FlatSpan *flat, uint64_t *trace_id)
{
    PyObject *v[CORE_FIELDS] = {NULL};
    int result = -1;
    for (int i = 0; i < CORE_FIELDS; i++) {
        v[i] = PyObject_GetAttrString(span, CORE_NAMES[i]);
        if (v[i] == NULL) {
            goto done;
        }
    }
    memset(flat, 0, sizeof(*flat));
    flat->has_parent = v[F_PARENT_ID] != Py_None;
    flat->has_type = v[F_SPAN_TYPE] != Py_None;
    int error = PyObject_IsTrue(v[F_ERROR]);
    if (error < 0 || extract_u64(v[F_TRACE_ID], "trace_id", trace_id) < 0 ||
        extract_u64(v[F_SPAN_ID], "span_id", &flat->span_id) < 0 ||
        (flat->has_parent && extract_u64(v[F_PARENT_ID], "parent_id", &flat->parent_id) < 0) ||
        extract_i64(v[F_START], "start_ns", &flat->start) < 0 ||
        extract_i64(v[F_DURATION], "duration_ns", &flat->duration) < 0 ||
        extract_text(x, v[F_SERVICE], "service", &flat->service) < 0 ||
        extract_text(x, v[F_RESOURCE], "resource", &flat->resource) < 0 ||
        extract_text(x, v[F_NAME], "name", &flat->name) < 0 ||
        (flat->has_type && extract_text(x, v[F_SPAN_TYPE], "span_type", &flat->type) < 0) ||
        extract_tags(x, v[F_META], 0, &flat->first_meta, &flat->meta_count) < 0 ||
        extract_tags(x, v[F_METRICS], 1, &flat->first_metric, &flat->metric_count) < 0) {
        goto done;
    }
    flat->has_error = (unsigned char)error;
    x->bound += 1 + 15 * 12 + 9 * 6; /* the map header, the keys, the numbers */
    result = 0;
done:
    for (int i = 0; i < CORE_FIELDS; i++) {
        Py_XDECREF(v[i]);
    }
    return result;
}

static void write_payload(OutBuf *out, const Extracted *x);

/* extract(traces) -> capsule: the spans' values in C arrays, for write_v04. */
static PyObject *
extract(PyObject *module, PyObject *traces)
{
    (void)module;
    if (!PyList_Check(traces)) {
        PyErr_SetString(PyExc_TypeError, "traces must be a list");
        return NULL;
    }
    Extracted *x = PyMem_Calloc(1, sizeof(Extracted));
    if (x == NULL) {
        return PyErr_NoMemory();
    }
    x->bound = 5;
    for (Py_ssize_t t = 0; t < PyList_GET_SIZE(traces); t++) {
        PyObject *trace = PyList_GET_ITEM(traces, t);
        if (!PyList_Check(trace) || grow((void **)&x->traces, x->trace_count, &x->trace_capacity,
                                         sizeof(FlatTrace), 1) < 0) {
            if (!PyErr_Occurred()) {
                PyErr_SetString(PyExc_TypeError, "a trace must be a list");
            }
            goto error;
        }
        FlatTrace *flat_trace = &x->traces[x->trace_count++];
        flat_trace->first_span = x->span_count;
        flat_trace->span_count = (size_t)PyList_GET_SIZE(trace);
        flat_trace->trace_id = 0;
        x->bound += 5;
        for (Py_ssize_t s = 0; s < PyList_GET_SIZE(trace); s++) {
            uint64_t trace_id;
            if (grow((void **)&x->spans, x->span_count, &x->span_capacity, sizeof(FlatSpan), 1) <
                    0 ||
                extract_span(x, PyList_GET_ITEM(trace, s), &x->spans[x->span_count], &trace_id) <
                    0) {
                goto error;
            }
            if (s == 0) {
                flat_trace->trace_id = trace_id; /* spanpack writes the first span's */
            }
            x->span_count++;
        }
    }
    /* The payload's exact size, so that write_v04 fills a bytes object of
     * that size and hands it over as it is (no resize, no copy). */
    OutBuf sizing;
    if (outbuf_init_raw(&sizing, (Py_ssize_t)x->bound) < 0) {
        goto error;
    }
    write_payload(&sizing, x);
    x->bound = (size_t)outbuf_len(&sizing);
    outbuf_free(&sizing);
    PyObject *capsule = PyCapsule_New(x, "readfloor.extracted", extracted_capsule_free);
    if (capsule == NULL) {
        goto error;
    }
    return capsule;
error:
    extracted_free(x);
    return NULL;
}

/* A fixstr key: its header byte and text. */
#define PUT_KEY(out, text)                                                                         \
    (mp_put_byte((out), (unsigned char)(MP_FIXSTR | (sizeof(text) - 1))),                          \
     memcpy((out)->pos, (text), sizeof(text) - 1), (out)->pos += sizeof(text) - 1)

static inline void
put_text(OutBuf *out, const char *arena, Text text)
{
    mp_put_str_header(out, text.size, 1);
    copy_bytes(out->pos, arena + text.offset, text.size); /* as spanpack copies */
    out->pos += text.size;
}

static void
put_span(OutBuf *out, const Extracted *x, uint64_t trace_id, const FlatSpan *span)
{
    const char *arena = x->arena;
    uint32_t count = 7 + span->has_parent + span->has_error + span->has_type +
                     (span->meta_count > 0) + (span->metric_count > 0);
    mp_put_map_header(out, count);
    PUT_KEY(out, "trace_id");
    mp_put_uint(out, trace_id);
    if (span->has_parent) {
        PUT_KEY(out, "parent_id");
        mp_put_uint(out, span->parent_id);
    }
    PUT_KEY(out, "span_id");
    mp_put_uint(out, span->span_id);
    PUT_KEY(out, "service");
    put_text(out, arena, span->service);
    PUT_KEY(out, "resource");
    put_text(out, arena, span->resource);
    PUT_KEY(out, "name");
    put_text(out, arena, span->name);
    PUT_KEY(out, "start");
    mp_put_int(out, span->start);
    PUT_KEY(out, "duration");
    mp_put_int(out, span->duration);
    if (span->has_error) {
        PUT_KEY(out, "error");
        mp_put_byte(out, MP_POSITIVE_FIXINT | 1);
    }
    if (span->has_type) {
        PUT_KEY(out, "type");
        put_text(out, arena, span->type);
    }
    if (span->meta_count > 0) {
        PUT_KEY(out, "meta");
        mp_put_map_header(out, (uint32_t)span->meta_count);
        for (size_t i = 0; i < span->meta_count; i++) {
            const Entry *entry = &x->entries[span->first_meta + i];
            put_text(out, arena, entry->key);
            put_text(out, arena, entry->value.text);
        }
    }
    if (span->metric_count > 0) {
        PUT_KEY(out, "metrics");
        mp_put_map_header(out, (uint32_t)span->metric_count);
        for (size_t i = 0; i < span->metric_count; i++) {
            const Entry *entry = &x->entries[span->first_metric + i];
            put_text(out, arena, entry->key);
            if (entry->kind == NUMBER_DOUBLE) {
                mp_put_double(out, entry->value.d);
            }
            else if (entry->kind == NUMBER_UINT) {
                mp_put_uint(out, entry->value.u);
            }
            else {
                mp_put_int(out, entry->value.i);
            }
        }
    }
}

/* The payload into `out`, which has room for x->bound bytes. */
static void
write_payload(OutBuf *out, const Extracted *x)
{
    mp_put_array_header(out, (uint32_t)x->trace_count);
    for (size_t t = 0; t < x->trace_count; t++) {
        const FlatTrace *trace = &x->traces[t];
        mp_put_array_header(out, (uint32_t)trace->span_count);
        for (size_t s = 0; s < trace->span_count; s++) {
            put_span(out, x, trace->trace_id, &x->spans[trace->first_span + s]);
        }
    }
}

/* write_v04(extracted) -> bytes: the v0.4 payload of the extracted traces. */
static PyObject *
write_v04(PyObject *module, PyObject *capsule)
{
    (void)module;
    const Extracted *x = PyCapsule_GetPointer(capsule, "readfloor.extracted");
    if (x == NULL) {
        return NULL;
    }
    OutBuf out;
    if (outbuf_init_bytes(&out, (Py_ssize_t)x->bound) < 0) {
        return NULL;
    }
    write_payload(&out, x);
    PyObject *payload = outbuf_finish_bytes(&out);
    if (payload == NULL) {
        outbuf_free(&out);
    }
    return payload;
}

static PyMethodDef methods[] = {
    {"read_cheapest", read_cheapest, METH_O, "read_cheapest(traces) -> int"},
    {"extract", extract, METH_O, "extract(traces) -> the spans' values in C arrays"},
    {"write_v04", write_v04, METH_O, "write_v04(extracted) -> bytes"},
    {"read_ddtrace_native", read_ddtrace_native, METH_O, "read_ddtrace_native(traces) -> int"},
    {NULL, NULL, 0, NULL},
};

static int
floor_exec(PyObject *module)
{
    FloorState *state = PyModule_GetState(module);
    for (int i = 0; i < CORE_FIELDS; i++) {
        state->names[i] = PyUnicode_InternFromString(CORE_NAMES[i]);
        if (state->names[i] == NULL) {
            return -1;
        }
    }
    return layout_probes_run(&state->fast, getenv("SPANPACK_DISABLE_FAST_PATHS"));
}

static int
floor_clear(PyObject *module)
{
    FloorState *state = PyModule_GetState(module);
    for (int i = 0; i < CORE_FIELDS; i++) {
        Py_CLEAR(state->names[i]);
    }
    return 0;
}

static void
floor_free(void *module)
{
    floor_clear(module);
}

static PyModuleDef_Slot slots[] = {{Py_mod_exec, floor_exec}, {0, NULL}};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "readfloor", NULL, sizeof(FloorState), methods, slots, NULL,
    floor_clear,           floor_free};

PyMODINIT_FUNC
PyInit_readfloor(void)
{
    return PyModuleDef_Init(&module_def);
}
