/* Joining encoded traces into v0.4, v0.5 and v1.0 payloads. */
#include "v10.h"

#include "mpwrite.h"
#include "wire.h"

/* The first two entries of every v0.5 string table (V05_FIXED_ENTRIES), as
 * in the reference tracer: "" (also what None maps to) and the origin key. */
static int
seed_table(StringTable *table, SpanpackState *state, strtable_encode_fn encode)
{
    uint32_t index;
    if (strtable_index(table, state->str_empty, encode, NULL, &index) < 0 ||
        strtable_index(table, state->str_origin_key, encode, NULL, &index) < 0) {
        return -1;
    }
    return 0;
}

/* A table entry: its text as a msgpack str (keys are exact str or bytes,
 * validated as UTF-8 when the trace was encoded). */
int
payload_encode_table_entry(void *arg, PyObject *key, OutBuf *out)
{
    (void)arg;
    const char *utf8;
    Py_ssize_t size;
    if (PyBytes_CheckExact(key)) {
        utf8 = PyBytes_AS_STRING(key);
        size = PyBytes_GET_SIZE(key);
    }
    else if (PyUnicode_GET_LENGTH(key) > MAX_TEXT_LEN) {
        /* Only the origin is keyed untruncated (as in the reference tracer);
         * its entry is written cut like every other string. */
        PyObject *cut = truncated_str(key);
        if (cut == NULL) {
            return -1;
        }
        utf8 = PyUnicode_AsUTF8AndSize(cut, &size);
        int result = utf8 == NULL ? -1 : mp_write_str(out, utf8, size, 1);
        Py_DECREF(cut);
        return result;
    }
    else if (SP_UNICODE_IS_READY(key) && PyUnicode_IS_ASCII(key)) {
        /* Its text is its UTF-8: no call. */
        utf8 = PyUnicode_DATA(key);
        size = PyUnicode_GET_LENGTH(key);
    }
    else {
        utf8 = PyUnicode_AsUTF8AndSize(key, &size);
        if (utf8 == NULL) {
            return -1;
        }
    }
    return mp_write_str(out, utf8, size, 1);
}

int
part_init(EncodedPart *part, SpanpackState *state, int version, int lends)
{
    memset(part, 0, sizeof *part);
    if (outbuf_init_raw(&part->body, 4096) < 0) {
        return -1;
    }
    /* v1.0 parts share v0.5's seed: only referenced entries ever reach a
     * payload. */
    if (version != 4 && (strtable_init(&part->strings, 1, state->text_hash_key) < 0 ||
                         seed_table(&part->strings, state, NULL) < 0 ||
                         (version == V10_VERSION && strtable_use_marks(&part->strings) < 0) ||
                         (lends && strtable_use_lending(&part->strings) < 0))) {
        part_free(part);
        return -1;
    }
    return 0;
}

void
part_reset(EncodedPart *part)
{
    outbuf_truncate(&part->body, 0);
    part->holes.count = 0;
    if (part->strings.strings != NULL) {
        strtable_rollback(&part->strings, V05_FIXED_ENTRIES, 0);
        /* A table that was a payload's (append_adopting) still holds its
         * seed's encoded entries: a part's table never reads them. */
        outbuf_truncate(&part->strings.encoded, 0);
    }
}

void
forecast_begin(ForecastTables *tables, EncodedPart *part, PayloadBuilder *payload)
{
    if (tables->capacity <= tables->in_flight) {
        uint32_t capacity = tables->in_flight + 4;
        RetiredTable *retired =
            PyMem_Realloc(tables->retired, (size_t)capacity * sizeof(RetiredTable));
        if (retired == NULL) {
            return; /* holes instead */
        }
        tables->retired = retired;
        tables->capacity = capacity;
    }
    tables->in_flight++;
    tables->current_users++;
    IndexForecast *forecast = &part->forecast;
    forecast->payload = &payload->table;
    forecast->current_id = &payload->id;
    forecast->payload_id = payload->id;
    forecast->base = payload->table.count;
    forecast->origin_ref = 0;
    forecast->tables = tables;
}

void
forecast_end(ForecastTables *tables, EncodedPart *part, const PayloadBuilder *current)
{
    IndexForecast *forecast = &part->forecast;
    if (forecast->payload == NULL) {
        return;
    }
    forecast->payload = NULL;
    tables->in_flight--;
    if (forecast->payload_id == current->id) {
        tables->current_users--;
        return;
    }
    for (uint32_t i = 0; i < tables->retired_count; i++) {
        RetiredTable *kept = &tables->retired[i];
        if (kept->payload_id == forecast->payload_id) {
            if (--kept->users == 0) {
                /* A str's dealloc runs no Python code. */
                strtable_free(&kept->table);
                *kept = tables->retired[--tables->retired_count];
            }
            return;
        }
    }
}

void
forecast_retire(ForecastTables *tables, PayloadBuilder *payload)
{
    if (tables->current_users == 0 || payload->table.strings == NULL) {
        return;
    }
    /* Each kept table has a put() of its own still encoding, and so does
     * the current payload: there is room (forecast_begin). */
    RetiredTable *kept = &tables->retired[tables->retired_count++];
    kept->payload_id = payload->id;
    kept->users = tables->current_users;
    kept->table = payload->table;
    memset(&payload->table, 0, sizeof payload->table);
    tables->current_users = 0;
}

void
forecast_tables_free(ForecastTables *tables)
{
    for (uint32_t i = 0; i < tables->retired_count; i++) {
        strtable_free(&tables->retired[i].table);
    }
    PyMem_Free(tables->retired);
    memset(tables, 0, sizeof *tables);
}

/* The table of the payload a forecast was made for: the current payload's
 * while it is that one, else the kept one (NULL if, against every rule
 * above, there is none). */
static const StringTable *
forecast_original_table(const IndexForecast *forecast)
{
    if (*forecast->current_id == forecast->payload_id) {
        return forecast->payload;
    }
    const ForecastTables *tables = forecast->tables;
    for (uint32_t i = 0; i < tables->retired_count; i++) {
        if (tables->retired[i].payload_id == forecast->payload_id) {
            return &tables->retired[i].table;
        }
    }
    return NULL;
}

void
part_shrink(EncodedPart *part, SpanpackState *state, Py_ssize_t keep)
{
    /* Each buffer is kept up to about `keep` bytes, so that a stream of big
     * traces does not regrow them (realloc copies, the index rebuilt at
     * every doubling) at every put(): a table entry takes 26-34 bytes (its
     * string, hash, mark and lent bytes, two to four index slots). */
    int big_table = part->strings.strings != NULL &&
                    part->strings.capacity > (uint64_t)keep / STRTABLE_MAX_ENTRY_BYTES;
    int big_holes = part->holes.capacity > keep / (Py_ssize_t)sizeof(StringHole);
    /* append_adopting encodes a trace's entries into its table, and gives
     * the part a payload's table, with that payload's encoded capacity. */
    int big_encoded =
        part->strings.strings != NULL && outbuf_capacity(&part->strings.encoded) > keep;
    /* Emptied now, not at the next put(): the strings of this trace already
     * in the payload are still the table's, and an idle encoder must not
     * keep them alive (up to keep/26 of them). */
    part_reset(part);
    if (outbuf_capacity(&part->body) <= keep && !big_table && !big_holes && !big_encoded) {
        return;
    }
    outbuf_shrink_capacity(&part->body, keep);
    if (big_encoded) {
        outbuf_shrink_capacity(&part->strings.encoded, keep);
    }
    if (big_holes) {
        holes_free(&part->holes);
    }
    if (big_table) {
        /* A fresh seeded table; if even that cannot be had, keep the old. */
        StringTable small;
        if (strtable_init(&small, 1, state->text_hash_key) == 0 &&
            seed_table(&small, state, NULL) == 0 &&
            (part->strings.marks == NULL || strtable_use_marks(&small) == 0) &&
            (part->strings.lent == NULL || strtable_use_lending(&small) == 0)) {
            strtable_free(&part->strings);
            part->strings = small;
        }
        else {
            if (small.strings != NULL) {
                strtable_free(&small);
            }
            PyErr_Clear();
        }
    }
}

void
part_free(EncodedPart *part)
{
    if (part->body.start != NULL) {
        outbuf_free(&part->body);
    }
    if (part->strings.strings != NULL) {
        strtable_free(&part->strings);
    }
    holes_free(&part->holes);
}

/* Tables up to this many entries are kept for the next payload (a bigger
 * one came from an unusual payload: the next starts small again). */
#define SPARE_TABLE_MAX_CAPACITY 4096
/* ... and up to this many bytes of encoded entries (long strings). */
#define SPARE_TABLE_MAX_ENCODED (1 << 20)

/* The payload with its body and no table. */
static int
payload_init_body(PayloadBuilder *payload, int version, Py_ssize_t capacity, Py_ssize_t header_room)
{
    memset(payload, 0, sizeof *payload);
    payload->version = version;
    payload->header_room = header_room;
    if (capacity < header_room + 64) {
        capacity = header_room + 64;
    }
    if ((header_room > 0 ? outbuf_init_bytes(&payload->body, capacity)
                         : outbuf_init_raw(&payload->body, capacity)) < 0) {
        return -1;
    }
    payload->body.pos += header_room;
    return 0;
}

int
payload_init(PayloadBuilder *payload, SpanpackState *state, int version, Py_ssize_t capacity,
             Py_ssize_t header_room)
{
    if (payload_init_body(payload, version, capacity, header_room) < 0) {
        return -1;
    }
    if (version == 5 && (strtable_init(&payload->table, 1024, state->text_hash_key) < 0 ||
                         seed_table(&payload->table, state, payload_encode_table_entry) < 0)) {
        payload_free(payload);
        return -1;
    }
    /* v1.0: id 0 is the empty string, never streamed. */
    uint32_t empty;
    if (version == V10_VERSION &&
        (strtable_init(&payload->table, 1, state->text_hash_key) < 0 ||
         strtable_use_marks(&payload->table) < 0 ||
         strtable_index(&payload->table, state->str_empty, NULL, NULL, &empty) < 0)) {
        payload_free(payload);
        return -1;
    }
    return 0;
}

void
payload_free(PayloadBuilder *payload)
{
    outbuf_free(&payload->body);
    if (payload->table.strings != NULL) {
        strtable_free(&payload->table);
    }
    Py_CLEAR(payload->preamble);
}

void
payload_seeded(PayloadBuilder *payload)
{
    payload->seed.count = payload->table.count;
    payload->seed.encoded_len = outbuf_len(&payload->table.encoded);
}

int
payload_init_on_spare(PayloadBuilder *payload, int version, Py_ssize_t capacity,
                      Py_ssize_t header_room, SpareTable *spare)
{
    if (payload_init_body(payload, version, capacity, header_room) < 0) {
        return -1;
    }
    payload->table = spare->table;
    payload->seed = spare->seed;
    memset(spare, 0, sizeof *spare);
    return 0;
}

int
payload_spare_table(PayloadBuilder *payload, SpareTable *spare)
{
    StringTable *table = &payload->table;
    if (spare->table.strings != NULL || table->strings == NULL || payload->seed.count == 0 ||
        table->capacity > SPARE_TABLE_MAX_CAPACITY ||
        outbuf_capacity(&table->encoded) > SPARE_TABLE_MAX_ENCODED) {
        return 0;
    }
    /* Drops the payload's strings: a str's dealloc runs no Python code. */
    strtable_rollback(table, payload->seed.count, payload->seed.encoded_len);
    spare->table = *table;
    spare->seed = payload->seed;
    spare->version = payload->version;
    spare->preamble = payload->preamble;
    memset(table, 0, sizeof *table);
    return 1;
}

void
spare_table_free(SpareTable *spare)
{
    if (spare->table.strings != NULL) {
        strtable_free(&spare->table);
    }
    memset(spare, 0, sizeof *spare);
}

/* Everything in front of the traces: for v0.5 `92`, the table and its header. */
static Py_ssize_t
payload_prefix_size(const PayloadBuilder *payload)
{
    if (payload->version == V10_VERSION) {
        return v10_prefix_size(payload->preamble, payload->trace_count);
    }
    Py_ssize_t size = array_header_size(payload->trace_count);
    if (payload->version == 5) {
        size += 1 + array_header_size(payload->table.count) + outbuf_len(&payload->table.encoded);
    }
    return size;
}

Py_ssize_t
payload_size(const PayloadBuilder *payload)
{
    return payload_prefix_size(payload) + outbuf_len(&payload->body) - payload->header_room;
}

PayloadMark
payload_mark(const PayloadBuilder *payload)
{
    PayloadMark mark = {outbuf_len(&payload->body), payload->table.count,
                        outbuf_len(&payload->table.encoded), payload->trace_count};
    return mark;
}

void
payload_release_part(PayloadBuilder *payload, PayloadMark mark, EncodedPart *part)
{
    strtable_reclaim(&part->strings);
    payload_rollback(payload, mark);
}

void
payload_rollback(PayloadBuilder *payload, PayloadMark mark)
{
    outbuf_truncate(&payload->body, mark.body_len);
    if (payload->version != 4) {
        strtable_rollback(&payload->table, mark.table_count, mark.table_len);
    }
    payload->trace_count = mark.trace_count;
}

/* v0.5, a trace whose forecast was made for this payload as it still is
 * (same payload, same table size: see forecast_payload_table).  Every
 * string of the trace's own table was new to the payload, and was written
 * as the index it gets when they are added in order from `base`: the body
 * is final as written. */
static int
append_forecast(PayloadBuilder *payload, EncodedPart *part)
{
    StringTable *local = &part->strings;
    for (uint32_t i = V05_FIXED_ENTRIES; i < local->count; i++) {
        uint32_t index;
        if (strtable_add_from(&payload->table, local, i, payload_encode_table_entry, NULL, &index) <
            0) {
            return -1;
        }
    }
    return outbuf_write(&payload->body, part->body.start, outbuf_len(&part->body)) < 0 ? -1 : 1;
}

/* v0.5, the first trace of a payload that holds only its seed, forecast for
 * it: every string of the trace's table beyond the seed was new to the
 * payload and written as its own index in that table, so the table (its
 * entries encoded behind the payload's seed) becomes the payload's, and the
 * trace's body the payload's body; the payload's empty table and body go to
 * the part, which part_reset empties before its next trace.  Swapping saves
 * adding every string to the payload's table again and copying the body
 * (put()+encode() of one large trace costs what encode_traces() does).  1
 * when adopted, 0 when the trace is no such first one, -1 on error (nothing
 * changed). */
static int
append_adopting(PayloadBuilder *payload, EncodedPart *part)
{
    StringTable *local = &part->strings;
    if (payload->trace_count != 0 || payload->seed.count != V05_FIXED_ENTRIES ||
        payload->table.count != V05_FIXED_ENTRIES ||
        outbuf_len(&payload->table.encoded) != payload->seed.encoded_len ||
        payload->header_room != 0 || payload->body.bytes != NULL ||
        outbuf_len(&payload->body) != 0 || part->body.bytes != NULL ||
        part->forecast.base != V05_FIXED_ENTRIES) {
        return 0;
    }
    OutBuf *encoded = &local->encoded;
    outbuf_truncate(encoded, 0);
    if (outbuf_write(encoded, payload->table.encoded.start, payload->seed.encoded_len) < 0) {
        goto error;
    }
    for (uint32_t i = V05_FIXED_ENTRIES; i < local->count; i++) {
        if (payload_encode_table_entry(NULL, local->strings[i], encoded) < 0) {
            goto error;
        }
    }
    /* The table the part gets lends, as the part's own did (put()'s parts
     * pass their references to the payload); the one the payload gets keeps
     * its (all clear) lent flags, which release every entry as its own. */
    if (strtable_use_lending(&payload->table) < 0) {
        goto error;
    }
    StringTable table = payload->table;
    payload->table = *local;
    *local = table;
    OutBuf body = payload->body;
    payload->body = part->body;
    part->body = body;
    return 1;
error:
    outbuf_truncate(encoded, 0);
    return -1;
}

/* v0.5: copy the body between holes, writing each hole's payload index. */
static int
append_with_indexes(PayloadBuilder *payload, const EncodedPart *part)
{
    const StringTable *local = &part->strings;
    uint32_t *index_map = PyMem_Malloc((size_t)local->count * sizeof(uint32_t));
    if (index_map == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    int result = -1;
    for (uint32_t i = 0; i < local->count; i++) {
        if (strtable_index_from(&payload->table, local, i, payload_encode_table_entry, NULL,
                                &index_map[i]) < 0) {
            goto done;
        }
    }
    Py_ssize_t body_len = outbuf_len(&part->body);
    /* Each hole widens to at most MP_MAX_HEADER bytes. */
    if (outbuf_reserve(&payload->body, body_len + part->holes.count * MP_MAX_HEADER) < 0) {
        goto done;
    }
    Py_ssize_t copied = 0;
    for (Py_ssize_t h = 0; h < part->holes.count; h++) {
        const StringHole *hole = &part->holes.items[h];
        Py_ssize_t run = hole->offset - copied;
        memcpy(payload->body.pos, part->body.start + copied, (size_t)run);
        payload->body.pos += run;
        copied = hole->offset;
        mp_put_uint(&payload->body, index_map[hole->local_index]);
    }
    memcpy(payload->body.pos, part->body.start + copied, (size_t)(body_len - copied));
    payload->body.pos += body_len - copied;
    result = 0;
done:
    PyMem_Free(index_map);
    return result;
}

/* v0.5, rewriting a forecast trace: reads the body written by the v0.5
 * span writer (span_v05.c) item by item. */
typedef struct {
    const unsigned char *pos;
    const unsigned char *end;
} BodyReader;

/* Size of the msgpack int, uint or float at the reader (0: none there). */
static Py_ssize_t
body_number_size(const BodyReader *r)
{
    if (r->pos >= r->end) {
        return 0;
    }
    unsigned char b = *r->pos;
    Py_ssize_t size = b < MP_FIXMAP || b >= MP_NEGATIVE_FIXINT             ? 1
                      : b == MP_UINT8 || b == MP_INT8                      ? 2
                      : b == MP_UINT16 || b == MP_INT16                    ? 3
                      : b == MP_UINT32 || b == MP_INT32 || b == MP_FLOAT32 ? 5
                      : b == MP_UINT64 || b == MP_INT64 || b == MP_FLOAT64 ? 9
                                                                           : 0;
    return size <= r->end - r->pos ? size : 0;
}

/* A msgpack uint of at most 32 bits (a string reference); -1 if none. */
static int64_t
body_read_ref(BodyReader *r)
{
    Py_ssize_t size = body_number_size(r);
    const unsigned char *p = r->pos;
    int64_t value = size == 1 && p[0] < MP_FIXMAP    ? p[0]
                    : size == 2 && p[0] == MP_UINT8  ? p[1]
                    : size == 3 && p[0] == MP_UINT16 ? (int64_t)p[1] << 8 | p[2]
                    : size == 5 && p[0] == MP_UINT32
                        ? (int64_t)p[1] << 24 | (int64_t)p[2] << 16 | (int64_t)p[3] << 8 | p[4]
                        : -1;
    r->pos += value >= 0 ? size : 0;
    return value;
}

/* A map or array header (the fix form is `fix` | count, up to 15); -1 if
 * none. */
static int64_t
body_read_count(BodyReader *r, unsigned char fix, unsigned char two_byte)
{
    Py_ssize_t left = r->end - r->pos;
    const unsigned char *p = r->pos;
    if (left >= 1 && (p[0] & 0xf0) == fix) {
        r->pos += 1;
        return p[0] & 0x0f;
    }
    if (left >= 3 && p[0] == two_byte) {
        r->pos += 3;
        return (int64_t)p[1] << 8 | p[2];
    }
    if (left >= 5 && p[0] == two_byte + 1) {
        r->pos += 5;
        return (int64_t)p[1] << 24 | (int64_t)p[2] << 16 | (int64_t)p[3] << 8 | p[4];
    }
    return -1;
}

/* Copy what the reader passed since `from`. */
static int
body_copy(OutBuf *out, const unsigned char *from, const BodyReader *r)
{
    return outbuf_write(out, from, r->pos - from);
}

/* How a forecast trace's string references become the indexes of the
 * payload it joins: below `base` an entry of the payload the forecast was
 * made for (`original`), from `base` on an entry of the trace's own table
 * (`local`), whose index in the payload joined `index_map` keeps once
 * found (UINT32_MAX before).  Each string is found or added as the body
 * first refers to it, so the payload's table takes them in the order a
 * one-shot encode does. */
typedef struct {
    StringTable *payload;
    const StringTable *original;
    uint32_t base;
    const StringTable *local;
    uint32_t *index_map;
} RefRewrite;

/* The payload index of forecast index `ref`; -1 without an exception when
 * it stands for no string, -1 with one when adding the string failed. */
static int
ref_payload_index(RefRewrite *rw, int64_t ref, uint32_t *index)
{
    if (ref < 0) {
        return -1;
    }
    if (ref < V05_FIXED_ENTRIES) {
        *index = (uint32_t)ref;
        return 0;
    }
    if (ref < rw->base) {
        if (rw->original == NULL || ref >= rw->original->count) {
            return -1;
        }
        return strtable_index_from(rw->payload, rw->original, (uint32_t)ref,
                                   payload_encode_table_entry, NULL, index);
    }
    if (ref - rw->base >= rw->local->count - V05_FIXED_ENTRIES) {
        return -1;
    }
    uint32_t local_index = (uint32_t)(ref - rw->base) + V05_FIXED_ENTRIES;
    if (rw->index_map[local_index] == UINT32_MAX &&
        strtable_index_from(rw->payload, rw->local, local_index, payload_encode_table_entry, NULL,
                            &rw->index_map[local_index]) < 0) {
        return -1;
    }
    *index = rw->index_map[local_index];
    return 0;
}

/* Read a string reference and write its payload index: 0 and 1 as they
 * are, any other the index of the string it stands for. */
static int
body_rewrite_ref(BodyReader *r, OutBuf *out, RefRewrite *rw)
{
    uint32_t index;
    if (ref_payload_index(rw, body_read_ref(r), &index) < 0) {
        return -1;
    }
    return mp_write_uint(out, index);
}

/* Read `count` string references, writing their payload indexes. */
static int
body_rewrite_refs(BodyReader *r, int64_t count, OutBuf *out, RefRewrite *rw)
{
    for (int64_t i = 0; i < count; i++) {
        if (body_rewrite_ref(r, out, rw) < 0) {
            return -1;
        }
    }
    return 0;
}

/* Copy the encoded trace's body to `out`, each string reference rewritten.
 * -1 (no exception set) if the body is not as the v0.5 writer writes it. */
static int
body_rewrite(const EncodedPart *part, OutBuf *out, RefRewrite *rw)
{
    BodyReader r = {(const unsigned char *)part->body.start, (const unsigned char *)part->body.pos};
    const unsigned char *from = r.pos;
    int64_t spans = body_read_count(&r, MP_FIXARRAY, MP_ARRAY16);
    if (spans < 0 || body_copy(out, from, &r) < 0) {
        return -1;
    }
    for (int64_t s = 0; s < spans; s++) {
        /* [service, name, resource, trace_id, span_id, parent_id, start,
         *  duration, error, meta, metrics, type] */
        from = r.pos;
        if (body_read_count(&r, MP_FIXARRAY, MP_ARRAY16) != 12 || body_copy(out, from, &r) < 0) {
            return -1;
        }
        if (body_rewrite_refs(&r, 3, out, rw) < 0) {
            return -1;
        }
        from = r.pos;
        for (int i = 0; i < 6; i++) {
            Py_ssize_t size = body_number_size(&r);
            if (size == 0) {
                return -1;
            }
            r.pos += size;
        }
        if (body_copy(out, from, &r) < 0) {
            return -1;
        }
        from = r.pos;
        int64_t meta = body_read_count(&r, MP_FIXMAP, MP_MAP16);
        if (meta < 0 || body_copy(out, from, &r) < 0) {
            return -1;
        }
        if (body_rewrite_refs(&r, 2 * meta, out, rw) < 0) {
            return -1;
        }
        from = r.pos;
        int64_t metrics = body_read_count(&r, MP_FIXMAP, MP_MAP16);
        if (metrics < 0 || body_copy(out, from, &r) < 0) {
            return -1;
        }
        for (int64_t e = 0; e < metrics; e++) {
            if (body_rewrite_ref(&r, out, rw) < 0) {
                return -1;
            }
            from = r.pos;
            Py_ssize_t size = body_number_size(&r);
            r.pos += size;
            if (size == 0 || body_copy(out, from, &r) < 0) {
                return -1;
            }
        }
        if (body_rewrite_ref(&r, out, rw) < 0) {
            return -1;
        }
    }
    return r.pos == r.end ? 0 : -1;
}

/* v0.5, a forecast trace joined to a payload other than the one it was
 * forecast for, or changed since: its strings are found or added, and its
 * body is copied with each reference rewritten. */
static int
append_rewriting(PayloadBuilder *payload, const EncodedPart *part)
{
    const StringTable *local = &part->strings;
    uint32_t *index_map = PyMem_Malloc((size_t)local->count * sizeof(uint32_t));
    if (index_map == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    memset(index_map, 0xff, (size_t)local->count * sizeof(uint32_t));
    int result = -1;
    RefRewrite rw = {&payload->table, forecast_original_table(&part->forecast), part->forecast.base,
                     local, index_map};
    /* The origin entered the table before any span's strings (v05_start_trace). */
    uint32_t origin_index;
    if ((part->forecast.origin_ref != 0 &&
         ref_payload_index(&rw, part->forecast.origin_ref, &origin_index) < 0) ||
        body_rewrite(part, &payload->body, &rw) < 0) {
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_SystemError, "spanpack: malformed encoded v0.5 trace");
        }
        goto done;
    }
    result = 0;
done:
    PyMem_Free(index_map);
    return result;
}

int
payload_append(PayloadBuilder *payload, EncodedPart *part)
{
    if (mp_check_length(payload->trace_count + 1, "payload's trace array") < 0) {
        return -1;
    }
    PayloadMark mark = payload_mark(payload);
    int result;
    if (payload->version == 5 && part->forecast.payload != NULL) {
        result = 0;
        if (part->forecast.payload_id != 0 && part->forecast.payload_id == payload->id &&
            part->forecast.base == payload->table.count) {
            result = append_adopting(payload, part);
            if (result == 0) {
                result = append_forecast(payload, part);
            }
        }
        if (result == 0) {
            result = append_rewriting(payload, part);
        }
    }
    else if (payload->version == 5) {
        result = append_with_indexes(payload, part);
    }
    else if (payload->version == V10_VERSION) {
        result = v10_append_part(payload, part);
    }
    else {
        result = outbuf_write(&payload->body, part->body.start, outbuf_len(&part->body));
    }
    if (result < 0) {
        payload_release_part(payload, mark, part);
        return -1;
    }
    payload->trace_count++;
    return 0;
}

int
payload_append_taking(PayloadBuilder *payload, EncodedPart *part)
{
    /* Only between buffers of about the same size: a larger payload buffer
     * (one kept from the last payload) is where the next traces go, and a
     * much smaller one (a new payload's) would leave the part to grow again
     * from fresh memory for the next trace.  (v0.5's own first-trace swap,
     * append_adopting, is chosen by its forecast, which only put()'s parts
     * have.) */
    Py_ssize_t part_capacity = outbuf_capacity(&part->body);
    Py_ssize_t payload_capacity = outbuf_capacity(&payload->body);
    if (payload->version == 4 && payload->trace_count == 0 && payload->header_room == 0 &&
        payload->body.bytes == NULL && outbuf_len(&payload->body) == 0 &&
        part->body.bytes == NULL && part_capacity >= payload_capacity &&
        payload_capacity >= part_capacity / 2) {
        OutBuf body = payload->body;
        payload->body = part->body;
        part->body = body;
        payload->trace_count = 1;
        return 0;
    }
    return payload_append(payload, part);
}

/* The headers in front of the traces: for v0.5 `92` and the string table,
 * then the traces' array header; for v1.0 see v10_put_prefix. */
static void
put_prefix(const PayloadBuilder *payload, OutBuf *head)
{
    if (payload->version == V10_VERSION) {
        v10_put_prefix(payload, head);
        return;
    }
    if (payload->version == 5) {
        mp_put_byte(head, MP_FIXARRAY | 2); /* [table, traces] */
        mp_put_array_header(head, payload->table.count);
        Py_ssize_t table_len = outbuf_len(&payload->table.encoded);
        memcpy(head->pos, payload->table.encoded.start, (size_t)table_len);
        head->pos += table_len;
    }
    mp_put_array_header(head, (uint32_t)payload->trace_count);
}

PyObject *
payload_finish(PayloadBuilder *payload)
{
    if (mp_check_length(payload->trace_count, "payload's trace array") < 0 ||
        (payload->version == 5 && mp_check_length(payload->table.count, "string table") < 0)) {
        return NULL;
    }
    Py_ssize_t prefix = payload_prefix_size(payload);
    Py_ssize_t traces_len = outbuf_len(&payload->body) - payload->header_room;
    char *traces = payload->body.start + payload->header_room;
    if (prefix == payload->header_room && payload->body.bytes != NULL) {
        /* The header fills the room left for it: hand out the body itself. */
        OutBuf head = {payload->body.start, payload->body.start, traces, NULL};
        put_prefix(payload, &head);
        return outbuf_finish_bytes(&payload->body);
    }
    if (traces_len > PY_SSIZE_T_MAX - prefix) {
        return PyErr_NoMemory();
    }
    PyObject *result = PyBytes_FromStringAndSize(NULL, prefix + traces_len);
    if (result == NULL) {
        return NULL;
    }
    char *start = PyBytes_AS_STRING(result);
    OutBuf head = {start, start, start + prefix, NULL};
    put_prefix(payload, &head);
    memcpy(start + prefix, traces, (size_t)traces_len);
    return result;
}
