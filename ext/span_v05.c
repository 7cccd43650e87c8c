/* /v0.5/traces: each span an array of 12 whose strings are indexes into the
 * payload's string table.  A trace is written against its own table (indexes
 * 0 = "" and 1 = "_dd.origin" fixed, as in every payload table); the other
 * string references are left as holes that joining the trace into a payload
 * fills with that payload's indexes.  A one-shot encode writes straight
 * against the payload's table instead. */
#include "links_events.h"
#include "spanwrite.h"

#define V05_SPAN_ELEMENTS 12
#define V05_EMPTY_INDEX 0
#define V05_ORIGIN_KEY_INDEX 1
/* trace_id, span_id, parent_id, start, duration and error, written in a row. */
#define V05_NUMBERS_MAX_SIZE (6 * 9)

/* The span writer is compiled twice, for writing straight into a payload
 * (into_payload: the table is the payload's) and into an encoded trace
 * (the trace's own table), so that a one-shot encode carries no test for
 * the other. */

/* A string reference.  Written at once when the table is the payload's, or
 * when the index is a forecast one (put(): see IndexForecast); else, in an
 * encoded trace's own table only 0 and 1 mean the same as in every
 * payload, so the others become holes. */
static SP_ALWAYS_INLINE int
v05_write_index(SpanWriter *w, uint32_t index, int into_payload)
{
    if (into_payload || index <= V05_ORIGIN_KEY_INDEX || w->forecast != NULL) {
        /* mp_write_uint, kept inline in this large function. */
        if (outbuf_reserve(w->out, MP_MAX_HEADER) < 0) {
            return -1;
        }
        mp_put_uint(w->out, index);
        return 0;
    }
    return holes_push(w->holes, outbuf_len(w->out), index);
}

/* strtable_index on the writer's table (`absent_hash`: the table's hash of
 * `key` when lookups just failed to find it, else -1).  With a forecast,
 * the index to write: the payload's when it has the key, else that of an
 * entry of the trace's own table (forecast_local_index). */
static SP_ALWAYS_INLINE int
v05_table_index(SpanWriter *w, PyObject *key, Py_hash_t absent_hash, uint32_t *index)
{
    if (w->forecast == NULL) {
        return absent_hash == -1
                   ? strtable_index(w->strings, key, w->encode_string, NULL, index)
                   : strtable_insert(w->strings, key, absent_hash, w->encode_string, NULL, index);
    }
    uint32_t local_index;
    Py_hash_t hash = absent_hash;
    if (hash == -1) {
        hash = strtable_key_hash(w->strings, key);
        StringTable *payload = forecast_payload_table(w->forecast);
        if (payload != NULL && strtable_find(payload, key, hash, index)) {
            return 0;
        }
        if (strtable_find(w->strings, key, hash, &local_index)) {
            return forecast_local_index(w->forecast, local_index, index);
        }
    }
    if (strtable_add(w->strings, key, hash, NULL, NULL, &local_index) < 0) {
        return -1;
    }
    return forecast_local_index(w->forecast, local_index, index);
}

/* The table key for a text value: the (truncated) exact str or exact bytes,
 * as the reference tracer keys its table.  `hash`: the table's hash of
 * `value`, an exact str of at most MAX_TEXT_LEN code points not in the
 * table(s), else -1. */
static SP_NOINLINE int
v05_text_index_slow(SpanWriter *w, PyObject *value, Py_hash_t hash, const char *field,
                    PyObject *key, uint32_t *index)
{
    if (hash != -1) {
        /* Validate now so that joining can never fail on this string. */
        Py_ssize_t size;
        if (!PyUnicode_IS_ASCII(value) && span_utf8(w, value, field, key, &size) == NULL) {
            return -1;
        }
        return v05_table_index(w, value, hash, index);
    }
    PreparedText text;
    int prepared = text_prepare(w, value, field, key, &text);
    if (prepared <= 0) {
        *index = V05_EMPTY_INDEX;
        return prepared;
    }
    int result = v05_table_index(w, text.object, -1, index);
    Py_DECREF(text.object);
    return result;
}

/* put()'s forecast lookup of a value the payload's table (`payload`,
 * forecast_payload_table's: NULL once the payload changed) did not find by
 * its address: by text there, then in the trace's own table; *hash as there
 * (computed once for both). */
static SP_ALWAYS_INLINE int
v05_forecast_find_text_not_object(SpanWriter *w, StringTable *payload, PyObject *value,
                                  Py_hash_t *hash, uint32_t *index)
{
    if (payload != NULL) {
        if (strtable_find_text_not_object(payload, value, MAX_TEXT_LEN, hash, index)) {
            return 1;
        }
    }
    else {
        *hash = strtable_short_str_hash(w->strings, value, MAX_TEXT_LEN);
    }
    uint32_t local_index;
    if (strtable_find_object(w->strings, value, &local_index) ||
        (*hash != -1 && strtable_find(w->strings, value, *hash, &local_index))) {
        return forecast_local_index(w->forecast, local_index, index) == 0 ? 1 : -1;
    }
    return 0;
}

/* The index of a text field that `table` (v05_address_table's) did not
 * find by its address, or that no table was asked for by address (NULL: the
 * trace's own table is, here): looked up by text (and in the trace's own
 * table by address too), or added; then written. */
static SP_ALWAYS_INLINE int
v05_write_text_not_object(SpanWriter *w, StringTable *table, PyObject *value, const char *field,
                          PyObject *key, int into_payload)
{
    uint32_t index = V05_EMPTY_INDEX;
    if (value != NULL && value != Py_None) {
        /* Text found here is a short str already in a table (it was
         * validated when it went in). */
        Py_hash_t hash;
        int found = into_payload
                        ? strtable_find_text_not_object(table, value, MAX_TEXT_LEN, &hash, &index)
                    : w->forecast != NULL
                        ? v05_forecast_find_text_not_object(w, table, value, &hash, &index)
                        : strtable_find_text(w->strings, value, MAX_TEXT_LEN, &hash, &index);
        if (found < 0 || (!found && v05_text_index_slow(w, value, hash, field, key, &index) < 0)) {
            return -1;
        }
    }
    return v05_write_index(w, index, into_payload);
}

static SP_NOINLINE int
v05_write_text_not_object_into_payload(SpanWriter *w, StringTable *table, PyObject *value,
                                       const char *field, PyObject *key)
{
    return v05_write_text_not_object(w, table, value, field, key, 1);
}

static SP_NOINLINE int
v05_write_text_not_object_into_part(SpanWriter *w, StringTable *table, PyObject *value,
                                    const char *field, PyObject *key)
{
    return v05_write_text_not_object(w, table, value, field, key, 0);
}

/* The table a text field is first looked up in by its address, inline:
 * the payload's, or under a forecast the payload's while it is as the
 * forecast found it; else NULL (the trace's own table is then asked, by
 * address too, in v05_write_text_not_object). */
static SP_ALWAYS_INLINE StringTable *
v05_address_table(SpanWriter *w, int into_payload)
{
    return into_payload          ? w->strings
           : w->forecast != NULL ? forecast_payload_table(w->forecast)
                                 : NULL;
}

/* A text field.  Inline only the most common case, the very object the
 * table last found at its address, unless `whole_lookup_inline`.  The rest
 * of the lookup, inlined at each of a span's text fields, made the span
 * writer bigger than the instruction cache (30 KB under a forecast): there
 * it is called instead, one copy per way of writing.  Callgrind's simulated
 * L1 instruction misses fell on every shape measured, by up to 46%,
 * instructions moved by 3.3% or less either way (docs/ddtrace.md).  A tag's
 * key and value keep the whole lookup inline (whole_lookup_inline), in the
 * entry writer of its map's loop: often text new to the table or another
 * object of the same text (a value or a key made per span), for which a
 * call cost 4-17% more instructions on spans of 40 tags. */
static SP_ALWAYS_INLINE int
v05_write_text_as(SpanWriter *w, PyObject *value, const char *field, PyObject *key,
                  int into_payload, int whole_lookup_inline)
{
    StringTable *table = v05_address_table(w, into_payload);
    uint32_t index;
    /* (NULL and None are never a table's strings: not found.) */
    if (table != NULL && strtable_find_object(table, value, &index)) {
        return v05_write_index(w, index, into_payload);
    }
    if (whole_lookup_inline) {
        return v05_write_text_not_object(w, table, value, field, key, into_payload);
    }
    return into_payload ? v05_write_text_not_object_into_payload(w, table, value, field, key)
                        : v05_write_text_not_object_into_part(w, table, value, field, key);
}

static SP_ALWAYS_INLINE int
v05_write_text(SpanWriter *w, PyObject *value, const char *field, PyObject *key, int into_payload)
{
    return v05_write_text_as(w, value, field, key, into_payload, 0);
}

static SP_ALWAYS_INLINE int
v05_write_tag_text(SpanWriter *w, PyObject *value, const char *field, PyObject *key,
                   int into_payload)
{
    return v05_write_text_as(w, value, field, key, into_payload, 1);
}

static SP_ALWAYS_INLINE int
v05_write_meta_entry(SpanWriter *w, PyObject *key, PyObject *value, int into_payload)
{
    if (check_tag_key(w, "meta", key) < 0) {
        return -1;
    }
    if (check_meta_value(w, key, value) < 0) {
        return -1;
    }
    if (v05_write_tag_text(w, key, "meta", key, into_payload) < 0) {
        return -1;
    }
    return v05_write_tag_text(w, value, "meta", key, into_payload);
}

static int
v05_write_meta_entry_into_payload(SpanWriter *w, PyObject *key, PyObject *value)
{
    return v05_write_meta_entry(w, key, value, 1);
}

static int
v05_write_meta_entry_into_part(SpanWriter *w, PyObject *key, PyObject *value)
{
    return v05_write_meta_entry(w, key, value, 0);
}

static SP_ALWAYS_INLINE int
v05_write_metric_entry(SpanWriter *w, PyObject *key, PyObject *value, int into_payload)
{
    if (check_tag_key(w, "metrics", key) < 0) {
        return -1;
    }
    if (v05_write_tag_text(w, key, "metrics", key, into_payload) < 0) {
        return -1;
    }
    return write_metric_value(w, key, value);
}

static int
v05_write_metric_entry_into_payload(SpanWriter *w, PyObject *key, PyObject *value)
{
    return v05_write_metric_entry(w, key, value, 1);
}

static int
v05_write_metric_entry_into_part(SpanWriter *w, PyObject *key, PyObject *value)
{
    return v05_write_metric_entry(w, key, value, 0);
}

/* A span's own entry where there are default tags: noted, so that the
 * default of the same key is not written too. */
static SP_ALWAYS_INLINE int
v05_write_entry_noted(SpanWriter *w, PyObject *key, PyObject *value, int metrics, int into_payload)
{
    if (metrics) {
        return v05_write_metric_entry(w, key, value, into_payload) < 0
                   ? -1
                   : default_note(w, w->default_metrics, "metrics", key);
    }
    return v05_write_meta_entry(w, key, value, into_payload) < 0
               ? -1
               : default_note(w, w->default_meta, "meta", key);
}

static int
v05_write_meta_entry_noted_into_payload(SpanWriter *w, PyObject *key, PyObject *value)
{
    return v05_write_entry_noted(w, key, value, 0, 1);
}

static int
v05_write_meta_entry_noted_into_part(SpanWriter *w, PyObject *key, PyObject *value)
{
    return v05_write_entry_noted(w, key, value, 0, 0);
}

static int
v05_write_metric_entry_noted_into_payload(SpanWriter *w, PyObject *key, PyObject *value)
{
    return v05_write_entry_noted(w, key, value, 1, 1);
}

static int
v05_write_metric_entry_noted_into_part(SpanWriter *w, PyObject *key, PyObject *value)
{
    return v05_write_entry_noted(w, key, value, 1, 0);
}

/* A default tag the span lacks (the span's own maps' entry writers above are
 * each used in one place only, their map's loop, into which they are inlined). */
static int
v05_write_default_meta_into_payload(SpanWriter *w, PyObject *key, PyObject *value)
{
    return v05_write_meta_entry(w, key, value, 1);
}

static int
v05_write_default_meta_into_part(SpanWriter *w, PyObject *key, PyObject *value)
{
    return v05_write_meta_entry(w, key, value, 0);
}

static int
v05_write_default_metric_into_payload(SpanWriter *w, PyObject *key, PyObject *value)
{
    return v05_write_metric_entry(w, key, value, 1);
}

static int
v05_write_default_metric_into_part(SpanWriter *w, PyObject *key, PyObject *value)
{
    return v05_write_metric_entry(w, key, value, 0);
}

/* The meta or metrics entries with default tags, behind a header fixed by
 * map_end_lenient (their count is known only once they are written). */
static SP_NOINLINE int
v05_write_tags_with_defaults(SpanWriter *w, PyObject *tags, int metrics, Py_ssize_t max_count,
                             int into_payload, Py_ssize_t *header_pos, Py_ssize_t *written)
{
    const DefaultTagMap *defaults = metrics ? w->default_metrics : w->default_meta;
    EntryWriter own, plain;
    if (metrics) {
        own = into_payload ? v05_write_metric_entry_noted_into_payload
                           : v05_write_metric_entry_noted_into_part;
        plain = into_payload ? v05_write_default_metric_into_payload
                             : v05_write_default_metric_into_part;
    }
    else {
        own = into_payload ? v05_write_meta_entry_noted_into_payload
                           : v05_write_meta_entry_noted_into_part;
        plain =
            into_payload ? v05_write_default_meta_into_payload : v05_write_default_meta_into_part;
    }
    if (map_begin_uncounted(w, max_count + defaults->count, header_pos) < 0) {
        return -1;
    }
    return write_tags_with_defaults(w, tags, metrics ? "metrics" : "meta", defaults, own, plain,
                                    written);
}

/* Not an int, or an int beyond 64 bits (clamping those would send a time
 * the span never had). */
/* The error field: an int that fits in 32 bits (None is 0). */
static SP_NOINLINE int
v05_error_value_slow(SpanWriter *w, PyObject *value, long *out)
{
    if (!PyLong_Check(value)) {
        return span_error(w, PyExc_TypeError, "error", NULL, "expected int, not %.200s",
                          Py_TYPE(value)->tp_name);
    }
    int overflow;
    *out = PyLong_AsLongAndOverflow(value, &overflow);
    if (*out == -1 && PyErr_Occurred()) {
        return span_reraise(w, "error", NULL);
    }
    if (overflow != 0 || *out < INT32_MIN || *out > INT32_MAX) {
        /* Beyond the int32 the agent reads: an error all the same, written
         * as v0.4 writes every error (1), so every version takes it. */
        *out = 1;
    }
    return 0;
}

static inline int
v05_error_value(SpanWriter *w, PyObject *value, long *out)
{
    uint64_t magnitude;
    int negative;
    *out = 0;
    if (value == NULL || value == Py_None) {
        return 0;
    }
    if (SP_LIKELY(PyLong_CheckExact(value)) &&
        pyint_magnitude64(&w->state->fast_paths, value, &magnitude, &negative) == 0 &&
        magnitude <= INT32_MAX) {
        *out = negative ? -(long)magnitude : (long)magnitude;
        return 0;
    }
    return v05_error_value_slow(w, value, out);
}

/* The JSON text of links or events as a meta entry: key index, value index. */
static SP_ALWAYS_INLINE int
v05_write_json_entry(SpanWriter *w, PyObject *key, PyObject *json_text, const char *field,
                     int into_payload)
{
    if (v05_write_text(w, key, field, NULL, into_payload) < 0) {
        return -1;
    }
    return v05_write_text(w, json_text, field, NULL, into_payload);
}

/* A meta_struct entry, checked as v0.4 and v1.0 write it (text key, a value
 * the Packer can pack) and not written: v0.5 has no place for it. */
static int
v05_check_meta_struct_entry(SpanWriter *w, PyObject *key, PyObject *value)
{
    PreparedText text;
    if (check_tag_key(w, "meta_struct", key) < 0 ||
        text_prepare(w, key, "meta_struct", key, &text) < 0) {
        return -1;
    }
    Py_DECREF(text.object); /* a text key is always prepared */
    return meta_struct_document(w, key, value, 0);
}

/* meta_struct (not None or empty): accepted or refused as in v0.4 and v1.0, then
 * dropped, each entry counted in dropped_tags (never dropped unseen). */
static int
v05_drop_meta_struct(SpanWriter *w, PyObject *meta_struct)
{
    Py_ssize_t checked;
    if (check_dict_field(w, meta_struct, "meta_struct") < 0 ||
        write_dict_entries(w, meta_struct, "meta_struct", v05_check_meta_struct_entry, 1,
                           &checked) < 0) {
        return -1;
    }
    w->dropped_tags += checked;
    return 0;
}

static SP_ALWAYS_INLINE int
v05_write_span(SpanWriter *w, PyObject *span, TraceInfo *info, int into_payload, int with_defaults)
{
    SpanValues v;
    PyObject *links_text = NULL, *events_text = NULL;
    int result = -1;

    if (span_values_read(w, span, info, &v) < 0) {
        return span_reraise(w, v.failed >= 0 ? span_field_names[v.failed] : "span", NULL);
    }
    PyObject *parent = v.value[SF_PARENT_ID], *error_obj = v.value[SF_ERROR];
    PyObject *meta = v.value[SF_META], *metrics = v.value[SF_METRICS];
    PyObject *meta_struct = v.value[SF_META_STRUCT];
    uint64_t span_id = 0, parent_id = 0;
    int64_t start, duration;
    long error_value = 0;

    if (check_required_fields(w, &v) < 0) {
        goto done;
    }
    if (span_uint64(w, v.value[SF_SPAN_ID], "span_id", &span_id) < 0 ||
        (parent != NULL && parent != Py_None &&
         span_uint64(w, parent, "parent_id", &parent_id) < 0) ||
        (v.value[SF_START] == Py_None && span_int_error(w, Py_None, "start_ns", 1) < 0) ||
        span_time_clamped(w, v.value[SF_START], "start_ns", &start) < 0 ||
        span_time_clamped(w, v.value[SF_DURATION], "duration_ns", &duration) < 0 ||
        v05_error_value(w, error_obj, &error_value) < 0) {
        goto done;
    }
    if (check_dict_field(w, meta, "meta") < 0 || check_dict_field(w, metrics, "metrics") < 0 ||
        (meta_struct != NULL && meta_struct != Py_None &&
         !(PyDict_CheckExact(meta_struct) && PyDict_GET_SIZE(meta_struct) == 0) &&
         v05_drop_meta_struct(w, meta_struct) < 0)) {
        goto done;
    }
    Py_ssize_t links_count = field_length(w, v.value[SF_LINKS], "links");
    Py_ssize_t events_count = field_length(w, v.value[SF_EVENTS], "events");
    if (links_count < 0 || events_count < 0) {
        goto done;
    }
    if (links_count > 0 && (links_text = links_json(w, v.value[SF_LINKS])) == NULL) {
        goto done;
    }
    if (events_count > 0 && (events_text = events_json(w, v.value[SF_EVENTS])) == NULL) {
        goto done;
    }
    int add_trace_id_high = 0;
    if (w->span_index == 0 && info->trace_id_high != 0 &&
        meta_lacks_trace_id_high(w, meta, &add_trace_id_high) < 0) {
        goto done;
    }

    if (mp_write_byte(w->out, MP_FIXARRAY | V05_SPAN_ELEMENTS) < 0 ||
        v05_write_text(w, v.value[SF_SERVICE], "service", NULL, into_payload) < 0 ||
        v05_write_text(w, v.value[SF_NAME], "name", NULL, into_payload) < 0 ||
        v05_write_text(w, v.value[SF_RESOURCE], "resource", NULL, into_payload) < 0 ||
        outbuf_reserve(w->out, V05_NUMBERS_MAX_SIZE) < 0) {
        goto done;
    }
    mp_put_uint(w->out, info->trace_id_low);
    mp_put_uint(w->out, span_id);
    mp_put_uint(w->out, parent_id);
    mp_put_int(w->out, start);
    mp_put_int(w->out, duration);
    mp_put_int(w->out, error_value);

    Py_ssize_t meta_size = tag_map_size(w, meta, MIXED_META);
    int has_origin = info->origin_index != V05_EMPTY_INDEX;
    Py_ssize_t extras =
        add_trace_id_high + has_origin + (links_text != NULL) + (events_text != NULL);
    Py_ssize_t header_pos, written;
    if (with_defaults && w->default_meta != NULL) {
        if (v05_write_tags_with_defaults(w, meta, 0, meta_size + extras, into_payload, &header_pos,
                                         &written) < 0) {
            goto done;
        }
    }
    else if (map_begin(w, meta_size + extras, &header_pos) < 0 ||
             write_dict_entries(w, meta, "meta",
                                into_payload ? v05_write_meta_entry_into_payload
                                             : v05_write_meta_entry_into_part,
                                0, &written) < 0) {
        goto done;
    }
    if (add_trace_id_high) {
        PyObject *hex = trace_id_high_hex(info->trace_id_high);
        if (hex == NULL) {
            goto done;
        }
        int written_tid =
            v05_write_json_entry(w, w->state->str_trace_id_high_key, hex, "trace_id", into_payload);
        Py_DECREF(hex);
        if (written_tid < 0) {
            goto done;
        }
    }
    if (has_origin && (v05_write_index(w, V05_ORIGIN_KEY_INDEX, into_payload) < 0 ||
                       v05_write_index(w, info->origin_index, into_payload) < 0)) {
        goto done;
    }
    if (links_text != NULL && v05_write_json_entry(w, w->state->str_span_links_key, links_text,
                                                   "links", into_payload) < 0) {
        goto done;
    }
    if (events_text != NULL && v05_write_json_entry(w, w->state->str_events_key, events_text,
                                                    "events", into_payload) < 0) {
        goto done;
    }
    if ((with_defaults && w->default_meta != NULL ? map_end_lenient(w, header_pos, written + extras)
                                                  : map_end(w, header_pos, written + extras)) < 0) {
        goto done;
    }

    Py_ssize_t metrics_size = tag_map_size(w, metrics, MIXED_METRICS);
    if (with_defaults && w->default_metrics != NULL) {
        if (v05_write_tags_with_defaults(w, metrics, 1, metrics_size, into_payload, &header_pos,
                                         &written) < 0 ||
            map_end_lenient(w, header_pos, written) < 0) {
            goto done;
        }
    }
    else if (map_begin(w, metrics_size, &header_pos) < 0 ||
             write_dict_entries(w, metrics, "metrics",
                                into_payload ? v05_write_metric_entry_into_payload
                                             : v05_write_metric_entry_into_part,
                                0, &written) < 0 ||
             map_end(w, header_pos, written) < 0) {
        goto done;
    }
    if (v05_write_text(w, v.value[SF_SPAN_TYPE], "span_type", NULL, into_payload) < 0) {
        goto done;
    }
    result = 0;
done:
    Py_XDECREF(links_text);
    Py_XDECREF(events_text);
    span_values_release(w, &v);
    return result;
}

static int
v05_write_span_into_payload(SpanWriter *w, PyObject *span, TraceInfo *info)
{
    return v05_write_span(w, span, info, 1, 0);
}

static int
v05_write_span_into_part(SpanWriter *w, PyObject *span, TraceInfo *info)
{
    return v05_write_span(w, span, info, 0, 0);
}

/* With default tags: copies of their own, so that the two above never test
 * for them. */
static SP_NOINLINE int
v05_write_span_with_defaults_into_payload(SpanWriter *w, PyObject *span, TraceInfo *info)
{
    return v05_write_span(w, span, info, 1, 1);
}

static SP_NOINLINE int
v05_write_span_with_defaults_into_part(SpanWriter *w, PyObject *span, TraceInfo *info)
{
    return v05_write_span(w, span, info, 0, 1);
}

/* The origin enters the table before any span's strings, as in the
 * reference tracer, keyed by the whole origin even when long (its entry is
 * cut); "" gets index 0, which means "no origin". */
static int
v05_start_trace(SpanWriter *w, TraceInfo *info)
{
    info->origin_index = V05_EMPTY_INDEX;
    if (info->origin == NULL) {
        return 0;
    }
    if (v05_table_index(w, info->origin, -1, &info->origin_index) < 0) {
        return -1;
    }
    if (w->forecast != NULL) {
        w->forecast->origin_ref = info->origin_index;
    }
    return 0;
}

int
v05_write_trace(SpanWriter *w, PyObject *trace)
{
    SpanWriteFn write_span;
    if (w->default_meta != NULL || w->default_metrics != NULL) {
        write_span = w->holes == NULL ? v05_write_span_with_defaults_into_payload
                                      : v05_write_span_with_defaults_into_part;
    }
    else {
        write_span = w->holes == NULL ? v05_write_span_into_payload : v05_write_span_into_part;
    }
    return write_trace(w, trace, v05_start_trace, write_span);
}
