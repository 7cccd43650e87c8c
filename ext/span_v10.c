/* /v1.0/traces: one trace as a chunk map, its spans as integer-keyed maps and
 * every string streamed (see v10.h and docs/wire-format-v1.md). */
#include "compat.h" /* Python.h before any system header */

#include <float.h>

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

/* The tags that leave a span's attributes, found while they are written
 * (one pass over meta): the span's env, version, component and kind;
 * `_dd.p.tid` (the chunk carries the whole trace id); `_dd.origin` when the
 * trace has an origin (which takes its place, as in v0.4); and on the first
 * span the decision maker and the sampling priority, which become chunk
 * fields.  A tag moves once per span: a second key of the same text (str
 * and bytes) stays an attribute. */
typedef enum {
    MOVED_ENV,
    MOVED_VERSION,
    MOVED_COMPONENT,
    MOVED_KIND,
    MOVED_TRACE_ID_HIGH,
    MOVED_ORIGIN,
    MOVED_DECISION_MAKER,
    MOVED_PRIORITY,
} MovedTag;

/* The tags whose text becomes a span field: env, version, component (the
 * first MovedTags). */
#define V10_SPAN_FIELD_TAGS (MOVED_COMPONENT + 1)

typedef struct {
    SpanWriter base; /* first: the write_trace callbacks get &base */
    /* The chunk's fields, written after its spans. */
    uint64_t trace_id_high;
    uint64_t trace_id_low;
    PyObject *origin; /* new reference (exact str), or NULL */
    int has_priority;
    int priority_seen; /* the first span's priority metric was looked at */
    int32_t priority;
    uint32_t mechanism; /* 0: none */
    /* The current span's moved tags: a bit per MovedTag, how many entries
     * left the attributes, the text of env, version and component (new
     * references: Python code may run before they are written, converting
     * links or packing meta_struct, and change the meta dict) and the kind
     * (0: no span.kind tag). */
    unsigned int moved;
    Py_ssize_t moved_count;
    PyObject *field_tag[V10_SPAN_FIELD_TAGS];
    /* The key of each field tag whose value may yet prove bad text (not an
     * exact ASCII str): named in its error, or its drop (lenient); new
     * references, or NULL. */
    PyObject *field_tag_key[V10_SPAN_FIELD_TAGS];
    /* A `_dd.origin` tag that gave way to the trace's origin but may yet
     * prove bad text, and its key (new references, or NULL). */
    PyObject *origin_tag;
    PyObject *origin_tag_key;
    int has_text_to_check; /* any of the above is set */
    uint32_t kind;
    /* Per trace: the first key object found to name each tag (new
     * references).  Tags that move are never streamed, so their keys miss
     * the string table; spans share their key objects (constants), so later
     * spans know them by address. */
    PyObject *tag_key[MOVED_PRIORITY];
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

/* `str` (an exact str of at most MAX_TEXT_LEN code points, with its hash)
 * is not in the table: written as a hole in a part; in a payload as the str
 * itself, taking the next id. */
static SP_NOINLINE int
v10_write_unseen_str(SpanWriter *w, PyObject *str, Py_hash_t hash, const char *field, PyObject *key)
{
    uint32_t index;
    /* Checked to be UTF-8 (lone surrogates are not).  An ASCII str is its
     * own UTF-8, read in place: span_utf8 would first own the span's
     * borrowed values (its error is an exception object). */
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
        if (strtable_append(w->strings, str, hash, &index) < 0) {
            return -1;
        }
        return v10_write_id(w, index);
    }
    Py_ssize_t before = outbuf_len(w->out);
    if (mp_write_str(w->out, utf8, size, 1) < 0) {
        return -1;
    }
    if (strtable_append(w->strings, str, hash, &index) < 0) {
        outbuf_truncate(w->out, before);
        return -1;
    }
    return 0;
}

/* `str`: an exact str of at most MAX_TEXT_LEN code points.  Its id when
 * streamed before, else as v10_write_unseen_str. */
static int
v10_write_new_str(SpanWriter *w, PyObject *str, const char *field, PyObject *key)
{
    uint32_t index;
    Py_hash_t hash = strtable_str_hash(w->strings, str);
    if (strtable_find(w->strings, str, hash, &index)) {
        return v10_write_id(w, index); /* equal text seen before */
    }
    return v10_write_unseen_str(w, str, hash, field, key);
}

/* Any other text (long, bytes, subclasses): its prepared (truncated) form,
 * keyed as str so that equal text never streams twice. */
static SP_NOINLINE int
v10_write_text_slow(SpanWriter *w, PyObject *value, const char *field, PyObject *key)
{
    if (PyUnicode_CheckExact(value) && SP_UNICODE_IS_READY(value) &&
        PyUnicode_GET_LENGTH(value) <= MAX_TEXT_LEN) {
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

/* Text not found in the table by `hash` (-1: not looked up, as it is no
 * exact str of at most MAX_TEXT_LEN code points): such a str is written as
 * new without a second lookup, anything else as v10_write_text_slow. */
static SP_ALWAYS_INLINE int
v10_write_text_not_found(SpanWriter *w, PyObject *value, Py_hash_t hash, const char *field,
                         PyObject *key)
{
    if (hash != -1) {
        return v10_write_unseen_str(w, value, hash, field, key);
    }
    return v10_write_text_slow(w, value, field, key);
}

/* Text (str, bytes, bytearray; None as ""), streamed. */
static SP_ALWAYS_INLINE int
v10_write_text(SpanWriter *w, PyObject *value, const char *field, PyObject *key)
{
    uint32_t index;
    /* Most text is a short str streamed before. */
    Py_hash_t hash;
    if (SP_LIKELY(strtable_find_text(w->strings, value, MAX_TEXT_LEN, &hash, &index))) {
        return v10_write_id(w, index);
    }
    return v10_write_text_not_found(w, value, hash, field, key);
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

/* A span field taken from the meta entry `key`: errors name the key. */
static int
v10_write_text_field_of(SpanWriter *w, int field_key, PyObject *value, PyObject *key)
{
    if (mp_write_byte(w->out, (unsigned char)field_key) < 0) {
        return -1;
    }
    return v10_write_text(w, value, "meta", key);
}

/* ---------------------------------------------------------------------------
 * Links and events: converted in Python (spanpack._extras) into plain
 * integer-keyed maps, written here with every str streamed. */

/* An int (exact or a subclass) within int64 or uint64. */
static inline int
v10_write_plain_int(SpanWriter *w, PyObject *obj, const char *field)
{
    uint64_t magnitude;
    int negative;
    if (pyint_magnitude64(&w->state->fast_paths, obj, &magnitude, &negative) != 0 ||
        (negative && magnitude > (uint64_t)INT64_MAX + 1)) {
        return span_error(w, PyExc_ValueError, field, NULL, "%R does not fit in 64 bits", obj);
    }
    return negative ? mp_write_int(w->out, (int64_t)((uint64_t)0 - magnitude))
                    : mp_write_uint(w->out, magnitude);
}

/* Subclasses of str, int and float (a StrEnum, an IntEnum, numpy.float64)
 * as their base values, as v0.4 and v0.5 write them; anything else is
 * refused.  (Tested after the exact types: a subtype test walks the MRO.) */
static SP_NOINLINE int
v10_write_plain_subclass(SpanWriter *w, PyObject *obj, const char *field)
{
    if (PyUnicode_Check(obj)) {
        return v10_write_text(w, obj, field, NULL);
    }
    if (PyLong_Check(obj)) {
        return v10_write_plain_int(w, obj, field);
    }
    if (PyFloat_Check(obj)) {
        return mp_write_double(w->out, PyFloat_AS_DOUBLE(obj));
    }
    return span_error(w, PyExc_TypeError, field, NULL, "cannot write %.200s",
                      Py_TYPE(obj)->tp_name);
}

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
        return v10_write_plain_int(w, obj, field);
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
    return v10_write_plain_subclass(w, obj, field);
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

/* "-N" with N a decimal in [1, 2**32) without leading zeros (the text the
 * agent rebuilds from the number): the sampling mechanism N. */
static int
parse_decision_maker(PyObject *value, uint32_t *mechanism)
{
    Py_ssize_t size;
    const char *text = ascii_text(value, &size);
    if (text == NULL || size < 2 || size > 11 || text[0] != '-' || text[1] == '0') {
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

/* 16 lowercase hex digits (the form tracers write): the high half of a
 * 128-bit trace id. */
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
        int digit = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        if (digit < 0) {
            return 0;
        }
        number = number << 4 | (uint64_t)digit;
    }
    *high = number;
    return 1;
}

/* The 8 lowercase hex digits of `value`, as a uint64 whose big-endian bytes
 * are the text (nibbles spread one to a byte, then each made its digit). */
static inline uint64_t
hex8_of(uint32_t value)
{
    uint64_t x = value;
    x = ((x & 0xFFFF0000u) << 16) | (x & 0xFFFFu);
    x = ((x & UINT64_C(0x0000FF000000FF00)) << 8) | (x & UINT64_C(0x000000FF000000FF));
    x = ((x & UINT64_C(0x00F000F000F000F0)) << 4) | (x & UINT64_C(0x000F000F000F000F));
    uint64_t above_nine = ((x + UINT64_C(0x0606060606060606)) >> 4) & UINT64_C(0x0101010101010101);
    return x + UINT64_C(0x3030303030303030) + above_nine * ('a' - '0' - 10);
}

/* Is `value` the 16 lowercase hex digits of `high`? */
static int
text_is_hex_of(PyObject *value, uint64_t high)
{
    Py_ssize_t size;
    const char *text = ascii_text(value, &size);
    char expected[16];
    if (text == NULL || size != 16) {
        return 0;
    }
    mp_store64(expected, hex8_of((uint32_t)(high >> 32)));
    mp_store64(expected + 8, hex8_of((uint32_t)high));
    return memcmp(text, expected, sizeof expected) == 0;
}

static void
v10_moved_release(V10Writer *v10)
{
    if (v10->moved == 0) {
        return;
    }
    for (int i = 0; i < V10_SPAN_FIELD_TAGS; i++) {
        Py_CLEAR(v10->field_tag[i]);
    }
    if (SP_UNLIKELY(v10->has_text_to_check)) {
        for (int i = 0; i < V10_SPAN_FIELD_TAGS; i++) {
            Py_CLEAR(v10->field_tag_key[i]);
        }
        Py_CLEAR(v10->origin_tag);
        Py_CLEAR(v10->origin_tag_key);
        v10->has_text_to_check = 0;
    }
    v10->moved = 0;
    v10->moved_count = 0;
    v10->kind = 0;
}

static uint32_t span_kind_number(const char *text, Py_ssize_t size);

/* The tag a meta key's text names (`size` bytes), or -1. */
static int
v10_meta_tag_of(const char *name, Py_ssize_t size)
{
    switch (size) {
    case 3:
        return memcmp(name, "env", 3) == 0 ? MOVED_ENV : -1;
    case 7:
        return memcmp(name, "version", 7) == 0 ? MOVED_VERSION : -1;
    case 8:
        return memcmp(name, "_dd.p.dm", 8) == 0 ? MOVED_DECISION_MAKER : -1;
    case 9:
        return memcmp(name, "component", 9) == 0         ? MOVED_COMPONENT
               : memcmp(name, "span.kind", 9) == 0       ? MOVED_KIND
               : memcmp(name, TRACE_ID_HIGH_KEY, 9) == 0 ? MOVED_TRACE_ID_HIGH
                                                         : -1;
    case 10:
        return memcmp(name, ORIGIN_KEY, 10) == 0 ? MOVED_ORIGIN : -1;
    default:
        return -1;
    }
}

/* The tag a meta key names (ASCII str or bytes), or -1. */
static int
v10_meta_key_tag(PyObject *key)
{
    Py_ssize_t size;
    const char *name = ascii_text(key, &size);
    return name != NULL ? v10_meta_tag_of(name, size) : -1;
}

/* A meta entry whose key names `tag`: taken out of the attributes (1) when
 * its value makes it a field.  Runs no Python code; only text values move
 * (any other value stays, to be refused or dropped as usual). */
static inline int
v10_take_meta_tag(V10Writer *v10, int tag, PyObject *key, PyObject *value)
{
    int first_span = v10->base.span_index == 0;
    Py_ssize_t size;
    const char *text;
    uint64_t high;
    if (!is_text(value) || (v10->moved & (1u << tag))) {
        return 0;
    }
    switch (tag) {
    case MOVED_ENV:
    case MOVED_VERSION:
    case MOVED_COMPONENT:
        /* An empty value stays an attribute: the field would read as none.
         * Text other than an exact ASCII str is checked when written. */
        if (SP_LIKELY(PyUnicode_CheckExact(value) && PyUnicode_IS_ASCII(value))) {
            if (PyUnicode_GET_LENGTH(value) == 0) {
                return 0;
            }
        }
        else {
            if ((PyUnicode_Check(value) ? PyUnicode_GET_LENGTH(value) : Py_SIZE(value)) == 0) {
                return 0;
            }
            v10->field_tag_key[tag] = Py_NewRef(key);
            v10->has_text_to_check = 1;
        }
        v10->field_tag[tag] = Py_NewRef(value);
        break;
    case MOVED_KIND:
        /* Text outside the five kinds stays an attribute (no field). */
        text = ascii_text(value, &size);
        if (text == NULL || (v10->kind = span_kind_number(text, size)) == 0) {
            return 0;
        }
        break;
    case MOVED_TRACE_ID_HIGH:
        /* The tag leaves only when the chunk's trace id says the same: 16
         * lowercase hex digits, not all zero, on the first span, that give
         * the high half (a 64-bit trace id) or equal it.  Any other text
         * stays an attribute, as v0.4 keeps it. */
        if (!first_span) {
            return 0; /* a later span's tag is its own, as in v0.4 */
        }
        if (v10->trace_id_high != 0) {
            if (!text_is_hex_of(value, v10->trace_id_high)) {
                return 0;
            }
        }
        else if (parse_trace_id_high(value, &high) && high != 0) {
            v10->trace_id_high = high;
        }
        else {
            return 0;
        }
        break;
    case MOVED_ORIGIN:
        /* Gives way to the trace's origin, as v0.4's second `_dd.origin`
         * entry overrides it; text that may be bad is checked when the span
         * ends (v10_check_origin_tag), as v0.4 writes it. */
        if (v10->origin == NULL) {
            return 0;
        }
        if (!PyUnicode_CheckExact(value) || !PyUnicode_IS_ASCII(value)) {
            v10->origin_tag = Py_NewRef(value);
            v10->origin_tag_key = Py_NewRef(key);
            v10->has_text_to_check = 1;
        }
        break;
    case MOVED_DECISION_MAKER:
        if (!first_span || !parse_decision_maker(value, &v10->mechanism)) {
            return 0;
        }
        break;
    default:
        return 0;
    }
    v10->moved |= 1u << tag;
    v10->moved_count++;
    return 1;
}

/* The first span's sampling priority metric, when an int that fits in 32
 * bits, becomes the chunk's priority (only the first key of that text is
 * looked at).  1: taken out of the attributes. */
static SP_NOINLINE int
v10_take_priority(V10Writer *v10, PyObject *key, PyObject *value)
{
    if (!KEY_IS(key, "_sampling_priority_v1")) {
        return 0;
    }
    v10->priority_seen = 1;
    if (!PyLong_CheckExact(value)) {
        return 0;
    }
    int overflow;
    long number = PyLong_AsLongAndOverflow(value, &overflow); /* an exact int: no error */
    if (overflow != 0 || number < INT32_MIN || number > INT32_MAX) {
        return 0;
    }
    v10->has_priority = 1;
    v10->priority = (int32_t)number;
    v10->moved |= 1u << MOVED_PRIORITY;
    v10->moved_count++;
    return 1;
}

/* span.kind text as its OpenTelemetry number, or 0 for any other text. */
static uint32_t
span_kind_number(const char *text, Py_ssize_t size)
{
    switch (size) {
    case 6:
        return memcmp(text, "server", 6) == 0 ? 2 : memcmp(text, "client", 6) == 0 ? 3 : 0;
    case 8:
        return memcmp(text, "producer", 8) == 0   ? 4
               : memcmp(text, "consumer", 8) == 0 ? 5
               : memcmp(text, "internal", 8) == 0 ? V10_KIND_INTERNAL
                                                  : 0;
    default:
        return 0;
    }
}

/* ---------------------------------------------------------------------------
 * Attributes: one array of (key, type, value) triplets */

/* The tag `key` was found to name earlier in this trace, or -1. */
static inline int
v10_known_tag_key(const V10Writer *v10, PyObject *key)
{
    for (int tag = 0; tag < MOVED_PRIORITY; tag++) {
        if (v10->tag_key[tag] == key) {
            return tag;
        }
    }
    return -1;
}

/* What a table entry's text means as a meta key (the table's marks). */
enum { V10_MARK_UNKNOWN = 0, V10_MARK_PLAIN = 1, V10_MARK_TAG = 2 /* + the MovedTag */ };

static int
v10_write_meta_entry(SpanWriter *w, PyObject *key, PyObject *value)
{
    V10Writer *v10 = (V10Writer *)w;
    StringTable *table = w->strings;
    uint32_t index;
    int tag;
    /* -1: not an exact str of at most MAX_TEXT_LEN code points, so not
     * looked up by its text. */
    Py_hash_t hash;
    /* Most keys are a str streamed before: its entry's mark says whether it
     * names a tag that may become a field (its text is read once per entry). */
    if (SP_LIKELY(strtable_find_text(table, key, MAX_TEXT_LEN, &hash, &index))) {
        unsigned int mark = table->marks[index]; /* v1.0 tables have marks */
        if (SP_UNLIKELY(mark != V10_MARK_PLAIN)) {
            if (mark == V10_MARK_UNKNOWN) {
                tag = v10_meta_key_tag(key);
                mark = tag < 0 ? V10_MARK_PLAIN : V10_MARK_TAG + (unsigned int)tag;
                table->marks[index] = (unsigned char)mark;
            }
            if (mark != V10_MARK_PLAIN &&
                v10_take_meta_tag(v10, (int)(mark - V10_MARK_TAG), key, value)) {
                return 0;
            }
        }
        if (check_tag_key(w, "meta", key) < 0 || check_meta_value(w, key, value) < 0 ||
            v10_write_id(w, index) < 0 || mp_write_byte(w->out, V10_TYPE_STRING) < 0) {
            return -1;
        }
        return v10_write_text(w, value, "meta", key);
    }
    /* A key not in the table: a tag that moves (never streamed), or new. */
    tag = v10_known_tag_key(v10, key);
    if (tag < 0 && (tag = v10_meta_key_tag(key)) >= 0 && v10->tag_key[tag] == NULL) {
        v10->tag_key[tag] = Py_NewRef(key); /* the first such object only: none is released */
    }
    if (tag >= 0 && v10_take_meta_tag(v10, tag, key, value)) {
        return 0;
    }
    if (check_tag_key(w, "meta", key) < 0 || check_meta_value(w, key, value) < 0) {
        return -1;
    }
    /* Looked up above: keys built per span, every key of a put() trace's
     * own table. */
    if (v10_write_text_not_found(w, key, hash, "meta", key) < 0 ||
        mp_write_byte(w->out, V10_TYPE_STRING) < 0) {
        return -1;
    }
    return v10_write_text(w, value, "meta", key);
}

/* The low bits of a double's 52-bit significand that a float's 23 bits
 * lack: set in most doubles (measured values), which a float32 cannot hold. */
#define V10_DOUBLE_ONLY_BITS ((UINT64_C(1) << 29) - 1)

/* A double attribute value, after its type byte: a float32 when that holds
 * it exactly (1.0, 0.25, small integers: 5 bytes, not 9), which the agent
 * widens back to the same double.  The significand test rejects most values
 * at once; the range test comes before the conversion, which is undefined
 * for a finite double beyond float's range (NaN fails it and stays a
 * float64). */
static inline void
v10_put_double(OutBuf *out, double value)
{
    float single;
    uint64_t bits;
    memcpy(&bits, &value, sizeof bits);
    if ((bits & V10_DOUBLE_ONLY_BITS) == 0 && value >= -FLT_MAX && value <= FLT_MAX &&
        (double)(single = (float)value) == value) {
        mp_put_float(out, single);
    }
    else {
        mp_put_double(out, value);
    }
}

/* An int in the int64 range as an int64; a float, or an int in
 * [2**63, 2**64), as a double (the agent reads int attributes as int64). */
static int
v10_write_metric_entry(SpanWriter *w, PyObject *key, PyObject *value)
{
    V10Writer *v10 = (V10Writer *)w;
    if (SP_UNLIKELY(w->span_index == 0) && !v10->priority_seen &&
        v10_take_priority(v10, key, value)) {
        return 0;
    }
    if (check_tag_key(w, "metrics", key) < 0 || v10_write_text(w, key, "metrics", key) < 0) {
        return -1;
    }
    /* An exact float, else an int (a flags test), before PyFloat_Check (a
     * subtype walk for every int); no type is both. */
    if (PyFloat_CheckExact(value) || (!PyLong_Check(value) && PyFloat_Check(value))) {
        if (outbuf_reserve(w->out, 10) < 0) {
            return -1;
        }
        mp_put_byte(w->out, V10_TYPE_DOUBLE);
        v10_put_double(w->out, PyFloat_AS_DOUBLE(value));
        return 0;
    }
    if (!PyLong_Check(value)) {
        return span_error(w, PyExc_TypeError, "metrics", key,
                          "values must be int or float, not %.200s", Py_TYPE(value)->tp_name);
    }
    uint64_t magnitude;
    int negative;
    if (pyint_magnitude64(&w->state->fast_paths, value, &magnitude, &negative) != 0 ||
        (negative && magnitude > (uint64_t)INT64_MAX + 1)) {
        return raise_metric_out_of_range(w, key, value);
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
        v10_put_double(w->out, (double)magnitude);
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
    return meta_struct_document(w, key, value, 1);
}

static Py_ssize_t
dict_size(PyObject *dict)
{
    return dict != NULL && dict != Py_None ? PyDict_GET_SIZE(dict) : 0;
}

/* Replace the `old_size`-byte header at `pos` by `size` bytes of `header`,
 * moving what follows (and the holes in it) when the sizes differ. */
static int
v10_replace_header(SpanWriter *w, Py_ssize_t pos, Py_ssize_t old_size, const char *header,
                   Py_ssize_t size)
{
    Py_ssize_t shift = size - old_size;
    if (shift > 0 && outbuf_reserve(w->out, shift) < 0) {
        return -1;
    }
    char *start = w->out->start + pos; /* after the reserve: it may move the buffer */
    if (shift != 0) {
        memmove(start + size, start + old_size, (size_t)(outbuf_len(w->out) - pos - old_size));
        w->out->pos += shift;
        if (w->holes != NULL) {
            for (Py_ssize_t i = w->holes->count - 1; i >= 0 && w->holes->items[i].offset > pos;
                 i--) {
                w->holes->items[i].offset += shift;
            }
        }
    }
    memcpy(start, header, (size_t)size);
    return 0;
}

/* The attributes: key 9 and the array of triplets, unless every entry left
 * for a field (or, lenient, was dropped).  The array header is written for
 * every entry and rewritten once the moved tags are known. */
static int
v10_write_attributes(V10Writer *v10, PyObject *meta, PyObject *metrics, PyObject *meta_struct,
                     Py_ssize_t entries, int *written_any)
{
    SpanWriter *w = &v10->base;
    Py_ssize_t key_pos = outbuf_len(w->out), meta_written, metrics_written, struct_written;
    if (entries * 3 > MP_ITEM_LIMIT) {
        return span_error(w, PyExc_ValueError, "meta", NULL, "too many attributes");
    }
    Py_ssize_t header_size = array_header_size(entries * 3);
    if (outbuf_reserve(w->out, 1 + header_size) < 0) {
        return -1;
    }
    mp_put_byte(w->out, V10_SPAN_ATTRIBUTES);
    mp_put_array_header(w->out, (uint32_t)(entries * 3));
    if (write_dict_entries(w, meta, "meta", v10_write_meta_entry, 0, &meta_written) < 0 ||
        write_dict_entries(w, metrics, "metrics", v10_write_metric_entry, 0, &metrics_written) <
            0 ||
        write_dict_entries(w, meta_struct, "meta_struct", v10_write_meta_struct_entry, 1,
                           &struct_written) < 0) {
        return -1;
    }
    Py_ssize_t count = meta_written + metrics_written + struct_written - v10->moved_count;
    *written_any = count > 0;
    if (count == 0) {
        outbuf_truncate(w->out, key_pos); /* nothing was written after the header */
        return 0;
    }
    if (count == entries) {
        return 0;
    }
    if (array_header_size(count * 3) == header_size) {
        /* The usual case: the header keeps its size, rewritten in place. */
        char *at = w->out->start + key_pos + 1;
        OutBuf header = {at, at, at + header_size, NULL};
        mp_put_array_header(&header, (uint32_t)(count * 3));
        return 0;
    }
    char header[5];
    OutBuf scratch = {header, header, header + sizeof header, NULL};
    mp_put_array_header(&scratch, (uint32_t)(count * 3));
    return v10_replace_header(w, key_pos + 1, header_size, header, outbuf_len(&scratch));
}

/* ---------------------------------------------------------------------------
 * Spans and chunks */

/* A tag that became a span field (env, version, component): its text under
 * `field_key`.  Bad text (bytes that are not UTF-8, a lone surrogate) is
 * what it would be as an attribute: an error naming the meta key, or in
 * lenient mode the tag dropped and counted, the rest of the span kept. */
static SP_NOINLINE int
v10_write_field_tag_checked(V10Writer *v10, int field_key, int tag)
{
    SpanWriter *w = &v10->base;
    Py_ssize_t start = outbuf_len(w->out);
    if (v10_write_text_field_of(w, field_key, v10->field_tag[tag], v10->field_tag_key[tag]) == 0) {
        return 0;
    }
    if (!w->lenient ||
        !(PyErr_ExceptionMatches(PyExc_ValueError) || PyErr_ExceptionMatches(PyExc_TypeError))) {
        return -1;
    }
    /* Text is checked before it takes a string id or a hole: only the key
     * byte was written. */
    PyErr_Clear();
    outbuf_truncate(w->out, start);
    Py_CLEAR(v10->field_tag[tag]);
    w->dropped_tags++;
    return 0;
}

static inline int
v10_write_field_tag(V10Writer *v10, int field_key, int tag)
{
    if (SP_LIKELY(v10->field_tag_key[tag] == NULL)) { /* an exact ASCII str */
        return v10_write_text_field(&v10->base, field_key, v10->field_tag[tag], "meta");
    }
    return v10_write_field_tag_checked(v10, field_key, tag);
}

/* A `_dd.origin` tag that gave way to the trace's origin, not written: its
 * text checked as v0.4 writes it (an error naming the key, or in lenient mode
 * the tag counted as dropped), so that both take the same traces. */
static SP_NOINLINE int
v10_check_origin_tag(V10Writer *v10)
{
    SpanWriter *w = &v10->base;
    PreparedText text;
    int prepared = text_prepare(w, v10->origin_tag, "meta", v10->origin_tag_key, &text);
    if (prepared >= 0) {
        if (prepared > 0) {
            Py_DECREF(text.object);
        }
        return 0;
    }
    if (!w->lenient ||
        !(PyErr_ExceptionMatches(PyExc_ValueError) || PyErr_ExceptionMatches(PyExc_TypeError))) {
        return -1;
    }
    PyErr_Clear();
    w->dropped_tags++;
    return 0;
}

/* start and duration: uint64 in the format, but the rule of every version
 * (span_time_clamped): within 64 bits, clamped to [0, 2**63 - 1], as the
 * agent reads a negative duration (0) and as v0.5 writes it. */
static inline int
v10_time_value(SpanWriter *w, PyObject *value, const char *field, uint64_t *out)
{
    int64_t clamped;
    if (SP_LIKELY(PyLong_CheckExact(value)) &&
        pyint_as_u64(&w->state->fast_paths, value, out) == 0 &&
        SP_LIKELY(*out <= (uint64_t)INT64_MAX)) {
        return 0;
    }
    if (value == Py_None) {
        return span_int_error(w, value, field, 0); /* start None: not a time */
    }
    if (span_time_clamped(w, value, field, &clamped) < 0) {
        return -1;
    }
    *out = (uint64_t)clamped;
    return 0;
}

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
        v10_time_value(w, v.value[SF_START], "start_ns", &start) < 0 ||
        (duration_obj != NULL && duration_obj != Py_None &&
         v10_time_value(w, duration_obj, "duration_ns", &duration) < 0) ||
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
    /* The map header is written when the fields are known (the tags that
     * become fields are found while the attributes are written): one byte
     * now, a fixmap unless every field is present. */
    Py_ssize_t header_pos = outbuf_len(w->out);
    Py_ssize_t entries = dict_size(meta) + dict_size(metrics) + dict_size(meta_struct);
    int has_duration = duration_obj != NULL && duration_obj != Py_None;
    int has_attributes = 0;
    if (mp_write_byte(w->out, MP_FIXMAP) < 0 ||
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
        mp_put_byte(w->out, MP_TRUE);
    }
    if (entries > 0 &&
        v10_write_attributes(v10, meta, metrics, meta_struct, entries, &has_attributes) < 0) {
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
    PyObject *const *tag = v10->field_tag;
    if ((tag[MOVED_ENV] != NULL && v10_write_field_tag(v10, V10_SPAN_ENV, MOVED_ENV) < 0) ||
        (tag[MOVED_VERSION] != NULL &&
         v10_write_field_tag(v10, V10_SPAN_VERSION, MOVED_VERSION) < 0) ||
        (tag[MOVED_COMPONENT] != NULL &&
         v10_write_field_tag(v10, V10_SPAN_COMPONENT, MOVED_COMPONENT) < 0) ||
        (SP_UNLIKELY(v10->origin_tag != NULL) && v10_check_origin_tag(v10) < 0)) {
        goto error;
    }
    /* A span.kind tag: its OTel number (no tag: no kind, OTel's unspecified). */
    if (v10->kind != 0) {
        if (outbuf_reserve(w->out, 2) < 0) {
            goto error;
        }
        mp_put_byte(w->out, V10_SPAN_KIND);
        mp_put_uint(w->out, v10->kind);
    }
    int has = (service != NULL && service != Py_None) + (name != NULL && name != Py_None) +
              (resource != NULL && resource != Py_None) +
              (span_type != NULL && span_type != Py_None);
    unsigned int fields =
        2 /* span_id, start */ + (unsigned int)has + (parent_id != 0) + has_duration + error_flag +
        has_attributes + (links_count > 0) + (events_count > 0) + (tag[MOVED_ENV] != NULL) +
        (tag[MOVED_VERSION] != NULL) + (tag[MOVED_COMPONENT] != NULL) + (v10->kind != 0);
    if (SP_LIKELY(fields < MP_FIXMAP_LIMIT)) {
        w->out->start[header_pos] = (char)(MP_FIXMAP | fields);
    }
    else {
        char header[3] = {(char)MP_MAP16, 0, (char)fields};
        if (v10_replace_header(w, header_pos, 1, header, sizeof header) < 0) {
            goto error;
        }
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
    unsigned int count = 2; /* spans, trace id */
    /* Every chunk has a trace id: an empty trace's is 0 (the agent drops
     * an empty trace in every version). */
    char id[V10_TRACE_ID_SIZE];
    mp_store64(id, v10->trace_id_high);
    mp_store64(id + 8, v10->trace_id_low);
    if (mp_write_byte(w->out, V10_CHUNK_TRACE_ID) < 0 ||
        mp_write_bin(w->out, id, V10_TRACE_ID_SIZE) < 0) {
        return -1;
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
    for (int tag = 0; tag < MOVED_PRIORITY; tag++) {
        Py_XDECREF(v10.tag_key[tag]);
    }
    return result;
}
