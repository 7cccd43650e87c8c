/* /v0.4/traces: each span a map with the reference tracer's keys, in its
 * order, written straight from the span object. */
#include "spanwrite.h"

/* A key known at compile time, header byte included: PUT_KEY where room is
 * already reserved, WRITE_KEY otherwise.  The constant size lets the compiler
 * turn the copy into a few moves. */
#define KEY_SIZE(literal) ((Py_ssize_t)sizeof(literal) - 1)
#define PUT_KEY(w, literal)                                                                        \
    (memcpy((w)->out->pos, literal, (size_t)KEY_SIZE(literal)), (w)->out->pos += KEY_SIZE(literal))
#define WRITE_KEY(w, literal)                                                                      \
    (outbuf_reserve((w)->out, KEY_SIZE(literal)) < 0 ? -1 : (PUT_KEY(w, literal), 0))

/* Everything but a short exact str: bytes, None, str subclasses, long str. */
static SP_NOINLINE int
v04_write_text_slow(SpanWriter *w, PyObject *value, const char *field, PyObject *key,
                    int allow_none)
{
    if (value == Py_None && allow_none) {
        return mp_write_byte(w->out, MP_NIL);
    }
    if (value == Py_None) {
        return span_error(w, PyExc_TypeError, field, key, "expected str or bytes, not None");
    }
    PreparedText text;
    int prepared = text_prepare(w, value, field, key, &text);
    if (prepared <= 0) {
        return prepared;
    }
    int result = mp_write_str(w->out, text.utf8, text.size, 1);
    Py_DECREF(text.object);
    return result;
}

/* A str not yet in the cache: encode it, then remember its bytes. */
static SP_NOINLINE int
v04_write_str_uncached(SpanWriter *w, PyObject *value, const char *field, PyObject *key)
{
    const char *data;
    Py_ssize_t size;
    if (PyUnicode_IS_COMPACT_ASCII(value)) {
        data = (const char *)PyUnicode_DATA(value);
        size = PyUnicode_GET_LENGTH(value);
    }
    else {
        data = span_utf8(w, value, field, key, &size);
        if (data == NULL) {
            return -1;
        }
    }
    Py_ssize_t before = outbuf_len(w->out);
    if (mp_write_str(w->out, data, size, 1) < 0) {
        return -1;
    }
    if (w->cache != NULL) {
        strcache_store(w->cache, value, w->out->start + before, outbuf_len(w->out) - before);
    }
    return 0;
}

/* How likely a text is to repeat: names and tag keys do, tag values may. */
enum { OFTEN_REPEATED = 0, MAYBE_REPEATED = 1 };

/* str (cached when interning is on), bytes, or None where allowed. */
static inline int
v04_write_text_probing(SpanWriter *w, PyObject *value, const char *field, PyObject *key,
                       int allow_none, int repeats)
{
    /* The cache is probed first, by address: only exact, short str are ever
     * stored, so a hit needs no type check and never touches the str. */
    if (w->cache != NULL) {
        int cached = strcache_write(w->cache, value, w->out, repeats == MAYBE_REPEATED);
        if (cached != 0) {
            return cached < 0 ? -1 : 0;
        }
    }
    if (SP_LIKELY(PyUnicode_CheckExact(value) && PyUnicode_GET_LENGTH(value) <= MAX_TEXT_LEN)) {
        return v04_write_str_uncached(w, value, field, key);
    }
    return v04_write_text_slow(w, value, field, key, allow_none);
}

static inline int
v04_write_text(SpanWriter *w, PyObject *value, const char *field, PyObject *key, int allow_none)
{
    return v04_write_text_probing(w, value, field, key, allow_none, OFTEN_REPEATED);
}

static int
v04_write_meta_entry(SpanWriter *w, PyObject *key, PyObject *value)
{
    if (check_tag_key(w, "meta", key) < 0) {
        return -1;
    }
    if (check_meta_value(w, key, value) < 0) {
        return -1;
    }
    if (v04_write_text(w, key, "meta", key, 0) < 0) {
        return -1;
    }
    return v04_write_text_probing(w, value, "meta", key, 0, MAYBE_REPEATED);
}

static int
v04_write_metric_entry(SpanWriter *w, PyObject *key, PyObject *value)
{
    if (check_tag_key(w, "metrics", key) < 0) {
        return -1;
    }
    if (v04_write_text(w, key, "metrics", key, 0) < 0) {
        return -1;
    }
    return write_metric_value(w, key, value);
}

static int
v04_write_meta(SpanWriter *w, PyObject *meta, const TraceInfo *info, int add_trace_id_high,
               PyObject *events_text)
{
    Py_ssize_t meta_size = meta != NULL && meta != Py_None ? PyDict_GET_SIZE(meta) : 0;
    Py_ssize_t extras = add_trace_id_high + (info->origin != NULL) + (events_text != NULL);
    Py_ssize_t header_pos, written;
    if (WRITE_KEY(w, "\xa4meta") < 0 || map_begin(w, meta_size + extras, &header_pos) < 0 ||
        write_dict_entries(w, meta, "meta", v04_write_meta_entry, 0, &written) < 0) {
        return -1;
    }
    if (add_trace_id_high) {
        PyObject *hex = trace_id_high_hex(info->trace_id_high);
        if (hex == NULL) {
            return -1;
        }
        int result = WRITE_KEY(w, "\xa9" TRACE_ID_HIGH_KEY);
        if (result == 0) {
            result = v04_write_text(w, hex, "trace_id", NULL, 0);
        }
        Py_DECREF(hex);
        if (result < 0) {
            return -1;
        }
    }
    if (info->origin != NULL) {
        /* The reference tracer writes the origin whole (never truncated). */
        Py_ssize_t size;
        const char *utf8 = PyUnicode_AsUTF8AndSize(info->origin, &size);
        if (utf8 == NULL || WRITE_KEY(w, "\xaa" ORIGIN_KEY) < 0) {
            return -1;
        }
        if (mp_write_str(w->out, utf8, size, 1) < 0) {
            return span_reraise(w, "origin", NULL);
        }
    }
    if (events_text != NULL) {
        if (WRITE_KEY(w, "\xa6" SPAN_EVENTS_KEY) < 0 ||
            v04_write_text(w, events_text, "events", NULL, 0) < 0) {
            return -1;
        }
    }
    return map_end(w, header_pos, written + extras);
}

static int
v04_write_metrics(SpanWriter *w, PyObject *metrics)
{
    Py_ssize_t header_pos, written;
    if (WRITE_KEY(w, "\xa7metrics") < 0 ||
        map_begin(w, PyDict_GET_SIZE(metrics), &header_pos) < 0 ||
        write_dict_entries(w, metrics, "metrics", v04_write_metric_entry, 0, &written) < 0) {
        return -1;
    }
    return map_end(w, header_pos, written);
}

/* meta_struct: str -> bin, each value a msgpack document of its own. */
static int
v04_write_meta_struct_entry(SpanWriter *w, PyObject *key, PyObject *value)
{
    if (check_tag_key(w, "meta_struct", key) < 0) {
        return -1;
    }
    if (v04_write_text(w, key, "meta_struct", key, 0) < 0) {
        return -1;
    }
    OutBuf document;
    if (outbuf_init_raw(&document, 256) < 0) {
        return -1;
    }
    int result = pack_object(&w->value_options, &document, value, PACK_NEST_LIMIT);
    if (result == 0) {
        result = mp_write_bin(w->out, document.start, outbuf_len(&document));
    }
    if (result < 0) {
        span_reraise(w, "meta_struct", key);
    }
    outbuf_free(&document);
    return result;
}

static int
v04_write_meta_struct(SpanWriter *w, PyObject *meta_struct)
{
    Py_ssize_t header_pos, written;
    if (WRITE_KEY(w, "\xabmeta_struct") < 0 ||
        map_begin(w, PyDict_GET_SIZE(meta_struct), &header_pos) < 0 ||
        write_dict_entries(w, meta_struct, "meta_struct", v04_write_meta_struct_entry, 1,
                           &written) < 0) {
        return -1;
    }
    return map_end(w, header_pos, written);
}

/* Links and native events: converted in Python, then packed as plain data. */
static int
v04_write_converted(SpanWriter *w, const char *key_literal, Py_ssize_t key_size,
                    PyObject *(*convert)(SpanWriter *, PyObject *), PyObject *items,
                    const char *field)
{
    PyObject *converted = convert(w, items);
    if (converted == NULL) {
        return -1;
    }
    int result = outbuf_write(w->out, key_literal, key_size);
    if (result == 0) {
        result = pack_object(&w->value_options, w->out, converted, PACK_NEST_LIMIT);
        if (result < 0) {
            span_reraise(w, field, NULL);
        }
    }
    Py_DECREF(converted);
    return result;
}

/* The largest fixed-size run of a span: map header, trace_id, parent_id and
 * span_id with their keys. */
#define V04_IDS_MAX_SIZE (1 + 9 + 9 + 10 + 9 + 8 + 9)
/* start, duration and error with their keys. */
#define V04_TIMES_MAX_SIZE (6 + 9 + 9 + 9 + 6 + 1)

static int
v04_write_span(SpanWriter *w, PyObject *span, TraceInfo *info)
{
    SpanValues v;
    PyObject *events_text = NULL;
    int result = -1;

    if (span_values_read(w, span, info, &v) < 0) {
        return span_reraise(w, v.failed >= 0 ? span_field_names[v.failed] : "span", NULL);
    }
    PyObject *parent = v.value[SF_PARENT_ID], *span_type = v.value[SF_SPAN_TYPE];
    PyObject *meta = v.value[SF_META], *metrics = v.value[SF_METRICS];
    PyObject *meta_struct = v.value[SF_META_STRUCT];
    PyObject *duration_obj = v.value[SF_DURATION];
    PyObject *service = v.value[SF_SERVICE], *resource = v.value[SF_RESOURCE];

    uint64_t span_id = 0, parent_id = 0;
    int64_t start = 0, duration = 0;
    int has_error;
    if (check_required_fields(w, &v) < 0) {
        goto error;
    }
    int has_parent = parent != NULL && parent != Py_None;
    int has_duration = duration_obj != NULL && duration_obj != Py_None;
    if (span_uint64(w, v.value[SF_SPAN_ID], "span_id", &span_id) < 0 ||
        (has_parent && span_uint64(w, parent, "parent_id", &parent_id) < 0) ||
        span_int64(w, v.value[SF_START], "start_ns", &start) < 0 ||
        (has_duration && span_int64(w, duration_obj, "duration_ns", &duration) < 0) ||
        span_error_flag(w, v.value[SF_ERROR], &has_error) < 0) {
        goto error;
    }
    if (check_dict_field(w, meta, "meta") < 0 || check_dict_field(w, metrics, "metrics") < 0 ||
        check_dict_field(w, meta_struct, "meta_struct") < 0) {
        goto error;
    }
    Py_ssize_t links_count = field_length(w, v.value[SF_LINKS], "links");
    Py_ssize_t events_count = field_length(w, v.value[SF_EVENTS], "events");
    if (links_count < 0 || events_count < 0) {
        goto error;
    }
    int has_type = span_type != NULL && span_type != Py_None;
    int has_links = links_count > 0;
    int native_events = events_count > 0 && w->native_span_events;
    int has_metrics = metrics != NULL && metrics != Py_None && PyDict_GET_SIZE(metrics) > 0;
    int has_meta_struct =
        meta_struct != NULL && meta_struct != Py_None && PyDict_GET_SIZE(meta_struct) > 0;
    int add_trace_id_high = 0;
    if (w->span_index == 0 && info->trace_id_high != 0 &&
        meta_lacks_trace_id_high(w, meta, &add_trace_id_high) < 0) {
        goto error;
    }
    if (events_count > 0 && !w->native_span_events) {
        events_text = events_json(w, v.value[SF_EVENTS]);
        if (events_text == NULL) {
            goto error;
        }
    }
    int has_meta = (meta != NULL && meta != Py_None && PyDict_GET_SIZE(meta) > 0) ||
                   info->origin != NULL || events_text != NULL || add_trace_id_high;

    uint32_t key_count = 7 + has_parent + has_error + has_type + has_links + native_events +
                         has_meta + has_meta_struct + has_metrics;
    if (outbuf_reserve(w->out, V04_IDS_MAX_SIZE) < 0) {
        goto error;
    }
    mp_put_map_header(w->out, key_count);
    PUT_KEY(w, "\xa8trace_id");
    mp_put_uint(w->out, info->trace_id_low);
    if (has_parent) {
        PUT_KEY(w, "\xa9parent_id");
        mp_put_uint(w->out, parent_id);
    }
    PUT_KEY(w, "\xa7span_id");
    mp_put_uint(w->out, span_id);
    if (WRITE_KEY(w, "\xa7service") < 0 ||
        v04_write_text(w, service ? service : Py_None, "service", NULL, 1) < 0 ||
        WRITE_KEY(w, "\xa8resource") < 0 ||
        v04_write_text(w, resource ? resource : Py_None, "resource", NULL, 1) < 0 ||
        WRITE_KEY(w, "\xa4name") < 0 || v04_write_text(w, v.value[SF_NAME], "name", NULL, 1) < 0 ||
        outbuf_reserve(w->out, V04_TIMES_MAX_SIZE) < 0) {
        goto error;
    }
    PUT_KEY(w, "\xa5start");
    mp_put_int(w->out, start);
    PUT_KEY(w, "\xa8"
               "duration");
    if (has_duration) {
        mp_put_int(w->out, duration);
    }
    else {
        mp_put_byte(w->out, MP_NIL);
    }
    if (has_error) {
        PUT_KEY(w, "\xa5"
                   "error");
        mp_put_byte(w->out, MP_POSITIVE_FIXINT | 1);
    }
    if (has_type &&
        (WRITE_KEY(w, "\xa4type") < 0 || v04_write_text(w, span_type, "span_type", NULL, 0) < 0)) {
        goto error;
    }
    if (has_links && v04_write_converted(w, "\xaaspan_links", 11, links_for_v04, v.value[SF_LINKS],
                                         "links") < 0) {
        goto error;
    }
    if (native_events && v04_write_converted(w, "\xabspan_events", 12, events_for_v04,
                                             v.value[SF_EVENTS], "events") < 0) {
        goto error;
    }
    if (has_meta && v04_write_meta(w, meta, info, add_trace_id_high, events_text) < 0) {
        goto error;
    }
    if (has_meta_struct && v04_write_meta_struct(w, meta_struct) < 0) {
        goto error;
    }
    if (has_metrics && v04_write_metrics(w, metrics) < 0) {
        goto error;
    }
    result = 0;
error:
    Py_XDECREF(events_text);
    span_values_release(w, &v);
    return result;
}

int
v04_write_trace(SpanWriter *w, PyObject *trace)
{
    return write_trace(w, trace, NULL, v04_write_span);
}
