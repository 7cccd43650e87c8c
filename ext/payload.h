/* Encoded traces and the payloads built from them.
 *
 * An EncodedPart is one trace as written by the v0.4, v0.5 or v1.0 span
 * writer (for v0.5 and v1.0 with its own string table and holes).  A PayloadBuilder appends
 * parts into one agent payload, all-or-nothing per part, and finishes it into
 * a bytes object in place. */
#ifndef SPANPACK_PAYLOAD_H
#define SPANPACK_PAYLOAD_H

#include "spanwrite.h"

typedef struct {
    OutBuf body;
    StringTable strings; /* v0.5, v1.0 */
    HoleList holes;      /* v0.5, v1.0 */
} EncodedPart;

int part_init(EncodedPart *part, SpanpackState *state, int version);
void part_reset(EncodedPart *part);
/* After a huge trace: give back the memory of a part kept for reuse. */
void part_shrink(EncodedPart *part, SpanpackState *state, Py_ssize_t keep);
void part_free(EncodedPart *part);

/* Bytes reserved in front of a payload body for its headers when the trace
 * count is not known in advance: enough for any traces array header (v0.5
 * payloads grow the gap for their table when they finish). */
#define PAYLOAD_PREFIX_RESERVE 5

typedef struct {
    int version;
    OutBuf body;        /* bytes-backed; `reserve` bytes, then the traces */
    Py_ssize_t reserve; /* room left in front for the headers */
    StringTable table;  /* v0.5: the payload's string table; v1.0: the strings
                           streamed so far, by id */
    Py_ssize_t trace_count;
    PyObject *preamble; /* v1.0: see v10_payload_start; NULL otherwise */
} PayloadBuilder;

/* `reserve`: PAYLOAD_PREFIX_RESERVE, or the exact header size when the trace
 * count is known (then a v0.4 payload finishes without moving its body). */
int payload_init(PayloadBuilder *payload, SpanpackState *state, int version, Py_ssize_t capacity,
                 Py_ssize_t reserve);
void payload_free(PayloadBuilder *payload);

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

/* Encodes a new entry of a payload's string table (a msgpack str). */
int payload_encode_table_entry(void *arg, PyObject *key, OutBuf *out);

/* Append one encoded trace; on failure the payload is unchanged. */
int payload_append(PayloadBuilder *payload, const EncodedPart *part);

/* The finished payload as bytes; the builder is left empty and unusable. */
PyObject *payload_finish(PayloadBuilder *payload);

/* Size of a msgpack array header for n items. */
static inline Py_ssize_t
array_header_size(Py_ssize_t n)
{
    return n < 16 ? 1 : n < 65536 ? 3 : 5;
}

#endif /* SPANPACK_PAYLOAD_H */
