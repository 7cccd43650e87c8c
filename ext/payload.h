/* Encoded traces and the payloads built from them.
 *
 * An EncodedPart is one trace as written by the v0.4, v0.5 or v1.0 span
 * writer (for v0.5 and v1.0 with its own string table and holes).  A PayloadBuilder appends
 * parts into one agent payload, all-or-nothing per part, and finishes it into
 * a bytes object in place. */
#ifndef SPANPACK_PAYLOAD_H
#define SPANPACK_PAYLOAD_H

#include "intern.h"
#include "outbuf.h"
#include "state.h"

typedef struct {
    OutBuf body;
    StringTable strings;    /* v0.5, v1.0 */
    HoleList holes;         /* v0.5, v1.0 */
    IndexForecast forecast; /* v0.5 put(); inactive (payload NULL) otherwise */
} EncodedPart;

/* `lends`: for a part emptied right after its join (put()), whose table's
 * references to strings new to the payload then pass to the payload's table
 * (strtable_use_lending); never for a part joined more than once. */
int part_init(EncodedPart *part, SpanpackState *state, int version, int lends);
/* Empty the part (its forecast inactive) for the next trace. */
void part_reset(EncodedPart *part);
/* After a put(): empty a part kept for reuse, releasing its strings, and
 * give back what its buffers hold beyond about `keep` bytes each. */
void part_shrink(EncodedPart *part, SpanpackState *state, Py_ssize_t keep);
void part_free(EncodedPart *part);

/* How many entries, and how many encoded bytes, a payload's table starts with. */
typedef struct {
    uint32_t count;
    Py_ssize_t encoded_len;
} TableSeed;

typedef struct {
    int version;
    OutBuf body;            /* `header_room` bytes, then the traces */
    Py_ssize_t header_room; /* room left in front for the traces' array header */
    StringTable table;      /* v0.5: the payload's string table; v1.0: the
                               strings streamed so far, by id */
    Py_ssize_t trace_count;
    PyObject *preamble; /* v1.0: see v10_payload_start; NULL otherwise */
    /* Tells a buffering encoder's payloads apart (0: none given), so that a
     * trace's forecast is only used for the payload it was made for. */
    uint64_t id;
    /* The table's entries every payload of its encoder starts with (v0.5's
     * seed; v1.0's "" and preamble strings), set by payload_seeded(); count
     * 0 before, and then the table is never kept for reuse. */
    TableSeed seed;
} PayloadBuilder;

/* A string table kept from a finished payload for its encoder's next one
 * (strings == NULL: none): emptied back to its seed, so the next payload
 * neither allocates nor fills one.  `version` and `preamble` (borrowed, for
 * an identity check only) are those of the payload that left it. */
typedef struct {
    StringTable table;
    TableSeed seed;
    int version;
    const PyObject *preamble;
} SpareTable;

/* The tables of payloads finished while a put() that forecast for them is
 * still encoding its trace (see IndexForecast), each kept until the last
 * such put() ends; and how many put()s forecast for the current payload.
 * Room for one kept table per put() encoding is made when it starts, so
 * that finishing a payload never allocates for this. */
typedef struct {
    uint64_t payload_id;
    uint32_t users; /* put()s still encoding with a forecast for it */
    StringTable table;
} RetiredTable;

typedef struct ForecastTables {
    RetiredTable *retired;
    uint32_t retired_count;
    uint32_t capacity;
    uint32_t in_flight;     /* put()s encoding with a forecast */
    uint32_t current_users; /* of those, the ones for the current payload */
} ForecastTables;

/* v0.5: forecast the payload indexes of the next trace encoded into `part`
 * (after part_reset) for joining it to `payload`, the encoder's current
 * one (see IndexForecast).  Without memory for it, the trace is encoded
 * with holes instead (no error). */
void forecast_begin(ForecastTables *tables, EncodedPart *part, PayloadBuilder *payload);
/* The put() of `part` is done with its forecast (joined or not): a kept
 * table no other put() needs is freed.  `current`: the encoder's current
 * payload.  Nothing happens for a part without a forecast. */
void forecast_end(ForecastTables *tables, EncodedPart *part, const PayloadBuilder *current);
/* Before `payload`, the encoder's current one, is finished or dropped:
 * keep its table if a put() encoding now forecast for it (the payload is
 * left without one). */
void forecast_retire(ForecastTables *tables, PayloadBuilder *payload);
void forecast_tables_free(ForecastTables *tables);

/* `header_room`: for a v0.4 payload whose trace count is known up front, the
 * size of its array header: the body is then written into a bytes object
 * behind that room and handed out without a copy.  0 writes the body to heap
 * memory and copies it behind its headers when finished: v0.5 payloads, whose
 * string table goes in front, and buffered payloads, which must stay intact
 * until their bytes are safely handed out. */
int payload_init(PayloadBuilder *payload, SpanpackState *state, int version, Py_ssize_t capacity,
                 Py_ssize_t header_room);
void payload_free(PayloadBuilder *payload);

/* Record the table as it is now as the payload's seed (after payload_init and,
 * for v1.0, v10_payload_start). */
void payload_seeded(PayloadBuilder *payload);

/* payload_init for v0.5 and v1.0 on a table `spare` holds (taken over, the
 * spare left empty), which must come from a payload of the same version and
 * preamble; the preamble is the caller's to set. */
int payload_init_on_spare(PayloadBuilder *payload, int version, Py_ssize_t capacity,
                          Py_ssize_t header_room, SpareTable *spare);

/* Move the payload's table, emptied back to its seed, into an empty `spare`
 * (then 1); 0, leaving the table to payload_free, when the spare is taken,
 * the table was never seeded or is too big to keep around. */
int payload_spare_table(PayloadBuilder *payload, SpareTable *spare);

/* Free the table a spare holds, if any. */
void spare_table_free(SpareTable *spare);

/* Exact size of the finished payload. */
Py_ssize_t payload_size(const PayloadBuilder *payload);

/* Where to roll back to if an append must be undone. */
typedef struct {
    Py_ssize_t body_len;
    uint32_t table_count;
    Py_ssize_t table_len;
    Py_ssize_t trace_count;
} PayloadMark;

PayloadMark payload_mark(const PayloadBuilder *payload);
void payload_rollback(PayloadBuilder *payload, PayloadMark mark);
/* Roll back (or, before payload_free, undo) the append of `part`, taking
 * back first the references the part lent the payload. */
void payload_release_part(PayloadBuilder *payload, PayloadMark mark, EncodedPart *part);

/* Encodes a new entry of a payload's string table (a msgpack str). */
int payload_encode_table_entry(void *arg, PyObject *key, OutBuf *out);

/* Append one encoded trace; on failure the payload is unchanged.  A part
 * that lends may lend the payload references: undo the append only with
 * payload_release_part. */
int payload_append(PayloadBuilder *payload, EncodedPart *part);
/* payload_append for put()'s part, which is emptied right after: the first
 * trace of an empty v0.4 payload takes the part's body as the payload's
 * (swapped, not copied; the part gets the payload's empty one) when the two
 * buffers are of about the same size (see recycle_body). */
int payload_append_taking(PayloadBuilder *payload, EncodedPart *part);

/* The finished payload as bytes.  The builder must be freed afterwards
 * either way; on failure it is unchanged, and so it is on success unless its
 * bytes-backed body was handed out. */
PyObject *payload_finish(PayloadBuilder *payload);

/* Size of a msgpack array header for n items. */
static inline Py_ssize_t
array_header_size(Py_ssize_t n)
{
    return n < 16 ? 1 : n < 65536 ? 3 : 5;
}

#endif /* SPANPACK_PAYLOAD_H */
