/* Span links and span events, written in C for the shapes tracers make:
 * links that give a dict of plain values through to_dict() (ddtrace's
 * SpanLink), events whose name, time and attributes are plain values.
 *
 * The rules are spanpack._extras's (docs/wire-format.md), and these paths
 * keep to them exactly: anything they would have to judge differently (a
 * user's link object without to_dict, a dict or str subclass, text that
 * truncation would cut, a value out of range or of a type the rules refuse)
 * is declined, the bytes written so far are discarded, and the whole list is
 * handed to spanpack._extras, which writes it or raises its error.  The
 * common case so costs no Python call beyond the accessors ddtrace itself
 * calls; the rare one costs what it always did. */
#include "links_events.h"

#include <math.h>
#include <string.h>

#include "jsontext.h"
#include "otel_span.h"
#include "packer.h"
#include "spanwrite.h"

/* The outcome of a C path: written, declined (nothing raised), or an error. */
enum { WRITE_ERROR = -1, WRITE_DECLINED = 0, WRITE_DONE = 1 };

/* A key of the v0.4 forms (a literal, shorter than 32 bytes: a fixstr). */
#define MP_KEY(text) text, (Py_ssize_t)(sizeof(text) - 1)
static int
put_key(OutBuf *out, const char *text, Py_ssize_t text_size)
{
    if (outbuf_reserve(out, 1 + text_size) < 0) {
        return -1;
    }
    mp_put_byte(out, (unsigned char)(MP_FIXSTR | text_size));
    memcpy(out->pos, text, (size_t)text_size);
    out->pos += text_size;
    return 0;
}

/* ---------------------------------------------------------------------------
 * Plain values */

/* The UTF-8 of an exact str that truncation leaves whole.  1, 0 (declined:
 * another type, a str to cut, a lone surrogate), or -1. */
static int
plain_utf8(PyObject *value, const char **utf8, Py_ssize_t *size)
{
    if (!PyUnicode_CheckExact(value) || PyUnicode_GET_LENGTH(value) > MAX_TEXT_LEN) {
        return WRITE_DECLINED;
    }
    *utf8 = PyUnicode_AsUTF8AndSize(value, size);
    if (*utf8 != NULL) {
        return WRITE_DONE;
    }
    if (PyErr_ExceptionMatches(PyExc_UnicodeEncodeError)) {
        PyErr_Clear(); /* spanpack._extras names it */
        return WRITE_DECLINED;
    }
    return WRITE_ERROR;
}

static int
put_plain_text(OutBuf *out, PyObject *value)
{
    const char *utf8;
    Py_ssize_t size;
    int found = plain_utf8(value, &utf8, &size);
    if (found != WRITE_DONE) {
        return found;
    }
    return mp_write_str(out, utf8, size, 1) < 0 ? WRITE_ERROR : WRITE_DONE;
}

/* An exact int in [-2**63, 2**64) as the Packer writes it. */
static int
put_plain_int(OutBuf *out, PyObject *value)
{
    uint64_t magnitude;
    int negative;
    int64_t signed_value;
    if (!PyLong_CheckExact(value) || pyint_magnitude64_api(value, &magnitude, &negative) != 0) {
        return WRITE_DECLINED;
    }
    if (!negative) {
        return mp_write_uint(out, magnitude) < 0 ? WRITE_ERROR : WRITE_DONE;
    }
    if (pyint_signed64(magnitude, negative, &signed_value) != 0) {
        return WRITE_DECLINED;
    }
    return mp_write_int(out, signed_value) < 0 ? WRITE_ERROR : WRITE_DONE;
}

/* An exact int in [0, 2**63). */
static int
plain_uint63(PyObject *value, uint64_t *out)
{
    int negative;
    if (!PyLong_CheckExact(value) || pyint_magnitude64_api(value, out, &negative) != 0 ||
        negative || *out > (uint64_t)INT64_MAX) {
        return WRITE_DECLINED;
    }
    return WRITE_DONE;
}

/* Hex digits as int(text, 16) reads them, for text of 1 to 16 digits and
 * nothing else (to_dict()'s ids). */
static int
parse_hex64(const char *text, Py_ssize_t size, uint64_t *out)
{
    if (size < 1 || size > 16) {
        return WRITE_DECLINED;
    }
    uint64_t value = 0;
    for (Py_ssize_t i = 0; i < size; i++) {
        char c = text[i];
        unsigned digit;
        if (c >= '0' && c <= '9') {
            digit = (unsigned)(c - '0');
        }
        else if (c >= 'a' && c <= 'f') {
            digit = (unsigned)(c - 'a' + 10);
        }
        else if (c >= 'A' && c <= 'F') {
            digit = (unsigned)(c - 'A' + 10);
        }
        else {
            return WRITE_DECLINED;
        }
        value = (value << 4) | digit;
    }
    *out = value;
    return WRITE_DONE;
}

/* An exact str of hex digits: `size` of them when `size` > 0, else 1 to 16. */
static int
hex_id(PyObject *value, Py_ssize_t size, uint64_t *high, uint64_t *low)
{
    const char *text;
    Py_ssize_t text_size;
    int found = value == NULL ? WRITE_DECLINED : plain_utf8(value, &text, &text_size);
    if (found != WRITE_DONE) {
        return found;
    }
    if (size == 32) {
        if (text_size != 32 || parse_hex64(text, 16, high) != WRITE_DONE) {
            return WRITE_DECLINED;
        }
        return parse_hex64(text + 16, 16, low);
    }
    *high = 0;
    return parse_hex64(text, text_size, low);
}

/* Is the text (`name`, `size`) the literal `key`? */
#define IS_KEY(name, size, key)                                                                    \
    ((size) == (Py_ssize_t)sizeof(key) - 1 && memcmp((name), (key), sizeof(key) - 1) == 0)

/* ---------------------------------------------------------------------------
 * Links */

/* One of a link's or an event's fields as spanpack._extras reads it: a dict's entry, an
 * object's attribute, None when there is none.  A new reference. */
static int
item_field(SpanWriter *w, PyObject *event, PyObject *name, const char *field_name, PyObject **value)
{
    if (PyDict_Check(event)) {
        if (!PyDict_CheckExact(event)) {
            return WRITE_DECLINED; /* its get() may be its own */
        }
        PyObject *entry = PyDict_GetItemWithError(event, name);
        if (entry == NULL && PyErr_Occurred()) {
            return span_reraise(w, field_name, NULL);
        }
        *value = Py_NewRef(entry != NULL ? entry : Py_None);
        return WRITE_DONE;
    }
    *value = PyObject_GetAttr(event, name);
    if (*value != NULL) {
        return WRITE_DONE;
    }
    if (!PyErr_ExceptionMatches(PyExc_AttributeError)) {
        return span_reraise(w, field_name, NULL);
    }
    PyErr_Clear();
    *value = Py_NewRef(Py_None);
    return WRITE_DONE;
}

/* "key.index", as PyUnicode_FromFormat("%U.%zd") makes it: for an ASCII key
 * (the usual attribute name) written in place, a tenth of that call's cost. */
static PyObject *
indexed_key(PyObject *key, Py_ssize_t index)
{
    if (!PyUnicode_IS_ASCII(key)) {
        return PyUnicode_FromFormat("%U.%zd", key, index);
    }
    /* ".index" (index >= 0: a list's). */
    char text[24];
    char *start = decimal64_put(text + sizeof text, (uint64_t)index);
    *--start = '.';
    Py_ssize_t digit_count = text + sizeof text - start;
    Py_ssize_t length = PyUnicode_GET_LENGTH(key);
    if (length > PY_SSIZE_T_MAX - digit_count) {
        PyErr_NoMemory();
        return NULL;
    }
    const char *digits = start;
    PyObject *made = PyUnicode_New(length + digit_count, 127);
    if (made == NULL) {
        return NULL;
    }
    memcpy(PyUnicode_1BYTE_DATA(made), PyUnicode_1BYTE_DATA(key), (size_t)length);
    memcpy(PyUnicode_1BYTE_DATA(made) + length, digits, (size_t)digit_count);
    return made;
}

/* A link attribute's text as spanpack._extras makes it (str as it is, bools
 * as true/false, ints and floats as str() writes them), added to `flat`
 * under `key`; lists and tuples flattened to key.0, key.1, ...  Anything
 * else (whose str() is Python code) declines. */
static int
flatten_link_attribute(PyObject *flat, PyObject *key, PyObject *value, int depth)
{
    PyObject *text = NULL;
    if (PyUnicode_CheckExact(value)) {
        text = Py_NewRef(value);
    }
    else if (PyBool_Check(value)) {
        text = PyUnicode_FromString(value == Py_True ? "true" : "false");
    }
    else if (PyLong_CheckExact(value) || PyFloat_CheckExact(value)) {
        OutBuf digits;
        if (outbuf_init_raw(&digits, 32) < 0) {
            return WRITE_ERROR;
        }
        int written = json_text_write(&digits, value, 0);
        /* json's text of an int or a float is its str(), but for NaN and
         * the infinities. */
        if (written == WRITE_DONE && PyFloat_CheckExact(value) &&
            !isfinite(PyFloat_AS_DOUBLE(value))) {
            written = WRITE_DECLINED;
        }
        text = written == WRITE_DONE ? json_text_str(&digits, 0) : NULL;
        outbuf_free(&digits);
        if (written != WRITE_DONE) {
            return written;
        }
    }
    else if ((PyList_CheckExact(value) || PyTuple_CheckExact(value)) && depth < 8) {
        /* Nothing below runs Python code: the sequence keeps its items. */
        for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(value); i++) {
            PyObject *item_key = indexed_key(key, i);
            if (item_key == NULL) {
                return WRITE_ERROR;
            }
            int written = flatten_link_attribute(flat, item_key, PySequence_Fast_GET_ITEM(value, i),
                                                 depth + 1);
            Py_DECREF(item_key);
            if (written != WRITE_DONE) {
                return written;
            }
        }
        return WRITE_DONE;
    }
    else {
        return WRITE_DECLINED;
    }
    if (text == NULL) {
        return WRITE_ERROR;
    }
    int result = PyDict_SetItem(flat, key, text);
    Py_DECREF(text);
    return result < 0 ? WRITE_ERROR : WRITE_DONE;
}

/* One of a ddtrace SpanLink's fields (`ddtrace`), which its to_dict() reads
 * as attributes: one it lacks declines (to_dict() raises its
 * AttributeError); else item_field. */
static int
link_field(SpanWriter *w, PyObject *link, PyObject *name, int ddtrace, PyObject **value)
{
    if (!ddtrace) {
        return item_field(w, link, name, "links", value);
    }
    *value = PyObject_GetAttr(link, name);
    if (*value != NULL) {
        return WRITE_DONE;
    }
    if (!PyErr_ExceptionMatches(PyExc_AttributeError)) {
        return span_reraise(w, "links", NULL);
    }
    PyErr_Clear();
    return WRITE_DECLINED;
}

void
link_values_clear(LinkValues *values)
{
    Py_CLEAR(values->attributes);
    Py_CLEAR(values->tracestate);
    Py_CLEAR(values->flags);
}

/* An exact int in [0, 2**bits) (`bits` 64 or 128) as 64-bit halves. */
static int
link_id(const SpFastPaths *fast_paths, PyObject *value, int bits, uint64_t *high, uint64_t *low)
{
    if (!PyLong_CheckExact(value)) {
        return WRITE_DECLINED;
    }
    int wide = pyint_u128(fast_paths, value, high, low);
    if (wide < 0) {
        return WRITE_ERROR;
    }
    return wide > 0 || (bits == 64 && *high != 0) ? WRITE_DECLINED /* negative, or too wide */
                                                  : WRITE_DONE;
}

/* A link's attributes flattened to text (a dict; NULL when there are none),
 * as spanpack._extras's _link_dict makes them: attributes of exact str keys
 * and values are the same dict (`borrow`: no code runs before they are
 * written) or a copy, others a new dict of flatten_link_attribute's. */
static int
link_attributes_flat(PyObject *attributes, int borrow, PyObject **flat)
{
    *flat = NULL;
    if (attributes == Py_None ||
        (PyDict_CheckExact(attributes) && PyDict_GET_SIZE(attributes) == 0)) {
        return WRITE_DONE;
    }
    if (!PyDict_CheckExact(attributes)) {
        return WRITE_DECLINED; /* its truth and items() are its own */
    }
    Py_ssize_t position = 0;
    PyObject *key, *value;
    int plain = 1;
    while (plain && PyDict_Next(attributes, &position, &key, &value)) {
        plain = PyUnicode_CheckExact(key) && PyUnicode_CheckExact(value);
    }
    if (plain) {
        *flat = borrow ? Py_NewRef(attributes) : PyDict_Copy(attributes);
        return *flat == NULL ? WRITE_ERROR : WRITE_DONE;
    }
    PyObject *made = PyDict_New();
    if (made == NULL) {
        return WRITE_ERROR;
    }
    int found = WRITE_DONE;
    position = 0;
    while (found == WRITE_DONE && PyDict_Next(attributes, &position, &key, &value)) {
        found = PyUnicode_CheckExact(key) ? flatten_link_attribute(made, key, value, 0)
                                          : WRITE_DECLINED;
    }
    if (found != WRITE_DONE) {
        Py_DECREF(made);
        return found;
    }
    *flat = made;
    return WRITE_DONE;
}

/* The values (LinkValues) of a link given as a dict, an object without
 * to_dict() or ddtrace's SpanLink (`ddtrace`), by spanpack._extras's
 * _link_dict rules: ids in range, attributes flattened to text, the
 * dropped count when above 0, tracestate when not empty, flags when not
 * None.  Declines what those rules would refuse or judge by Python code.
 * `borrow`: see link_attributes_flat. */
static int
link_values_read(SpanWriter *w, PyObject *link, int ddtrace, int borrow, LinkValues *values)
{
    SpanpackState *state = w->state;
    PyObject *trace_id = NULL, *span_id = NULL, *attributes = NULL, *dropped = NULL;
    PyObject *tracestate = NULL, *flags = NULL;
    *values = (LinkValues){0};
    /* ddtrace's SpanLink keeps its dropped count as _dropped_attributes. */
    PyObject *dropped_name =
        ddtrace ? state->str_dropped_attributes : state->str_dropped_attributes_count;
    int result = link_field(w, link, state->str_trace_id, ddtrace, &trace_id);
    if (result == WRITE_DONE) {
        result = link_field(w, link, state->str_span_id, ddtrace, &span_id);
    }
    if (result == WRITE_DONE) {
        result = link_field(w, link, state->str_attributes, ddtrace, &attributes);
    }
    if (result == WRITE_DONE) {
        result = link_field(w, link, dropped_name, ddtrace, &dropped);
    }
    if (result == WRITE_DONE) {
        result = link_field(w, link, state->str_tracestate, ddtrace, &tracestate);
    }
    if (result == WRITE_DONE) {
        result = link_field(w, link, state->str_flags, ddtrace, &flags);
    }
    /* Every field read (getters may be Python code); what follows runs none
     * but allocation. */
    uint64_t span_high = 0;
    if (result == WRITE_DONE) {
        result =
            link_id(&state->fast_paths, trace_id, 128, &values->trace_high, &values->trace_low);
    }
    if (result == WRITE_DONE) {
        result = link_id(&state->fast_paths, span_id, 64, &span_high, &values->span_id);
    }
    if (result == WRITE_DONE) {
        result = link_attributes_flat(attributes, borrow, &values->attributes);
    }
    if (result == WRITE_DONE && dropped == Py_None && ddtrace) {
        result = WRITE_DECLINED; /* to_dict() compares it with 0: a TypeError */
    }
    if (result == WRITE_DONE && dropped != Py_None) {
        result = plain_uint63(dropped, &values->dropped);
    }
    if (result == WRITE_DONE && tracestate != Py_None) {
        if (!PyUnicode_CheckExact(tracestate)) {
            result = WRITE_DECLINED;
        }
        else if (PyUnicode_GET_LENGTH(tracestate) > 0) {
            values->tracestate = Py_NewRef(tracestate);
        }
    }
    if (result == WRITE_DONE && flags != Py_None) {
        if (!PyLong_CheckExact(flags)) {
            result = WRITE_DECLINED;
        }
        else {
            values->flags = Py_NewRef(flags);
        }
    }
    if (result != WRITE_DONE) {
        link_values_clear(values);
    }
    Py_XDECREF(trace_id);
    Py_XDECREF(span_id);
    Py_XDECREF(attributes);
    Py_XDECREF(dropped);
    Py_XDECREF(tracestate);
    Py_XDECREF(flags);
    return result;
}

/* `digits` / 16 64-bit words (high first) as lowercase hex: a new str. */
static PyObject *
hex_text(const uint64_t *words, int digits)
{
    char text[32];
    for (int i = 0; i < digits / 16; i++) {
        hex64_put(text + 16 * i, words[i]);
    }
    return PyUnicode_FromStringAndSize(text, digits);
}

PyObject *
link_values_dict(SpanpackState *state, const LinkValues *values, int copy_attributes)
{
    const uint64_t trace_id[2] = {values->trace_high, values->trace_low};
    PyObject *fields = PyDict_New();
    PyObject *trace_text = hex_text(trace_id, 32);
    PyObject *span_text = hex_text(&values->span_id, 16);
    PyObject *attributes = values->attributes == NULL ? NULL
                           : copy_attributes          ? PyDict_Copy(values->attributes)
                                                      : Py_NewRef(values->attributes);
    PyObject *dropped = values->dropped > 0 ? PyLong_FromUnsignedLongLong(values->dropped) : NULL;
    if (fields == NULL || trace_text == NULL || span_text == NULL ||
        (values->attributes != NULL && attributes == NULL) ||
        (values->dropped > 0 && dropped == NULL) ||
        PyDict_SetItem(fields, state->str_trace_id, trace_text) < 0 ||
        PyDict_SetItem(fields, state->str_span_id, span_text) < 0 ||
        (attributes != NULL && PyDict_SetItem(fields, state->str_attributes, attributes) < 0) ||
        (dropped != NULL &&
         PyDict_SetItem(fields, state->str_dropped_attributes_count, dropped) < 0) ||
        (values->tracestate != NULL &&
         PyDict_SetItem(fields, state->str_tracestate, values->tracestate) < 0) ||
        (values->flags != NULL && PyDict_SetItem(fields, state->str_flags, values->flags) < 0)) {
        Py_CLEAR(fields);
    }
    Py_XDECREF(trace_text);
    Py_XDECREF(span_text);
    Py_XDECREF(attributes);
    Py_XDECREF(dropped);
    return fields;
}

/* What one link gave: the result of an object's own to_dict(), or the
 * values of its fields (LinkValues). */
typedef struct {
    PyObject *dict; /* held; NULL: `values` */
    LinkValues values;
} LinkFields;

static void
link_fields_clear(LinkFields *fields)
{
    Py_CLEAR(fields->dict);
    link_values_clear(&fields->values);
}

/* A link's fields (LinkFields, `borrow`: link_values_read's): its values
 * for a dict, an OtelLink, ddtrace's SpanLink (read as its to_dict() reads
 * it, with its dropped count kept as _dropped_attributes; what those rules
 * decline, its to_dict() makes) or an object without to_dict(); else what
 * its to_dict() gives.  Declined for what spanpack._extras must judge. */
static int
link_fields(SpanWriter *w, PyObject *link, int borrow, LinkFields *fields)
{
    fields->dict = NULL;
    fields->values = (LinkValues){0};
    if (PyDict_Check(link)) {
        return link_values_read(w, link, 0, borrow, &fields->values);
    }
    if (Py_TYPE(link) == w->state->otel_link_type) {
        /* spanpack.otel's: its values as the mapping made them (they never change). */
        fields->values = ((OtelLinkObject *)link)->values;
        Py_XINCREF(fields->values.attributes);
        Py_XINCREF(fields->values.tracestate);
        Py_XINCREF(fields->values.flags);
        return WRITE_DONE;
    }
    int ddtrace_link = spanfields_is_ddtrace_link(w->reader, link);
    if (ddtrace_link < 0) {
        return span_reraise(w, "links", NULL);
    }
    if (ddtrace_link) {
        int read = link_values_read(w, link, 1, borrow, &fields->values);
        if (read != WRITE_DECLINED) {
            return read;
        }
    }
    PyObject *to_dict = PyObject_GetAttr(link, w->state->str_to_dict);
    if (to_dict == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_AttributeError)) {
            return span_reraise(w, "links", NULL);
        }
        PyErr_Clear();
        return link_values_read(w, link, 0, borrow, &fields->values);
    }
    if (to_dict == Py_None) {
        Py_DECREF(to_dict);
        return link_values_read(w, link, 0, borrow, &fields->values);
    }
    PyObject *result = PyObject_CallNoArgs(to_dict);
    Py_DECREF(to_dict);
    if (result == NULL) {
        return span_reraise(w, "links", NULL);
    }
    if (!PyDict_CheckExact(result)) {
        Py_DECREF(result);
        return WRITE_DECLINED;
    }
    fields->dict = result;
    return WRITE_DONE;
}

/* A link attribute map: exact str keys and values. */
static int
put_string_map(OutBuf *out, PyObject *dict)
{
    if (mp_write_map_header(out, PyDict_GET_SIZE(dict)) < 0) {
        return WRITE_ERROR;
    }
    Py_ssize_t position = 0;
    PyObject *key, *value;
    while (PyDict_Next(dict, &position, &key, &value)) {
        int written = put_plain_text(out, key);
        if (written == WRITE_DONE) {
            written = put_plain_text(out, value);
        }
        if (written != WRITE_DONE) {
            return written;
        }
    }
    return WRITE_DONE;
}

/* One v0.4 link from its fields: the ids as ints (the high half of a 128-bit
 * trace id as trace_id_high, last), flags with bit 31 set to say that they
 * are present, dropped_attributes_count left out (libdatadog's v0.4 decoder
 * refuses it), every other value as it is. */
static int
v04_put_link(SpanWriter *w, PyObject *fields)
{
    uint64_t trace_high, trace_low, span_high, span_id;
    int found = hex_id(PyDict_GetItemWithError(fields, w->state->str_trace_id), 32, &trace_high,
                       &trace_low);
    if (found == WRITE_DONE) {
        found =
            hex_id(PyDict_GetItemWithError(fields, w->state->str_span_id), 0, &span_high, &span_id);
    }
    if (found != WRITE_DONE) {
        return PyErr_Occurred() ? WRITE_ERROR : found;
    }
    PyObject *dropped = PyDict_GetItemWithError(fields, w->state->str_dropped_attributes_count);
    if (dropped == NULL && PyErr_Occurred()) {
        return WRITE_ERROR;
    }
    Py_ssize_t count = PyDict_GET_SIZE(fields) - (dropped != NULL) + (trace_high > 0);
    if (mp_write_map_header(w->out, count) < 0) {
        return WRITE_ERROR;
    }
    Py_ssize_t position = 0;
    PyObject *key, *value;
    while (PyDict_Next(fields, &position, &key, &value)) {
        const char *name;
        Py_ssize_t name_size;
        int written = plain_utf8(key, &name, &name_size);
        if (written != WRITE_DONE) {
            return written;
        }
        if (IS_KEY(name, name_size, "dropped_attributes_count")) {
            continue;
        }
        if (IS_KEY(name, name_size, "trace_id_high")) {
            return WRITE_DECLINED; /* replaced in place by spanpack._extras */
        }
        if (mp_write_str(w->out, name, name_size, 1) < 0) {
            return WRITE_ERROR;
        }
        if (IS_KEY(name, name_size, "trace_id") || IS_KEY(name, name_size, "span_id")) {
            written = mp_write_uint(w->out, name_size == 8 ? trace_low : span_id) < 0 ? WRITE_ERROR
                                                                                      : WRITE_DONE;
        }
        else if (IS_KEY(name, name_size, "flags")) {
            uint64_t flags;
            written = plain_uint63(value, &flags);
            if (written == WRITE_DONE && mp_write_uint(w->out, flags | (UINT64_C(1) << 31)) < 0) {
                written = WRITE_ERROR;
            }
        }
        else if (PyUnicode_CheckExact(value)) {
            written = put_plain_text(w->out, value);
        }
        else if (PyLong_CheckExact(value)) {
            written = put_plain_int(w->out, value);
        }
        else if (PyFloat_CheckExact(value)) {
            written =
                mp_write_double(w->out, PyFloat_AS_DOUBLE(value)) < 0 ? WRITE_ERROR : WRITE_DONE;
        }
        else if (PyDict_CheckExact(value)) {
            written = put_string_map(w->out, value);
        }
        else {
            written = WRITE_DECLINED;
        }
        if (written != WRITE_DONE) {
            return written;
        }
    }
    if (trace_high > 0 &&
        (put_key(w->out, MP_KEY("trace_id_high")) < 0 || mp_write_uint(w->out, trace_high) < 0)) {
        return WRITE_ERROR;
    }
    return WRITE_DONE;
}

/* ---------------------------------------------------------------------------
 * Events */


typedef struct {
    PyObject *name;
    PyObject *time;
    PyObject *attributes; /* NULL when empty or falsy: not written */
} EventFields;

static void
event_fields_clear(EventFields *fields)
{
    Py_CLEAR(fields->name);
    Py_CLEAR(fields->time);
    Py_CLEAR(fields->attributes);
}

static int
event_fields_read(SpanWriter *w, PyObject *event, EventFields *fields)
{
    if (Py_TYPE(event) == w->state->otel_event_type) {
        /* Its attributes are None or a dict (written when not empty, as
         * the truth test below has it). */
        const OtelEventObject *own = (const OtelEventObject *)event;
        PyObject *attributes = own->attributes;
        fields->name = Py_NewRef(own->name);
        fields->time = Py_NewRef(own->time_unix_nano);
        fields->attributes =
            attributes != Py_None && PyDict_GET_SIZE(attributes) > 0 ? Py_NewRef(attributes) : NULL;
        return WRITE_DONE;
    }
    fields->name = fields->time = fields->attributes = NULL;
    int found = item_field(w, event, w->state->str_name, "events", &fields->name);
    if (found == WRITE_DONE) {
        found = item_field(w, event, w->state->str_time_unix_nano, "events", &fields->time);
    }
    if (found == WRITE_DONE) {
        found = item_field(w, event, w->state->str_attributes, "events", &fields->attributes);
    }
    if (found == WRITE_DONE) {
        int truthy = PyObject_IsTrue(fields->attributes);
        if (truthy < 0) {
            found = span_reraise(w, "events", NULL);
        }
        else if (!truthy) {
            Py_CLEAR(fields->attributes);
        }
    }
    if (found != WRITE_DONE) {
        event_fields_clear(fields);
    }
    return found;
}

/* A native (typed) event attribute value: {"type": T, "<kind>_value": V};
 * a list (not inside another) as {"type": 4, "array_value": {"values": [...]}}. */
static int
put_typed_value(OutBuf *out, PyObject *value, int nested)
{
    int written;
    if (outbuf_reserve(out, 1) < 0) {
        return WRITE_ERROR;
    }
    mp_put_byte(out, MP_FIXMAP | 2);
    if (put_key(out, MP_KEY("type")) < 0) {
        return WRITE_ERROR;
    }
    if (PyUnicode_CheckExact(value)) {
        if (mp_write_uint(out, 0) < 0 || put_key(out, MP_KEY("string_value")) < 0) {
            return WRITE_ERROR;
        }
        return put_plain_text(out, value);
    }
    if (PyBool_Check(value)) {
        if (mp_write_uint(out, 1) < 0 || put_key(out, MP_KEY("bool_value")) < 0 ||
            mp_write_byte(out, value == Py_True ? MP_TRUE : MP_FALSE) < 0) {
            return WRITE_ERROR;
        }
        return WRITE_DONE;
    }
    if (PyLong_CheckExact(value)) {
        if (mp_write_uint(out, 2) < 0 || put_key(out, MP_KEY("int_value")) < 0) {
            return WRITE_ERROR;
        }
        return put_plain_int(out, value);
    }
    if (PyFloat_CheckExact(value)) {
        if (mp_write_uint(out, 3) < 0 || put_key(out, MP_KEY("double_value")) < 0 ||
            mp_write_double(out, PyFloat_AS_DOUBLE(value)) < 0) {
            return WRITE_ERROR;
        }
        return WRITE_DONE;
    }
    if (!PyList_CheckExact(value) || nested) {
        return WRITE_DECLINED;
    }
    if (mp_write_uint(out, 4) < 0 || put_key(out, MP_KEY("array_value")) < 0 ||
        mp_write_byte(out, MP_FIXMAP | 1) < 0 || put_key(out, MP_KEY("values")) < 0 ||
        mp_write_array_header(out, PyList_GET_SIZE(value)) < 0) {
        return WRITE_ERROR;
    }
    /* Nothing below runs Python code: the list keeps its items. */
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(value); i++) {
        written = put_typed_value(out, PyList_GET_ITEM(value, i), 1);
        if (written != WRITE_DONE) {
            return written;
        }
    }
    return WRITE_DONE;
}

/* One native v0.4 event: name, time_unix_nano, typed attributes. */
static int
v04_put_event(SpanWriter *w, OutBuf *out, const EventFields *fields, Py_ssize_t index)
{
    (void)w;
    (void)index;
    uint64_t time;
    const char *name;
    Py_ssize_t name_size;
    int written = plain_utf8(fields->name, &name, &name_size);
    if (written == WRITE_DONE) {
        written = plain_uint63(fields->time, &time);
    }
    if (written != WRITE_DONE) {
        return written; /* spanpack._extras takes times beyond 2**63 too */
    }
    if (mp_write_byte(out, MP_FIXMAP | (fields->attributes != NULL ? 3 : 2)) < 0 ||
        put_key(out, MP_KEY("name")) < 0 || mp_write_str(out, name, name_size, 1) < 0 ||
        put_key(out, MP_KEY("time_unix_nano")) < 0 || mp_write_uint(out, time) < 0) {
        return WRITE_ERROR;
    }
    if (fields->attributes == NULL) {
        return WRITE_DONE;
    }
    PyObject *attributes = fields->attributes;
    if (!PyDict_CheckExact(attributes)) {
        return WRITE_DECLINED;
    }
    if (put_key(out, MP_KEY("attributes")) < 0 ||
        mp_write_map_header(out, PyDict_GET_SIZE(attributes)) < 0) {
        return WRITE_ERROR;
    }
    /* Nothing below runs Python code: the dict keeps its entries. */
    Py_ssize_t position = 0;
    PyObject *key, *value;
    while (PyDict_Next(attributes, &position, &key, &value)) {
        written = put_plain_text(out, key);
        if (written == WRITE_DONE) {
            written = put_typed_value(out, value, 0);
        }
        if (written != WRITE_DONE) {
            return written;
        }
    }
    return WRITE_DONE;
}

static int
json_put(OutBuf *out, const char *text, Py_ssize_t size)
{
    return outbuf_write(out, text, size) < 0 ? WRITE_ERROR : WRITE_DONE;
}

/* One event as json.dumps writes spanpack._extras's dict of it:
 * {"name": ..., "time_unix_nano": ..., "attributes": ...}. */
static int
json_put_event(SpanWriter *w, OutBuf *out, const EventFields *fields, Py_ssize_t index)
{
    (void)w;
    int written = index > 0 ? json_put(out, ", ", 2) : WRITE_DONE;
    if (written == WRITE_DONE) {
        written = json_put(out, "{\"name\": ", 9);
    }
    if (written == WRITE_DONE) {
        written = json_text_write(out, fields->name, 2);
    }
    if (written == WRITE_DONE) {
        written = json_put(out, ", \"time_unix_nano\": ", 20);
    }
    if (written == WRITE_DONE) {
        written = json_text_write(out, fields->time, 2);
    }
    if (written == WRITE_DONE && fields->attributes != NULL) {
        written = json_put(out, ", \"attributes\": ", 16);
        if (written == WRITE_DONE) {
            written = json_text_write(out, fields->attributes, 2);
        }
    }
    return written == WRITE_DONE ? json_put(out, "}", 1) : written;
}

/* A JSON key and its separators: `text` is '"key": ' (a literal). */
#define JSON_KEY(text) text, (Py_ssize_t)(sizeof(text) - 1)

/* One link's values as json.dumps writes their to_dict() form:
 * {"trace_id": ..., "span_id": ..., "attributes": ...,
 *  "dropped_attributes_count": ..., "tracestate": ..., "flags": ...}. */
static int
json_put_link_values(OutBuf *out, const LinkValues *link)
{
    char text[2 + 32 + 1];
    text[0] = '"';
    hex64_put(text + 1, link->trace_high);
    hex64_put(text + 17, link->trace_low);
    text[33] = '"';
    int written = json_put(out, JSON_KEY("{\"trace_id\": "));
    if (written == WRITE_DONE) {
        written = json_put(out, text, 34);
    }
    if (written == WRITE_DONE) {
        written = json_put(out, JSON_KEY(", \"span_id\": "));
    }
    if (written == WRITE_DONE) {
        hex64_put(text + 1, link->span_id);
        text[17] = '"';
        written = json_put(out, text, 18);
    }
    if (written == WRITE_DONE && link->attributes != NULL) {
        written = json_put(out, JSON_KEY(", \"attributes\": "));
        if (written == WRITE_DONE) {
            written = json_text_write(out, link->attributes, 2);
        }
    }
    if (written == WRITE_DONE && link->dropped > 0) {
        char digits[24];
        const char *start = decimal64_put(digits + sizeof digits, link->dropped);
        written = json_put(out, JSON_KEY(", \"dropped_attributes_count\": "));
        if (written == WRITE_DONE) {
            written = json_put(out, start, digits + sizeof digits - start);
        }
    }
    if (written == WRITE_DONE && link->tracestate != NULL) {
        written = json_put(out, JSON_KEY(", \"tracestate\": "));
        if (written == WRITE_DONE) {
            written = json_text_write(out, link->tracestate, 2);
        }
    }
    if (written == WRITE_DONE && link->flags != NULL) {
        written = json_put(out, JSON_KEY(", \"flags\": "));
        if (written == WRITE_DONE) {
            written = json_text_write(out, link->flags, 2);
        }
    }
    return written == WRITE_DONE ? json_put(out, "}", 1) : written;
}

/* One link as json.dumps writes its to_dict(). */
static int
json_put_link(SpanWriter *w, OutBuf *out, const LinkFields *fields, Py_ssize_t index)
{
    (void)w;
    int written = index > 0 ? json_put(out, ", ", 2) : WRITE_DONE;
    if (written != WRITE_DONE) {
        return written;
    }
    return fields->dict != NULL ? json_text_write(out, fields->dict, 1)
                                : json_put_link_values(out, &fields->values);
}

/* ---------------------------------------------------------------------------
 * The lists */

typedef int (*LinkPutFn)(SpanWriter *w, OutBuf *out, const LinkFields *fields, Py_ssize_t index);
typedef int (*EventPutFn)(SpanWriter *w, OutBuf *out, const EventFields *fields, Py_ssize_t index);

/* What one item gave: a link's fields (links), or an event's. */
typedef struct {
    LinkFields link;
    EventFields event;
} ItemFields;

/* (`borrow`: link_values_read's, for an item written before the next is read.) */
static int
item_fields_read(SpanWriter *w, PyObject *item, int is_link, int borrow, ItemFields *fields)
{
    fields->link.dict = NULL;
    fields->link.values = (LinkValues){0};
    fields->event.name = fields->event.time = fields->event.attributes = NULL;
    return is_link ? link_fields(w, item, borrow, &fields->link)
                   : event_fields_read(w, item, &fields->event);
}

static void
item_fields_clear(ItemFields *fields)
{
    link_fields_clear(&fields->link);
    event_fields_clear(&fields->event);
}

/* Each item of an exact list or tuple, read (link_fields, event_fields_read)
 * and written by `put_link` or `put_event` (one of the two is set).  Reading
 * runs Python code (to_dict(), getters) that could change the list: its
 * length is checked before each item and at the end, and a change declines.
 *
 * That code could also change what an earlier item gave (its attributes
 * dict).  spanpack._extras's v0.4 forms convert each item before reading the
 * next, as this does item by item; its JSON is json.dumps of the list of
 * every item's fields, made before any is written.  So with `read_all` (JSON)
 * every item is read first and then all are written (writing runs no Python
 * code). */
static int
put_each(SpanWriter *w, OutBuf *out, PyObject *items, LinkPutFn put_link, EventPutFn put_event,
         int read_all)
{
    if (!PyList_CheckExact(items) && !PyTuple_CheckExact(items)) {
        return WRITE_DECLINED;
    }
    Py_ssize_t count = PySequence_Fast_GET_SIZE(items), held = 0;
    ItemFields few[4]; /* most spans have one or two links or events */
    ItemFields *read = few;
    if (read_all && count > (Py_ssize_t)Py_ARRAY_LENGTH(few)) {
        read = PyMem_Calloc((size_t)count, sizeof(ItemFields));
        if (read == NULL) {
            PyErr_NoMemory();
            return WRITE_ERROR;
        }
    }
    int written = WRITE_DONE;
    for (Py_ssize_t i = 0; i < count; i++) {
        if (PySequence_Fast_GET_SIZE(items) != count) {
            written = WRITE_DECLINED;
            break;
        }
        ItemFields *fields = &read[read_all ? i : 0];
        PyObject *item = Py_NewRef(PySequence_Fast_GET_ITEM(items, i));
        written = item_fields_read(w, item, put_link != NULL, !read_all, fields);
        if (written != WRITE_DONE || read_all) {
            Py_DECREF(item);
            if (written != WRITE_DONE) {
                break;
            }
            held = i + 1;
            continue;
        }
        /* The item is held until it is written: freeing it (its __del__, a
         * weakref callback) runs Python code, which could change what was
         * read from it (a borrowed attributes dict, an event's fields). */
        written = put_link != NULL ? put_link(w, out, &fields->link, i)
                                   : put_event(w, out, &fields->event, i);
        item_fields_clear(fields);
        Py_DECREF(item);
        if (written != WRITE_DONE) {
            break;
        }
    }
    if (written == WRITE_DONE && PySequence_Fast_GET_SIZE(items) != count) {
        written = WRITE_DECLINED;
    }
    for (Py_ssize_t i = 0; i < held && written == WRITE_DONE; i++) {
        written = put_link != NULL ? put_link(w, out, &read[i].link, i)
                                   : put_event(w, out, &read[i].event, i);
    }
    for (Py_ssize_t i = 0; i < held; i++) {
        item_fields_clear(&read[i]);
    }
    if (read != few) {
        PyMem_Free(read);
    }
    return written;
}

/* A link written from its values: v04_put_link's bytes for their to_dict()
 * form, in that form's key order (the dropped count left out, as there). */
static int
v04_put_link_values(SpanWriter *w, const LinkValues *link)
{
    uint64_t flags = 0;
    int written = link->flags != NULL ? plain_uint63(link->flags, &flags) : WRITE_DONE;
    if (written != WRITE_DONE) {
        return written;
    }
    Py_ssize_t count = 2 + (link->attributes != NULL) + (link->tracestate != NULL) +
                       (link->flags != NULL) + (link->trace_high > 0);
    if (mp_write_map_header(w->out, count) < 0 || put_key(w->out, MP_KEY("trace_id")) < 0 ||
        mp_write_uint(w->out, link->trace_low) < 0 || put_key(w->out, MP_KEY("span_id")) < 0 ||
        mp_write_uint(w->out, link->span_id) < 0) {
        return WRITE_ERROR;
    }
    if (link->attributes != NULL) {
        written = put_key(w->out, MP_KEY("attributes")) < 0
                      ? WRITE_ERROR
                      : put_string_map(w->out, link->attributes);
        if (written != WRITE_DONE) {
            return written;
        }
    }
    if (link->tracestate != NULL) {
        written = put_key(w->out, MP_KEY("tracestate")) < 0
                      ? WRITE_ERROR
                      : put_plain_text(w->out, link->tracestate);
        if (written != WRITE_DONE) {
            return written;
        }
    }
    if ((link->flags != NULL && (put_key(w->out, MP_KEY("flags")) < 0 ||
                                 mp_write_uint(w->out, flags | (UINT64_C(1) << 31)) < 0)) ||
        (link->trace_high > 0 && (put_key(w->out, MP_KEY("trace_id_high")) < 0 ||
                                  mp_write_uint(w->out, link->trace_high) < 0))) {
        return WRITE_ERROR;
    }
    return WRITE_DONE;
}

static int
v04_put_link_item(SpanWriter *w, OutBuf *out, const LinkFields *fields, Py_ssize_t index)
{
    (void)out;
    (void)index;
    return fields->dict != NULL ? v04_put_link(w, fields->dict)
                                : v04_put_link_values(w, &fields->values);
}

/* What spanpack._extras makes of the list, packed as plain data. */
static int
v04_write_converted(SpanWriter *w, PyObject *converter, PyObject *items, const char *field)
{
    PyObject *converted = PyObject_CallOneArg(converter, items);
    if (converted == NULL) {
        return span_reraise(w, field, NULL);
    }
    int result = pack_object(&w->value_options, w->out, converted, PACK_NEST_LIMIT);
    Py_DECREF(converted);
    return result < 0 ? span_reraise(w, field, NULL) : 0;
}

/* The v0.4 list in C, or, declined, by spanpack._extras. */
static int
v04_write_list(SpanWriter *w, PyObject *items, LinkPutFn put_link, EventPutFn put_event,
               PyObject *converter, const char *field)
{
    Py_ssize_t start = outbuf_len(w->out);
    Py_ssize_t count = field_length(w, items, field);
    if (count < 0 || mp_write_array_header(w->out, count) < 0) {
        return -1;
    }
    int written = put_each(w, w->out, items, put_link, put_event, 0);
    if (written != WRITE_DECLINED) {
        return written == WRITE_DONE ? 0 : -1;
    }
    outbuf_truncate(w->out, start);
    return v04_write_converted(w, converter, items, field);
}

int
v04_write_links(SpanWriter *w, PyObject *links)
{
    return v04_write_list(w, links, v04_put_link_item, NULL, w->state->links_for_v04, "links");
}

int
v04_write_events(SpanWriter *w, PyObject *events)
{
    return v04_write_list(w, events, NULL, v04_put_event, w->state->events_for_v04, "events");
}

/* The JSON text of the list in C, or, declined, by spanpack._extras. */
static PyObject *
json_list(SpanWriter *w, PyObject *items, LinkPutFn put_link, EventPutFn put_event,
          PyObject *converter, const char *field)
{
    OutBuf text;
    PyObject *result = NULL;
    if (outbuf_init_raw(&text, 256) < 0) {
        return NULL;
    }
    int written = json_put(&text, "[", 1);
    if (written == WRITE_DONE) {
        written = put_each(w, &text, items, put_link, put_event, 1);
    }
    if (written == WRITE_DONE) {
        written = json_put(&text, "]", 1);
    }
    if (written == WRITE_DONE) {
        result = json_text_str(&text, 0);
    }
    else if (written == WRITE_DECLINED) {
        result = PyObject_CallOneArg(converter, items);
        if (result == NULL) {
            span_reraise(w, field, NULL);
        }
    }
    outbuf_free(&text);
    return result;
}

PyObject *
links_json(SpanWriter *w, PyObject *links)
{
    return json_list(w, links, json_put_link, NULL, w->state->links_json, "links");
}

PyObject *
events_json(SpanWriter *w, PyObject *events)
{
    return json_list(w, events, NULL, json_put_event, w->state->events_json, "events");
}
