/* Shared span-writing rules: locations in errors, text, ids, trace-level
 * values. */
#include "spanwrite.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>

/* "trace T, span S, FIELD[ KEY]" */
static PyObject *
location_text(SpanWriter *w, const char *field, PyObject *key)
{
    if (key != NULL) {
        return PyUnicode_FromFormat("trace %zd, span %zd, %s key %R", w->trace_index, w->span_index,
                                    field, key);
    }
    return PyUnicode_FromFormat("trace %zd, span %zd, %s", w->trace_index, w->span_index, field);
}

int
span_error(SpanWriter *w, PyObject *type, const char *field, PyObject *key, const char *format, ...)
{
    span_hold_values(w);
    /* `key` may be borrowed from a dict that the repr of a value in the
     * message (Python code) empties or replaces: hold it until it is named. */
    Py_XINCREF(key);
    va_list vargs;
    va_start(vargs, format);
    PyObject *detail = PyUnicode_FromFormatV(format, vargs);
    va_end(vargs);
    if (detail != NULL) {
        PyObject *location = location_text(w, field, key);
        if (location != NULL) {
            PyErr_Format(type, "%U: %U", location, detail);
            Py_DECREF(location);
        }
        Py_DECREF(detail);
    }
    Py_XDECREF(key);
    return -1;
}

/* Append `note` to the exception's notes, as BaseException.add_note does
 * (a method from CPython 3.11; on older versions the list is set directly,
 * which 3.11's tracebacks would show the same way).  An exception that
 * carries the same note already (located once before) is left alone. */
static int
exception_add_note(PyObject *exception, PyObject *note)
{
    PyObject *notes = NULL;
    int result = -1;
    notes = PyObject_GetAttrString(exception, "__notes__");
    if (notes == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_AttributeError)) {
            return -1;
        }
        PyErr_Clear();
    }
    if (notes != NULL && PyList_Check(notes)) {
        int known = PySequence_Contains(notes, note);
        if (known != 0) {
            result = known < 0 ? -1 : 0;
            goto done;
        }
    }
#if PY_VERSION_HEX >= 0x030B0000
    PyObject *added = PyObject_CallMethod(exception, "add_note", "O", note);
    result = added != NULL ? 0 : -1;
    Py_XDECREF(added);
#else
    if (notes == NULL) {
        notes = PyList_New(0);
        if (notes == NULL || PyObject_SetAttrString(exception, "__notes__", notes) < 0) {
            goto done;
        }
    }
    if (!PyList_Check(notes)) {
        PyErr_SetString(PyExc_TypeError, "Cannot add note: __notes__ is not a list");
        goto done;
    }
    result = PyList_Append(notes, note);
#endif
done:
    Py_XDECREF(notes);
    return result;
}

/* Add the location to the current exception as a note (see span_reraise);
 * if that fails, the exception stays as it was. */
static void
add_location_note(SpanWriter *w, const char *field, PyObject *key)
{
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
    PyErr_NormalizeException(&type, &value, &traceback);
    if (value == NULL || !PyObject_TypeCheck(value, (PyTypeObject *)PyExc_Exception)) {
        PyErr_Restore(type, value, traceback); /* KeyboardInterrupt, SystemExit: as they are */
        return;
    }
    if (traceback != NULL) {
        PyException_SetTraceback(value, traceback);
    }
    PyObject *note = key != NULL ? PyUnicode_FromFormat("trace %zd, span %zd, field %s key %R",
                                                        w->trace_index, w->span_index, field, key)
                                 : PyUnicode_FromFormat("trace %zd, span %zd, field %s",
                                                        w->trace_index, w->span_index, field);
    if (note == NULL || exception_add_note(value, note) < 0) {
        PyErr_Clear();
    }
    Py_XDECREF(note);
    PyErr_Restore(type, value, traceback);
}

int
span_reraise(SpanWriter *w, const char *field, PyObject *key)
{
    span_hold_values(w);
    PyObject *type = NULL;
    if (PyErr_ExceptionMatches(PyExc_UnicodeError)) {
        type = PyExc_ValueError;
    }
    else if (PyErr_ExceptionMatches(PyExc_TypeError)) {
        type = PyExc_TypeError;
    }
    else if (PyErr_ExceptionMatches(PyExc_OverflowError) ||
             PyErr_ExceptionMatches(PyExc_ValueError)) {
        type = PyExc_ValueError;
    }
    else if (PyErr_ExceptionMatches(PyExc_AttributeError)) {
        type = PyExc_AttributeError; /* raised by a span's getter */
    }
    if (type == NULL) {
        Py_XINCREF(key); /* naming it may run Python code */
        add_location_note(w, field, key);
        Py_XDECREF(key);
        return -1;
    }
    PyObject *exc_type, *exc_value, *exc_tb;
    PyErr_Fetch(&exc_type, &exc_value, &exc_tb);
    PyErr_NormalizeException(&exc_type, &exc_value, &exc_tb);
    if (exc_tb != NULL && exc_value != NULL) {
        PyException_SetTraceback(exc_value, exc_tb);
    }
    span_error(w, type, field, key, "%S", exc_value ? exc_value : Py_None);
    if (exc_value != NULL) {
        PyObject *new_type, *new_value, *new_tb;
        PyErr_Fetch(&new_type, &new_value, &new_tb);
        PyErr_NormalizeException(&new_type, &new_value, &new_tb);
        if (new_value != NULL) {
            PyException_SetCause(new_value, Py_NewRef(exc_value));
            PyException_SetContext(new_value, Py_NewRef(exc_value));
        }
        PyErr_Restore(new_type, new_value, new_tb);
    }
    Py_XDECREF(exc_type);
    Py_XDECREF(exc_value);
    Py_XDECREF(exc_tb);
    return -1;
}

/* ---------------------------------------------------------------------------
 * Text */

PyObject *
truncated_str(PyObject *str)
{
    PyObject *prefix = PyUnicode_Substring(str, 0, TRUNCATED_PREFIX_LEN);
    if (prefix == NULL) {
        return NULL;
    }
    PyObject *suffix = PyUnicode_FromString(TRUNCATION_SUFFIX);
    if (suffix == NULL) {
        Py_DECREF(prefix);
        return NULL;
    }
    PyObject *result = PyUnicode_Concat(prefix, suffix);
    Py_DECREF(prefix);
    Py_DECREF(suffix);
    return result;
}

/* Cut bytes like ddtrace, but never inside a UTF-8 sequence (the decoders
 * downstream reject the whole payload for one invalid byte). */
static PyObject *
truncated_bytes(const char *data)
{
    Py_ssize_t cut = TRUNCATED_PREFIX_LEN;
    Py_ssize_t back = 0;
    while (back < 3 && cut - back > 0 && ((unsigned char)data[cut - back - 1] & 0xC0) == 0x80) {
        back++;
    }
    if (cut - back > 0) {
        unsigned char lead = (unsigned char)data[cut - back - 1];
        Py_ssize_t needed = lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : lead >= 0xC0 ? 2 : 1;
        if (needed > back + 1) {
            cut -= back + 1; /* the last sequence is incomplete: drop it */
        }
    }
    Py_ssize_t suffix_len = (Py_ssize_t)strlen(TRUNCATION_SUFFIX);
    PyObject *result = PyBytes_FromStringAndSize(NULL, cut + suffix_len);
    if (result == NULL) {
        return NULL;
    }
    memcpy(PyBytes_AS_STRING(result), data, (size_t)cut);
    memcpy(PyBytes_AS_STRING(result) + cut, TRUNCATION_SUFFIX, (size_t)suffix_len);
    return result;
}

/* Error paths below name `key`, which may be borrowed from a dict being
 * written.  Creating an exception object can start a garbage collection, and
 * with it finalizers (Python code) that could drop that key: it is held while
 * a call may fail. */

const char *
span_utf8(SpanWriter *w, PyObject *str, const char *field, PyObject *key, Py_ssize_t *size)
{
    span_hold_values(w); /* the encoding error is an exception object */
    Py_XINCREF(key);
    const char *utf8 = PyUnicode_AsUTF8AndSize(str, size);
    if (utf8 == NULL) {
        span_reraise(w, field, key);
    }
    Py_XDECREF(key);
    return utf8;
}

static int text_prepare_held(SpanWriter *w, PyObject *value, const char *field, PyObject *key,
                             PreparedText *text);

int
text_prepare(SpanWriter *w, PyObject *value, const char *field, PyObject *key, PreparedText *text)
{
    span_hold_values(w); /* str subclasses, truncation, decoding: all may fail */
    Py_XINCREF(key);
    int result = text_prepare_held(w, value, field, key, text);
    Py_XDECREF(key);
    return result;
}

static int
text_prepare_held(SpanWriter *w, PyObject *value, const char *field, PyObject *key,
                  PreparedText *text)
{
    text->object = NULL;
    if (value == Py_None) {
        return 0;
    }
    if (PyUnicode_Check(value)) {
        if (SP_UNICODE_READY(value) < 0) {
            return span_reraise(w, field, key);
        }
        if (PyUnicode_GET_LENGTH(value) > MAX_TEXT_LEN) {
            text->object = truncated_str(value);
        }
        else if (PyUnicode_CheckExact(value)) {
            text->object = Py_NewRef(value);
        }
        else {
            text->object = PyUnicode_FromObject(value); /* exact copy of a subclass */
        }
        if (text->object == NULL) {
            return -1;
        }
        text->utf8 = PyUnicode_AsUTF8AndSize(text->object, &text->size);
        if (text->utf8 == NULL) {
            Py_CLEAR(text->object);
            return span_reraise(w, field, key);
        }
        return 1;
    }
    if (PyBytes_Check(value) || PyByteArray_Check(value)) {
        const char *data =
            PyBytes_Check(value) ? PyBytes_AS_STRING(value) : PyByteArray_AS_STRING(value);
        Py_ssize_t size =
            PyBytes_Check(value) ? PyBytes_GET_SIZE(value) : PyByteArray_GET_SIZE(value);
        if (size > MAX_TEXT_LEN) {
            text->object = truncated_bytes(data);
        }
        else if (PyBytes_CheckExact(value)) {
            text->object = Py_NewRef(value);
        }
        else {
            text->object = PyBytes_FromStringAndSize(data, size);
        }
        if (text->object == NULL) {
            return -1;
        }
        /* Validate: payload decoders reject invalid UTF-8 in strings. */
        PyObject *decoded = PyUnicode_DecodeUTF8(PyBytes_AS_STRING(text->object),
                                                 PyBytes_GET_SIZE(text->object), "strict");
        if (decoded == NULL) {
            Py_CLEAR(text->object);
            return span_reraise(w, field, key);
        }
        Py_DECREF(decoded);
        text->utf8 = PyBytes_AS_STRING(text->object);
        text->size = PyBytes_GET_SIZE(text->object);
        return 1;
    }
    span_error(w, PyExc_TypeError, field, key, "expected str, bytes or None, not %.200s",
               Py_TYPE(value)->tp_name);
    return -1;
}

/* ---------------------------------------------------------------------------
 * Integers */

int
raise_bad_tag_key(SpanWriter *w, const char *field, PyObject *key)
{
    return span_error(w, PyExc_TypeError, field, key, "keys must be str, not %.200s",
                      Py_TYPE(key)->tp_name);
}

/* A key that may be cut (or equal a cut key): its text as written, a str. */
static PyObject *
key_as_written(SpanWriter *w, const char *field, PyObject *key)
{
    PreparedText text;
    int prepared = text_prepare(w, key, field, key, &text);
    if (prepared <= 0) {
        return NULL; /* keys are text: never None */
    }
    PyObject *written = PyUnicode_DecodeUTF8(text.utf8, text.size, "strict");
    Py_DECREF(text.object);
    return written;
}

void
cut_keys_clear(SpanWriter *w)
{
    for (Py_ssize_t i = 0; i < w->cut_key_count; i++) {
        Py_DECREF(w->cut_keys[i]); /* exact str: no finalizer */
    }
    w->cut_key_count = 0;
}

/* Forget the cut keys of `field`'s map after the first `count` (those of a
 * dropped entry). */
static void
cut_keys_rollback(SpanWriter *w, const char *field, Py_ssize_t count)
{
    if (w->cut_keys_field != field || w->cut_keys_span != w->span_index) {
        return;
    }
    while (w->cut_key_count > count) {
        Py_DECREF(w->cut_keys[--w->cut_key_count]); /* exact str: no finalizer */
    }
}

/* Is `written` one of the cut keys kept?  Exact str compared: no code runs. */
static int
cut_key_seen(const SpanWriter *w, PyObject *written)
{
    for (Py_ssize_t i = 0; i < w->cut_key_count; i++) {
        if (PyUnicode_Compare(w->cut_keys[i], written) == 0) {
            return 1;
        }
    }
    return 0;
}

int
check_cut_key_unique(SpanWriter *w, const char *field, PyObject *key)
{
    if (PyUnicode_Check(key) && PyUnicode_GET_LENGTH(key) != CUT_TEXT_LEN &&
        PyUnicode_GET_LENGTH(key) <= MAX_TEXT_LEN) {
        return 0; /* written whole, and of another length than any cut str */
    }
    /* Only str are made here (never tracked by the garbage collector), so
     * an in-place read of the map's entries stays valid. */
    PyObject *written = key_as_written(w, field, key);
    if (written == NULL) {
        return -1;
    }
    if (w->cut_keys_field != field || w->cut_keys_span != w->span_index) {
        cut_keys_clear(w); /* another map */
        w->cut_keys_field = field;
        w->cut_keys_span = w->span_index;
    }
    if (cut_key_seen(w, written)) {
        PyObject *start = PyUnicode_Substring(written, 0, 20);
        if (start != NULL) {
            span_error(w, PyExc_ValueError, field, NULL,
                       "two keys are written as the same %zd-character text starting %R (keys "
                       "longer than %d characters are cut); only the first is written",
                       PyUnicode_GET_LENGTH(written), start, MAX_TEXT_LEN);
            Py_DECREF(start);
        }
        Py_DECREF(written);
        return -1;
    }
    if (w->cut_key_count == w->cut_key_capacity) {
        Py_ssize_t capacity = w->cut_key_capacity ? 2 * w->cut_key_capacity : 4;
        PyObject **grown = PyMem_Realloc(w->cut_keys, (size_t)capacity * sizeof(PyObject *));
        if (grown == NULL) {
            Py_DECREF(written);
            span_hold_values(w);
            PyErr_NoMemory();
            return -1;
        }
        w->cut_keys = grown;
        w->cut_key_capacity = capacity;
    }
    w->cut_keys[w->cut_key_count++] = written;
    return 0;
}

int
raise_bad_meta_value(SpanWriter *w, PyObject *key, PyObject *value)
{
    return span_error(w, PyExc_TypeError, "meta", key, "values must be str or bytes, not %.200s",
                      Py_TYPE(value)->tp_name);
}

int
span_int_error(SpanWriter *w, PyObject *value, const char *field, int is_signed)
{
    if (!PyLong_Check(value)) {
        return span_error(w, PyExc_TypeError, field, NULL, "expected int, not %.200s",
                          Py_TYPE(value)->tp_name);
    }
    return span_error(w, PyExc_ValueError, field, NULL, "%R is outside the %s 64-bit range", value,
                      is_signed ? "signed" : "unsigned");
}

int
meta_struct_document(SpanWriter *w, PyObject *key, PyObject *value, int write)
{
    OutBuf document;
    if (outbuf_init_raw(&document, 256) < 0) {
        return -1;
    }
    int result = pack_object(&w->value_options, &document, value, PACK_NEST_LIMIT);
    if (result == 0 && write) {
        result = mp_write_bin(w->out, document.start, outbuf_len(&document));
    }
    if (result < 0) {
        span_reraise(w, "meta_struct", key);
    }
    outbuf_free(&document);
    return result;
}

int
span_time_error(SpanWriter *w, PyObject *value, const char *field)
{
    if (!PyLong_Check(value)) {
        return span_error(w, PyExc_TypeError, field, NULL, "expected int, not %.200s",
                          Py_TYPE(value)->tp_name);
    }
    return span_error(w, PyExc_ValueError, field, NULL, "%R does not fit in 64 bits", value);
}

int
span_times_to_ns(SpanWriter *w, SpanValues *v)
{
    static const SpanField TIMES[] = {SF_START, SF_DURATION};
    spanvalues_own(v); /* the values are replaced: no borrowed one stays */
    for (size_t k = 0; k < sizeof TIMES / sizeof TIMES[0]; k++) {
        SpanField field = TIMES[k];
        long scale = w->reader->time_scale[field];
        PyObject *value = v->value[field];
        if (scale <= 1 || value == NULL || value == Py_None) {
            continue;
        }
        PyObject *ns = NULL;
        if (PyFloat_Check(value)) {
            double seconds_or_less = PyFloat_AS_DOUBLE(value);
            if (!isfinite(seconds_or_less)) {
                PyErr_Format(PyExc_ValueError, "expected a finite time, not %R", value);
            }
            else {
                ns = PyLong_FromDouble(nearbyint(seconds_or_less * (double)scale));
            }
        }
        else if (PyLong_Check(value)) {
            PyObject *factor = PyLong_FromLong(scale);
            ns = factor != NULL ? PyNumber_Multiply(value, factor) : NULL;
            Py_XDECREF(factor);
        }
        else {
            PyErr_Format(PyExc_TypeError, "expected int or float, not %.200s",
                         Py_TYPE(value)->tp_name);
        }
        if (ns == NULL) {
            v->failed = (int)field;
            spanvalues_release(v);
            return -1;
        }
        Py_SETREF(v->value[field], ns);
    }
    return 0;
}

void
span_count_mixed_tags(SpanWriter *w, PyObject *mixed)
{
    if (!PyDict_Check(mixed)) {
        return; /* (the meta writer refuses it, as any meta that is no dict) */
    }
    /* A refused value is counted in meta, whose pass refuses it: so a
     * mapping of numbers and refused values still enters that pass. */
    Py_ssize_t counts[2] = {0, 0};
    DictEntries entries;
    if (pydict_entries(&w->state->fast_paths, mixed, &entries)) {
        PyObject *const *entry = entries.keys;
        for (Py_ssize_t i = 0; i < entries.count; i++, entry += entries.stride) {
            dict_entries_prefetch_ahead(&entries, entry, i);
            if (entry[1] != NULL) {
                counts[mixed_tag_kind(entry[1]) == MIXED_METRICS]++;
            }
        }
    }
    else {
        Py_ssize_t pos = 0;
        PyObject *key, *value;
        while (PyDict_Next(mixed, &pos, &key, &value)) {
            counts[mixed_tag_kind(value) == MIXED_METRICS]++;
        }
    }
    w->mixed_tags = mixed;
    w->mixed_count[MIXED_META] = counts[0];
    w->mixed_count[MIXED_METRICS] = counts[1];
}

void
span_tags_one_mapping(SpanValues *v)
{
    spanvalues_own(v);
    Py_SETREF(v->value[SF_METRICS], Py_NewRef(v->value[SF_META]));
}

int
span_object_options(SpanWriter *w, PyObject *span, SpanValues *v)
{
    if (w->reader->scales_times && span_times_to_ns(w, v) < 0) {
        return -1;
    }
    if (w->reader->strict) {
        spanvalues_own(v); /* the check may run Python code */
        if (spanfields_check_strict(w->reader, span) < 0) {
            v->failed = -1;
            spanvalues_release(v);
            return -1;
        }
    }
    return 0;
}

int
span_error_flag_slow(SpanWriter *w, PyObject *value, int *flag)
{
    if (!PyLong_Check(value)) {
        return span_error(w, PyExc_TypeError, "error", NULL, "expected int, not %.200s",
                          Py_TYPE(value)->tp_name);
    }
    *flag = PyObject_IsTrue(value); /* an int subclass may define __bool__ */
    return *flag < 0 ? span_reraise(w, "error", NULL) : 0;
}

int
raise_metric_out_of_range(SpanWriter *w, PyObject *key, PyObject *value)
{
    /* `value` may be borrowed from the metrics dict (read in place), which
     * Python code run by naming it (a pending signal handler, a collection's
     * finalizers) can empty: span_error holds the span's values and `key`,
     * not the dict's entries, so it is held here until it is named. */
    Py_INCREF(value);
    span_error(w, PyExc_ValueError, "metrics", key, "%R does not fit in 64 bits", value);
    Py_DECREF(value);
    return -1;
}

int
write_metric_value(SpanWriter *w, PyObject *key, PyObject *value)
{
    /* An exact float, else an int (a flags test), before PyFloat_Check (a
     * call into libpython walking the subtypes of every int: 9,000 calls of
     * 19 instructions for 3,000 spans of 3 int metrics); no type is both. */
    if (PyFloat_CheckExact(value) || (!PyLong_Check(value) && PyFloat_Check(value))) {
        return mp_write_double(w->out, PyFloat_AS_DOUBLE(value));
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
    if (negative) {
        return mp_write_int(w->out, (int64_t)((uint64_t)0 - magnitude));
    }
    return mp_write_uint(w->out, magnitude);
}

/* ---------------------------------------------------------------------------
 * Trace-level values */

static int
read_trace_id(SpanWriter *w, PyObject *value, TraceInfo *info)
{
    if (value == NULL) {
        return raise_missing_field(w, SF_TRACE_ID);
    }
    if (!PyLong_Check(value)) {
        return raise_trace_id_not_int(w, value);
    }
    uint64_t low;
    if (pyint_as_u64(&w->state->fast_paths, value, &low) == 0) {
        info->trace_id_low = low;
        info->trace_id_high = 0;
        return 0;
    }
    /* Beyond 64 bits (or negative): split a 128-bit id into its halves. */
    int wide = pyint_u128(&w->state->fast_paths, value, &info->trace_id_high, &info->trace_id_low);
    if (wide > 0) {
        return span_error(w, PyExc_ValueError, "trace_id", NULL,
                          "%R is outside the unsigned 128-bit range", value);
    }
    return wide;
}

int
trace_info_read(SpanWriter *w, PyObject *first_span, TraceInfo *info)
{
    SpanValues values;
    info->origin = NULL;
    w->span_index = 0;
    if (spanfields_read(w->reader, first_span, SF_TRACE_ID, SF_TRACE_ID, &values) < 0) {
        /* (The first span of a class may fail on another field's name.) */
        return span_reraise(w, span_field_names[values.failed >= 0 ? values.failed : SF_TRACE_ID],
                            NULL);
    }
    int result = read_trace_id(w, values.value[SF_TRACE_ID], info);
    Py_XDECREF(values.value[SF_TRACE_ID]);
    if (result < 0) {
        return -1;
    }
    PyObject *origin;
    if (spanfields_read_origin(w->reader, first_span, &origin) < 0) {
        return span_reraise(w, "origin", NULL);
    }
    if (origin == NULL || origin == Py_None) {
        Py_XDECREF(origin);
        return 0;
    }
    if (!PyUnicode_Check(origin)) {
        span_error(w, PyExc_TypeError, "origin", NULL, "expected str or None, not %.200s",
                   Py_TYPE(origin)->tp_name);
        Py_DECREF(origin);
        return -1;
    }
    if (!PyUnicode_CheckExact(origin)) {
        Py_SETREF(origin, PyUnicode_FromObject(origin));
        if (origin == NULL) {
            return -1;
        }
    }
    if (PyUnicode_AsUTF8(origin) == NULL) {
        Py_DECREF(origin);
        return span_reraise(w, "origin", NULL);
    }
    info->origin = origin;
    return 0;
}

void
trace_info_release(TraceInfo *info)
{
    Py_CLEAR(info->origin);
}

int
meta_lacks_trace_id_high(SpanWriter *w, PyObject *meta, int *lacks)
{
    if (meta == NULL || meta == Py_None) {
        *lacks = 1;
        return 0;
    }
    PyObject *value = PyDict_GetItemWithError(meta, w->state->str_trace_id_high_key);
    if (value == NULL && PyErr_Occurred()) {
        return span_reraise(w, "meta", NULL);
    }
    /* In lenient mode a tag that is not text is dropped: replace it.  In a
     * mixed tags mapping a number is a metric. */
    *lacks = value == NULL || (w->lenient && !is_text(value)) ||
             (meta == w->mixed_tags && mixed_tag_kind(value) != MIXED_META);
    return 0;
}

PyObject *
trace_id_high_hex(uint64_t high)
{
    char hex[16];
    hex64_put(hex, high);
    return PyUnicode_FromStringAndSize(hex, 16);
}

Py_ssize_t
field_length_slow(SpanWriter *w, PyObject *value, const char *field)
{
    if (PyDict_Check(value)) {
        return PyDict_GET_SIZE(value);
    }
    if (PyList_Check(value) || PyTuple_Check(value)) {
        return Py_SIZE(value);
    }
    Py_ssize_t length = PyObject_Size(value);
    if (length < 0) {
        span_reraise(w, field, NULL);
    }
    return length;
}

static int
check_trace(SpanWriter *w, PyObject *trace)
{
    if (PyList_Check(trace) || PyTuple_Check(trace)) {
        return 0;
    }
    PyErr_Format(PyExc_TypeError, "trace %zd: expected a list of spans, not %.200s", w->trace_index,
                 Py_TYPE(trace)->tp_name);
    return -1;
}

/* ---------------------------------------------------------------------------
 * Maps */

int
map_begin_uncounted(SpanWriter *w, Py_ssize_t max_count, Py_ssize_t *header_pos)
{
    if (mp_check_length(max_count, "map") < 0) {
        return span_reraise(w, "map", NULL);
    }
    *header_pos = outbuf_len(w->out);
    if (outbuf_reserve(w->out, 5) < 0) {
        return -1;
    }
    w->out->pos[0] = (char)MP_MAP32;
    w->out->pos += 5;
    return 0;
}

int
map_begin_slow(SpanWriter *w, Py_ssize_t count, Py_ssize_t *header_pos)
{
    if (w->lenient) {
        return map_begin_uncounted(w, count, header_pos);
    }
    if (mp_check_length(count, "map") < 0) {
        return span_reraise(w, "map", NULL);
    }
    *header_pos = outbuf_len(w->out);
    if (outbuf_reserve(w->out, 5) < 0) {
        return -1;
    }
    mp_put_map_header(w->out, (uint32_t)count);
    return 0;
}

int
map_end_lenient(SpanWriter *w, Py_ssize_t header_pos, Py_ssize_t count)
{
    /* Rewrite the placeholder in its smallest form and close the gap. */
    char header[5];
    OutBuf scratch = {header, header, header + sizeof header, NULL};
    mp_put_map_header(&scratch, (uint32_t)count);
    Py_ssize_t header_size = outbuf_len(&scratch);
    Py_ssize_t shift = 5 - header_size;
    char *start = w->out->start + header_pos;
    memcpy(start, header, (size_t)header_size);
    if (shift > 0) {
        Py_ssize_t body = outbuf_len(w->out) - header_pos - 5;
        memmove(start + header_size, start + 5, (size_t)body);
        w->out->pos -= shift;
        if (w->holes != NULL) {
            for (Py_ssize_t i = w->holes->count - 1; i >= 0; i--) {
                if (w->holes->items[i].offset <= header_pos) {
                    break;
                }
                w->holes->items[i].offset -= shift;
            }
        }
    }
    return 0;
}

static int
is_data_error(void)
{
    return PyErr_ExceptionMatches(PyExc_TypeError) || PyErr_ExceptionMatches(PyExc_ValueError) ||
           PyErr_ExceptionMatches(PyExc_OverflowError);
}

/* A dict changed by Python code run while it was being written. */
static int
raise_dict_changed(SpanWriter *w, const char *field)
{
    span_hold_values(w);
    PyErr_Format(PyExc_RuntimeError, "trace %zd, span %zd, %s: dict changed during encoding",
                 w->trace_index, w->span_index, field);
    return -1;
}

/* Lenient mode: an entry that fails with bad data is rolled back and
 * counted instead of failing the trace. */
static SP_NOINLINE int
write_dict_entries_lenient(SpanWriter *w, PyObject *dict, const char *field,
                           EntryWriter write_entry, Py_ssize_t *written)
{
    Py_ssize_t expected = PyDict_GET_SIZE(dict);
    Py_ssize_t pos = 0, seen = 0;
    PyObject *key, *value;
    while (PyDict_Next(dict, &pos, &key, &value)) {
        if (seen++ == expected) {
            return raise_dict_changed(w, field);
        }
        Py_ssize_t entry_start = outbuf_len(w->out);
        Py_ssize_t holes_before = w->holes ? w->holes->count : 0;
        uint32_t strings_before = w->strings ? w->strings->count : 0;
        Py_ssize_t encoded_before = w->strings ? outbuf_len(&w->strings->encoded) : 0;
        /* The cut keys of this map so far (a dropped entry's key is no
         * longer written: a later key cut to the same text is then the
         * first). */
        Py_ssize_t cut_keys_before =
            w->cut_keys_field == field && w->cut_keys_span == w->span_index ? w->cut_key_count : 0;
        Py_INCREF(key);
        Py_INCREF(value);
        int result = write_entry(w, key, value);
        Py_DECREF(key);
        Py_DECREF(value);
        if (result >= 0) {
            *written += result == 0; /* (1: another map's entry, write_mixed_entry) */
        }
        else if (is_data_error()) {
            PyErr_Clear();
            outbuf_truncate(w->out, entry_start);
            if (w->holes != NULL) {
                w->holes->count = holes_before;
            }
            if (w->strings != NULL) {
                strtable_rollback(w->strings, strings_before, encoded_before);
            }
            cut_keys_rollback(w, field, cut_keys_before);
            w->dropped_tags++;
        }
        else {
            return -1;
        }
        if (PyDict_GET_SIZE(dict) != expected) {
            return raise_dict_changed(w, field);
        }
    }
    return seen == expected ? 0 : raise_dict_changed(w, field);
}

/* One entry of a mixed tags mapping in the pass of w->mixed_pass: written
 * with w->mixed_write_entry (0) when it is that map's, else skipped (1), or
 * refused (-1, in the meta pass). */
static int
write_mixed_entry(SpanWriter *w, PyObject *key, PyObject *value)
{
    int kind = mixed_tag_kind(value);
    if (kind == w->mixed_pass) {
        if (PyBool_Check(value)) {
            /* Text, as the agent's OTLP mapping writes a bool attribute. */
            value = w->reader->bool_text[value == Py_True];
        }
        return w->mixed_write_entry(w, key, value);
    }
    if (kind == MIXED_REFUSED && w->mixed_pass == MIXED_META) {
        return span_error(w, PyExc_TypeError, "meta", key,
                          "a mixed tags mapping (one dict given as both meta and metrics) takes "
                          "str, bool, int or float, not %.200s",
                          Py_TYPE(value)->tp_name);
    }
    return 1;
}

int
write_mixed_entries(SpanWriter *w, PyObject *dict, const char *field, EntryWriter write_entry,
                    Py_ssize_t *written)
{
    int pass = strcmp(field, "meta") == 0      ? MIXED_META
               : strcmp(field, "metrics") == 0 ? MIXED_METRICS
                                               : MIXED_REFUSED;
    if (pass == MIXED_REFUSED) {
        /* (The same dict as another field too, meta_struct: as it is.) */
        return write_dict_entries_checked(w, dict, field, write_entry, written);
    }
    w->mixed_pass = pass;
    w->mixed_write_entry = write_entry;
    *written = 0;
    if (w->lenient) {
        return write_dict_entries_lenient(w, dict, field, write_mixed_entry, written);
    }
    /* As write_dict_entries' plain loop: the entry writers of meta and
     * metrics run no Python code until an error ends the loop, so the
     * entries may be read in place. */
    Py_ssize_t expected = PyDict_GET_SIZE(dict), count = 0;
    DictEntries entries;
    if (pydict_entries(&w->state->fast_paths, dict, &entries)) {
        PyObject *const *entry = entries.keys;
        for (Py_ssize_t i = 0; i < entries.count; i++, entry += entries.stride) {
            dict_entries_prefetch_ahead(&entries, entry, i);
            if (entry[1] != NULL) {
                int result = write_mixed_entry(w, entry[0], entry[1]);
                if (result < 0) {
                    return -1;
                }
                count += result == 0;
            }
        }
    }
    else {
        Py_ssize_t pos = 0;
        PyObject *key, *value;
        while (PyDict_Next(dict, &pos, &key, &value)) {
            int result = write_mixed_entry(w, key, value);
            if (result < 0) {
                return -1;
            }
            count += result == 0;
        }
    }
    /* The header holds the count made when the span was read: Python code
     * run since (converting its links or events) may have changed the
     * mapping. */
    if (count != w->mixed_count[pass] || PyDict_GET_SIZE(dict) != expected) {
        return raise_dict_changed(w, field);
    }
    *written = count;
    return 0;
}

int
write_dict_entries_checked(SpanWriter *w, PyObject *dict, const char *field,
                           EntryWriter write_entry, Py_ssize_t *written)
{
    *written = 0;
    if (w->lenient) {
        return write_dict_entries_lenient(w, dict, field, write_entry, written);
    }
    /* Only entry writers that may run Python code get here (the others take
     * the plain loop of write_dict_entries). */
    Py_ssize_t expected = PyDict_GET_SIZE(dict);
    Py_ssize_t pos = 0, seen = 0;
    PyObject *key, *value;
    while (PyDict_Next(dict, &pos, &key, &value)) {
        /* An entry writer may run Python code (a meta_struct value's
         * __iter__) that replaces entries without changing the size: never
         * write more entries than the header counts. */
        if (seen++ == expected) {
            return raise_dict_changed(w, field);
        }
        /* Strong references: that code may also drop the entry. */
        Py_INCREF(key);
        Py_INCREF(value);
        int result = write_entry(w, key, value);
        Py_DECREF(key);
        Py_DECREF(value);
        if (result < 0) {
            return -1;
        }
        if (PyDict_GET_SIZE(dict) != expected) {
            return raise_dict_changed(w, field);
        }
    }
    if (seen != expected) {
        return raise_dict_changed(w, field);
    }
    *written = expected;
    return 0;
}

int
raise_not_dict(SpanWriter *w, PyObject *value, const char *field)
{
    return span_error(w, PyExc_TypeError, field, NULL, "expected a dict, not %.200s",
                      Py_TYPE(value)->tp_name);
}

/* How many spans ahead write_trace requests a span object's memory, and its
 * field values (measured on 100 x 1,000-span traces of ddtrace Spans). */
#define SPAN_OBJECT_PREFETCH_DISTANCE 4
#define SPAN_VALUES_PREFETCH_DISTANCE 2

/* Values that are never spans (a span is a dict, or an object whose
 * attributes are the fields): a trace nested one level too deep, or a
 * placeholder, would otherwise be reported as lacking trace_id.  Asked only
 * once a required field is found missing. */
static inline int
is_not_span(PyObject *span)
{
    const unsigned long builtin_kinds = Py_TPFLAGS_LONG_SUBCLASS | Py_TPFLAGS_LIST_SUBCLASS |
                                        Py_TPFLAGS_TUPLE_SUBCLASS | Py_TPFLAGS_BYTES_SUBCLASS |
                                        Py_TPFLAGS_UNICODE_SUBCLASS;
    return span == Py_None || (Py_TYPE(span)->tp_flags & builtin_kinds) != 0 ||
           PyFloat_Check(span) || PyByteArray_Check(span) || PyAnySet_Check(span);
}

static SP_NOINLINE int
raise_not_span(SpanWriter *w, PyObject *span)
{
    span_hold_values(w);
    PyErr_Format(PyExc_TypeError, "trace %zd, span %zd: expected a span object or dict, not %.200s",
                 w->trace_index, w->span_index, Py_TYPE(span)->tp_name);
    return -1;
}

/* The flags of default_note, one per default tag of the larger map. */
static SP_NOINLINE int
default_seen_alloc(SpanWriter *w)
{
    Py_ssize_t flags = w->default_meta != NULL ? w->default_meta->count : 0;
    if (w->default_metrics != NULL && w->default_metrics->count > flags) {
        flags = w->default_metrics->count;
    }
    w->default_seen = PyMem_Malloc((size_t)flags);
    if (w->default_seen == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

int
write_trace(SpanWriter *w, PyObject *trace, TraceStartFn start, SpanWriteFn write_span)
{
    if (check_trace(w, trace) < 0) {
        return -1;
    }
    Py_ssize_t count = Py_SIZE(trace);
    if (mp_write_array_header(w->out, count) < 0) {
        return span_reraise(w, "spans", NULL);
    }
    if (count == 0) {
        return 0;
    }
    TraceInfo info;
    PyObject *first = Py_NewRef(PySequence_Fast_GET_ITEM(trace, 0));
    w->span_index = 0;
    w->span = first;
    int result = trace_info_read(w, first, &info);
    w->span = NULL;
    Py_DECREF(first);
    if (result < 0) {
        return -1;
    }
    if (start != NULL) {
        result = start(w, &info);
    }
    if (result == 0 && SP_UNLIKELY(w->default_meta != NULL || w->default_metrics != NULL)) {
        result = default_seen_alloc(w);
    }
    if (result == 0 && count > 1 && count <= SPAN_WARM_MAX &&
        PySequence_Fast_GET_SIZE(trace) == count) {
        /* A short trace, most of which the prefetch ahead below would not
         * reach: all of it loaded level by level first (as long as the code
         * that reading its first span ran left it as it was).  (A long one's
         * first spans are not worth it: 2.3% more instructions on 100-span
         * traces of slotted spans, no time saved measurably.) */
        spanfields_warm(w->reader, PySequence_Fast_ITEMS(trace), count);
    }
    for (Py_ssize_t i = 0; i < count && result == 0; i++) {
        /* Span code may resize the trace list while we read it. */
        if (Py_SIZE(trace) != count) {
            PyErr_Format(PyExc_RuntimeError, "trace %zd changed size during encoding",
                         w->trace_index);
            result = -1;
            break;
        }
        w->span_index = i;
        /* Large traces outgrow the CPU caches: start loading the spans
         * ahead (the field values of one a little ahead, whose object was
         * requested a little earlier still). */
        if (i + SPAN_OBJECT_PREFETCH_DISTANCE < count) {
            spanfields_prefetch_object(
                w->reader, PySequence_Fast_GET_ITEM(trace, i + SPAN_OBJECT_PREFETCH_DISTANCE));
        }
        if (i + SPAN_VALUES_PREFETCH_DISTANCE < count) {
            SpanTextPeek next;
            spanfields_prefetch(w->reader,
                                PySequence_Fast_GET_ITEM(trace, i + SPAN_VALUES_PREFETCH_DISTANCE),
                                w->cache != NULL ? &next : NULL);
            if (w->cache != NULL) {
                /* The interned encodings the next span's text will need. */
                strcache_prefetch(w->cache, next.service, 1);
                strcache_prefetch(w->cache, next.name, 1);
                strcache_prefetch(w->cache, next.resource, 1);
                strcache_prefetch(w->cache, next.span_type, 1);
            }
        }
        PyObject *span = Py_NewRef(PySequence_Fast_GET_ITEM(trace, i));
        w->span = span;
        result = write_span(w, span, &info);
        w->span = NULL;
        Py_DECREF(span);
    }
    trace_info_release(&info);
    if (w->default_seen != NULL) {
        PyMem_Free(w->default_seen);
        w->default_seen = NULL;
    }
    cut_keys_clear(w);
    PyMem_Free(w->cut_keys);
    w->cut_keys = NULL;
    w->cut_key_capacity = 0;
    return result;
}

int
raise_missing_field(SpanWriter *w, int field)
{
    /* An item that is no span at all lacks every field: say what it is. */
    if (w->span != NULL && is_not_span(w->span)) {
        return raise_not_span(w, w->span);
    }
    return span_error(w, PyExc_TypeError, span_field_names[field], NULL,
                      "missing (no attribute or key %R)", w->reader->attribute[field]);
}

int
raise_trace_id_not_int(SpanWriter *w, PyObject *trace_id)
{
    return span_error(w, PyExc_TypeError, "trace_id", NULL, "expected int, not %.200s",
                      Py_TYPE(trace_id)->tp_name);
}

/* ---------------------------------------------------------------------------
 * Default tags */

/* Up to this many defaults, default_note compares a key with each. */
#define DEFAULT_NOTE_SCAN 8

int
default_note(SpanWriter *w, const DefaultTagMap *defaults, const char *field, PyObject *key)
{
    PyObject *text = key;
    int whole = PyUnicode_CheckExact(key) && PyUnicode_GET_LENGTH(key) <= MAX_TEXT_LEN;
    if (whole && !((defaults->key_lengths >> (PyUnicode_GET_LENGTH(key) & 63)) & 1)) {
        return 0; /* written as it is, and no default key has its length */
    }
    if (whole && defaults->count <= DEFAULT_NOTE_SCAN) {
        /* A few defaults: compared in place, cheaper than a lookup. */
        for (Py_ssize_t i = 0; i < defaults->count; i++) {
            if (sp_same_str_text(PyTuple_GET_ITEM(defaults->keys, i), key)) {
                w->default_seen[i] = 1;
                break;
            }
        }
        return 0;
    }
    if (!whole) {
        /* Written before, so its text is valid: only a MemoryError can fail. */
        text = key_as_written(w, field, key);
        if (text == NULL) {
            return -1;
        }
    }
    /* Exact str looked up among exact str: no Python code runs. */
    PyObject *position = PyDict_GetItemWithError(defaults->index, text);
    if (text != key) {
        Py_DECREF(text); /* an exact str: no finalizer */
    }
    if (position == NULL) {
        return PyErr_Occurred() ? span_reraise(w, field, key) : 0;
    }
    w->default_seen[PyLong_AsSsize_t(position)] = 1;
    return 0;
}

int
write_tags_with_defaults(SpanWriter *w, PyObject *dict, const char *field,
                         const DefaultTagMap *defaults, EntryWriter write_own,
                         EntryWriter write_default, Py_ssize_t *written)
{
    memset(w->default_seen, 0, (size_t)defaults->count);
    if (write_dict_entries(w, dict, field, write_own, 0, written) < 0) {
        return -1;
    }
    /* The defaults come back in every span: the v0.4 cache is for them,
     * however few references they have (uncached_refs is the span's dict's). */
    w->uncached_refs = 1;
    for (Py_ssize_t i = 0; i < defaults->count; i++) {
        if (w->default_seen[i]) {
            continue;
        }
        if (write_default(w, PyTuple_GET_ITEM(defaults->keys, i),
                          PyTuple_GET_ITEM(defaults->values, i)) < 0) {
            return -1;
        }
        (*written)++;
    }
    return 0;
}

/* Option checks (when the encoder is made, not per span). */

/* The meta keys the writers add themselves: a default for one of them would
 * be written beside the writer's own entry. */
static const char *const default_meta_refused_keys[] = {ORIGIN_KEY, TRACE_ID_HIGH_KEY,
                                                        SPAN_LINKS_KEY, SPAN_EVENTS_KEY};

/* A str option value as it is written: an exact str, cut over MAX_TEXT_LEN,
 * valid UTF-8.  New reference, or NULL with the error naming `option` and
 * `key` (`what`: "keys" or "values"). */
static PyObject *
default_text(PyObject *value, const char *option, PyObject *key, const char *what)
{
    if (!PyUnicode_Check(value)) {
        PyErr_Format(PyExc_TypeError, "%s key %R: %s must be str, not %.200s", option, key, what,
                     Py_TYPE(value)->tp_name);
        return NULL;
    }
    PyObject *text = PyUnicode_GET_LENGTH(value) > MAX_TEXT_LEN ? truncated_str(value)
                     : PyUnicode_CheckExact(value)              ? Py_NewRef(value)
                                                                : PyUnicode_FromObject(value);
    if (text == NULL) {
        return NULL;
    }
    if (PyUnicode_AsUTF8AndSize(text, NULL) == NULL) {
        PyErr_Clear();
        PyErr_Format(PyExc_ValueError, "%s key %R: %s must be valid text (no lone surrogate)",
                     option, key, what);
        Py_DECREF(text);
        return NULL;
    }
    return text;
}

/* A metric option value as it is written: an exact int within
 * [-2**63, 2**64) or an exact float (bool refused: say 1 or 0). */
static PyObject *
default_metric(PyObject *value, const char *option, PyObject *key)
{
    if (PyFloat_Check(value)) {
        return PyFloat_CheckExact(value) ? Py_NewRef(value)
                                         : PyFloat_FromDouble(PyFloat_AS_DOUBLE(value));
    }
    if (!PyLong_Check(value) || PyBool_Check(value)) {
        PyErr_Format(PyExc_TypeError, "%s key %R: values must be int or float, not %.200s", option,
                     key, Py_TYPE(value)->tp_name);
        return NULL;
    }
    int overflow;
    long long signed_value = PyLong_AsLongLongAndOverflow(value, &overflow);
    if (signed_value == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (overflow == 0) {
        return PyLong_CheckExact(value) ? Py_NewRef(value) : PyLong_FromLongLong(signed_value);
    }
    if (overflow > 0) {
        unsigned long long unsigned_value = PyLong_AsUnsignedLongLong(value);
        if (unsigned_value != (unsigned long long)-1 || !PyErr_Occurred()) {
            return PyLong_CheckExact(value) ? Py_NewRef(value)
                                            : PyLong_FromUnsignedLongLong(unsigned_value);
        }
        PyErr_Clear();
    }
    PyErr_Format(PyExc_ValueError, "%s key %R: %R does not fit in 64 bits", option, key, value);
    return NULL;
}

static void
default_tag_map_clear(DefaultTagMap *map)
{
    Py_CLEAR(map->keys);
    Py_CLEAR(map->values);
    Py_CLEAR(map->index);
    map->count = 0;
}

/* One option: None, or a mapping (a dict, or anything with items()). */
static int
default_tag_map_init(DefaultTagMap *map, PyObject *mapping, const char *option, int metrics)
{
    PyObject *items = NULL, *position = NULL;
    memset(map, 0, sizeof *map);
    if (mapping == Py_None) {
        return 0;
    }
    items = PyMapping_Items(mapping);
    if (items == NULL) {
        if (PyErr_ExceptionMatches(PyExc_AttributeError)) {
            PyErr_Clear();
            PyErr_Format(PyExc_TypeError, "%s must be a mapping of str to %s, not %.200s", option,
                         metrics ? "int or float" : "str", Py_TYPE(mapping)->tp_name);
        }
        goto error;
    }
    Py_ssize_t count = PyList_GET_SIZE(items);
    if (count == 0) {
        Py_DECREF(items);
        return 0;
    }
    map->keys = PyTuple_New(count);
    map->values = PyTuple_New(count);
    map->index = PyDict_New();
    if (map->keys == NULL || map->values == NULL || map->index == NULL) {
        goto error;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *item = PyList_GET_ITEM(items, i);
        if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 2) {
            PyErr_Format(PyExc_TypeError, "%s: items() must give (key, value) pairs, not %.200s",
                         option, Py_TYPE(item)->tp_name);
            goto error;
        }
        PyObject *key = PyTuple_GET_ITEM(item, 0), *value = PyTuple_GET_ITEM(item, 1);
        PyObject *written_key = default_text(key, option, key, "keys");
        if (written_key == NULL) {
            goto error;
        }
        PyTuple_SET_ITEM(map->keys, i, written_key);
        map->key_lengths |= (uint64_t)1 << (PyUnicode_GET_LENGTH(written_key) & 63);
        for (size_t r = 0; !metrics && r < Py_ARRAY_LENGTH(default_meta_refused_keys); r++) {
            if (PyUnicode_CompareWithASCIIString(written_key, default_meta_refused_keys[r]) == 0) {
                PyErr_Format(PyExc_ValueError,
                             "%s key %R: the encoder writes this meta key itself "
                             "(docs/wire-format.md, \"Default tags\")",
                             option, key);
                goto error;
            }
        }
        int known = PyDict_Contains(map->index, written_key);
        if (known != 0) {
            if (known > 0) {
                PyErr_Format(PyExc_ValueError,
                             "%s key %R: another key is written as the same text (keys longer "
                             "than %d characters are cut)",
                             option, key, MAX_TEXT_LEN);
            }
            goto error;
        }
        PyObject *written_value = metrics ? default_metric(value, option, key)
                                          : default_text(value, option, key, "values");
        if (written_value == NULL) {
            goto error;
        }
        PyTuple_SET_ITEM(map->values, i, written_value);
        position = PyLong_FromSsize_t(i);
        if (position == NULL || PyDict_SetItem(map->index, written_key, position) < 0) {
            goto error;
        }
        Py_CLEAR(position);
    }
    map->count = count;
    Py_DECREF(items);
    return 0;
error:
    Py_XDECREF(position);
    Py_XDECREF(items);
    default_tag_map_clear(map);
    return -1;
}

int
default_tags_init(DefaultTags *tags, PyObject *meta, PyObject *metrics, int for_v10)
{
    memset(tags, 0, sizeof *tags);
    if (for_v10 && (meta != Py_None || metrics != Py_None)) {
        PyErr_Format(PyExc_TypeError,
                     "%s: default tags are for versions \"v0.4\" and \"v0.5\"; v1.0 carries such "
                     "values as payload fields (hostname, env, app_version, runtime_id, "
                     "payload_attributes)",
                     meta != Py_None && metrics != Py_None ? "default_meta, default_metrics"
                     : meta != Py_None                     ? "default_meta"
                                                           : "default_metrics");
        return -1;
    }
    if (default_tag_map_init(&tags->meta, meta, "default_meta", 0) < 0) {
        return -1;
    }
    if (default_tag_map_init(&tags->metrics, metrics, "default_metrics", 1) < 0) {
        default_tag_map_clear(&tags->meta);
        return -1;
    }
    return 0;
}

void
default_tags_clear(DefaultTags *tags)
{
    default_tag_map_clear(&tags->meta);
    default_tag_map_clear(&tags->metrics);
}

int
default_tags_traverse(const DefaultTags *tags, visitproc visit, void *arg)
{
    Py_VISIT(tags->meta.keys);
    Py_VISIT(tags->meta.values);
    Py_VISIT(tags->meta.index);
    Py_VISIT(tags->metrics.keys);
    Py_VISIT(tags->metrics.values);
    Py_VISIT(tags->metrics.index);
    return 0;
}
