/* What the span writers of every version share (their interface to the
 * encoder is tracewrite.h): errors that name the trace, span and field, the
 * value rules of the reference tracer (text and its 25,000-character
 * truncation, ids, numbers), reading a span's values (borrowed when safe),
 * and writing tag maps. */
#ifndef SPANPACK_SPANWRITE_H
#define SPANPACK_SPANWRITE_H

#include "mpwrite.h"
#include "pydict.h"
#include "pyint.h"
#include "tracewrite.h"
#include "wire.h"

/* The length of a cut str: every str longer than MAX_TEXT_LEN becomes one of
 * this many characters. */
#define CUT_TEXT_LEN (TRUNCATED_PREFIX_LEN + (Py_ssize_t)sizeof(TRUNCATION_SUFFIX) - 1)


/* Own the current span's values if they are borrowed.  Called before
 * anything that can run Python code: formatting or creating an exception
 * (a garbage collection and its finalizers, pending signal handlers),
 * encoding that can fail, calls into Python. */
static inline void
span_hold_values(SpanWriter *w)
{
    if (w->values != NULL) {
        spanvalues_own(w->values);
    }
}

/* Trace-level values read from the trace's first span. */
typedef struct {
    uint64_t trace_id_low;
    uint64_t trace_id_high;
    PyObject *origin;      /* new reference (exact str), or NULL */
    uint32_t origin_index; /* v0.5: the origin's string-table index, 0 for none */
} TraceInfo;

/* Raise `type` with "trace T, span S, FIELD[ KEY]: <message>".  Returns -1. */
int span_error(SpanWriter *w, PyObject *type, const char *field, PyObject *key, const char *format,
               ...);

/* Re-raise the current exception with the location prefixed when it is a
 * TypeError, ValueError or AttributeError (OverflowError and UnicodeError
 * become ValueError), the original as __cause__; any other Exception keeps
 * its type and gets the location as a note (PEP 678: "trace T, span S,
 * field F[ key K]", in __notes__, which tracebacks show from CPython 3.11).
 * Returns -1. */
int span_reraise(SpanWriter *w, const char *field, PyObject *key);

/* Text: str, bytes or bytearray (and None where the field allows).  The
 * prepared form is a new reference to an exact str or exact bytes, already
 * truncated, with its UTF-8 bytes. */
typedef struct {
    PyObject *object;
    const char *utf8;
    Py_ssize_t size;
} PreparedText;

/* 1: prepared; 0: `value` is None (nothing prepared); -1: error raised. */
int text_prepare(SpanWriter *w, PyObject *value, const char *field, PyObject *key,
                 PreparedText *text);

/* The UTF-8 of a str (NULL and the located error for a lone surrogate). */
const char *span_utf8(SpanWriter *w, PyObject *str, const char *field, PyObject *key,
                      Py_ssize_t *size);

/* Is `value` text (str, bytes, bytearray)? */
static inline int
is_text(PyObject *value)
{
    return PyUnicode_Check(value) || PyBytes_Check(value) || PyByteArray_Check(value);
}

int raise_bad_tag_key(SpanWriter *w, const char *field, PyObject *key);
int raise_bad_meta_value(SpanWriter *w, PyObject *key, PyObject *value);
int check_cut_key_unique(SpanWriter *w, const char *field, PyObject *key);
void cut_keys_clear(SpanWriter *w);

/* TypeError unless a tag key (meta, metrics, meta_struct) is text;
 * ValueError for a key that is cut to the same text as an earlier key of
 * its map (only keys of at least about CUT_TEXT_LEN units can be). */
static inline int
check_tag_key(SpanWriter *w, const char *field, PyObject *key)
{
    if (SP_UNLIKELY(!is_text(key))) {
        return raise_bad_tag_key(w, field, key);
    }
    Py_ssize_t length = PyUnicode_Check(key) ? PyUnicode_GET_LENGTH(key) : Py_SIZE(key);
    return SP_LIKELY(length < CUT_TEXT_LEN - 3) ? 0 : check_cut_key_unique(w, field, key);
}

/* A meta_struct value packed as a msgpack document of its own (the Packer's
 * defaults), written as a bin when `write`, else only checked (v0.5, which
 * has no place for it).  Errors name the entry. */
int meta_struct_document(SpanWriter *w, PyObject *key, PyObject *value, int write);

/* TypeError unless a meta value is text. */
static inline int
check_meta_value(SpanWriter *w, PyObject *key, PyObject *value)
{
    return SP_LIKELY(is_text(value)) ? 0 : raise_bad_meta_value(w, key, value);
}

/* The error for an id or time that is not an int in the `is_signed` 64-bit
 * range.  Returns -1. */
int span_int_error(SpanWriter *w, PyObject *value, const char *field, int is_signed);

/* Integers with range checks.  `field` names the value in errors. */
static inline int
span_uint64(SpanWriter *w, PyObject *value, const char *field, uint64_t *out)
{
    if (SP_LIKELY(PyLong_Check(value)) && pyint_as_u64(&w->state->fast_paths, value, out) == 0) {
        return 0;
    }
    return span_int_error(w, value, field, 0);
}

static inline int
span_int64(SpanWriter *w, PyObject *value, const char *field, int64_t *out)
{
    if (SP_LIKELY(PyLong_Check(value)) && pyint_as_i64(&w->state->fast_paths, value, out) == 0) {
        return 0;
    }
    return span_int_error(w, value, field, 1);
}

/* start and duration, one rule for every version (docs/wire-format.md, "One
 * trace, one meaning"): an int within 64 bits (signed or unsigned), clamped
 * to [0, 2**63 - 1] as the agent's normalizer treats it (a negative duration
 * is 0 there) and as the reference tracer's v0.5 encoder clamps it; None is 0.
 * int subclasses too: their value is read as an int's, no method runs.
 * v0.4 writes an int64 as it is (byte-identical to the reference tracer) and
 * takes this rule only beyond int64. */
int span_time_error(SpanWriter *w, PyObject *value, const char *field);

static inline int
span_time_clamped(SpanWriter *w, PyObject *value, const char *field, int64_t *out)
{
    uint64_t magnitude;
    int negative;
    *out = 0;
    if (value == NULL || value == Py_None) {
        return 0;
    }
    if (SP_UNLIKELY(!PyLong_Check(value)) ||
        SP_UNLIKELY(pyint_magnitude64(&w->state->fast_paths, value, &magnitude, &negative) != 0)) {
        return span_time_error(w, value, field);
    }
    if (!negative) {
        *out = magnitude > (uint64_t)INT64_MAX ? INT64_MAX : (int64_t)magnitude;
    }
    return 0;
}

/* The span's error field (an int; None or absent is 0) as a flag: 1 when
 * non-zero.  Returns 0, or -1 with TypeError naming the field. */
int span_error_flag_slow(SpanWriter *w, PyObject *value, int *flag);

static inline int
span_error_flag(SpanWriter *w, PyObject *value, int *flag)
{
    uint64_t magnitude;
    int negative;
    if (value == NULL || value == Py_None || value == Py_False) {
        *flag = 0;
        return 0;
    }
    if (SP_LIKELY(PyLong_CheckExact(value))) {
        /* More than 64 bits is non-zero too. */
        *flag = pyint_magnitude64(&w->state->fast_paths, value, &magnitude, &negative) != 0 ||
                magnitude != 0;
        return 0;
    }
    return span_error_flag_slow(w, value, flag);
}

/* The ValueError for a metric int beyond 64 bits (`value` may be borrowed
 * from the metrics dict).  Returns -1. */
int raise_metric_out_of_range(SpanWriter *w, PyObject *key, PyObject *value);

/* A metric value: int in [-2**63, 2**64) (bool counts as int, as in the
 * reference tracer) as the smallest int, or float as float64. */
int write_metric_value(SpanWriter *w, PyObject *key, PyObject *value);

/* The trace-level values of a non-empty trace. */
int trace_info_read(SpanWriter *w, PyObject *first_span, TraceInfo *info);
void trace_info_release(TraceInfo *info);

/* Does `meta` (a dict) lack the `_dd.p.tid` key? */
int meta_lacks_trace_id_high(SpanWriter *w, PyObject *meta, int *lacks);

/* 16 lowercase hex digits of the high half of a 128-bit trace id. */
PyObject *trace_id_high_hex(uint64_t high);


/* Length of a container field (list/dict), 0 for None or absent, -1 on
 * error (raised). */
Py_ssize_t field_length_slow(SpanWriter *w, PyObject *value, const char *field);

static inline Py_ssize_t
field_length(SpanWriter *w, PyObject *value, const char *field)
{
    if (value == NULL || value == Py_None) {
        return 0;
    }
    if (PyList_CheckExact(value)) {
        return PyList_GET_SIZE(value);
    }
    return field_length_slow(w, value, field);
}

/* One trace: the array header, the trace-level values from its first span
 * (then `start`, if given, sees them), and `write_span` for each span. */
typedef int (*TraceStartFn)(SpanWriter *w, TraceInfo *info);
typedef int (*SpanWriteFn)(SpanWriter *w, PyObject *span, TraceInfo *info);
int write_trace(SpanWriter *w, PyObject *trace, TraceStartFn start, SpanWriteFn write_span);


/* ---- map helpers shared by both versions ---- */

int map_begin_slow(SpanWriter *w, Py_ssize_t count, Py_ssize_t *header_pos);
int map_end_lenient(SpanWriter *w, Py_ssize_t header_pos, Py_ssize_t count);

/* A map whose count is known only once it is written (lenient mode, default
 * tags): a 5-byte placeholder that map_end_lenient() rewrites.  `max_count`,
 * the most entries it can get, is checked against the format's limit. */
int map_begin_uncounted(SpanWriter *w, Py_ssize_t max_count, Py_ssize_t *header_pos);

/* Write a map header: exact when `count` is final, or (lenient mode, where
 * entries may be dropped) a 5-byte placeholder fixed by map_end(). */
static SP_ALWAYS_INLINE int
map_begin(SpanWriter *w, Py_ssize_t count, Py_ssize_t *header_pos)
{
    *header_pos = outbuf_len(w->out);
    if (SP_LIKELY(!w->lenient && count < MP_FIXMAP_LIMIT && w->out->pos < w->out->end)) {
        mp_put_byte(w->out, (unsigned char)(MP_FIXMAP | count));
        return 0;
    }
    return map_begin_slow(w, count, header_pos);
}

static inline int
map_end(SpanWriter *w, Py_ssize_t header_pos, Py_ssize_t count)
{
    return w->lenient ? map_end_lenient(w, header_pos, count) : 0;
}

/* Write every (key, value) of `dict` with write_entry.  In lenient mode an
 * entry whose key or value is bad data (TypeError, ValueError, OverflowError)
 * is rolled back and counted in w->dropped_tags.  *written: entries kept.
 * `runs_python`: write_entry may run Python code (which could change the
 * dict), so entries are held and the dict re-checked after each; when 0
 * (text and numbers only) the plain loop suffices. */
typedef int (*EntryWriter)(SpanWriter *w, PyObject *key, PyObject *value);
/* The lenient loop, and the loop for entry writers that may run Python code;
 * `dict` is a non-empty dict (write_dict_entries handles the rest). */
int write_dict_entries_checked(SpanWriter *w, PyObject *dict, const char *field,
                               EntryWriter write_entry, Py_ssize_t *written);

/* A mixed tags mapping's value goes to meta (str, bool: MIXED_META), to
 * metrics (int, float: MIXED_METRICS), or is refused (MIXED_REFUSED); a
 * subclass as its base. */
enum { MIXED_REFUSED = -1, MIXED_META = 0, MIXED_METRICS = 1 };

static inline int
mixed_tag_kind(PyObject *value)
{
    if (PyUnicode_Check(value) || PyBool_Check(value)) {
        return MIXED_META;
    }
    return PyLong_Check(value) || PyFloat_Check(value) ? MIXED_METRICS : MIXED_REFUSED;
}

/* The entries a span's meta (`which` MIXED_META) or metrics (MIXED_METRICS)
 * map gets from `dict`, the field's value: its size, or for a mixed tags
 * mapping the entries of that map's kind. */
static inline Py_ssize_t
tag_map_size(const SpanWriter *w, PyObject *dict, int which)
{
    if (dict == NULL || dict == Py_None) {
        return 0;
    }
    return SP_UNLIKELY(dict == w->mixed_tags) ? w->mixed_count[which] : PyDict_GET_SIZE(dict);
}

/* write_dict_entries for the span's mixed tags mapping written as `field`:
 * for meta, its str entries and its bools as "true"/"false"; for metrics,
 * its int and float entries; a value of neither kind is a TypeError naming
 * the key in the meta pass (lenient: dropped and counted once).  The
 * entries written must be those counted when the span was read (else the
 * mapping changed meanwhile: RuntimeError). */
int write_mixed_entries(SpanWriter *w, PyObject *dict, const char *field, EntryWriter write_entry,
                        Py_ssize_t *written);

static SP_ALWAYS_INLINE int
write_dict_entries(SpanWriter *w, PyObject *dict, const char *field, EntryWriter write_entry,
                   int runs_python, Py_ssize_t *written)
{
    if (dict == NULL || dict == Py_None || PyDict_GET_SIZE(dict) == 0) {
        *written = 0;
        return 0;
    }
    if (SP_UNLIKELY(dict == w->mixed_tags)) {
        return write_mixed_entries(w, dict, field, write_entry, written);
    }
    if (SP_LIKELY(!runs_python && !w->lenient)) {
        /* No Python code runs until an error ends the loop: the dict and its
         * entries cannot change under us.  Inlined, so that the entry writer
         * (a constant at each call) is inlined into the loop. */
        DictEntries entries;
        *written = PyDict_GET_SIZE(dict);
        if (pydict_entries(&w->state->fast_paths, dict, &entries)) {
            PyObject *const *entry = entries.keys;
            for (Py_ssize_t i = 0; i < entries.count; i++, entry += entries.stride) {
                dict_entries_prefetch_ahead(&entries, entry, i);
                if (entry[1] != NULL && write_entry(w, entry[0], entry[1]) < 0) {
                    return -1;
                }
            }
            return 0;
        }
        Py_ssize_t pos = 0;
        PyObject *key, *value;
        while (PyDict_Next(dict, &pos, &key, &value)) {
            if (write_entry(w, key, value) < 0) {
                return -1;
            }
        }
        return 0;
    }
    return write_dict_entries_checked(w, dict, field, write_entry, written);
}

/* ---- default tags (DefaultTagMap, tracewrite.h) ---- */

/* The span's own entry `key` of a map with default tags was written: when
 * it is one of the defaults, that default is not written for this span.
 * Compared as written (a bytes key, a str subclass or a cut key counts as
 * the text it is written as).  Runs no Python code (only str are made). */
int default_note(SpanWriter *w, const DefaultTagMap *defaults, const char *field, PyObject *key);

/* The entries of a tag map with default tags, the map's header left to the
 * caller (map_begin_uncounted): the span's own entries (`dict`, through
 * `write_own`, which writes one with `write_default` and then calls
 * default_note), then each default the span lacks, in the order given.
 * *written: the entries written. */
int write_tags_with_defaults(SpanWriter *w, PyObject *dict, const char *field,
                             const DefaultTagMap *defaults, EntryWriter write_own,
                             EntryWriter write_default, Py_ssize_t *written);

/* Absent, None or an empty list: a links/events field with nothing to convert. */
static inline int
no_list_items(PyObject *value)
{
    return value == NULL || value == Py_None ||
           (PyList_CheckExact(value) && PyList_GET_SIZE(value) == 0);
}

/* Could looking `_dd.p.tid` up in a span's meta run Python code (a key's
 * __eq__)?  Not in a dict whose keys are all exact str, nor without meta. */
static inline int
trace_id_high_lookup_may_run_python(const SpanWriter *w, PyObject *meta)
{
    return !(meta == NULL || meta == Py_None ||
             (PyDict_Check(meta) && pydict_has_only_str_keys(&w->state->fast_paths, meta)));
}

/* Could writing this span run Python code (after its fields are read)?  Only
 * these do: an int subclass's __bool__ / __index__ for `error`, converting
 * links or events, packing meta_struct values, looking `_dd.p.tid` up in a
 * meta dict with keys other than str, and in lenient mode the repr of a bad
 * value whose tag is dropped.  A writer holding borrowed values owns them
 * first. */
static inline int
span_may_run_python(const SpanWriter *w, const SpanValues *v, const TraceInfo *info)
{
    PyObject *error = v->value[SF_ERROR], *links = v->value[SF_LINKS];
    PyObject *events = v->value[SF_EVENTS], *meta_struct = v->value[SF_META_STRUCT];
    return w->lenient ||
           !(error == NULL || error == Py_None || PyLong_CheckExact(error) ||
             PyBool_Check(error)) ||
           !no_list_items(links) || !no_list_items(events) ||
           !(meta_struct == NULL || meta_struct == Py_None ||
             (PyDict_CheckExact(meta_struct) && PyDict_GET_SIZE(meta_struct) == 0)) ||
           (w->looks_up_trace_id_high && w->span_index == 0 && info->trace_id_high != 0 &&
            trace_id_high_lookup_may_run_python(w, v->value[SF_META]));
}

/* start_ns and duration_ns of an object span kept in the unit fields= gives
 * (seconds, ms, us: an int or a float), as int nanoseconds in `v` (owned
 * then): a float rounded to the nearest nanosecond.  0, or -1 with an
 * exception naming nothing (v->failed names the field; `v` released). */
int span_times_to_ns(SpanWriter *w, SpanValues *v);

/* What fields= units and strict=True ask of an object span read into `v`:
 * its times in nanoseconds (span_times_to_ns), then nothing carried that is
 * not written (spanfields_check_strict).  0, or -1 with `v` released and
 * v->failed naming the field (-1: none). */
int span_object_options(SpanWriter *w, PyObject *span, SpanValues *v);

/* A span whose meta and metrics are one and the same dict (a dict span's
 * "meta" and "metrics" keys holding one mapping, or fields= naming one
 * attribute for both): the mapping's entries counted per map
 * (w->mixed_tags, w->mixed_count), for the writers' headers.  Its entries
 * are then routed as they are written (write_mixed_entries): no dict is
 * made.  Runs no Python code. */
void span_count_mixed_tags(SpanWriter *w, PyObject *mixed);

/* fields= names one attribute for meta and metrics, and its two reads gave
 * two objects (a getter building the mapping at each read): the first read
 * is the span's mixed tags mapping for both (`v` owned first: dropping the
 * second may run Python code). */
void span_tags_one_mapping(SpanValues *v);

/* The per-span fields, borrowed when that is safe (see SpanValues). */
static inline int
span_values_read(SpanWriter *w, PyObject *span, const TraceInfo *info, SpanValues *v)
{
    if (spanfields_read_span(w->reader, span, !w->lenient, v) < 0) {
        return -1;
    }
    if (SP_UNLIKELY(w->reader->scales_times | w->reader->strict) && !PyDict_Check(span) &&
        span_object_options(w, span, v) < 0) {
        return -1;
    }
    w->values = v;
    w->mixed_tags = NULL;
    PyObject *meta = v->value[SF_META];
    if (SP_UNLIKELY(w->reader->tags_one_attribute) && meta != NULL && meta != Py_None &&
        v->value[SF_METRICS] != NULL && v->value[SF_METRICS] != meta) {
        span_tags_one_mapping(v);
    }
    if (SP_UNLIKELY(meta == v->value[SF_METRICS] && meta != NULL && meta != Py_None)) {
        span_count_mixed_tags(w, meta);
    }
    if (v->borrowed && span_may_run_python(w, v, info)) {
        spanvalues_own(v);
    }
    return 0;
}

/* The end of a span read with span_values_read. */
static inline void
span_values_release(SpanWriter *w, SpanValues *v)
{
    w->values = NULL;
    w->mixed_tags = NULL;
    spanvalues_release(v);
}

int raise_missing_field(SpanWriter *w, int field);
int raise_trace_id_not_int(SpanWriter *w, PyObject *trace_id);

/* TypeError naming the first required field the span lacks, or a trace_id
 * that is not an int (every span's is checked; the first span's is the one
 * written, and its range is checked by trace_info_read). */
static inline int
check_required_fields(SpanWriter *w, const SpanValues *values)
{
    int missing = spanvalues_missing_required(w->reader, values);
    if (SP_LIKELY(missing < 0)) {
        return 0;
    }
    return missing < SF_COUNT ? raise_missing_field(w, missing)
                              : raise_trace_id_not_int(w, values->value[SF_TRACE_ID]);
}

/* A dict-valued field: NULL/None is an empty dict; anything else but a dict
 * is a TypeError naming the field. */
int raise_not_dict(SpanWriter *w, PyObject *value, const char *field);

static inline int
check_dict_field(SpanWriter *w, PyObject *value, const char *field)
{
    if (value == NULL || value == Py_None || PyDict_Check(value)) {
        return 0;
    }
    return raise_not_dict(w, value, field);
}

#endif /* SPANPACK_SPANWRITE_H */
