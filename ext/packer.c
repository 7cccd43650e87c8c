/* The general msgpack Packer: packing rules identical to msgpack-python's
 * Packer (same type checks in the same order, same encodings, same exception
 * types), the Packer heap type, and the module-level packb(). */
#include "packer.h"

#include "mpwrite.h"

/* pack_value() returns this when `obj` is not packable as-is and the caller
 * should hand it to the `default` callable. */
#define PACK_TRY_DEFAULT 1

static int pack_value(const PackOptions *options, OutBuf *buf, PyObject *obj, int will_default,
                      int nest_limit);

/* ---------------------------------------------------------------------------
 * Arguments read the way msgpack-python's compiled code reads them */

/* A C integer argument as msgpack-python reads it: an int (subclasses by
 * value, their hooks unused), else whatever the type's __int__ returns (so
 * 1.5 counts as 1, and an object with only __index__ is refused).  Returns a
 * new reference to an int, or NULL with an exception set. */
static PyObject *
int_arg(PyObject *arg)
{
    if (PyLong_Check(arg)) {
        return Py_NewRef(arg);
    }
    PyNumberMethods *number = Py_TYPE(arg)->tp_as_number;
    if (number == NULL || number->nb_int == NULL) {
        PyErr_Format(PyExc_TypeError, "an integer is required, not '%.200s'",
                     Py_TYPE(arg)->tp_name);
        return NULL;
    }
    PyObject *result = number->nb_int(arg);
    if (result == NULL || PyLong_CheckExact(result)) {
        return result;
    }
    if (!PyLong_Check(result)) {
        PyErr_Format(PyExc_TypeError, "__int__ returned non-int (type %.200s)",
                     Py_TYPE(result)->tp_name);
        Py_DECREF(result);
        return NULL;
    }
    /* An int subclass is accepted with the warning int() gives for it. */
    if (PyErr_WarnFormat(PyExc_DeprecationWarning, 1,
                         "__int__ returned non-int (type %.200s); returning an instance of a "
                         "strict subclass of int is deprecated",
                         Py_TYPE(result)->tp_name) < 0) {
        Py_DECREF(result);
        return NULL;
    }
    return result;
}

/* int_arg() as a long long: 0, or -1 with an exception set (OverflowError
 * when out of range). */
static int
long_long_arg(PyObject *arg, long long *out)
{
    PyObject *number = int_arg(arg);
    if (number == NULL) {
        return -1;
    }
    *out = PyLong_AsLongLong(number);
    Py_DECREF(number);
    return *out == -1 && PyErr_Occurred() ? -1 : 0;
}

/* The bytes of a C string argument as msgpack-python reads them: a str of
 * ASCII characters only (UnicodeEncodeError otherwise), bytes or bytearray,
 * subclasses included; anything else (memoryview too) is a TypeError.  The
 * pointer borrows from `arg`: use it before any Python code can run. */
static int
char_data_arg(PyObject *arg, const char **data, Py_ssize_t *size)
{
    if (PyUnicode_Check(arg)) {
        if (!PyUnicode_IS_ASCII(arg)) {
            /* Raises the UnicodeEncodeError naming the first non-ASCII
             * character; a result would mean the check above was wrong. */
            PyObject *encoded = PyUnicode_AsASCIIString(arg);
            if (encoded != NULL) {
                Py_DECREF(encoded);
                PyErr_SetString(PyExc_SystemError, "non-ASCII str encoded as ASCII");
            }
            return -1;
        }
        *data = (const char *)PyUnicode_DATA(arg);
        *size = PyUnicode_GET_LENGTH(arg);
        return 0;
    }
    if (PyByteArray_Check(arg)) {
        *data = PyByteArray_AS_STRING(arg);
        *size = PyByteArray_GET_SIZE(arg);
        return 0;
    }
    char *bytes;
    if (PyBytes_AsStringAndSize(arg, &bytes, size) < 0) {
        return -1;
    }
    *data = bytes;
    return 0;
}

/* ---------------------------------------------------------------------------
 * Scalars */

/* An int subclass goes by its own `> 0` as in msgpack-python: true packs it
 * unsigned, false signed, so a negative value whose comparison says positive
 * (or the reverse beyond int64) is out of range.  An OverflowError from the
 * comparison counts as out of range too; other errors propagate. */
/* An int beyond 64 bits: `default` gets it, else OverflowError as msgpack
 * raises it. */
static int
int_out_of_range(int will_default)
{
    if (will_default) {
        return PACK_TRY_DEFAULT;
    }
    PyErr_SetString(PyExc_OverflowError, "Integer value out of range");
    return -1;
}

static int
pack_int_subclass(OutBuf *buf, PyObject *obj, int will_default)
{
    PyObject *zero = PyLong_FromLong(0);
    if (zero == NULL) {
        return -1;
    }
    int positive = PyObject_RichCompareBool(obj, zero, Py_GT);
    Py_DECREF(zero);
    if (positive > 0) {
        unsigned long long value = PyLong_AsUnsignedLongLong(obj);
        if (!(value == (unsigned long long)-1 && PyErr_Occurred())) {
            return mp_write_uint(buf, (uint64_t)value);
        }
    }
    else if (positive == 0) {
        long long value = PyLong_AsLongLong(obj);
        if (!(value == -1 && PyErr_Occurred())) {
            return mp_write_int(buf, (int64_t)value);
        }
    }
    if (!PyErr_ExceptionMatches(PyExc_OverflowError)) {
        return -1;
    }
    PyErr_Clear();
    return int_out_of_range(will_default);
}

static int
pack_int(OutBuf *buf, PyObject *obj, int will_default)
{
    int overflow;
    long long value = PyLong_AsLongLongAndOverflow(obj, &overflow);
    if (overflow == 0) {
        if (value == -1 && PyErr_Occurred()) {
            return -1;
        }
        return mp_write_int(buf, (int64_t)value);
    }
    if (overflow > 0) {
        unsigned long long uvalue = PyLong_AsUnsignedLongLong(obj);
        if (!(uvalue == (unsigned long long)-1 && PyErr_Occurred())) {
            return mp_write_uint(buf, (uint64_t)uvalue);
        }
        if (!PyErr_ExceptionMatches(PyExc_OverflowError)) {
            return -1;
        }
        PyErr_Clear();
    }
    return int_out_of_range(will_default);
}

static int
pack_float(const PackOptions *options, OutBuf *buf, double value)
{
    if (!options->use_single_float) {
        return mp_write_double(buf, value);
    }
    if (outbuf_reserve(buf, 5) < 0) {
        return -1;
    }
    /* The C API's packer (not a bare cast) so that values beyond float range
     * raise OverflowError exactly as msgpack-python does. */
#if PY_VERSION_HEX >= 0x030B0000
    if (PyFloat_Pack4(value, buf->pos + 1, 0) < 0) {
        return -1;
    }
#else
    if (_PyFloat_Pack4(value, (unsigned char *)buf->pos + 1, 0) < 0) {
        return -1;
    }
#endif
    buf->pos[0] = (char)MP_FLOAT32;
    buf->pos += 5;
    return 0;
}

/* str and bytes bodies share this: header per use_bin_type, then the body. */
static int
pack_raw(const PackOptions *options, OutBuf *buf, const char *data, Py_ssize_t size, int as_bin,
         const char *what)
{
    if (mp_check_length(size, what) < 0 || outbuf_reserve(buf, size + 5) < 0) {
        return -1;
    }
    if (as_bin && options->use_bin_type) {
        mp_put_bin_header(buf, (uint32_t)size);
    }
    else {
        mp_put_str_header(buf, (uint32_t)size, options->use_bin_type);
    }
    memcpy(buf->pos, data, (size_t)size);
    buf->pos += size;
    return 0;
}

static int
pack_str(const PackOptions *options, OutBuf *buf, PyObject *obj)
{
    const char *data;
    Py_ssize_t size;
    if (options->unicode_errors == NULL) {
        if (PyUnicode_IS_COMPACT_ASCII(obj)) {
            data = (const char *)PyUnicode_DATA(obj);
            size = PyUnicode_GET_LENGTH(obj);
        }
        else {
            data = PyUnicode_AsUTF8AndSize(obj, &size);
            if (data == NULL) {
                return -1;
            }
        }
        return pack_raw(options, buf, data, size, 0, "unicode string");
    }
    PyObject *encoded = PyUnicode_AsEncodedString(obj, "utf-8", options->unicode_errors);
    if (encoded == NULL) {
        return -1;
    }
    int result = pack_raw(options, buf, PyBytes_AS_STRING(encoded), PyBytes_GET_SIZE(encoded), 0,
                          "unicode string");
    Py_DECREF(encoded);
    return result;
}

static int
pack_bytes_like(const PackOptions *options, OutBuf *buf, PyObject *obj)
{
    const char *data;
    Py_ssize_t size;
    if (PyBytes_Check(obj)) {
        data = PyBytes_AS_STRING(obj);
        size = PyBytes_GET_SIZE(obj);
    }
    else {
        data = PyByteArray_AS_STRING(obj);
        size = PyByteArray_GET_SIZE(obj);
    }
    return pack_raw(options, buf, data, size, 1, Py_TYPE(obj)->tp_name);
}

static int
pack_memoryview(const PackOptions *options, OutBuf *buf, PyObject *obj)
{
    Py_buffer view;
    if (PyObject_GetBuffer(obj, &view, PyBUF_SIMPLE) < 0) {
        return -1;
    }
    int result = pack_raw(options, buf, view.buf, view.len, 1, "memoryview");
    PyBuffer_Release(&view);
    return result;
}

/* ExtType(code, data), read as msgpack-python reads it: `data` as a C string
 * argument (the constructor's bytes check can be skipped by a subclass), then
 * `code` as a C long, cut to its low byte as a C char conversion does. */
static int
pack_ext_type_object(const PackOptions *options, OutBuf *buf, PyObject *obj)
{
    SpanpackState *state = options->state;
    PyObject *code_obj = NULL, *data_obj = NULL, *code_int = NULL;
    int result = -1;

    data_obj = PyObject_GetAttr(obj, state->str_data);
    if (data_obj == NULL) {
        goto done;
    }
    const char *data;
    Py_ssize_t size;
    /* Checked before `code` is read, as msgpack-python does. */
    if (char_data_arg(data_obj, &data, &size) < 0 || mp_check_length(size, "EXT data") < 0) {
        goto done;
    }
    code_obj = PyObject_GetAttr(obj, state->str_code);
    if (code_obj == NULL) {
        goto done;
    }
    code_int = int_arg(code_obj);
    if (code_int == NULL) {
        goto done;
    }
    long code = PyLong_AsLong(code_int);
    if (code == -1 && PyErr_Occurred()) {
        goto done;
    }
    /* Python code ran since char_data_arg(): read the bytes again (data_obj
     * is kept alive, but a bytearray may have been resized). */
    if (char_data_arg(data_obj, &data, &size) < 0) {
        goto done;
    }
    result = mp_write_ext(buf, (int8_t)code, data, size);
done:
    Py_XDECREF(code_int);
    Py_XDECREF(code_obj);
    Py_XDECREF(data_obj);
    return result;
}

static int
write_timestamp(OutBuf *buf, long long seconds, unsigned long nanoseconds)
{
    if (outbuf_reserve(buf, 15) < 0) {
        return -1;
    }
    mp_put_timestamp(buf, (int64_t)seconds, (uint32_t)nanoseconds);
    return 0;
}

static int
pack_timestamp_object(const PackOptions *options, OutBuf *buf, PyObject *obj)
{
    SpanpackState *state = options->state;
    PyObject *seconds_obj = NULL, *nanoseconds_obj = NULL, *nanoseconds_int = NULL;
    int result = -1;

    seconds_obj = PyObject_GetAttr(obj, state->str_seconds);
    if (seconds_obj == NULL) {
        goto done;
    }
    long long seconds;
    if (long_long_arg(seconds_obj, &seconds) < 0) {
        goto done;
    }
    nanoseconds_obj = PyObject_GetAttr(obj, state->str_nanoseconds);
    if (nanoseconds_obj == NULL) {
        goto done;
    }
    nanoseconds_int = int_arg(nanoseconds_obj);
    if (nanoseconds_int == NULL) {
        goto done;
    }
    unsigned long nanoseconds = PyLong_AsUnsignedLong(nanoseconds_int);
    if (nanoseconds == (unsigned long)-1 && PyErr_Occurred()) {
        goto done;
    }
    result = write_timestamp(buf, seconds, nanoseconds);
done:
    Py_XDECREF(seconds_obj);
    Py_XDECREF(nanoseconds_obj);
    Py_XDECREF(nanoseconds_int);
    return result;
}

/* An aware datetime as a timestamp: its distance from the Unix epoch. */
static int
pack_aware_datetime(const PackOptions *options, OutBuf *buf, PyObject *obj)
{
    SpanpackState *state = options->state;
    PyObject *delta = NULL, *days_obj = NULL, *seconds_obj = NULL, *micros_obj = NULL;
    int result = -1;

    delta = PyNumber_Subtract(obj, state->epoch);
    if (delta == NULL) {
        goto done;
    }
    if (Py_TYPE(delta) != (PyTypeObject *)state->timedelta_type) {
        PyErr_SetString(PyExc_ValueError, "failed to calculate delta");
        goto done;
    }
    days_obj = PyObject_GetAttr(delta, state->str_days);
    seconds_obj = days_obj ? PyObject_GetAttr(delta, state->str_seconds) : NULL;
    micros_obj = seconds_obj ? PyObject_GetAttr(delta, state->str_microseconds) : NULL;
    if (micros_obj == NULL) {
        goto done;
    }
    /* timedelta normalises to |days| <= 999999999, 0 <= seconds < 86400 and
     * 0 <= microseconds < 10**6, so none of this can overflow. */
    long long days = PyLong_AsLongLong(days_obj);
    long long seconds = PyLong_AsLongLong(seconds_obj);
    long long micros = PyLong_AsLongLong(micros_obj);
    if (PyErr_Occurred()) {
        goto done;
    }
    result = write_timestamp(buf, days * 86400 + seconds, (unsigned long)(micros * 1000));
done:
    Py_XDECREF(delta);
    Py_XDECREF(days_obj);
    Py_XDECREF(seconds_obj);
    Py_XDECREF(micros_obj);
    return result;
}

/* ---------------------------------------------------------------------------
 * Containers.  Each element is held by a strong reference while it is packed:
 * `default` may run Python code that empties the container. */

static int
raise_changed_size(const char *what)
{
    PyErr_Format(PyExc_RuntimeError, "%s changed size during iteration", what);
    return -1;
}

static int
pack_exact_dict(const PackOptions *options, OutBuf *buf, PyObject *dict, int nest_limit)
{
    Py_ssize_t size = PyDict_GET_SIZE(dict);
    if (mp_write_map_header(buf, size) < 0) {
        return -1;
    }
    int result = 0;
    Py_ssize_t written = 0;
    SP_BEGIN_CRITICAL_SECTION(dict);
    Py_ssize_t pos = 0;
    PyObject *key, *value;
    while (PyDict_Next(dict, &pos, &key, &value)) {
        /* `default` may replace entries without changing the size: never
         * write more (or fewer) pairs than the header counts. */
        if (written++ == size) {
            result = raise_changed_size("dictionary");
            break;
        }
        Py_INCREF(key);
        Py_INCREF(value);
        result = pack_object(options, buf, key, nest_limit);
        if (result == 0) {
            result = pack_object(options, buf, value, nest_limit);
        }
        Py_DECREF(key);
        Py_DECREF(value);
        if (result == 0 && PyDict_GET_SIZE(dict) != size) {
            result = raise_changed_size("dictionary");
        }
        if (result < 0) {
            break;
        }
    }
    if (result == 0 && written != size) {
        result = raise_changed_size("dictionary");
    }
    SP_END_CRITICAL_SECTION();
    return result;
}

/* Unpack one (key, value) pair produced by a mapping's items(). */
static int
pack_item_pair(const PackOptions *options, OutBuf *buf, PyObject *pair, int nest_limit)
{
    PyObject *tuple = PySequence_Tuple(pair);
    if (tuple == NULL) {
        return -1;
    }
    int result = -1;
    if (PyTuple_GET_SIZE(tuple) != 2) {
        PyErr_Format(PyExc_ValueError, "expected a (key, value) pair, got %zd items",
                     PyTuple_GET_SIZE(tuple));
    }
    else if (pack_object(options, buf, PyTuple_GET_ITEM(tuple, 0), nest_limit) == 0) {
        result = pack_object(options, buf, PyTuple_GET_ITEM(tuple, 1), nest_limit);
    }
    Py_DECREF(tuple);
    return result;
}

/* `size` items from iterating `iterable`: an array of values (list and tuple
 * subclasses: the header counts ob_size, the items come from iterating, as in
 * msgpack-python) or, with `as_map`, a map from (key, value) pairs (dict
 * subclasses through their items(), and Packer.pack_map_pairs).  A count that
 * does not match the header raises instead of writing a corrupt container. */
static int
pack_iterated(const PackOptions *options, OutBuf *buf, PyObject *iterable, Py_ssize_t size,
              int nest_limit, int as_map)
{
    PyObject *iterator = NULL, *item = NULL;
    Py_ssize_t count = 0;
    int result = -1;

    if ((as_map ? mp_write_map_header(buf, size) : mp_write_array_header(buf, size)) < 0) {
        goto done;
    }
    iterator = PyObject_GetIter(iterable);
    if (iterator == NULL) {
        goto done;
    }
    while ((item = PyIter_Next(iterator)) != NULL) {
        if (++count > size || (as_map ? pack_item_pair(options, buf, item, nest_limit)
                                      : pack_object(options, buf, item, nest_limit)) < 0) {
            break;
        }
        Py_CLEAR(item);
    }
    if (PyErr_Occurred()) {
        goto done;
    }
    if (count != size) {
        raise_changed_size(as_map ? "mapping" : "sequence");
        goto done;
    }
    result = 0;
done:
    Py_XDECREF(item);
    Py_XDECREF(iterator);
    return result;
}

static int
pack_dict_subclass(const PackOptions *options, OutBuf *buf, PyObject *obj, int nest_limit)
{
    Py_ssize_t size = PyObject_Size(obj);
    if (size < 0) {
        return -1;
    }
    PyObject *items = PyObject_CallMethodObjArgs(obj, options->state->str_items, NULL);
    if (items == NULL) {
        return -1;
    }
    int result = pack_iterated(options, buf, items, size, nest_limit, 1);
    Py_DECREF(items);
    return result;
}

static int
pack_exact_list(const PackOptions *options, OutBuf *buf, PyObject *list, int nest_limit)
{
    Py_ssize_t size = PyList_GET_SIZE(list);
    if (mp_write_array_header(buf, size) < 0) {
        return -1;
    }
    int result = 0;
    SP_BEGIN_CRITICAL_SECTION(list);
    for (Py_ssize_t i = 0; i < size; i++) {
        if (PyList_GET_SIZE(list) != size) {
            result = raise_changed_size("list");
            break;
        }
        PyObject *item = PyList_GET_ITEM(list, i);
        Py_INCREF(item);
        result = pack_object(options, buf, item, nest_limit);
        Py_DECREF(item);
        if (result < 0) {
            break;
        }
    }
    SP_END_CRITICAL_SECTION();
    return result;
}

static int
pack_exact_tuple(const PackOptions *options, OutBuf *buf, PyObject *tuple, int nest_limit)
{
    /* A tuple is immutable and our caller holds it, so its items stay alive. */
    Py_ssize_t size = PyTuple_GET_SIZE(tuple);
    if (mp_write_array_header(buf, size) < 0) {
        return -1;
    }
    for (Py_ssize_t i = 0; i < size; i++) {
        if (pack_object(options, buf, PyTuple_GET_ITEM(tuple, i), nest_limit) < 0) {
            return -1;
        }
    }
    return 0;
}

/* ---------------------------------------------------------------------------
 * Dispatch */

static int
is_datetime_with_tzinfo(const PackOptions *options, PyObject *obj, int *has_tzinfo)
{
    PyObject *tzinfo = PyObject_GetAttr(obj, options->state->str_tzinfo);
    if (tzinfo == NULL) {
        return -1;
    }
    *has_tzinfo = tzinfo != Py_None;
    Py_DECREF(tzinfo);
    return 0;
}

/* Everything that is not one of the common exact types, checked in
 * msgpack-python's order (which decides where subclasses go). */
static SP_NOINLINE int
pack_value_slow(const PackOptions *options, OutBuf *buf, PyObject *obj, int will_default,
                int nest_limit)
{
    SpanpackState *state = options->state;
    const int strict = options->strict_types;
    PyTypeObject *type = Py_TYPE(obj);

    if (type == &PyLong_Type) {
        return pack_int(buf, obj, will_default);
    }
    if (!strict && PyLong_Check(obj)) {
        return pack_int_subclass(buf, obj, will_default);
    }
    if (strict ? type == &PyFloat_Type : PyFloat_Check(obj)) {
        return pack_float(options, buf, PyFloat_AS_DOUBLE(obj));
    }
    if (strict ? (type == &PyBytes_Type || type == &PyByteArray_Type)
               : (PyBytes_Check(obj) || PyByteArray_Check(obj))) {
        return pack_bytes_like(options, buf, obj);
    }
    if (strict ? type == &PyUnicode_Type : PyUnicode_Check(obj)) {
        return pack_str(options, buf, obj);
    }
    if (strict ? type == &PyDict_Type : PyDict_Check(obj)) {
        return PyDict_CheckExact(obj) ? pack_exact_dict(options, buf, obj, nest_limit)
                                      : pack_dict_subclass(options, buf, obj, nest_limit);
    }
    /* ExtType is a tuple subclass, so it must come before tuples. */
    if (strict ? (PyObject *)type == state->ext_type
               : PyObject_TypeCheck(obj, (PyTypeObject *)state->ext_type)) {
        return pack_ext_type_object(options, buf, obj);
    }
    if ((PyObject *)type == state->timestamp_type) {
        return pack_timestamp_object(options, buf, obj);
    }
    if (strict ? type == &PyList_Type : (PyList_Check(obj) || PyTuple_Check(obj))) {
        if (type == &PyList_Type) {
            return pack_exact_list(options, buf, obj, nest_limit);
        }
        if (type == &PyTuple_Type) {
            return pack_exact_tuple(options, buf, obj, nest_limit);
        }
        return pack_iterated(options, buf, obj, Py_SIZE(obj), nest_limit, 0);
    }
    if (PyMemoryView_Check(obj)) {
        return pack_memoryview(options, buf, obj);
    }
    int is_datetime = options->datetime && (PyObject *)type == state->datetime_type;
    int has_tzinfo = 0;
    if (is_datetime && is_datetime_with_tzinfo(options, obj, &has_tzinfo) < 0) {
        return -1;
    }
    if (is_datetime && has_tzinfo) {
        return pack_aware_datetime(options, buf, obj);
    }
    if (will_default) {
        return PACK_TRY_DEFAULT;
    }
    if (is_datetime) {
        PyErr_Format(PyExc_ValueError, "can not serialize '%.200s' object where tzinfo=None",
                     type->tp_name);
        return -1;
    }
    PyErr_Format(PyExc_TypeError, "can not serialize '%.200s' object", type->tp_name);
    return -1;
}

static inline int
pack_value(const PackOptions *options, OutBuf *buf, PyObject *obj, int will_default, int nest_limit)
{
    PyTypeObject *type = Py_TYPE(obj);
    if (type == &PyUnicode_Type) {
        return pack_str(options, buf, obj);
    }
    if (type == &PyLong_Type) {
        return pack_int(buf, obj, will_default);
    }
    if (type == &PyFloat_Type) {
        return pack_float(options, buf, PyFloat_AS_DOUBLE(obj));
    }
    if (obj == Py_None) {
        return mp_write_byte(buf, MP_NIL);
    }
    if (type == &PyBool_Type) {
        return mp_write_byte(buf, obj == Py_True ? MP_TRUE : MP_FALSE);
    }
    if (type == &PyDict_Type) {
        return pack_exact_dict(options, buf, obj, nest_limit);
    }
    if (type == &PyList_Type) {
        return pack_exact_list(options, buf, obj, nest_limit);
    }
    if (type == &PyBytes_Type) {
        return pack_bytes_like(options, buf, obj);
    }
    if (type == &PyTuple_Type && !options->strict_types) {
        return pack_exact_tuple(options, buf, obj, nest_limit);
    }
    return pack_value_slow(options, buf, obj, will_default, nest_limit);
}

int
pack_object(const PackOptions *options, OutBuf *buf, PyObject *obj, int nest_limit)
{
    if (nest_limit < 0) {
        PyErr_SetString(PyExc_ValueError, "recursion limit exceeded.");
        return -1;
    }
    nest_limit--;
    if (options->default_fn == NULL) {
        return pack_value(options, buf, obj, 0, nest_limit);
    }
    int result = pack_value(options, buf, obj, 1, nest_limit);
    if (result != PACK_TRY_DEFAULT) {
        return result;
    }
    PyObject *replacement = PyObject_CallOneArg(options->default_fn, obj);
    if (replacement == NULL) {
        return -1;
    }
    result = pack_value(options, buf, replacement, 0, nest_limit);
    Py_DECREF(replacement);
    return result;
}

/* ---------------------------------------------------------------------------
 * Options shared by Packer() and packb() */

typedef struct {
    PyObject *default_fn;
    PyObject *use_single_float;
    PyObject *autoreset;
    PyObject *use_bin_type;
    PyObject *strict_types;
    PyObject *datetime;
    PyObject *unicode_errors;
    PyObject *buf_size;
} OptionArgs; /* borrowed references; NULL when not given */

#define PACKER_DEFAULT_BUF_SIZE 1024

static int
flag_value(PyObject *arg, int default_value, int *out)
{
    if (arg == NULL) {
        *out = default_value;
        return 0;
    }
    int truth = PyObject_IsTrue(arg);
    if (truth < 0) {
        return -1;
    }
    *out = truth;
    return 0;
}

/* unicode_errors as msgpack-python takes it (a C string argument: an ASCII
 * str, bytes or bytearray), copied so that a later change to a bytearray
 * cannot reach the packer.  Returns a new bytes object or NULL. */
static PyObject *
unicode_errors_arg(PyObject *arg)
{
    const char *data;
    Py_ssize_t size;
    if (char_data_arg(arg, &data, &size) < 0) {
        return NULL;
    }
    return PyBytes_FromStringAndSize(data, size);
}

/* buf_size as msgpack-python takes it: a C size_t (int_arg() rules).  A size
 * no allocation can satisfy is the MemoryError msgpack-python's would give. */
static int
buf_size_arg(PyObject *arg, Py_ssize_t *out)
{
    PyObject *number = int_arg(arg);
    if (number == NULL) {
        return -1;
    }
    size_t size = PyLong_AsSize_t(number);
    Py_DECREF(number);
    if (size == (size_t)-1 && PyErr_Occurred()) {
        return -1;
    }
    if (size > (size_t)PY_SSIZE_T_MAX) {
        PyErr_NoMemory();
        return -1;
    }
    *out = (Py_ssize_t)size;
    return 0;
}

/* Validate arguments into `options`.  On success *unicode_errors_out is a
 * new reference to the bytes that options->unicode_errors points into, or
 * NULL. */
static int
options_from_args(SpanpackState *state, const OptionArgs *args, PackOptions *options,
                  int *autoreset, Py_ssize_t *buf_size, PyObject **unicode_errors_out)
{
    memset(options, 0, sizeof *options);
    options->state = state;
    *unicode_errors_out = NULL;
    /* msgpack-python converts buf_size first, then the rest in order. */
    *buf_size = PACKER_DEFAULT_BUF_SIZE;
    if (args->buf_size != NULL && args->buf_size != Py_None &&
        buf_size_arg(args->buf_size, buf_size) < 0) {
        return -1;
    }
    if (flag_value(args->use_single_float, 0, &options->use_single_float) < 0 ||
        flag_value(args->autoreset, 1, autoreset) < 0 ||
        flag_value(args->use_bin_type, 1, &options->use_bin_type) < 0 ||
        flag_value(args->strict_types, 0, &options->strict_types) < 0 ||
        flag_value(args->datetime, 0, &options->datetime) < 0) {
        return -1;
    }
    if (args->default_fn != NULL && args->default_fn != Py_None) {
        if (!PyCallable_Check(args->default_fn)) {
            PyErr_SetString(PyExc_TypeError, "default must be a callable.");
            return -1;
        }
        options->default_fn = args->default_fn;
    }
    if (args->unicode_errors != NULL && args->unicode_errors != Py_None) {
        PyObject *errors = unicode_errors_arg(args->unicode_errors);
        if (errors == NULL) {
            return -1;
        }
        options->unicode_errors = PyBytes_AS_STRING(errors);
        *unicode_errors_out = errors;
    }
    return 0;
}

/* ---------------------------------------------------------------------------
 * Packer type */

typedef struct {
    PyObject_HEAD
    PackOptions options;      /* options.default_fn borrows default_fn below */
    PyObject *default_fn;     /* strong reference or NULL */
    PyObject *unicode_errors; /* bytes holding options.unicode_errors' text */
    OutBuf buf;
    Py_ssize_t exports; /* live buffer-protocol views of `buf` */
    int packing;        /* a pack is under way (its `default` may call back in) */
    int autoreset;
} PackerObject;

static PyObject *
packer_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    (void)args;
    (void)kwargs;
    SpanpackState *state = spanpack_state_from_type(type);
    if (state == NULL) {
        return NULL;
    }
    PackerObject *self = (PackerObject *)type->tp_alloc(type, 0);
    if (self == NULL) {
        return NULL;
    }
    self->options.state = state;
    self->options.use_bin_type = 1;
    self->autoreset = 1;
    if (outbuf_init_raw(&self->buf, PACKER_DEFAULT_BUF_SIZE) < 0) {
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

/* May the buffer change now?  Not while a view of it is exported, nor from
 * a `default` callback in the middle of packing into it. */
static int
packer_check_exports(PackerObject *self)
{
    if (self->exports > 0) {
        PyErr_SetString(PyExc_BufferError, "Existing exports of data: Packer cannot be changed");
        return -1;
    }
    if (self->packing) {
        PyErr_SetString(PyExc_RuntimeError, "Packer is already packing (called from default?)");
        return -1;
    }
    return 0;
}

static int
packer_init(PackerObject *self, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"default",        "use_single_float", "autoreset",
                               "use_bin_type",   "strict_types",     "datetime",
                               "unicode_errors", "buf_size",         NULL};
    OptionArgs option_args = {0};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|$OOOOOOOO:Packer", keywords,
                                     &option_args.default_fn, &option_args.use_single_float,
                                     &option_args.autoreset, &option_args.use_bin_type,
                                     &option_args.strict_types, &option_args.datetime,
                                     &option_args.unicode_errors, &option_args.buf_size)) {
        return -1;
    }
    int result = -1;
    SP_BEGIN_CRITICAL_SECTION(self);
    PackOptions options;
    int autoreset;
    Py_ssize_t buf_size;
    PyObject *unicode_errors;
    if (packer_check_exports(self) == 0 &&
        options_from_args(self->options.state, &option_args, &options, &autoreset, &buf_size,
                          &unicode_errors) == 0) {
        /* Grow first: a failed __init__ leaves the packer as it was. */
        if (buf_size > outbuf_capacity(&self->buf) && outbuf_len(&self->buf) == 0 &&
            outbuf_grow(&self->buf, buf_size) < 0) {
            Py_XDECREF(unicode_errors);
        }
        else {
            Py_XINCREF(options.default_fn);
            Py_XSETREF(self->default_fn, options.default_fn);
            Py_XSETREF(self->unicode_errors, unicode_errors);
            self->options = options;
            self->autoreset = autoreset;
            result = 0;
        }
    }
    SP_END_CRITICAL_SECTION();
    return result;
}

static int
packer_traverse(PackerObject *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(self->default_fn);
    return 0;
}

static int
packer_clear(PackerObject *self)
{
    self->options.default_fn = NULL;
    Py_CLEAR(self->default_fn);
    return 0;
}

static void
packer_dealloc(PackerObject *self)
{
    PyTypeObject *type = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    packer_clear(self);
    self->options.unicode_errors = NULL;
    Py_CLEAR(self->unicode_errors);
    outbuf_free(&self->buf);
    type->tp_free((PyObject *)self);
    Py_DECREF(type);
}

/* The common tail of every writing method: with autoreset, hand the buffer's
 * contents out as bytes and empty it; otherwise return None. */
static PyObject *
packer_result(PackerObject *self)
{
    if (!self->autoreset) {
        Py_RETURN_NONE;
    }
    PyObject *result = PyBytes_FromStringAndSize(self->buf.start, outbuf_len(&self->buf));
    outbuf_truncate(&self->buf, 0);
    return result;
}

static PyObject *
packer_pack(PackerObject *self, PyObject *obj)
{
    PyObject *result = NULL;
    SP_BEGIN_CRITICAL_SECTION(self);
    if (packer_check_exports(self) == 0) {
        /* A failed pack leaves earlier (autoreset=False) output untouched. */
        Py_ssize_t before = outbuf_len(&self->buf);
        self->packing = 1;
        int packed = pack_object(&self->options, &self->buf, obj, PACK_NEST_LIMIT);
        self->packing = 0;
        if (packed == 0) {
            result = packer_result(self);
        }
        else {
            outbuf_truncate(&self->buf, before);
        }
    }
    SP_END_CRITICAL_SECTION();
    return result;
}

/* size argument of pack_array_header / pack_map_header (the header writer
 * checks the upper limit). */
static int
header_size_arg(PyObject *arg, const char *what, long long *size)
{
    long long value;
    if (long_long_arg(arg, &value) < 0) {
        return -1;
    }
    if (value < 0) {
        PyErr_Format(PyExc_ValueError, "%s size must be non-negative", what);
        return -1;
    }
    *size = value;
    return 0;
}

static PyObject *
packer_pack_header(PackerObject *self, PyObject *arg, int is_map)
{
    PyObject *result = NULL;
    long long size;
    if (header_size_arg(arg, is_map ? "map" : "array", &size) < 0) {
        return NULL;
    }
    SP_BEGIN_CRITICAL_SECTION(self);
    if (packer_check_exports(self) == 0 &&
        (is_map ? mp_write_map_header(&self->buf, size)
                : mp_write_array_header(&self->buf, size)) == 0) {
        result = packer_result(self);
    }
    SP_END_CRITICAL_SECTION();
    return result;
}

static PyObject *
packer_pack_array_header(PackerObject *self, PyObject *arg)
{
    return packer_pack_header(self, arg, 0);
}

static PyObject *
packer_pack_map_header(PackerObject *self, PyObject *arg)
{
    return packer_pack_header(self, arg, 1);
}

static PyObject *
packer_pack_map_pairs(PackerObject *self, PyObject *pairs)
{
    Py_ssize_t size = PyObject_Size(pairs);
    if (size < 0) {
        return NULL;
    }
    PyObject *result = NULL;
    SP_BEGIN_CRITICAL_SECTION(self);
    if (packer_check_exports(self) == 0) {
        Py_ssize_t before = outbuf_len(&self->buf);
        /* Keys and values nest one level below the map, as in pack(). */
        self->packing = 1;
        int packed = pack_iterated(&self->options, &self->buf, pairs, size, PACK_NEST_LIMIT, 1);
        self->packing = 0;
        if (packed == 0) {
            result = packer_result(self);
        }
        else {
            outbuf_truncate(&self->buf, before);
        }
    }
    SP_END_CRITICAL_SECTION();
    return result;
}

static PyObject *
packer_pack_ext_type(PackerObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError, "pack_ext_type() takes exactly 2 arguments (%zd given)",
                     nargs);
        return NULL;
    }
    PyObject *data = args[1];
    /* msgpack-python's order: len(data), the code, then the bytes of data. */
    Py_ssize_t length = PyObject_Size(data);
    if (length < 0) {
        return NULL;
    }
    if (mp_check_length(length, "ext data") < 0) {
        return NULL;
    }
    PyObject *code_int = int_arg(args[0]);
    if (code_int == NULL) {
        return NULL;
    }
    long code = PyLong_AsLong(code_int);
    Py_DECREF(code_int);
    if (code == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (code < -128 || code > 127) {
        PyErr_SetString(PyExc_OverflowError, "value too large to convert to char");
        return NULL;
    }
    /* The real size of the bytes, not len(): a subclass's __len__ may lie. */
    const char *bytes;
    Py_ssize_t size;
    if (char_data_arg(data, &bytes, &size) < 0) {
        return NULL;
    }
    if (mp_check_length(size, "ext data") < 0) {
        return NULL;
    }
    PyObject *result = NULL;
    SP_BEGIN_CRITICAL_SECTION(self);
    if (packer_check_exports(self) == 0 &&
        mp_write_ext(&self->buf, (int8_t)code, bytes, size) == 0) {
        result = packer_result(self);
    }
    SP_END_CRITICAL_SECTION();
    return result;
}

static PyObject *
packer_reset(PackerObject *self, PyObject *Py_UNUSED(ignored))
{
    PyObject *result = NULL;
    SP_BEGIN_CRITICAL_SECTION(self);
    if (packer_check_exports(self) == 0) {
        outbuf_truncate(&self->buf, 0);
        result = Py_NewRef(Py_None);
    }
    SP_END_CRITICAL_SECTION();
    return result;
}

static PyObject *
packer_bytes(PackerObject *self, PyObject *Py_UNUSED(ignored))
{
    PyObject *result;
    SP_BEGIN_CRITICAL_SECTION(self);
    result = PyBytes_FromStringAndSize(self->buf.start, outbuf_len(&self->buf));
    SP_END_CRITICAL_SECTION();
    return result;
}

static PyObject *
packer_getbuffer(PackerObject *self, PyObject *Py_UNUSED(ignored))
{
    return PyMemoryView_FromObject((PyObject *)self);
}

static int
packer_getbuffer_slot(PackerObject *self, Py_buffer *view, int flags)
{
    int result;
    SP_BEGIN_CRITICAL_SECTION(self);
    if (self->packing) {
        /* The buffer may still move: no view of it until packing ends. */
        PyErr_SetString(PyExc_BufferError, "Packer is packing; its buffer cannot be exported now");
        view->obj = NULL;
        result = -1;
    }
    else {
        result = PyBuffer_FillInfo(view, (PyObject *)self, self->buf.start, outbuf_len(&self->buf),
                                   1, flags);
    }
    if (result == 0) {
        self->exports++;
    }
    SP_END_CRITICAL_SECTION();
    return result;
}

static void
packer_releasebuffer_slot(PackerObject *self, Py_buffer *view)
{
    (void)view;
    SP_BEGIN_CRITICAL_SECTION(self);
    self->exports--;
    SP_END_CRITICAL_SECTION();
}

static PyMethodDef packer_methods[] = {
    {"pack", (PyCFunction)packer_pack, METH_O,
     "pack($self, obj, /)\n--\n\nPack obj: the bytes with autoreset, else None."},
    {"pack_array_header", (PyCFunction)packer_pack_array_header, METH_O,
     "pack_array_header($self, n, /)\n--\n\nWrite an array header for n items."},
    {"pack_map_header", (PyCFunction)packer_pack_map_header, METH_O,
     "pack_map_header($self, n, /)\n--\n\nWrite a map header for n pairs."},
    {"pack_map_pairs", (PyCFunction)packer_pack_map_pairs, METH_O,
     "pack_map_pairs($self, pairs, /)\n--\n\nWrite a map from a sized iterable of (key, value) "
     "pairs."},
    {"pack_ext_type", (PyCFunction)(void (*)(void))packer_pack_ext_type, METH_FASTCALL,
     "pack_ext_type($self, code, data, /)\n--\n\nWrite an ext value."},
    {"reset", (PyCFunction)packer_reset, METH_NOARGS,
     "reset($self, /)\n--\n\nEmpty the internal buffer."},
    {"bytes", (PyCFunction)packer_bytes, METH_NOARGS,
     "bytes($self, /)\n--\n\nThe internal buffer's contents as bytes."},
    {"getbuffer", (PyCFunction)packer_getbuffer, METH_NOARGS,
     "getbuffer($self, /)\n--\n\nA memoryview of the internal buffer."},
    {NULL, NULL, 0, NULL},
};

PyDoc_STRVAR(packer_doc,
             "Packer(*, default=None, use_single_float=False, autoreset=True, "
             "use_bin_type=True, strict_types=False, datetime=False, unicode_errors=None, "
             "buf_size=None)\n--\n\n"
             "msgpack serializer with the options, methods and output of msgpack-python's "
             "Packer.");

static PyType_Slot packer_slots[] = {
    {Py_tp_doc, (void *)packer_doc},
    {Py_tp_new, packer_new},
    {Py_tp_init, packer_init},
    {Py_tp_dealloc, packer_dealloc},
    {Py_tp_traverse, packer_traverse},
    {Py_tp_clear, packer_clear},
    {Py_tp_methods, packer_methods},
    {Py_bf_getbuffer, packer_getbuffer_slot},
    {Py_bf_releasebuffer, packer_releasebuffer_slot},
    {0, NULL},
};

static PyType_Spec packer_spec = {
    .name = "spanpack.Packer",
    .basicsize = sizeof(PackerObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .slots = packer_slots,
};

/* ---------------------------------------------------------------------------
 * packb(obj, **options) */

#define PACKB_INITIAL_CAPACITY 128

static int
packb_parse_kwargs(PyObject *const *values, PyObject *kwnames, OptionArgs *args)
{
    static const char *const names[] = {"default",        "use_single_float", "autoreset",
                                        "use_bin_type",   "strict_types",     "datetime",
                                        "unicode_errors", "buf_size"};
    PyObject **slots[] = {&args->default_fn,     &args->use_single_float, &args->autoreset,
                          &args->use_bin_type,   &args->strict_types,     &args->datetime,
                          &args->unicode_errors, &args->buf_size};
    Py_ssize_t count = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *name = PyTuple_GET_ITEM(kwnames, i);
        size_t j = 0;
        while (j < sizeof names / sizeof names[0] &&
               PyUnicode_CompareWithASCIIString(name, names[j]) != 0) {
            j++;
        }
        if (j == sizeof names / sizeof names[0]) {
            PyErr_Format(PyExc_TypeError, "packb() got an unexpected keyword argument '%U'", name);
            return -1;
        }
        *slots[j] = values[i];
    }
    return 0;
}

PyObject *
spanpack_packb(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    if (nargs != 1) {
        PyErr_Format(PyExc_TypeError, "packb() takes exactly 1 positional argument (%zd given)",
                     nargs);
        return NULL;
    }
    PackOptions options;
    OptionArgs option_args = {0};
    int autoreset;
    Py_ssize_t buf_size;
    PyObject *unicode_errors;
    OutBuf buf;
    if (packb_parse_kwargs(args + nargs, kwnames, &option_args) < 0 ||
        options_from_args(spanpack_state_from_module(module), &option_args, &options, &autoreset,
                          &buf_size, &unicode_errors) < 0) {
        return NULL;
    }
    PyObject *result = NULL;
    if (outbuf_init_bytes(&buf, PACKB_INITIAL_CAPACITY) < 0) {
        goto done;
    }
    if (pack_object(&options, &buf, args[0], PACK_NEST_LIMIT) < 0) {
        outbuf_free(&buf);
        goto done;
    }
    if (!autoreset) {
        /* Packer(autoreset=False).pack() returns None, and so does packb. */
        outbuf_free(&buf);
        result = Py_NewRef(Py_None);
        goto done;
    }
    result = outbuf_finish_bytes(&buf);
done:
    Py_XDECREF(unicode_errors);
    return result;
}

int
packer_module_init(PyObject *module, SpanpackState *state)
{
    state->packer_type = (PyTypeObject *)PyType_FromModuleAndSpec(module, &packer_spec, NULL);
    if (state->packer_type == NULL) {
        return -1;
    }
    return PyModule_AddType(module, state->packer_type);
}
