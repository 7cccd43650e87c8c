/* JSON text as json.dumps writes it by default (see jsontext.h).  The rules
 * are those of CPython's json encoder (Lib/json/encoder.py, Modules/_json.c):
 * str escaped to ASCII, int (within 64 bits) and float by int.__repr__ and
 * float.__repr__ whatever their class, NaN and the infinities by name, lists, tuples and
 * dicts in their own order. */
#include "jsontext.h"
#include "pyint.h"

#include <math.h>
#include <string.h>

static const char hex_digits[] = "0123456789abcdef";

/* "\\u" and four lowercase hex digits. */
static inline char *
put_unicode_escape(char *p, Py_UCS4 unit)
{
    p[0] = '\\';
    p[1] = 'u';
    p[2] = hex_digits[(unit >> 12) & 0xf];
    p[3] = hex_digits[(unit >> 8) & 0xf];
    p[4] = hex_digits[(unit >> 4) & 0xf];
    p[5] = hex_digits[unit & 0xf];
    return p + 6;
}

/* The letter of a two-character escape ("\\n"), or 0 for none. */
static inline char
short_escape(Py_UCS4 c)
{
    switch (c) {
    case '\\':
        return '\\';
    case '"':
        return '"';
    case '\b':
        return 'b';
    case '\f':
        return 'f';
    case '\n':
        return 'n';
    case '\r':
        return 'r';
    case '\t':
        return 't';
    default:
        return 0;
    }
}

/* One character, escaped as json's ensure_ascii escapes it. */
static inline char *
put_json_char(char *p, Py_UCS4 c)
{
    if (c >= ' ' && c <= '~' && c != '\\' && c != '"') {
        *p++ = (char)c;
        return p;
    }
    char letter = short_escape(c);
    if (letter != 0) {
        p[0] = '\\';
        p[1] = letter;
        return p + 2;
    }
    if (c >= 0x10000) {
        /* A surrogate pair, each half escaped. */
        Py_UCS4 offset = c - 0x10000;
        p = put_unicode_escape(p, 0xd800 | ((offset >> 10) & 0x3ff));
        return put_unicode_escape(p, 0xdc00 | (offset & 0x3ff));
    }
    return put_unicode_escape(p, c);
}

static int
write_json_str(OutBuf *out, PyObject *str)
{
    Py_ssize_t length = PyUnicode_GET_LENGTH(str);
    int kind = PyUnicode_KIND(str);
    /* The longest escape of one character: 6 bytes, 12 for a pair. */
    Py_ssize_t per_char = kind == PyUnicode_4BYTE_KIND ? 12 : 6;
    if (length > (PY_SSIZE_T_MAX - 2) / per_char) {
        PyErr_NoMemory();
        return -1;
    }
    if (outbuf_reserve(out, 2 + length * per_char) < 0) {
        return -1;
    }
    char *p = out->pos;
    *p++ = '"';
    if (PyUnicode_IS_ASCII(str)) {
        const unsigned char *text = (const unsigned char *)PyUnicode_1BYTE_DATA(str);
        Py_ssize_t i = 0;
        while (i < length) {
            /* Copy the run that needs no escape in one go. */
            Py_ssize_t run = i;
            while (run < length && text[run] >= ' ' && text[run] <= '~' && text[run] != '\\' &&
                   text[run] != '"') {
                run++;
            }
            memcpy(p, text + i, (size_t)(run - i));
            p += run - i;
            if (run < length) {
                p = put_json_char(p, text[run]);
                run++;
            }
            i = run;
        }
    }
    else {
        const void *data = PyUnicode_DATA(str);
        for (Py_ssize_t i = 0; i < length; i++) {
            p = put_json_char(p, PyUnicode_READ(kind, data, i));
        }
    }
    *p++ = '"';
    out->pos = p;
    return 0;
}

/* An int of at most 64 bits, either sign, as int.__repr__ writes it, whatever its class (json
 * calls int's own repr, never a subclass's): 1.  Declined (0) beyond that:
 * int.__repr__ may refuse (sys.set_int_max_str_digits), its error then naming
 * no span, and from CPython 3.12 a long one runs Python code (_pylong), during
 * which the containers being walked here, held without references, could
 * change or be freed.  json.dumps takes such an int whole. */
static int
write_json_int(OutBuf *out, PyObject *value)
{
    int negative;
    uint64_t magnitude;
    if (pyint_magnitude64_api(value, &magnitude, &negative) != 0) {
        return 0;
    }
    char digits[24];
    char *end = digits + sizeof digits, *p = signed_decimal64_put(end, magnitude, negative);
    return outbuf_write(out, p, end - p) < 0 ? -1 : 1;
}

static int
write_json_float(OutBuf *out, PyObject *value)
{
    double number = PyFloat_AS_DOUBLE(value);
    if (!isfinite(number)) {
        /* (Each name with its own constant size: the copy's length stays
         * known to the compiler.) */
        if (isnan(number)) {
            return outbuf_write(out, "NaN", 3);
        }
        return number > 0 ? outbuf_write(out, "Infinity", 8) : outbuf_write(out, "-Infinity", 9);
    }
    /* float.__repr__'s own formatting. */
    char *text = PyOS_double_to_string(number, 'r', 0, Py_DTSF_ADD_DOT_0, NULL);
    if (text == NULL) {
        return -1;
    }
    int result = outbuf_write(out, text, (Py_ssize_t)strlen(text));
    PyMem_Free(text);
    return result;
}

static int
write_json_array(OutBuf *out, PyObject *sequence, int depth)
{
    /* A list may change while items are written (nothing written here runs
     * Python code, but the length is read afresh each time anyway). */
    if (outbuf_write(out, "[", 1) < 0) {
        return -1;
    }
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(sequence); i++) {
        if (i > 0 && outbuf_write(out, ", ", 2) < 0) {
            return -1;
        }
        int written = json_text_write(out, PySequence_Fast_GET_ITEM(sequence, i), depth + 1);
        if (written <= 0) {
            return written;
        }
    }
    return outbuf_write(out, "]", 1) < 0 ? -1 : 1;
}

static int
write_json_object(OutBuf *out, PyObject *dict, int depth)
{
    if (outbuf_write(out, "{", 1) < 0) {
        return -1;
    }
    Py_ssize_t position = 0, index = 0;
    PyObject *key, *item;
    while (PyDict_Next(dict, &position, &key, &item)) {
        if (!PyUnicode_Check(key)) {
            return 0; /* json converts or refuses other keys */
        }
        if ((index++ > 0 && outbuf_write(out, ", ", 2) < 0) || write_json_str(out, key) < 0 ||
            outbuf_write(out, ": ", 2) < 0) {
            return -1;
        }
        int written = json_text_write(out, item, depth + 1);
        if (written <= 0) {
            return written;
        }
    }
    return outbuf_write(out, "}", 1) < 0 ? -1 : 1;
}

int
json_text_write(OutBuf *out, PyObject *value, int depth)
{
    if (depth > JSON_TEXT_MAX_DEPTH) {
        return 0;
    }
    if (value == Py_None) {
        return outbuf_write(out, "null", 4) < 0 ? -1 : 1;
    }
    if (value == Py_True) {
        return outbuf_write(out, "true", 4) < 0 ? -1 : 1;
    }
    if (value == Py_False) {
        return outbuf_write(out, "false", 5) < 0 ? -1 : 1;
    }
    if (PyUnicode_Check(value)) {
        return write_json_str(out, value) < 0 ? -1 : 1;
    }
    if (PyLong_Check(value)) {
        return write_json_int(out, value);
    }
    if (PyFloat_Check(value)) {
        return write_json_float(out, value) < 0 ? -1 : 1;
    }
    if (PyList_CheckExact(value) || PyTuple_CheckExact(value)) {
        return write_json_array(out, value, depth);
    }
    if (PyDict_CheckExact(value)) {
        return write_json_object(out, value, depth);
    }
    return 0;
}

PyObject *
json_text_str(const OutBuf *out, Py_ssize_t start)
{
    Py_ssize_t size = outbuf_len(out) - start;
    PyObject *str = PyUnicode_New(size, 127);
    if (str != NULL) {
        memcpy(PyUnicode_1BYTE_DATA(str), out->start + start, (size_t)size);
    }
    return str;
}
