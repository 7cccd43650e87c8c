/* /v1.0/traces: one trace as a chunk map, its spans as integer-keyed maps and
 * every string streamed (see v10.h and docs/wire-format-v1.md). */
#include "spanwrite.h"
#include "v10.h"

/* Chunk keys. */
#define V10_CHUNK_PRIORITY 1
#define V10_CHUNK_ORIGIN 2
#define V10_CHUNK_SPANS 4
#define V10_CHUNK_TRACE_ID 6
#define V10_CHUNK_MECHANISM 7

/* Span keys. */
enum {
    V10_SPAN_SERVICE = 1,
    V10_SPAN_NAME = 2,
    V10_SPAN_RESOURCE = 3,
    V10_SPAN_SPAN_ID = 4,
    V10_SPAN_PARENT_ID = 5,
    V10_SPAN_START = 6,
    V10_SPAN_DURATION = 7,
    V10_SPAN_ERROR = 8,
    V10_SPAN_ATTRIBUTES = 9,
    V10_SPAN_TYPE = 10,
    V10_SPAN_LINKS = 11,
    V10_SPAN_EVENTS = 12,
    V10_SPAN_ENV = 13,
    V10_SPAN_VERSION = 14,
    V10_SPAN_COMPONENT = 15,
    V10_SPAN_KIND = 16,
};

/* Attribute value types. */
#define V10_TYPE_STRING 1
#define V10_TYPE_DOUBLE 3
#define V10_TYPE_INT 4
#define V10_TYPE_BYTES 5

/* Span kinds (OpenTelemetry numbering). */
#define V10_KIND_INTERNAL 1

#define V10_TRACE_ID_SIZE 16
/* Nesting of the converted links and events (a few levels in practice). */
#define V10_PLAIN_NEST_LIMIT 16

/* The tags that leave a span's attributes for a field of their own: the
 * span's env, version, component and kind; `_dd.p.tid` (the chunk carries
 * the whole trace id); `_dd.origin` when the trace has an origin (which
 * takes its place, as in v0.4); and on the first span the decision maker
 * and the sampling priority, which become chunk fields. */
typedef enum {
    MOVED_ENV,
    MOVED_VERSION,
    MOVED_COMPONENT,
    MOVED_KIND,
    MOVED_TRACE_ID_HIGH,
    MOVED_ORIGIN,
    MOVED_DECISION_MAKER,
    MOVED_PRIORITY,
    MOVED_COUNT
} MovedTag;

typedef struct {
    SpanWriter base; /* first: the write_trace callbacks get &base */
    /* The chunk's fields, written after its spans. */
    int has_trace_id;
    uint64_t trace_id_high;
    uint64_t trace_id_low;
    PyObject *origin; /* new reference (exact str), or NULL */
    int has_priority;
    int32_t priority;
    uint32_t mechanism; /* 0: none */
    /* The current span's moved tags: key and value, new references. */
    PyObject *moved_key[MOVED_COUNT];
    PyObject *moved_value[MOVED_COUNT];
    int moved_meta;
    int moved_metrics;
} V10Writer;

/* ---------------------------------------------------------------------------
 * Streamed strings */

/* A string already in the table: its id, or (in an encoded part) a hole. */
static inline int
v10_write_id(SpanWriter *w, uint32_t index)
{
    if (index == 0 || w->holes == NULL) {
        return mp_write_uint(w->out, index);
    }
    return holes_push(w->holes, outbuf_len(w->out), index);
}

/* `str`: an exact str of at most MAX_TEXT_LEN code points.  Written as a
 * hole in a part; in a payload as its id when streamed before, else as the
 * str itself, taking the next id. */
static SP_NOINLINE int
v10_write_new_str(SpanWriter *w, PyObject *str, const char *field, PyObject *key)
{
    uint32_t index;
    Py_hash_t hash = PyObject_Hash(str); /* an exact str: cached, cannot fail */
    if (hash == -1) {
        return -1;
    }
    if (strtable_find(w->strings, str, hash, &index)) {
        return v10_write_id(w, index); /* equal text seen before */
    }
    /* New to the table: checked to be UTF-8 (lone surrogates are not).  An
     * ASCII str is its own UTF-8, read in place: span_utf8 would first own
     * the span's borrowed values (its error is an exception object). */
    Py_ssize_t size;
    const char *utf8;
    if (PyUnicode_IS_ASCII(str)) {
        utf8 = (const char *)PyUnicode_DATA(str);
        size = PyUnicode_GET_LENGTH(str);
    }
    else if ((utf8 = span_utf8(w, str, field, key, &size)) == NULL) {
        return -1;
    }
    if (SP_UNLIKELY(strtable_insert_may_fail(w->strings))) {
        span_hold_values(w);
    }
    if (w->holes != NULL) {
        if (strtable_insert(w->strings, str, hash, NULL, NULL, &index) < 0) {
            return -1;
        }
        return v10_write_id(w, index);
    }
    Py_ssize_t before = outbuf_len(w->out);
    if (mp_write_str(w->out, utf8, size, 1) < 0) {
        return -1;
    }
    if (strtable_insert(w->strings, str, hash, NULL, NULL, &index) < 0) {
        outbuf_truncate(w->out, before);
        return -1;
    }
    return 0;
}

/* Any other text (long, bytes, subclasses): its prepared (truncated) form,
 * keyed as str so that equal text never streams twice. */
static SP_NOINLINE int
v10_write_text_slow(SpanWriter *w, PyObject *value, const char *field, PyObject *key)
{
    if (PyUnicode_CheckExact(value) && PyUnicode_GET_LENGTH(value) <= MAX_TEXT_LEN) {
        return v10_write_new_str(w, value, field, key);
    }
    PreparedText text;
    int prepared = text_prepare(w, value, field, key, &text);
    if (prepared <= 0) {
        return prepared < 0 ? -1 : mp_write_uint(w->out, 0);
    }
    PyObject *str = text.object;
    if (PyBytes_CheckExact(str)) {
        span_hold_values(w); /* decoding may fail: an exception */
        str = PyUnicode_DecodeUTF8(text.utf8, text.size, "strict");
        Py_DECREF(text.object);
        if (str == NULL) {
            return span_reraise(w, field, key);
        }
    }
    int result = v10_write_new_str(w, str, field, key);
    Py_DECREF(str);
    return result;
}

/* Text (str, bytes, bytearray; None as ""), streamed. */
static SP_ALWAYS_INLINE int
v10_write_text(SpanWriter *w, PyObject *value, const char *field, PyObject *key)
{
    uint32_t index;
    Py_hash_t hash;
    /* Most text is a str streamed before, found by the hash it keeps. */
    if (SP_LIKELY(PyUnicode_CheckExact(value)) && (hash = ((PyASCIIObject *)value)->hash) != -1 &&
        strtable_find(w->strings, value, hash, &index)) {
        return v10_write_id(w, index);
    }
    return v10_write_text_slow(w, value, field, key);
}

/* A field key and its text. */
static inline int
v10_write_text_field(SpanWriter *w, int field_key, PyObject *value, const char *field)
{
    if (mp_write_byte(w->out, (unsigned char)field_key) < 0) {
        return -1;
    }
    return v10_write_text(w, value, field, NULL);
}

/* ---------------------------------------------------------------------------
 * Links and events: converted in Python (spanpack._extras) into plain
 * integer-keyed maps, written here with every str streamed. */

static int
v10_write_plain(SpanWriter *w, PyObject *obj, const char *field, int depth)
{
    if (depth > V10_PLAIN_NEST_LIMIT) {
        return span_error(w, PyExc_ValueError, field, NULL, "nested too deeply");
    }
    if (PyUnicode_CheckExact(obj)) {
        return v10_write_text(w, obj, field, NULL);
    }
    if (PyBool_Check(obj)) {
        return mp_write_byte(w->out, obj == Py_True ? 0xc3 : 0xc2);
    }
    if (PyLong_CheckExact(obj)) {
        uint64_t magnitude;
        int negative;
        if (pyint_magnitude64(obj, &magnitude, &negative) != 0 ||
            (negative && magnitude > (uint64_t)INT64_MAX + 1)) {
            return span_error(w, PyExc_ValueError, field, NULL, "%R does not fit in 64 bits", obj);
        }
        return negative ? mp_write_int(w->out, (int64_t)((uint64_t)0 - magnitude))
                        : mp_write_uint(w->out, magnitude);
    }
    if (PyFloat_CheckExact(obj)) {
        return mp_write_double(w->out, PyFloat_AS_DOUBLE(obj));
    }
    if (PyBytes_CheckExact(obj)) {
        return mp_write_bin(w->out, PyBytes_AS_STRING(obj), PyBytes_GET_SIZE(obj));
    }
    if (PyList_CheckExact(obj)) {
        Py_ssize_t count = PyList_GET_SIZE(obj);
        if (mp_write_array_header(w->out, count) < 0) {
            return -1;
        }
        for (Py_ssize_t i = 0; i < count; i++) {
            if (v10_write_plain(w, PyList_GET_ITEM(obj, i), field, depth + 1) < 0) {
                return -1;
            }
        }
        return 0;
    }
    if (PyDict_CheckExact(obj)) {
        Py_ssize_t pos = 0;
        PyObject *key, *value;
        if (mp_write_map_header(w->out, PyDict_GET_SIZE(obj)) < 0) {
            return -1;
        }
        while (PyDict_Next(obj, &pos, &key, &value)) {
            if (v10_write_plain(w, key, field, depth + 1) < 0 ||
                v10_write_plain(w, value, field, depth + 1) < 0) {
                return -1;
            }
        }
        return 0;
    }
    return span_error(w, PyExc_TypeError, field, NULL, "cannot write %.200s",
                      Py_TYPE(obj)->tp_name);
}

/* Convert links or events with `convert` and write them under `field_key`. */
static int
v10_write_converted(SpanWriter *w, int field_key, PyObject *convert, PyObject *items,
                    const char *field)
{
    span_hold_values(w); /* Python code runs */
    PyObject *converted = PyObject_CallOneArg(convert, items);
    if (converted == NULL) {
        return span_reraise(w, field, NULL);
    }
    int result = -1;
    if (!PyList_CheckExact(converted)) {
        span_error(w, PyExc_TypeError, field, NULL, "converter returned %.200s",
                   Py_TYPE(converted)->tp_name);
    }
    else if (mp_write_byte(w->out, (unsigned char)field_key) == 0) {
        result = v10_write_plain(w, converted, field, 0);
    }
    Py_DECREF(converted);
    return result;
}

/* ---------------------------------------------------------------------------
 * Tags moved out of the attributes */

/* Does `key` (any text) spell the ASCII `name` of `size` bytes? */
static inline int
key_is(PyObject *key, const char *name, Py_ssize_t size)
{
    if (PyUnicode_Check(key)) {
        return PyUnicode_IS_ASCII(key) && PyUnicode_GET_LENGTH(key) == size &&
               memcmp(PyUnicode_DATA(key), name, (size_t)size) == 0;
    }
    if (PyBytes_Check(key)) {
        return PyBytes_GET_SIZE(key) == size &&
               memcmp(PyBytes_AS_STRING(key), name, (size_t)size) == 0;
    }
    return 0;
}

#define KEY_IS(key, literal) key_is((key), literal, (Py_ssize_t)(sizeof literal - 1))

/* The bytes of a text value (str only when ASCII), or NULL. */
static const char *
ascii_text(PyObject *value, Py_ssize_t *size)
{
    if (PyUnicode_Check(value) && PyUnicode_IS_ASCII(value)) {
        *size = PyUnicode_GET_LENGTH(value);
        return PyUnicode_DATA(value);
    }
    if (PyBytes_Check(value)) {
        *size = PyBytes_GET_SIZE(value);
        return PyBytes_AS_STRING(value);
    }
    return NULL;
}

/* "-N" with N a decimal in [1, 2**32): the sampling mechanism N. */
static int
parse_decision_maker(PyObject *value, uint32_t *mechanism)
{
    Py_ssize_t size;
    const char *text = ascii_text(value, &size);
    if (text == NULL || size < 2 || size > 11 || text[0] != '-') {
        return 0;
    }
    uint64_t number = 0;
    for (Py_ssize_t i = 1; i < size; i++) {
        if (text[i] < '0' || text[i] > '9') {
            return 0;
        }
        number = number * 10 + (uint64_t)(text[i] - '0');
    }
    if (number == 0 || number > UINT32_MAX) {
        return 0;
    }
    *mechanism = (uint32_t)number;
    return 1;
}

/* 16 hex digits: the high half of a 128-bit trace id. */
static int
parse_trace_id_high(PyObject *value, uint64_t *high)
{
    Py_ssize_t size;
    const char *text = ascii_text(value, &size);
    if (text == NULL || size != 16) {
        return 0;
    }
    uint64_t number = 0;
    for (Py_ssize_t i = 0; i < size; i++) {
        char c = text[i];
        int digit = c >= '0' && c <= '9'   ? c - '0'
                    : c >= 'a' && c <= 'f' ? c - 'a' + 10
                    : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                           : -1;
        if (digit < 0) {
            return 0;
        }
        number = number << 4 | (uint64_t)digit;
    }
    *high = number;
    return 1;
}

static void
v10_moved_release(V10Writer *v10)
{
    if (v10->moved_meta + v10->moved_metrics == 0) {
        return; /* every slot is empty */
    }
    for (int i = 0; i < MOVED_COUNT; i++) {
        Py_CLEAR(v10->moved_key[i]);
        Py_CLEAR(v10->moved_value[i]);
    }
    v10->moved_meta = v10->moved_metrics = 0;
}

static void
v10_move(V10Writer *v10, MovedTag tag, PyObject *key, PyObject *value)
{
    if (v10->moved_key[tag] == NULL) {
        v10->moved_key[tag] = Py_NewRef(key);
        v10->moved_value[tag] = Py_NewRef(value);
        if (tag == MOVED_PRIORITY) {
            v10->moved_metrics++;
        }
        else {
            v10->moved_meta++;
        }
    }
}

/* Does this meta entry become a field?  Runs no Python code; only text
 * values move (any other value stays, to be refused or dropped as usual). */
static void
v10_scan_meta_entry(V10Writer *v10, PyObject *key, PyObject *value, int first_span)
{
    if (!is_text(value)) {
        return;
    }
    Py_ssize_t size = PyUnicode_Check(key) ? PyUnicode_GET_LENGTH(key)
                      : PyBytes_Check(key) ? PyBytes_GET_SIZE(key)
                                           : 0;
    switch (size) {
    case 3:
        if (KEY_IS(key, "env")) {
            v10_move(v10, MOVED_ENV, key, value);
        }
        break;
    case 7:
        if (KEY_IS(key, "version")) {
            v10_move(v10, MOVED_VERSION, key, value);
        }
        break;
    case 8:
        if (first_span && KEY_IS(key, "_dd.p.dm") && parse_decision_maker(value, &v10->mechanism)) {
            v10_move(v10, MOVED_DECISION_MAKER, key, value);
        }
        break;
    case 9:
        if (KEY_IS(key, "component")) {
            v10_move(v10, MOVED_COMPONENT, key, value);
        }
        else if (KEY_IS(key, "span.kind")) {
            v10_move(v10, MOVED_KIND, key, value);
        }
        else if (KEY_IS(key, TRACE_ID_HIGH_KEY)) {
            uint64_t high;
            if (first_span && v10->trace_id_high == 0 && parse_trace_id_high(value, &high)) {
                v10->trace_id_high = high;
            }
            v10_move(v10, MOVED_TRACE_ID_HIGH, key, value);
        }
        break;
    case 10:
        if (v10->origin != NULL && KEY_IS(key, ORIGIN_KEY)) {
            v10_move(v10, MOVED_ORIGIN, key, value);
        }
        break;
    default:
        break;
    }
}

/* Find the meta entries that become fields (read in place where possible:
 * nothing here runs Python code). */
static void
v10_scan_meta(V10Writer *v10, PyObject *meta, int first_span)
{
    DictEntries entries;
    if (pydict_entries(meta, &entries)) {
        PyObject *const *entry = entries.keys;
        for (Py_ssize_t i = 0; i < entries.count; i++, entry += entries.stride) {
            if (entry[1] != NULL) {
                v10_scan_meta_entry(v10, entry[0], entry[1], first_span);
            }
        }
        return;
    }
    Py_ssize_t pos = 0;
    PyObject *key, *value;
    while (PyDict_Next(meta, &pos, &key, &value)) {
        v10_scan_meta_entry(v10, key, value, first_span);
    }
}

/* The first span's sampling priority metric, when an int that fits in 32
 * bits, becomes the chunk's priority. */
static void
v10_scan_metrics(V10Writer *v10, PyObject *metrics)
{
    Py_ssize_t pos = 0;
    PyObject *key, *value;
    while (PyDict_Next(metrics, &pos, &key, &value)) {
        if (!KEY_IS(key, "_sampling_priority_v1") || !PyLong_CheckExact(value)) {
            continue;
        }
        int overflow;
        long number = PyLong_AsLongAndOverflow(value, &overflow);
        if (overflow == 0 && number >= INT32_MIN && number <= INT32_MAX) {
            v10->has_priority = 1;
            v10->priority = (int32_t)number;
            v10_move(v10, MOVED_PRIORITY, key, value);
        }
        return;
    }
}

static inline int
v10_is_moved(const V10Writer *v10, PyObject *key)
{
    for (int i = 0; i < MOVED_COUNT; i++) {
        if (v10->moved_key[i] == key) {
            return 1;
        }
    }
    return 0;
}

/* span.kind text as its OpenTelemetry number: anything unknown is internal. */
static uint32_t
span_kind_number(PyObject *value)
{
    static const char *const names[] = {"server", "client", "producer", "consumer"};
    Py_ssize_t size;
    const char *text = ascii_text(value, &size);
    if (text != NULL) {
        for (uint32_t i = 0; i < 4; i++) {
            if ((size_t)size == strlen(names[i]) && memcmp(text, names[i], (size_t)size) == 0) {
                return i + 2;
            }
        }
    }
    return V10_KIND_INTERNAL;
}

/* ---------------------------------------------------------------------------
 * Attributes: one array of (key, type, value) triplets */

static int
v10_write_meta_entry(SpanWriter *w, PyObject *key, PyObject *value)
{
    V10Writer *v10 = (V10Writer *)w;
    if (SP_UNLIKELY(v10->moved_meta > 0) && v10_is_moved(v10, key)) {
        return 0;
    }
    if (check_tag_key(w, "meta", key) < 0 || check_meta_value(w, key, value) < 0 ||
        v10_write_text(w, key, "meta", key) < 0 || mp_write_byte(w->out, V10_TYPE_STRING) < 0) {
        return -1;
    }
    return v10_write_text(w, value, "meta", key);
}

/* An int in the int64 range as an int64; a float, or an int in
 * [2**63, 2**64), as a double (the agent reads int attributes as int64). */
static int
v10_write_metric_entry(SpanWriter *w, PyObject *key, PyObject *value)
{
    V10Writer *v10 = (V10Writer *)w;
    if (SP_UNLIKELY(v10->moved_metrics > 0) && v10_is_moved(v10, key)) {
        return 0;
    }
    if (check_tag_key(w, "metrics", key) < 0 || v10_write_text(w, key, "metrics", key) < 0) {
        return -1;
    }
    if (PyFloat_Check(value)) {
        if (outbuf_reserve(w->out, 10) < 0) {
            return -1;
        }
        mp_put_byte(w->out, V10_TYPE_DOUBLE);
        mp_put_double(w->out, PyFloat_AS_DOUBLE(value));
        return 0;
    }
    if (!PyLong_Check(value)) {
        return span_error(w, PyExc_TypeError, "metrics", key,
                          "values must be int or float, not %.200s", Py_TYPE(value)->tp_name);
    }
    uint64_t magnitude;
    int negative;
    if (pyint_magnitude64(value, &magnitude, &negative) != 0 ||
        (negative && magnitude > (uint64_t)INT64_MAX + 1)) {
        return span_error(w, PyExc_ValueError, "metrics", key, "%R does not fit in 64 bits", value);
    }
    if (outbuf_reserve(w->out, 10) < 0) {
        return -1;
    }
    if (negative) {
        mp_put_byte(w->out, V10_TYPE_INT);
        mp_put_int(w->out, (int64_t)((uint64_t)0 - magnitude));
    }
    else if (magnitude <= (uint64_t)INT64_MAX) {
        mp_put_byte(w->out, V10_TYPE_INT);
        mp_put_uint(w->out, magnitude);
    }
    else {
        mp_put_byte(w->out, V10_TYPE_DOUBLE);
        mp_put_double(w->out, (double)magnitude);
    }
    return 0;
}

/* meta_struct: each value a msgpack document of its own, as bytes. */
static int
v10_write_meta_struct_entry(SpanWriter *w, PyObject *key, PyObject *value)
{
    if (check_tag_key(w, "meta_struct", key) < 0 ||
        v10_write_text(w, key, "meta_struct", key) < 0 ||
        mp_write_byte(w->out, V10_TYPE_BYTES) < 0) {
        return -1;
    }
    OutBuf document;
    if (outbuf_init_raw(&document, 256) < 0) {
        return -1;
    }
    int result = pack_object(&w->value_options, &document, value, PACK_NEST_LIMIT);
    if (result < 0) {
        span_reraise(w, "meta_struct", key);
    }
    else {
        result = mp_write_bin(w->out, document.start, outbuf_len(&document));
    }
    outbuf_free(&document);
    return result;
}

/* The array header of `count` triplets; in lenient mode (entries may be
 * dropped) a 5-byte placeholder that v10_attributes_end rewrites. */
static int
v10_attributes_begin(SpanWriter *w, Py_ssize_t count, Py_ssize_t *header_pos)
{
    *header_pos = outbuf_len(w->out);
    if (count * 3 > MP_ITEM_LIMIT) {
        return span_error(w, PyExc_ValueError, "meta", NULL, "too many attributes");
    }
    if (outbuf_reserve(w->out, 5) < 0) {
        return -1;
    }
    if (!w->lenient) {
        mp_put_array_header(w->out, (uint32_t)(count * 3));
        return 0;
    }
    w->out->pos[0] = (char)0xdd;
    w->out->pos += 5;
    return 0;
}

static void
v10_attributes_end(SpanWriter *w, Py_ssize_t header_pos, Py_ssize_t count)
{
    if (!w->lenient) {
        return;
    }
    char header[5];
    OutBuf scratch = {header, header, header + sizeof header, NULL};
    mp_put_array_header(&scratch, (uint32_t)(count * 3));
    Py_ssize_t header_size = outbuf_len(&scratch);
    Py_ssize_t shift = 5 - header_size;
    char *start = w->out->start + header_pos;
    memcpy(start, header, (size_t)header_size);
    if (shift == 0) {
        return;
    }
    memmove(start + header_size, start + 5, (size_t)(outbuf_len(w->out) - header_pos - 5));
    w->out->pos -= shift;
    if (w->holes != NULL) {
        for (Py_ssize_t i = w->holes->count - 1; i >= 0 && w->holes->items[i].offset > header_pos;
             i--) {
            w->holes->items[i].offset -= shift;
        }
    }
}

static Py_ssize_t
dict_size(PyObject *dict)
{
    return dict != NULL && dict != Py_None ? PyDict_GET_SIZE(dict) : 0;
}

static int
v10_write_attributes(V10Writer *v10, PyObject *meta, PyObject *metrics, PyObject *meta_struct,
                     Py_ssize_t count)
{
    SpanWriter *w = &v10->base;
    Py_ssize_t header_pos, meta_written, metrics_written, struct_written;
    if (mp_write_byte(w->out, V10_SPAN_ATTRIBUTES) < 0 ||
        v10_attributes_begin(w, count, &header_pos) < 0 ||
        write_dict_entries(w, meta, "meta", v10_write_meta_entry, 0, &meta_written) < 0 ||
        write_dict_entries(w, metrics, "metrics", v10_write_metric_entry, 0, &metrics_written) <
            0 ||
        write_dict_entries(w, meta_struct, "meta_struct", v10_write_meta_struct_entry, 1,
                           &struct_written) < 0) {
        return -1;
    }
    v10_attributes_end(w, header_pos,
                       meta_written + metrics_written + struct_written - v10->moved_meta -
                           v10->moved_metrics);
    return 0;
}

/* ---------------------------------------------------------------------------
 * Spans and chunks */

static int
v10_write_span(SpanWriter *w, PyObject *span, TraceInfo *info)
{
    V10Writer *v10 = (V10Writer *)w;
    SpanValues v;
    int result = -1;

    if (span_values_read(w, span, info, &v) < 0) {
        return span_reraise(w, v.failed >= 0 ? span_field_names[v.failed] : "span", NULL);
    }
    PyObject *parent = v.value[SF_PARENT_ID], *duration_obj = v.value[SF_DURATION];
    PyObject *meta = v.value[SF_META], *metrics = v.value[SF_METRICS];
    PyObject *meta_struct = v.value[SF_META_STRUCT];
    PyObject *service = v.value[SF_SERVICE], *name = v.value[SF_NAME];
    PyObject *resource = v.value[SF_RESOURCE], *span_type = v.value[SF_SPAN_TYPE];
    uint64_t span_id = 0, parent_id = 0, start = 0, duration = 0;
    int error_flag = 0;

    if (check_required_fields(w, &v) < 0 ||
        span_uint64(w, v.value[SF_SPAN_ID], "span_id", &span_id) < 0 ||
        (parent != NULL && parent != Py_None &&
         span_uint64(w, parent, "parent_id", &parent_id) < 0) ||
        span_uint64(w, v.value[SF_START], "start_ns", &start) < 0 ||
        (duration_obj != NULL && duration_obj != Py_None &&
         span_uint64(w, duration_obj, "duration_ns", &duration) < 0) ||
        span_error_flag(w, v.value[SF_ERROR], &error_flag) < 0 ||
        check_dict_field(w, meta, "meta") < 0 || check_dict_field(w, metrics, "metrics") < 0 ||
        check_dict_field(w, meta_struct, "meta_struct") < 0) {
        goto error;
    }
    Py_ssize_t links_count = field_length(w, v.value[SF_LINKS], "links");
    Py_ssize_t events_count = field_length(w, v.value[SF_EVENTS], "events");
    if (links_count < 0 || events_count < 0) {
        goto error;
    }
    int first_span = w->span_index == 0;
    if (dict_size(meta) > 0) {
        v10_scan_meta(v10, meta, first_span);
    }
    if (first_span && dict_size(metrics) > 0) {
        v10_scan_metrics(v10, metrics);
    }
    Py_ssize_t attributes = dict_size(meta) + dict_size(metrics) + dict_size(meta_struct) -
                            v10->moved_meta - v10->moved_metrics;
    int has_duration = duration_obj != NULL && duration_obj != Py_None;
    int has = (service != NULL && service != Py_None) + (name != NULL && name != Py_None) +
              (resource != NULL && resource != Py_None) +
              (span_type != NULL && span_type != Py_None);
    uint32_t fields =
        2 /* span_id, start */ + (uint32_t)has + (parent_id != 0) + has_duration + error_flag +
        (attributes > 0) + (links_count > 0) + (events_count > 0) +
        (v10->moved_key[MOVED_ENV] != NULL) + (v10->moved_key[MOVED_VERSION] != NULL) +
        (v10->moved_key[MOVED_COMPONENT] != NULL) + (v10->moved_key[MOVED_KIND] != NULL);
    if (mp_write_map_header(w->out, fields) < 0 ||
        (service != NULL && service != Py_None &&
         v10_write_text_field(w, V10_SPAN_SERVICE, service, "service") < 0) ||
        (name != NULL && name != Py_None &&
         v10_write_text_field(w, V10_SPAN_NAME, name, "name") < 0) ||
        (resource != NULL && resource != Py_None &&
         v10_write_text_field(w, V10_SPAN_RESOURCE, resource, "resource") < 0) ||
        outbuf_reserve(w->out, 4 * 10 + 2) < 0) {
        goto error;
    }
    mp_put_byte(w->out, V10_SPAN_SPAN_ID);
    mp_put_uint(w->out, span_id);
    if (parent_id != 0) {
        mp_put_byte(w->out, V10_SPAN_PARENT_ID);
        mp_put_uint(w->out, parent_id);
    }
    mp_put_byte(w->out, V10_SPAN_START);
    mp_put_uint(w->out, start);
    if (has_duration) {
        mp_put_byte(w->out, V10_SPAN_DURATION);
        mp_put_uint(w->out, duration);
    }
    if (error_flag) {
        mp_put_byte(w->out, V10_SPAN_ERROR);
        mp_put_byte(w->out, 0xc3);
    }
    if ((attributes > 0) && v10_write_attributes(v10, meta, metrics, meta_struct, attributes) < 0) {
        goto error;
    }
    if (span_type != NULL && span_type != Py_None &&
        v10_write_text_field(w, V10_SPAN_TYPE, span_type, "span_type") < 0) {
        goto error;
    }
    if (links_count > 0 && v10_write_converted(w, V10_SPAN_LINKS, w->state->links_for_v10,
                                               v.value[SF_LINKS], "links") < 0) {
        goto error;
    }
    if (events_count > 0 && v10_write_converted(w, V10_SPAN_EVENTS, w->state->events_for_v10,
                                                v.value[SF_EVENTS], "events") < 0) {
        goto error;
    }
    if ((v10->moved_key[MOVED_ENV] != NULL &&
         v10_write_text_field(w, V10_SPAN_ENV, v10->moved_value[MOVED_ENV], "meta") < 0) ||
        (v10->moved_key[MOVED_VERSION] != NULL &&
         v10_write_text_field(w, V10_SPAN_VERSION, v10->moved_value[MOVED_VERSION], "meta") < 0) ||
        (v10->moved_key[MOVED_COMPONENT] != NULL &&
         v10_write_text_field(w, V10_SPAN_COMPONENT, v10->moved_value[MOVED_COMPONENT], "meta") <
             0)) {
        goto error;
    }
    /* A span.kind tag: its OTel number (no tag: no kind, OTel's unspecified). */
    if (v10->moved_key[MOVED_KIND] != NULL) {
        if (outbuf_reserve(w->out, 2) < 0) {
            goto error;
        }
        mp_put_byte(w->out, V10_SPAN_KIND);
        mp_put_uint(w->out, span_kind_number(v10->moved_value[MOVED_KIND]));
    }
    result = 0;
error:
    v10_moved_release(v10);
    span_values_release(w, &v);
    return result;
}

static int
v10_start_chunk(SpanWriter *w, TraceInfo *info)
{
    V10Writer *v10 = (V10Writer *)w;
    v10->has_trace_id = 1;
    v10->trace_id_high = info->trace_id_high;
    v10->trace_id_low = info->trace_id_low;
    v10->origin = info->origin != NULL ? Py_NewRef(info->origin) : NULL;
    return 0;
}

/* The chunk's fields after its spans (what the first span says is known
 * then); the map header in front is patched to their count. */
static int
v10_write_chunk_fields(V10Writer *v10, Py_ssize_t header_pos)
{
    SpanWriter *w = &v10->base;
    unsigned int count = 1; /* spans */
    if (v10->has_trace_id) {
        char id[V10_TRACE_ID_SIZE];
        mp_store64(id, v10->trace_id_high);
        mp_store64(id + 8, v10->trace_id_low);
        if (mp_write_byte(w->out, V10_CHUNK_TRACE_ID) < 0 ||
            mp_write_bin(w->out, id, V10_TRACE_ID_SIZE) < 0) {
            return -1;
        }
        count++;
    }
    if (v10->origin != NULL && PyUnicode_GET_LENGTH(v10->origin) > 0) {
        if (mp_write_byte(w->out, V10_CHUNK_ORIGIN) < 0 ||
            v10_write_text(w, v10->origin, "origin", NULL) < 0) {
            return -1;
        }
        count++;
    }
    if (outbuf_reserve(w->out, 2 * 10) < 0) {
        return -1;
    }
    if (v10->has_priority) {
        mp_put_byte(w->out, V10_CHUNK_PRIORITY);
        mp_put_int(w->out, v10->priority);
        count++;
    }
    if (v10->mechanism != 0) {
        mp_put_byte(w->out, V10_CHUNK_MECHANISM);
        mp_put_uint(w->out, v10->mechanism);
        count++;
    }
    w->out->start[header_pos] = (char)(0x80 | count);
    return 0;
}

int
v10_write_trace(SpanWriter *w, PyObject *trace)
{
    V10Writer v10;
    memset(&v10, 0, sizeof v10);
    v10.base = *w;
    Py_ssize_t header_pos = outbuf_len(w->out);
    int result = -1;
    /* The map header (at most 5 entries: a fixmap) is patched at the end. */
    if (mp_write_byte(w->out, 0x80) < 0 || mp_write_byte(w->out, V10_CHUNK_SPANS) < 0 ||
        write_trace(&v10.base, trace, v10_start_chunk, v10_write_span) < 0 ||
        v10_write_chunk_fields(&v10, header_pos) < 0) {
        goto error;
    }
    result = 0;
error:
    *w = v10.base; /* counters and buffers the trace's writing updated */
    Py_XDECREF(v10.origin);
    v10_moved_release(&v10);
    return result;
}
