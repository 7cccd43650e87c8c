/* /v0.4/traces: each span a map with the reference tracer's keys, in its
 * order, written straight from the span object. */
#include "links_events.h"
#include "spanwrite.h"

/* The keys a v0.4 span map uses, in the reference tracer's order: X(name,
 * length, text).  Each is written as one literal, its fixstr header byte
 * (from the length) and its text; the length is checked against the text at
 * compile time, so no key is encoded or counted by hand. */
#define V04_SPAN_KEYS(X)                                                                           \
    X(TRACE_ID, 8, "trace_id")                                                                     \
    X(PARENT_ID, 9, "parent_id")                                                                   \
    X(SPAN_ID, 7, "span_id")                                                                       \
    X(SERVICE, 7, "service")                                                                       \
    X(RESOURCE, 8, "resource")                                                                     \
    X(NAME, 4, "name")                                                                             \
    X(START, 5, "start")                                                                           \
    X(DURATION, 8, "duration")                                                                     \
    X(ERROR, 5, "error")                                                                           \
    X(TYPE, 4, "type")                                                                             \
    X(SPAN_LINKS, 10, "span_links")                                                                \
    X(SPAN_EVENTS, 11, "span_events")                                                              \
    X(META, 4, "meta")                                                                             \
    X(META_STRUCT, 11, "meta_struct")                                                              \
    X(METRICS, 7, "metrics")                                                                       \
    /* Meta keys spanpack adds (wire.h). */                                                        \
    X(TRACE_ID_HIGH, 9, TRACE_ID_HIGH_KEY)                                                         \
    X(ORIGIN, 10, ORIGIN_KEY)                                                                      \
    X(EVENTS, 6, SPAN_EVENTS_KEY)

#define V04_CHECK_KEY(name, length, text)                                                          \
    _Static_assert(sizeof(text) - 1 == (length) && (length) < MP_FIXSTR_LIMIT,                     \
                   "the length of key " #name " fits a fixstr and is its text's");
V04_SPAN_KEYS(V04_CHECK_KEY)
#undef V04_CHECK_KEY

#define V04_KEY_ENUM(name, length, text) KEY_##name,
typedef enum { V04_SPAN_KEYS(V04_KEY_ENUM) } V04Key;
#undef V04_KEY_ENUM

/* Each key, header byte included, and its size.  Indexed by constants, so the
 * compiler reads both at compile time and copies a key with a few moves. */
#define V04_KEY_BYTES(name, length, text) [KEY_##name] = MP_FIXSTR_HEADER(length) text,
static const char *const v04_key_bytes[] = {V04_SPAN_KEYS(V04_KEY_BYTES)};
#undef V04_KEY_BYTES
#define V04_KEY_SIZE(name, length, text) [KEY_##name] = 1 + (length),
static const unsigned char v04_key_size[] = {V04_SPAN_KEYS(V04_KEY_SIZE)};
#undef V04_KEY_SIZE

#define KEY_SIZE(key) ((Py_ssize_t)v04_key_size[key])
/* PUT_KEY where room is already reserved, WRITE_KEY otherwise. */
#define PUT_KEY(w, key)                                                                            \
    (memcpy((w)->out->pos, v04_key_bytes[key], (size_t)KEY_SIZE(key)),                             \
     (w)->out->pos += KEY_SIZE(key))
#define WRITE_KEY(w, key) (outbuf_reserve((w)->out, KEY_SIZE(key)) < 0 ? -1 : (PUT_KEY(w, key), 0))

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

/* Encode the str `data` (`size` bytes of UTF-8, at most MAX_TEXT_LEN
 * characters: the length fits any header) into room already reserved, then
 * remember its bytes if it has a slot (`cache_index`, else STRCACHE_NO_SLOT). */
static inline void
v04_put_str_uncached(SpanWriter *w, PyObject *value, size_t cache_index, const char *data,
                     Py_ssize_t size)
{
    OutBuf *out = w->out;
    char *encoded = out->pos;
    mp_put_str_header(out, (uint32_t)size, 1);
    copy_bytes(out->pos, data, size);
    out->pos += size;
    if (cache_index != STRCACHE_NO_SLOT) {
        (void)strcache_store(w->cache, value, cache_index, encoded, out->pos - encoded);
    }
}

/* v04_write_str_uncached for a str that is not compact ASCII, or a buffer
 * that must grow first: the calls its fast path makes none of. */
static SP_NOINLINE int
v04_write_str_uncached_slow(SpanWriter *w, PyObject *value, size_t cache_index, const char *field,
                            PyObject *key)
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
    if (outbuf_reserve(w->out, size + 5) < 0) {
        return -1;
    }
    v04_put_str_uncached(w, value, cache_index, data, size);
    return 0;
}

/* A str not in the cache: encode it, then remember its bytes if it has a
 * slot (`cache_index`, else STRCACHE_NO_SLOT).  The usual case (compact ASCII, under
 * 256 characters, room in the buffer) is written here; the rest, and an
 * admission, are tail calls, which keeps this frame to two saved registers
 * (the miss of every unique value goes through it). */
static SP_NOINLINE int
v04_write_str_uncached(SpanWriter *w, PyObject *value, size_t cache_index, const char *field,
                       PyObject *key)
{
    OutBuf *out = w->out;
    Py_ssize_t size = PyUnicode_GET_LENGTH(value);
    char *encoded = out->pos;
    if (!PyUnicode_IS_COMPACT_ASCII(value) || size > 255 || out->end - encoded < 2 + 255) {
        return v04_write_str_uncached_slow(w, value, cache_index, field, key);
    }
    const char *data = (const char *)PyUnicode_DATA(value);
    /* Written here rather than by v04_put_str_uncached, which gives the
     * same bytes: calling it measured 5% more instructions on keys_per_span
     * and many_tags (callgrind, CPython 3.11). */
    char *p = encoded;
    if (size < MP_FIXSTR_LIMIT) {
        *p++ = (char)(MP_FIXSTR | size);
    }
    else {
        *p++ = (char)MP_STR8;
        *p++ = (char)size;
    }
    copy_bytes(p, data, size);
    out->pos = p + size;
    if (cache_index == STRCACHE_NO_SLOT) {
        return 0;
    }
    return strcache_store(w->cache, value, cache_index, encoded, out->pos - encoded);
}

/* How likely a text is to repeat: names and tag keys do, tag values may. */
enum { OFTEN_REPEATED = 0, MAYBE_REPEATED = 1 };

/* str (cached when interning is on), bytes, or None where allowed. */
static inline int
v04_write_text_probing(SpanWriter *w, PyObject *value, const char *field, PyObject *key,
                       int allow_none, int repeats)
{
    /* The cache is probed first, by address: only exact, short str are ever
     * stored, so a hit needs no type check and reads only the str's
     * reference count.  A value whose one reference is its span's (a tag
     * value or key built for this span, read without a reference of ours)
     * skips the cache: it cannot be in it (the cache holds a reference of
     * its own), a span is usually encoded once, and the probe would load a
     * tag line for nothing (a benchmark that encodes the same spans again
     * would otherwise fill the cache with them).  So does one held only by
     * a tags dict made for this read and the span (w->uncached_refs 2). */
    size_t cache_index = STRCACHE_NO_SLOT;
    if (w->cache != NULL && Py_REFCNT(value) > w->uncached_refs) {
        int cached =
            strcache_write(w->cache, value, w->out, repeats == MAYBE_REPEATED, &cache_index);
        if (cached != 0) {
            return cached < 0 ? -1 : 0;
        }
    }
    if (SP_LIKELY(PyUnicode_CheckExact(value) && SP_UNICODE_IS_READY(value) &&
                  PyUnicode_GET_LENGTH(value) <= MAX_TEXT_LEN)) {
        return v04_write_str_uncached(w, value, cache_index, field, key);
    }
    return v04_write_text_slow(w, value, field, key, allow_none);
}

static inline int
v04_write_text(SpanWriter *w, PyObject *value, const char *field, PyObject *key, int allow_none)
{
    return v04_write_text_probing(w, value, field, key, allow_none, OFTEN_REPEATED);
}

static SP_ALWAYS_INLINE int
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

/* A span's own entry where there are default tags: noted, so that the
 * default of the same key is not written too. */
static int
v04_write_meta_entry_noted(SpanWriter *w, PyObject *key, PyObject *value)
{
    if (v04_write_meta_entry(w, key, value) < 0) {
        return -1;
    }
    return default_note(w, w->default_meta, "meta", key);
}

static int
v04_write_metric_entry_noted(SpanWriter *w, PyObject *key, PyObject *value)
{
    if (v04_write_metric_entry(w, key, value) < 0) {
        return -1;
    }
    return default_note(w, w->default_metrics, "metrics", key);
}

/* The entries of a meta dict read in place: an entry whose position's memo
 * (EncodedStrCache.meta_entries) holds the same key and value objects is
 * copied from there; the others are written, and remembered when they
 * qualify.  No Python code runs (text only), so the entries stay put. */
static SP_NOINLINE int
v04_write_meta_entries_memo(SpanWriter *w, const DictEntries *entries)
{
    MetaMemoEntry *memo = w->cache->meta_entries;
    Py_ssize_t position = 0, copied = 0;
    PyObject *const *entry = entries->keys;
    for (Py_ssize_t i = 0; i < entries->count; i++, entry += entries->stride) {
        dict_entries_prefetch_ahead(entries, entry, i);
        PyObject *key = entry[0], *value = entry[1];
        if (value == NULL) {
            continue; /* deleted */
        }
        MetaMemoEntry *remembered = position < META_MEMO_ENTRIES ? &memo[position++] : NULL;
        if (remembered != NULL && remembered->key == key && remembered->value == value) {
            if (outbuf_reserve(w->out, META_MEMO_COPY) < 0) {
                return -1;
            }
            memcpy(w->out->pos, (const void *)remembered, META_MEMO_COPY);
            w->out->pos += remembered->size;
            remembered->misses = 0;
            copied++;
            continue;
        }
        Py_ssize_t start = outbuf_len(w->out);
        if (v04_write_meta_entry(w, key, value) < 0) {
            return -1;
        }
        if (remembered != NULL) {
            meta_memo_remember(remembered, key, value, w->out->start + start,
                               outbuf_len(w->out) - start, w->uncached_refs);
        }
    }
    w->cache->hits += 2 * copied;
    w->cache->meta_entries_copied += copied;
    /* (Worth it when at least a quarter of the entries it looked at were
     * copied: each miss costs a compare and the bookkeeping.) */
    w->cache->meta_memo_idle = copied * 4 >= position ? 0 : w->cache->meta_memo_idle + 1;
    return 0;
}

/* A span's meta entries (no default tags): through the memo when the cache
 * is on and the dict can be read in place, else as any tag map. */
static inline int
v04_write_meta_entries(SpanWriter *w, PyObject *meta, Py_ssize_t *written)
{
    DictEntries entries;
    EncodedStrCache *cache = w->cache;
    if (cache != NULL && !w->lenient && meta != NULL && meta != Py_None && meta != w->mixed_tags &&
        PyDict_GET_SIZE(meta) > 0) {
        if ((cache->meta_memo_idle < META_MEMO_IDLE_SPANS || cache->meta_memo_idle % 64 == 0) &&
            pydict_entries(&w->state->fast_paths, meta, &entries)) {
            *written = PyDict_GET_SIZE(meta);
            return v04_write_meta_entries_memo(w, &entries);
        }
        cache->meta_memo_idle++;
    }
    return write_dict_entries(w, meta, "meta", v04_write_meta_entry, 0, written);
}

/* The meta entries with default tags: their count is known only once they
 * are written. */
static SP_NOINLINE int
v04_write_meta_with_defaults(SpanWriter *w, PyObject *meta, Py_ssize_t max_count,
                             Py_ssize_t *header_pos, Py_ssize_t *written)
{
    if (map_begin_uncounted(w, max_count + w->default_meta->count, header_pos) < 0) {
        return -1;
    }
    return write_tags_with_defaults(w, meta, "meta", w->default_meta, v04_write_meta_entry_noted,
                                    v04_write_meta_entry, written);
}

static int
v04_write_meta(SpanWriter *w, PyObject *meta, const TraceInfo *info, int add_trace_id_high,
               PyObject *events_text)
{
    Py_ssize_t meta_size = tag_map_size(w, meta, MIXED_META);
    Py_ssize_t extras = add_trace_id_high + (info->origin != NULL) + (events_text != NULL);
    Py_ssize_t header_pos, written;
    int with_defaults = w->default_meta != NULL;
    if (WRITE_KEY(w, KEY_META) < 0) {
        return -1;
    }
    if (SP_UNLIKELY(with_defaults)) {
        if (v04_write_meta_with_defaults(w, meta, meta_size + extras, &header_pos, &written) < 0) {
            return -1;
        }
    }
    else if (map_begin(w, meta_size + extras, &header_pos) < 0 ||
             v04_write_meta_entries(w, meta, &written) < 0) {
        return -1;
    }
    if (add_trace_id_high) {
        PyObject *hex = trace_id_high_hex(info->trace_id_high);
        if (hex == NULL) {
            return -1;
        }
        int result = WRITE_KEY(w, KEY_TRACE_ID_HIGH);
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
        if (utf8 == NULL || WRITE_KEY(w, KEY_ORIGIN) < 0) {
            return -1;
        }
        if (mp_write_str(w->out, utf8, size, 1) < 0) {
            return span_reraise(w, "origin", NULL);
        }
    }
    if (events_text != NULL) {
        if (WRITE_KEY(w, KEY_EVENTS) < 0 || v04_write_text(w, events_text, "events", NULL, 0) < 0) {
            return -1;
        }
    }
    if (SP_UNLIKELY(with_defaults)) {
        return map_end_lenient(w, header_pos, written + extras);
    }
    return map_end(w, header_pos, written + extras);
}

static SP_NOINLINE int
v04_write_metrics_with_defaults(SpanWriter *w, PyObject *metrics)
{
    Py_ssize_t size = tag_map_size(w, metrics, MIXED_METRICS);
    Py_ssize_t header_pos, written;
    if (WRITE_KEY(w, KEY_METRICS) < 0 ||
        map_begin_uncounted(w, size + w->default_metrics->count, &header_pos) < 0 ||
        write_tags_with_defaults(w, metrics, "metrics", w->default_metrics,
                                 v04_write_metric_entry_noted, v04_write_metric_entry,
                                 &written) < 0) {
        return -1;
    }
    return map_end_lenient(w, header_pos, written);
}

static int
v04_write_metrics(SpanWriter *w, PyObject *metrics)
{
    if (SP_UNLIKELY(w->default_metrics != NULL)) {
        return v04_write_metrics_with_defaults(w, metrics);
    }
    Py_ssize_t header_pos, written;
    if (WRITE_KEY(w, KEY_METRICS) < 0 ||
        map_begin(w, tag_map_size(w, metrics, MIXED_METRICS), &header_pos) < 0 ||
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
    return meta_struct_document(w, key, value, 1);
}

static int
v04_write_meta_struct(SpanWriter *w, PyObject *meta_struct)
{
    Py_ssize_t header_pos, written;
    if (WRITE_KEY(w, KEY_META_STRUCT) < 0 ||
        map_begin(w, PyDict_GET_SIZE(meta_struct), &header_pos) < 0 ||
        write_dict_entries(w, meta_struct, "meta_struct", v04_write_meta_struct_entry, 1,
                           &written) < 0) {
        return -1;
    }
    return map_end(w, header_pos, written);
}

/* The largest fixed-size run of a span: map header, trace_id, parent_id and
 * span_id with their keys. */
#define V04_IDS_MAX_SIZE                                                                           \
    (1 + KEY_SIZE(KEY_TRACE_ID) + MP_MAX_HEADER + KEY_SIZE(KEY_PARENT_ID) + MP_MAX_HEADER +        \
     KEY_SIZE(KEY_SPAN_ID) + MP_MAX_HEADER)
/* start, duration and error (the byte 1) with their keys. */
#define V04_TIMES_MAX_SIZE                                                                         \
    (KEY_SIZE(KEY_START) + MP_MAX_HEADER + KEY_SIZE(KEY_DURATION) + MP_MAX_HEADER +                \
     KEY_SIZE(KEY_ERROR) + 1)

/* start and duration: an int64 as it is (a negative duration is 0 to the
 * agent); beyond int64 but within 64 bits, clamped as in v0.5 and v1.0
 * (span_time_clamped), so that every version accepts the same times. */
static inline int
v04_time_value(SpanWriter *w, PyObject *value, const char *field, int64_t *out)
{
    if (SP_LIKELY(PyLong_Check(value)) && pyint_as_i64(&w->state->fast_paths, value, out) == 0) {
        return 0;
    }
    if (value == Py_None) {
        return span_int_error(w, value, field, 1); /* start None: not a time */
    }
    return span_time_clamped(w, value, field, out);
}

/* Is `map`, field `field` of `v`, a dict made for this read (a getter's or
 * accessor's new dict that nothing else holds)?  Then w->uncached_refs is 2
 * while it is written. */
static inline int
made_for_this_read(const SpanValues *v, SpanField field, PyObject *map)
{
    return map != NULL && Py_REFCNT(map) == 1 &&
           (!v->borrowed || ((v->owned_mask >> field) & 1u) != 0);
}

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
        goto done;
    }
    int has_parent = parent != NULL && parent != Py_None;
    int has_duration = duration_obj != NULL && duration_obj != Py_None;
    if (span_uint64(w, v.value[SF_SPAN_ID], "span_id", &span_id) < 0 ||
        (has_parent && span_uint64(w, parent, "parent_id", &parent_id) < 0) ||
        v04_time_value(w, v.value[SF_START], "start_ns", &start) < 0 ||
        (has_duration && v04_time_value(w, duration_obj, "duration_ns", &duration) < 0) ||
        span_error_flag(w, v.value[SF_ERROR], &has_error) < 0) {
        goto done;
    }
    if (check_dict_field(w, meta, "meta") < 0 || check_dict_field(w, metrics, "metrics") < 0 ||
        check_dict_field(w, meta_struct, "meta_struct") < 0) {
        goto done;
    }
    Py_ssize_t links_count = field_length(w, v.value[SF_LINKS], "links");
    Py_ssize_t events_count = field_length(w, v.value[SF_EVENTS], "events");
    if (links_count < 0 || events_count < 0) {
        goto done;
    }
    int has_type = span_type != NULL && span_type != Py_None;
    int has_links = links_count > 0;
    int native_events = events_count > 0 && w->native_span_events;
    int has_metrics = tag_map_size(w, metrics, MIXED_METRICS) > 0 || w->default_metrics != NULL;
    int has_meta_struct =
        meta_struct != NULL && meta_struct != Py_None && PyDict_GET_SIZE(meta_struct) > 0;
    int add_trace_id_high = 0;
    if (w->span_index == 0 && info->trace_id_high != 0 &&
        meta_lacks_trace_id_high(w, meta, &add_trace_id_high) < 0) {
        goto done;
    }
    if (events_count > 0 && !w->native_span_events) {
        events_text = events_json(w, v.value[SF_EVENTS]);
        if (events_text == NULL) {
            goto done;
        }
    }
    int has_meta = tag_map_size(w, meta, MIXED_META) > 0 || info->origin != NULL ||
                   events_text != NULL || add_trace_id_high || w->default_meta != NULL;

    uint32_t key_count = 7 + has_parent + has_error + has_type + has_links + native_events +
                         has_meta + has_meta_struct + has_metrics;
    if (outbuf_reserve(w->out, V04_IDS_MAX_SIZE) < 0) {
        goto done;
    }
    mp_put_map_header(w->out, key_count);
    PUT_KEY(w, KEY_TRACE_ID);
    mp_put_uint(w->out, info->trace_id_low);
    if (has_parent) {
        PUT_KEY(w, KEY_PARENT_ID);
        mp_put_uint(w->out, parent_id);
    }
    PUT_KEY(w, KEY_SPAN_ID);
    mp_put_uint(w->out, span_id);
    if (WRITE_KEY(w, KEY_SERVICE) < 0 ||
        v04_write_text(w, service ? service : Py_None, "service", NULL, 1) < 0 ||
        WRITE_KEY(w, KEY_RESOURCE) < 0 ||
        v04_write_text(w, resource ? resource : Py_None, "resource", NULL, 1) < 0 ||
        WRITE_KEY(w, KEY_NAME) < 0 || v04_write_text(w, v.value[SF_NAME], "name", NULL, 1) < 0 ||
        outbuf_reserve(w->out, V04_TIMES_MAX_SIZE) < 0) {
        goto done;
    }
    PUT_KEY(w, KEY_START);
    mp_put_int(w->out, start);
    PUT_KEY(w, KEY_DURATION);
    if (has_duration) {
        mp_put_int(w->out, duration);
    }
    else {
        mp_put_byte(w->out, MP_NIL);
    }
    if (has_error) {
        PUT_KEY(w, KEY_ERROR);
        mp_put_byte(w->out, MP_POSITIVE_FIXINT | 1);
    }
    if (has_type &&
        (WRITE_KEY(w, KEY_TYPE) < 0 || v04_write_text(w, span_type, "span_type", NULL, 0) < 0)) {
        goto done;
    }
    if (has_links &&
        (WRITE_KEY(w, KEY_SPAN_LINKS) < 0 || v04_write_links(w, v.value[SF_LINKS]) < 0)) {
        goto done;
    }
    if (native_events &&
        (WRITE_KEY(w, KEY_SPAN_EVENTS) < 0 || v04_write_events(w, v.value[SF_EVENTS]) < 0)) {
        goto done;
    }
    if (has_meta) {
        w->uncached_refs = made_for_this_read(&v, SF_META, meta) ? 2 : 1;
        if (v04_write_meta(w, meta, info, add_trace_id_high, events_text) < 0) {
            goto done;
        }
    }
    if (has_meta_struct) {
        w->uncached_refs = 1;
        if (v04_write_meta_struct(w, meta_struct) < 0) {
            goto done;
        }
    }
    if (has_metrics) {
        w->uncached_refs = made_for_this_read(&v, SF_METRICS, metrics) ? 2 : 1;
        if (v04_write_metrics(w, metrics) < 0) {
            goto done;
        }
    }
    result = 0;
done:
    w->uncached_refs = 1;
    Py_XDECREF(events_text);
    span_values_release(w, &v);
    return result;
}

int
v04_write_trace(SpanWriter *w, PyObject *trace)
{
    return write_trace(w, trace, NULL, v04_write_span);
}
