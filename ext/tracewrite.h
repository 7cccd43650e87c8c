/* Writing one trace: the interface between the encoder (trace_encoder.c) and
 * the span writers (span_v04.c, span_v05.c, on the rules of spanwrite.h).
 *
 * The encoder fills a SpanWriter (where to write, the field reader, the
 * string cache or table, options, the trace's index for errors) and calls the
 * version's trace writer, which appends one encoded trace to w->out. */
#ifndef SPANPACK_TRACEWRITE_H
#define SPANPACK_TRACEWRITE_H

#include "intern.h"
#include "packer.h"
#include "spanfields.h"

/* Tags every span of a v0.4/v0.5 payload gets unless it has the key itself
 * (the encoder options default_meta= and default_metrics=; docs/wire-format.md,
 * "Default tags").  Checked once, when the encoder is made: keys as written
 * (exact str, cut like span keys), meta values exact str (cut), metric values
 * exact int within 64 bits or float.  Empty when count is 0 (objects NULL). */
typedef struct {
    Py_ssize_t count;
    PyObject *keys;   /* tuple */
    PyObject *values; /* tuple, in the order of keys */
    PyObject *index;  /* dict: each key -> its position (an int) */
    /* Bit (length % 64) set for the length of each key: most span keys are
     * ruled out by their length alone, without a lookup. */
    uint64_t key_lengths;
} DefaultTagMap;

typedef struct {
    DefaultTagMap meta;
    DefaultTagMap metrics;
} DefaultTags;

/* Check and keep the options (None: none).  `for_v10`: refused, naming the
 * v1.0 payload fields instead.  0, or -1 with TypeError/ValueError naming the
 * option and key (*tags is then empty). */
int default_tags_init(DefaultTags *tags, PyObject *meta, PyObject *metrics, int for_v10);
void default_tags_clear(DefaultTags *tags);
int default_tags_traverse(const DefaultTags *tags, visitproc visit, void *arg);

typedef struct SpanWriter {
    SpanpackState *state;
    SpanFieldReader *reader;
    EncodedStrCache *cache; /* v0.4 interning; NULL when off */
    /* v0.4: a str with at most this many references is not looked up in the
     * cache (nor remembered by it), which holds one of its own: 1, a str
     * only its span holds; 2 while the entries of a tags dict made for this
     * read (an accessor's or getter's new dict, ours alone) are written,
     * whose strs held by it and by at most the span's own storage are that
     * span's values (ddtrace's native spans, a property building a dict). */
    Py_ssize_t uncached_refs;
    PackOptions value_options; /* for meta_struct values */
    int lenient;               /* drop bad tags (counted) instead of raising */
    int native_span_events;    /* v0.4: events as top-level span_events */
    /* v0.4, v0.5: the first span of a trace with a 128-bit id looks its
     * meta up for _dd.p.tid (a dict lookup, which can run Python code: the
     * keys' __eq__); v1.0 reads that tag as it walks the map. */
    int looks_up_trace_id_high;
    Py_ssize_t dropped_tags;
    /* Location for error messages. */
    Py_ssize_t trace_index;
    Py_ssize_t span_index;
    OutBuf *out;
    /* v0.5: the string table that indexes are taken from.  Either the
     * encoded trace's own table, with holes recorded in `holes` and no
     * encoding (encode_string NULL), or, when writing straight into a
     * payload, the payload's table (holes NULL, encode_string set). */
    StringTable *strings;
    strtable_encode_fn encode_string;
    HoleList *holes;
    /* v0.5 put(): with the encoded trace's own table, the payload indexes
     * its strings are expected to get (written into the holes); NULL
     * otherwise. */
    IndexForecast *forecast;
    /* The span being written (held by the caller), and its fields while
     * they are (or may be) borrowed: every path that can run Python code
     * owns them first. */
    PyObject *span;
    SpanValues *values;
    /* The tag keys of one map that are (or look like) cut text, as written
     * (exact str, owned), to refuse a second key that cuts to the same text
     * (a decoder would keep one value and lose the other).  A plain array,
     * not a Python set: the map's entries may be being read in place, where
     * allocating a container could start a garbage collection (Python
     * code).  For the map of `cut_keys_field` in span `cut_keys_span`. */
    PyObject **cut_keys;
    Py_ssize_t cut_key_count;
    Py_ssize_t cut_key_capacity;
    const char *cut_keys_field;
    Py_ssize_t cut_keys_span;
    /* Default tags (NULL when there are none), and while a map is written
     * which of them the span has itself (one flag per key, allocated by
     * write_trace). */
    const DefaultTagMap *default_meta;
    const DefaultTagMap *default_metrics;
    unsigned char *default_seen;
    /* The span's mixed tags mapping: its meta and metrics as one dict
     * (borrowed from `values`; NULL for any other span), how many of its
     * entries each map gets, counted when the span is read (meta: str,
     * bool and any value refused; metrics: int and float), and while one of
     * the two is written, which (0 meta, 1 metrics) and the version's entry
     * writer for it (spanwrite.c: write_mixed_entries). */
    PyObject *mixed_tags;
    Py_ssize_t mixed_count[2];
    int mixed_pass;
    int (*mixed_write_entry)(struct SpanWriter *w, PyObject *key, PyObject *value);
} SpanWriter;

/* Give the writer the encoder's default tags. */
static inline void
default_tags_attach(SpanWriter *w, const DefaultTags *tags)
{
    w->default_meta = tags->meta.count > 0 ? &tags->meta : NULL;
    w->default_metrics = tags->metrics.count > 0 ? &tags->metrics : NULL;
}

/* One trace: an array of spans (v0.4: maps; v0.5: arrays of 12 with string
 * indexes).  0, or -1 with an exception naming the trace, span and field;
 * on failure w->out holds a partial trace the caller rolls back. */
int v04_write_trace(SpanWriter *w, PyObject *trace);
int v05_write_trace(SpanWriter *w, PyObject *trace);

#endif /* SPANPACK_TRACEWRITE_H */
