/* TraceEncoder: the C type under spanpack.TraceMsgPackEncoder.
 *
 * One-shot:  encode_traces(traces) -> payload bytes;
 *            encode_trace(trace) -> EncodedTrace, join_encoded(parts) -> bytes.
 * Buffered:  put(trace) encodes the trace on its own (running any Python code
 *            the spans need) and then appends it to the buffered payload in a
 *            short step that runs no Python code, so a failed trace leaves the
 *            buffer untouched and concurrent put()/encode() never tear.
 *            encode() -> [(payload, trace_count), ...].
 * AgentWriter's intake (_start_intake()): put_counted(trace) also keeps the
 *            trace object beside its bytes (encode() then gives
 *            (payload, trace_count, traces)) and counts what it refuses, in
 *            the same call, so a writer's count and its put cannot be parted
 *            (see WriterIntake). */
#include "payload.h"
#include "tracewrite.h"
#include "v10.h"

#include <structmember.h>

#define DEFAULT_MAX_SIZE (20 * 1024 * 1024)
/* What put()'s scratch part keeps of its buffers between traces: enough for
 * a 1,000-span trace's holes (16 bytes each), whose regrowth from nothing
 * on every put() cost 5-10% of the call in realloc copies; a larger trace's
 * buffers are given back. */
#define RETAINED_BUFFER (1024 * 1024)
/* What a v0.4 encoder keeps of a sealed payload's buffer for its next
 * payload (recycle_body): payloads up to this size (AgentWriter's default
 * max_payload_size is 5 MiB) are then built without growing a buffer from
 * fresh memory each time. */
#define RETAINED_PAYLOAD_BUFFER (4 * RETAINED_BUFFER)
#define MAX_SIZE_HINT (32 * 1024 * 1024)

/* A payload's string table (v0.5, v1.0) is kept for the encoder's next
 * payload (see SpareTable).  Not on free-threaded builds: one-shot calls
 * there may run at once in several threads, with no lock to share it. */
#ifndef Py_GIL_DISABLED
#define SP_SPARE_TABLES 1
#endif

/* What put_counted() refused, by reason (the writer's drop reasons). */
enum {
    REFUSED_BUFFER_FULL,
    REFUSED_TOO_LARGE,
    REFUSED_BAD_INPUT,   /* an Exception while encoding the trace */
    REFUSED_INTERRUPTED, /* any other BaseException while encoding it */
    REFUSED_CLOSED,      /* put after _close() */
    REFUSED_REASONS
};

/* put_counted()'s answers: taken, taken and the buffer reached wake_size
 * (once per encode()), or refused (REFUSED_* + PUT_REFUSED). */
enum { PUT_TAKEN = 0, PUT_TAKEN_WAKE = 1, PUT_REFUSED = 2 };

/* The AgentWriter's use of an encoder (_start_intake()): the trace objects of
 * the current payload, in its order, for re-encoding; counters that only
 * grow; a closed flag.  Everything is changed inside put_counted()'s one
 * C call, so an exception from a signal handler in the caller, before or
 * after it, cannot leave a trace counted twice or not at all. */
typedef struct {
    int on;
    int closed;
    int woken;            /* put_counted() said PUT_TAKEN_WAKE since encode() */
    Py_ssize_t wake_size; /* 0: never */
    PyObject *traces;     /* list: the current payload's trace objects */
    PyObject *spare;      /* an empty list for the next payload a put starts */
    PyObject *last_error; /* str: "Type: message" of the last bad input, for the log */
    Py_ssize_t refused[REFUSED_REASONS];
} WriterIntake;

typedef struct {
    PyObject_HEAD
    SpanpackState *state;
    int version; /* 4, 5 or V10_VERSION */
    int lenient;
    int native_span_events;
    SpanFieldReader reader;
    EncodedStrCache cache; /* v0.4 interning; slots == NULL when off */
    Py_ssize_t dropped_tags;
    /* Buffered traces. */
    Py_ssize_t max_size;
    Py_ssize_t max_item_size;
    Py_ssize_t max_payload_size; /* 0: no splitting */
    PayloadBuilder current;
    PyObject *sealed; /* list of (bytes, count): payloads already split off */
    Py_ssize_t sealed_size;
    Py_ssize_t sealed_traces;
    /* A reusable scratch part for put(); a concurrent put() that finds it in
     * use encodes into a part of its own. */
    EncodedPart scratch;
    int scratch_in_use;
    /* v0.5: the put()s encoding with a forecast, and the tables of payloads
     * finished meanwhile that they still read. */
    ForecastTables forecasts;
    /* Encodes under way, and put()s from their encoding to their join (span
     * code, or a collection between the two, may call back into the
     * encoder); while any runs, __init__ must not swap the reader, cache,
     * version, scratch part or payload. */
    int active_encodes;
    /* Capacity to start a one-shot payload with: the last one's size. */
    Py_ssize_t size_hint;
    /* v1.0: the payload fields in front of the chunks (v10.h); else NULL. */
    PyObject *preamble;
    /* The last PayloadBuilder.id given to a buffered payload. */
    uint64_t payload_ids;
    /* v0.4/v0.5: default_meta= and default_metrics= (tracewrite.h). */
    DefaultTags default_tags;
    WriterIntake intake;
#ifdef SP_SPARE_TABLES
    /* The last finished payload's string table, for the next payload. */
    SpareTable spare;
#endif
} TraceEncoderObject;

typedef struct {
    PyObject_HEAD
    int version;
    EncodedPart part;
} EncodedTraceObject;

/* ---------------------------------------------------------------------------
 * Encoding one trace */

static void
writer_init(TraceEncoderObject *self, SpanWriter *w, OutBuf *out, EncodedPart *part,
            Py_ssize_t trace_index)
{
    memset(w, 0, sizeof *w);
    w->state = self->state;
    w->reader = &self->reader;
    w->cache = self->cache.slots != NULL ? &self->cache : NULL;
    w->uncached_refs = 1;
    w->value_options.state = self->state;
    w->value_options.use_bin_type = 1;
    w->lenient = self->lenient;
    w->native_span_events = self->native_span_events;
    default_tags_attach(w, &self->default_tags);
    w->looks_up_trace_id_high = self->version != V10_VERSION;
    w->trace_index = trace_index;
    w->out = out;
    if (self->version != 4 && part != NULL) {
        w->strings = &part->strings;
        w->holes = &part->holes;
        if (part->forecast.payload != NULL) {
            w->forecast = &part->forecast;
        }
    }
}

/* A one-shot encode writes straight into its payload: no copy for v0.4, and
 * for v0.5 indexes from the payload's own table (no holes to fill). */
static int
write_into_payload(TraceEncoderObject *self, PayloadBuilder *payload, PyObject *trace,
                   Py_ssize_t index, Py_ssize_t *dropped)
{
    SpanWriter w;
    writer_init(self, &w, &payload->body, NULL, index);
    int result;
    self->active_encodes++;
    if (self->version == 5) {
        w.strings = &payload->table;
        w.encode_string = payload_encode_table_entry;
        result = v05_write_trace(&w, trace);
    }
    else if (self->version == V10_VERSION) {
        w.strings = &payload->table;
        result = v10_write_trace(&w, trace);
    }
    else {
        result = v04_write_trace(&w, trace);
    }
    self->active_encodes--;
    *dropped = w.dropped_tags;
    if (result == 0) {
        payload->trace_count++;
    }
    return result;
}

/* Encode `trace` into `part` (reset first), for put() with `forecast`.
 * Dropped tags are only counted when the whole trace succeeds. */
static int
encode_part(TraceEncoderObject *self, EncodedPart *part, PyObject *trace, Py_ssize_t index,
            int forecast, Py_ssize_t *dropped)
{
    SpanWriter w;
    part_reset(part);
#ifndef Py_GIL_DISABLED
    /* The forecast reads the current payload's table while the trace is
     * encoded: under the GIL no other thread changes it meanwhile (unless
     * span code runs Python code, which the join then notices).  Without
     * the GIL that read would race with other threads' put(). */
    if (forecast && self->version == 5) {
        forecast_begin(&self->forecasts, part, &self->current);
    }
#else
    (void)forecast;
#endif
    writer_init(self, &w, &part->body, part, index);
    self->active_encodes++;
    int result = self->version == 5             ? v05_write_trace(&w, trace)
                 : self->version == V10_VERSION ? v10_write_trace(&w, trace)
                                                : v04_write_trace(&w, trace);
    self->active_encodes--;
    *dropped = w.dropped_tags;
    return result;
}

/* A payload of this encoder's version (and for v1.0 its preamble), on the
 * spare table when there is one. */
static int
encoder_payload_init(TraceEncoderObject *self, PayloadBuilder *payload, Py_ssize_t capacity,
                     Py_ssize_t reserve)
{
#ifdef SP_SPARE_TABLES
    SpareTable *spare = &self->spare;
    if (spare->table.strings != NULL && spare->version == self->version &&
        spare->preamble == self->preamble) {
        if (payload_init_on_spare(payload, self->version, capacity, reserve, spare) < 0) {
            return -1;
        }
        payload->preamble = Py_XNewRef(self->preamble);
        return 0;
    }
#endif
    if (payload_init(payload, self->state, self->version, capacity, reserve) < 0) {
        return -1;
    }
    if (self->version == V10_VERSION && v10_payload_start(payload, self->preamble) < 0) {
        payload_free(payload);
        return -1;
    }
    payload_seeded(payload);
    return 0;
}

/* payload_free, keeping the table for the next payload when it was made for
 * this encoder as it is now (span code may have called __init__ since). */
static void
encoder_payload_free(TraceEncoderObject *self, PayloadBuilder *payload)
{
#ifdef SP_SPARE_TABLES
    if (payload->version == self->version && payload->preamble == self->preamble) {
        payload_spare_table(payload, &self->spare);
    }
#else
    (void)self;
#endif
    payload_free(payload);
}

/* A payload for the buffer, with an id of its own (see IndexForecast). */
static int
buffer_payload_init(TraceEncoderObject *self, PayloadBuilder *payload)
{
    if (encoder_payload_init(self, payload, 4096, 0) < 0) {
        return -1;
    }
    payload->id = ++self->payload_ids;
    return 0;
}

/* "v0.4", "v0.5" or "v1.0". */
static PyObject *
version_name(int version)
{
    return version == V10_VERSION ? PyUnicode_FromString("v1.0")
                                  : PyUnicode_FromFormat("v0.%d", version);
}

/* ---------------------------------------------------------------------------
 * Construction */

static int
size_argument(PyObject *value, const char *name, Py_ssize_t default_value, Py_ssize_t *out)
{
    if (value == NULL || value == Py_None) {
        *out = default_value;
        return 0;
    }
    Py_ssize_t size = PyNumber_AsSsize_t(value, PyExc_OverflowError);
    if (size == -1 && PyErr_Occurred()) {
        return -1;
    }
    if (size <= 0) {
        PyErr_Format(PyExc_ValueError, "%s must be positive, not %zd", name, size);
        return -1;
    }
    *out = size;
    return 0;
}

static PyObject *
trace_encoder_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    (void)args;
    (void)kwargs;
    SpanpackState *state = spanpack_state_from_type(type);
    if (state == NULL) {
        return NULL;
    }
    TraceEncoderObject *self = (TraceEncoderObject *)type->tp_alloc(type, 0);
    if (self == NULL) {
        return NULL;
    }
    self->state = state;
    self->version = 4;
    self->max_size = DEFAULT_MAX_SIZE;
    self->max_item_size = DEFAULT_MAX_SIZE;
    self->sealed = PyList_New(0);
    if (self->sealed == NULL ||
        spanfields_init(&self->reader, Py_None, state->span_field_warning, &state->fast_paths) <
            0 ||
        payload_init(&self->current, state, 4, 4096, 0) < 0 ||
        part_init(&self->scratch, state, 4, 1) < 0) {
        Py_DECREF(self);
        return NULL;
    }
    self->current.id = ++self->payload_ids;
    return (PyObject *)self;
}

/* __init__ swaps the reader, cache, version, scratch part and payload: not
 * while an encode or a put() (from its encoding to its join) is under way. */
static int
refuse_while_encoding(TraceEncoderObject *self)
{
    if (self->active_encodes > 0 || self->scratch_in_use) {
        PyErr_SetString(PyExc_RuntimeError,
                        "TraceEncoder.__init__() called while the encoder is encoding");
        return -1;
    }
    return 0;
}

static int
trace_encoder_init(TraceEncoderObject *self, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"version",
                               "fields",
                               "max_size",
                               "max_item_size",
                               "max_payload_size",
                               "lenient",
                               "intern",
                               "native_span_events",
                               "default_meta",
                               "default_metrics",
                               "_preamble",
                               "strict",
                               NULL};
    const char *version = "v0.4";
    PyObject *fields = Py_None, *max_size = NULL, *max_item_size = NULL, *max_payload_size = NULL;
    PyObject *default_meta = Py_None, *default_metrics = Py_None, *preamble = Py_None;
    int lenient = 0, intern = 0, native_span_events = 0, strict = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|sO$OOOpppOOOp:TraceEncoder", keywords,
                                     &version, &fields, &max_size, &max_item_size,
                                     &max_payload_size, &lenient, &intern, &native_span_events,
                                     &default_meta, &default_metrics, &preamble, &strict)) {
        return -1;
    }
    if (refuse_while_encoding(self) < 0) {
        return -1;
    }
    int version_number;
    if (strcmp(version, "v0.4") == 0) {
        version_number = 4;
    }
    else if (strcmp(version, "v0.5") == 0) {
        version_number = 5;
    }
    else if (strcmp(version, "v1.0") == 0) {
        version_number = V10_VERSION;
    }
    else {
        PyErr_Format(PyExc_ValueError, "version must be \"v0.4\", \"v0.5\" or \"v1.0\", not %R",
                     PyTuple_GET_SIZE(args) > 0 ? PyTuple_GET_ITEM(args, 0) : Py_None);
        return -1;
    }
    if (preamble != Py_None &&
        (version_number != V10_VERSION || v10_check_preamble(preamble) < 0)) {
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_TypeError, "payload fields are for version \"v1.0\" only");
        }
        return -1;
    }
    Py_ssize_t max_size_value, max_item_value, max_payload_value;
    if (size_argument(max_size, "max_size", DEFAULT_MAX_SIZE, &max_size_value) < 0 ||
        size_argument(max_item_size, "max_item_size", max_size_value, &max_item_value) < 0 ||
        size_argument(max_payload_size, "max_payload_size", 0, &max_payload_value) < 0) {
        return -1;
    }
    SpanFieldReader reader;
    if (spanfields_init(&reader, fields, self->state->span_field_warning,
                        &self->state->fast_paths) < 0) {
        return -1;
    }
    reader.strict = strict;
    PayloadBuilder current;
    EncodedPart scratch;
    if (payload_init(&current, self->state, version_number, 4096, 0) < 0) {
        spanfields_clear(&reader);
        return -1;
    }
    current.id = ++self->payload_ids;
    if (version_number == V10_VERSION &&
        v10_payload_start(&current, preamble == Py_None ? NULL : preamble) < 0) {
        payload_free(&current);
        spanfields_clear(&reader);
        return -1;
    }
    payload_seeded(&current);
    if (part_init(&scratch, self->state, version_number, 1) < 0) {
        payload_free(&current);
        spanfields_clear(&reader);
        return -1;
    }
    EncodedStrCache cache = {0};
    PyObject *sealed = NULL;
    DefaultTags default_tags;
    if (default_tags_init(&default_tags, default_meta, default_metrics,
                          version_number == V10_VERSION) < 0 ||
        (intern && version_number == 4 && strcache_init(&cache) < 0) ||
        (sealed = PyList_New(0)) == NULL ||
        /* Those steps can run Python code (a mapping's items(), a
         * collection's finalizers), and another thread may have started
         * encoding meanwhile: it must not find the encoder swapped under it. */
        refuse_while_encoding(self) < 0) {
        Py_XDECREF(sealed);
        default_tags_clear(&default_tags);
        strcache_free(&cache);
        part_free(&scratch);
        payload_free(&current);
        spanfields_clear(&reader);
        return -1;
    }
    /* Everything is ready: swap it in (dropping any buffered traces).  The
     * old reader is released last: its layouts' objects may have finalizers
     * (Python code) that use this encoder, which must find it whole. */
    SpanFieldReader old_reader = self->reader;
    DefaultTags old_default_tags = self->default_tags;
    self->reader = reader;
    self->default_tags = default_tags;
    payload_free(&self->current);
    self->current = current;
#ifdef SP_SPARE_TABLES
    spare_table_free(&self->spare);
#endif
    part_free(&self->scratch);
    self->scratch = scratch;
    strcache_free(&self->cache);
    self->cache = cache;
    Py_SETREF(self->sealed, sealed);
    self->sealed_size = self->sealed_traces = 0;
    self->version = version_number;
    self->lenient = lenient;
    self->native_span_events = native_span_events;
    self->max_size = max_size_value;
    /* As in the reference encoder, an item can never exceed the buffer. */
    self->max_item_size = max_item_value < max_size_value ? max_item_value : max_size_value;
    self->max_payload_size = max_payload_value;
    self->dropped_tags = 0;
    Py_XSETREF(self->preamble, preamble == Py_None ? NULL : Py_NewRef(preamble));
    /* Not the writer's intake until _start_intake() (the counters stay:
     * they only grow). */
    self->intake.on = self->intake.closed = self->intake.woken = 0;
    self->intake.wake_size = 0;
    Py_CLEAR(self->intake.spare);
    Py_CLEAR(self->intake.traces);
    default_tags_clear(&old_default_tags);
    spanfields_clear(&old_reader);
    return 0;
}

static int
trace_encoder_traverse(TraceEncoderObject *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(self->sealed);
    Py_VISIT(self->preamble);
    Py_VISIT(self->intake.traces);
    Py_VISIT(self->intake.spare);
    Py_VISIT(self->intake.last_error);
    int visited = default_tags_traverse(&self->default_tags, visit, arg);
    if (visited != 0) {
        return visited;
    }
    return spanfields_traverse(&self->reader, visit, arg);
}

static int
trace_encoder_clear(TraceEncoderObject *self)
{
    Py_CLEAR(self->sealed);
    Py_CLEAR(self->preamble);
    Py_CLEAR(self->intake.traces);
    Py_CLEAR(self->intake.spare);
    Py_CLEAR(self->intake.last_error);
    default_tags_clear(&self->default_tags);
    for (int i = 0; i < SPAN_LAYOUT_CACHE; i++) {
        Py_CLEAR(self->reader.layouts[i].type);
    }
    return 0;
}

static void
trace_encoder_dealloc(TraceEncoderObject *self)
{
    PyTypeObject *type = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    trace_encoder_clear(self);
    spanfields_clear(&self->reader);
    strcache_free(&self->cache);
    payload_free(&self->current);
#ifdef SP_SPARE_TABLES
    spare_table_free(&self->spare);
#endif
    part_free(&self->scratch);
    forecast_tables_free(&self->forecasts);
    type->tp_free((PyObject *)self);
    Py_DECREF(type);
}

/* ---------------------------------------------------------------------------
 * One-shot encoding */

/* A v0.4 payload of a known trace count is written behind room for its
 * header and handed out without a copy, unless it is likely to outgrow its
 * first buffer (its predecessor reached the size hint's cap): a bytes object
 * that must grow is copied to heap memory and then once more when finished,
 * heap memory is remapped as it grows and copied once.  v0.5 puts its string
 * table in front and so is always copied behind it (see payload_init). */
static Py_ssize_t
one_shot_header_room(const TraceEncoderObject *self, Py_ssize_t trace_count)
{
    if (self->version == 5 || self->size_hint >= MAX_SIZE_HINT) {
        return 0;
    }
    if (self->version == V10_VERSION) {
        return v10_prefix_size(self->preamble, trace_count);
    }
    return array_header_size(trace_count);
}

/* The buffer of an encoder's first payload, with no previous one to size
 * it: room for its spans at a generous size each (an untouched part of a
 * large buffer costs no memory), so that it is rarely outgrown (a bytes
 * buffer outgrown is copied twice).  Lists and tuples are counted; any
 * other trace counts for one span (its length could run code). */
#define FIRST_PAYLOAD_MIN (16 * 1024)
#define FIRST_PAYLOAD_BYTES_PER_SPAN 384
static Py_ssize_t
first_payload_capacity(PyObject *items)
{
    Py_ssize_t spans = 0;
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(items); i++) {
        PyObject *trace = PySequence_Fast_GET_ITEM(items, i);
        spans += PyList_Check(trace) || PyTuple_Check(trace) ? Py_SIZE(trace) : 1;
        if (spans > MAX_SIZE_HINT / FIRST_PAYLOAD_BYTES_PER_SPAN) {
            return MAX_SIZE_HINT;
        }
    }
    Py_ssize_t capacity = spans * FIRST_PAYLOAD_BYTES_PER_SPAN;
    return capacity > FIRST_PAYLOAD_MIN ? capacity : FIRST_PAYLOAD_MIN;
}

static PyObject *
trace_encoder_encode_traces(TraceEncoderObject *self, PyObject *traces)
{
    /* A snapshot: span code may resize the caller's list while we iterate. */
    PyObject *items = PySequence_Tuple(traces);
    if (items == NULL && PyErr_ExceptionMatches(PyExc_TypeError)) {
        PyErr_Format(PyExc_TypeError, "traces must be a list of traces, not %.200s",
                     Py_TYPE(traces)->tp_name);
    }
    if (items == NULL) {
        return NULL;
    }
    Py_ssize_t count = PySequence_Fast_GET_SIZE(items);
    PayloadBuilder payload;
    Py_ssize_t dropped = 0;
    PyObject *result = NULL;
    /* Start at the size of this encoder's previous payload: similar calls
     * then never grow the buffer. */
    Py_ssize_t capacity = self->size_hint > 0 ? self->size_hint : first_payload_capacity(items);
    if (encoder_payload_init(self, &payload, capacity, one_shot_header_room(self, count)) < 0) {
        Py_DECREF(items);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *trace = Py_NewRef(PySequence_Fast_GET_ITEM(items, i));
        Py_ssize_t trace_dropped;
        int failed = write_into_payload(self, &payload, trace, i, &trace_dropped) < 0;
        Py_DECREF(trace);
        if (failed) {
            goto done;
        }
        dropped += trace_dropped;
    }
    result = payload_finish(&payload);
    if (result != NULL) {
        self->dropped_tags += dropped;
        Py_ssize_t size = PyBytes_GET_SIZE(result);
        self->size_hint = size < MAX_SIZE_HINT ? size + size / 16 : MAX_SIZE_HINT;
    }
done:
    encoder_payload_free(self, &payload);
    Py_DECREF(items);
    return result;
}

static PyObject *
trace_encoder_encode_trace(TraceEncoderObject *self, PyObject *trace)
{
    EncodedTraceObject *encoded = PyObject_New(EncodedTraceObject, self->state->encoded_part_type);
    if (encoded == NULL) {
        return NULL;
    }
    encoded->version = self->version;
    if (part_init(&encoded->part, self->state, self->version, 0) < 0) {
        memset(&encoded->part, 0, sizeof encoded->part);
        Py_DECREF(encoded);
        return NULL;
    }
    Py_ssize_t dropped;
    if (encode_part(self, &encoded->part, trace, 0, 0, &dropped) < 0) {
        Py_DECREF(encoded);
        return NULL;
    }
    self->dropped_tags += dropped;
    return (PyObject *)encoded;
}

static PyObject *
trace_encoder_join_encoded(TraceEncoderObject *self, PyObject *parts)
{
    PyObject *items = PySequence_Fast(parts, "join_encoded() takes a list of encoded traces");
    if (items == NULL) {
        return NULL;
    }
    Py_ssize_t count = PySequence_Fast_GET_SIZE(items);
    PyObject *result = NULL;
    Py_ssize_t total = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *item = PySequence_Fast_GET_ITEM(items, i);
        if (Py_TYPE(item) != self->state->encoded_part_type) {
            PyErr_Format(PyExc_TypeError,
                         "join_encoded(): item %zd is %.200s, not an "
                         "EncodedTrace from encode_trace()",
                         i, Py_TYPE(item)->tp_name);
            Py_DECREF(items);
            return NULL;
        }
        if (((EncodedTraceObject *)item)->version != self->version) {
            PyObject *item_version = version_name(((EncodedTraceObject *)item)->version);
            PyObject *own_version = version_name(self->version);
            if (item_version != NULL && own_version != NULL) {
                PyErr_Format(PyExc_ValueError,
                             "join_encoded(): item %zd was encoded for %U, "
                             "this encoder writes %U",
                             i, item_version, own_version);
            }
            Py_XDECREF(item_version);
            Py_XDECREF(own_version);
            Py_DECREF(items);
            return NULL;
        }
        /* A large part listed many times could overflow the sum. */
        Py_ssize_t part_len = outbuf_len(&((EncodedTraceObject *)item)->part.body);
        if (part_len > PY_SSIZE_T_MAX - 64 - total) {
            Py_DECREF(items);
            return PyErr_NoMemory();
        }
        total += part_len;
    }
    total += 64;
    PayloadBuilder payload;
    if (encoder_payload_init(self, &payload, total, one_shot_header_room(self, count)) < 0) {
        Py_DECREF(items);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        EncodedTraceObject *item = (EncodedTraceObject *)PySequence_Fast_GET_ITEM(items, i);
        if (payload_append(&payload, &item->part) < 0) {
            goto done;
        }
    }
    result = payload_finish(&payload);
done:
    encoder_payload_free(self, &payload);
    Py_DECREF(items);
    return result;
}

/* ---------------------------------------------------------------------------
 * Buffered encoding */

/* Bytes encode() would return now.  An empty current payload counts only
 * when nothing else is buffered (then, as in ddtrace, `size` is the size of
 * an empty payload). */
static Py_ssize_t
buffered_size(TraceEncoderObject *self)
{
    if (self->current.trace_count == 0 && self->sealed_traces > 0) {
        return self->sealed_size;
    }
    return self->sealed_size + payload_size(&self->current);
}

/* BufferFull / BufferItemTooLarge: args stays (the trace's encoded size,),
 * which callers read; the limit's name and value are attributes, and str()
 * gives the message built here (see limit_error_str). */
static PyObject *
raise_limit(PyObject *exception, Py_ssize_t size, const char *limit_name, Py_ssize_t limit,
            PyObject *message /* stolen */)
{
    PyObject *error = message != NULL ? PyObject_CallFunction(exception, "n", size) : NULL;
    PyObject *name = error != NULL ? PyUnicode_FromString(limit_name) : NULL;
    PyObject *value = name != NULL ? PyLong_FromSsize_t(limit) : NULL;
    if (value != NULL && PyObject_SetAttrString(error, "limit_name", name) == 0 &&
        PyObject_SetAttrString(error, "limit", value) == 0 &&
        PyObject_SetAttrString(error, "_message", message) == 0) {
        PyErr_SetObject(exception, error);
    }
    Py_XDECREF(value);
    Py_XDECREF(name);
    Py_XDECREF(error);
    Py_XDECREF(message);
    return NULL;
}

/* A sealed v0.4 payload's buffer (its bytes already copied out) of up to
 * RETAINED_PAYLOAD_BUFFER starts the empty `next` in place of next's new
 * one: a payload's first trace then either takes the scratch part's buffer
 * when the two are of about the same size, the scratch getting this one
 * (payload_append_taking), or is copied into it; neither buffer is grown
 * again from fresh memory for each payload.  A larger buffer is freed (kept
 * and shrunk, it made glibc map every large payload afresh). */
static void
recycle_body(TraceEncoderObject *self, PayloadBuilder *next)
{
    PayloadBuilder *sealed = &self->current;
    if (self->version != 4 || next->trace_count != 0 || next->header_room != 0 ||
        outbuf_len(&next->body) != 0 || next->body.bytes != NULL || sealed->body.bytes != NULL ||
        sealed->header_room != 0 ||
        outbuf_capacity(&sealed->body) <= outbuf_capacity(&next->body) ||
        outbuf_capacity(&sealed->body) > RETAINED_PAYLOAD_BUFFER) {
        return;
    }
    OutBuf body = sealed->body;
    sealed->body = next->body;
    next->body = body;
    outbuf_truncate(&next->body, 0);
}

/* Drop the current payload (its table kept while a put() still reads it)
 * and continue with `next` and, for the writer's intake, its list of trace
 * objects (stolen). */
static void
replace_current(TraceEncoderObject *self, PayloadBuilder *next, PyObject *next_traces)
{
    forecast_retire(&self->forecasts, &self->current);
    encoder_payload_free(self, &self->current);
    self->current = *next;
    if (self->intake.on) {
        Py_SETREF(self->intake.traces, next_traces);
    }
    else {
        Py_XDECREF(next_traces);
    }
}

/* Finish the current payload into the sealed list and continue with `next`,
 * which the encoder then owns (on failure `next` is freed and the encoder is
 * unchanged: the current payload is only dropped once its entry is listed). */
static int
seal_current(TraceEncoderObject *self, PayloadBuilder *next, PyObject *next_traces /* stolen */)
{
    PyObject *bytes = NULL, *count_object = NULL;
    /* Allocated first: a GC-tracked allocation may run finalizers (Python
     * code that can put() into this encoder) before anything is read.  For
     * the writer's intake the entry also takes the payload's trace objects. */
    PyObject *entry = PyTuple_New(self->intake.on ? 3 : 2);
    if (entry == NULL) {
        goto error;
    }
    if (self->current.trace_count == 0) {
        /* That Python code finished the payload itself (encode()): an empty
         * one is not listed, `next` just takes its place. */
        Py_DECREF(entry);
        replace_current(self, next, next_traces);
        return 0;
    }
    Py_ssize_t size = payload_size(&self->current);
    Py_ssize_t count = self->current.trace_count;
    count_object = PyLong_FromSsize_t(count);
    if (count_object == NULL) {
        goto error;
    }
    bytes = payload_finish(&self->current);
    if (bytes == NULL) {
        goto error;
    }
    PyTuple_SET_ITEM(entry, 0, bytes);
    PyTuple_SET_ITEM(entry, 1, count_object);
    bytes = count_object = NULL;
    if (self->intake.on) {
        PyTuple_SET_ITEM(entry, 2, Py_NewRef(self->intake.traces));
    }
    if (PyList_Append(self->sealed, entry) < 0) {
        goto error;
    }
    Py_DECREF(entry);
    recycle_body(self, next);
    replace_current(self, next, next_traces);
    self->sealed_size += size;
    self->sealed_traces += count;
    return 0;
error:
    Py_XDECREF(entry);
    Py_XDECREF(count_object);
    Py_XDECREF(bytes);
    Py_XDECREF(next_traces);
    payload_free(next);
    return -1;
}

static int
seal_current_and_start_new(TraceEncoderObject *self)
{
    PyObject *fresh_traces = NULL;
    if (self->intake.on && (fresh_traces = PyList_New(0)) == NULL) {
        return -1;
    }
    PayloadBuilder fresh;
    if (buffer_payload_init(self, &fresh) < 0) {
        Py_XDECREF(fresh_traces);
        return -1;
    }
    return seal_current(self, &fresh, fresh_traces);
}

/* The append step of put(): no Python code runs here, so under the GIL it is
 * atomic; free-threaded builds hold the encoder's critical section.  Nothing
 * changes unless the trace is accepted. */
static PyObject *
append_encoded(TraceEncoderObject *self, EncodedPart *part, PyObject *trace, int counted)
{
    WriterIntake *intake = &self->intake;
    if (counted && intake->closed) {
        intake->refused[REFUSED_CLOSED]++;
        return PyLong_FromLong(PUT_REFUSED + REFUSED_CLOSED);
    }
    Py_ssize_t size_before = buffered_size(self);
    PayloadMark mark = payload_mark(&self->current);
    if (payload_append_taking(&self->current, part) < 0) {
        return NULL;
    }
    Py_ssize_t growth = buffered_size(self) - size_before;
    Py_ssize_t payload_after = payload_size(&self->current);
    /* Too big for the payload with the traces already there: it would start
     * a payload of its own, built aside until it is accepted. */
    int split = self->max_payload_size > 0 && mark.trace_count > 0 &&
                payload_after > self->max_payload_size;
    PayloadBuilder next;
    PyObject *next_traces = NULL;
    if (split) {
        payload_release_part(&self->current, mark, part);
        if (buffer_payload_init(self, &next) < 0) {
            return NULL;
        }
        if (payload_append_taking(&next, part) < 0) {
            payload_free(&next);
            return NULL;
        }
        payload_after = payload_size(&next);
        growth = payload_after;
    }
    int too_large = growth > self->max_item_size ||
                    (self->max_payload_size > 0 && payload_after > self->max_payload_size);
    if (too_large || size_before + growth > self->max_size) {
        if (split) {
            strtable_reclaim(&part->strings);
            payload_free(&next);
        }
        else {
            payload_release_part(&self->current, mark, part);
            /* A refused first trace may have left its buffer with the
             * payload (payload_append_taking): kept no larger than put()
             * keeps its own. */
            outbuf_shrink_capacity(&self->current.body, RETAINED_BUFFER);
        }
        if (counted) {
            int reason = too_large ? REFUSED_TOO_LARGE : REFUSED_BUFFER_FULL;
            intake->refused[reason]++;
            return PyLong_FromLong(PUT_REFUSED + reason);
        }
        if (growth > self->max_item_size) {
            return raise_limit(self->state->buffer_item_too_large_error, growth, "max_item_size",
                               self->max_item_size,
                               PyUnicode_FromFormat("trace of %zd bytes is over max_item_size=%zd",
                                                    growth, self->max_item_size));
        }
        if (too_large) {
            return raise_limit(
                self->state->buffer_item_too_large_error, growth, "max_payload_size",
                self->max_payload_size,
                PyUnicode_FromFormat("trace of %zd bytes makes a payload of %zd bytes "
                                     "on its own, over max_payload_size=%zd",
                                     growth, payload_after, self->max_payload_size));
        }
        return raise_limit(self->state->buffer_full_error, growth, "max_size", self->max_size,
                           PyUnicode_FromFormat("trace of %zd bytes does not fit: %zd bytes "
                                                "buffered, max_size=%zd",
                                                growth, size_before, self->max_size));
    }
    if (intake->on) {
        /* The trace object goes beside its bytes: into the list of the
         * payload it joined (a list made ready before this step, when it
         * starts a payload of its own).  Appending to a list allocates no
         * object, so no Python code runs here either. */
        PyObject *traces = split ? intake->spare : intake->traces;
        if (traces == NULL || PyList_Append(traces, trace) < 0) {
            if (traces == NULL) {
                PyErr_SetString(PyExc_SystemError, "put_counted: no list for a new payload");
            }
            if (split) {
                strtable_reclaim(&part->strings);
                payload_free(&next);
            }
            else {
                payload_release_part(&self->current, mark, part);
            }
            return NULL;
        }
        if (split) {
            next_traces = intake->spare; /* now the new payload's (seal_current takes it) */
            intake->spare = NULL;
        }
    }
    if (split && seal_current(self, &next, next_traces) < 0) {
        return NULL;
    }
    if (counted && intake->wake_size > 0 && !intake->woken &&
        buffered_size(self) >= intake->wake_size) {
        intake->woken = 1;
        return PyLong_FromLong(PUT_TAKEN_WAKE);
    }
    return counted ? PyLong_FromLong(PUT_TAKEN) : Py_NewRef(Py_None);
}

/* Take the error set now as the intake's last_error text ("Type: message")
 * and return `answer`; the error is cleared.  Text that cannot be made
 * leaves the type's name. */
static PyObject *
refusal_noted(TraceEncoderObject *self, int answer)
{
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
    PyErr_NormalizeException(&type, &value, &traceback);
    PyObject *text = NULL;
    if (value != NULL) {
        text = PyUnicode_FromFormat("%s: %S", Py_TYPE(value)->tp_name, value);
        if (text == NULL) {
            PyErr_Clear();
            text = PyUnicode_FromString(Py_TYPE(value)->tp_name);
        }
    }
    if (text == NULL) {
        PyErr_Clear();
    }
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(traceback);
    if (text != NULL) {
        Py_XSETREF(self->intake.last_error, text);
    }
    return PyLong_FromLong(answer);
}

static PyObject *
put_impl(TraceEncoderObject *self, PyObject *trace, int counted)
{
    EncodedPart own_part;
    EncodedPart *part;
    int use_scratch = !self->scratch_in_use;
    if (use_scratch) {
        self->scratch_in_use = 1;
        part = &self->scratch;
    }
    else {
        if (part_init(&own_part, self->state, self->version, 1) < 0) {
            return NULL;
        }
        part = &own_part;
    }
    PyObject *result = NULL;
    Py_ssize_t dropped;
    self->active_encodes++;
    int encoded = encode_part(self, part, trace, 0, 1, &dropped) == 0;
    if (encoded && counted && self->intake.spare == NULL) {
        /* The list for a payload this trace may start, made before the step
         * that runs no Python code (span code may have used the last one). */
        self->intake.spare = PyList_New(0);
        encoded = self->intake.spare != NULL;
    }
    if (encoded) {
        SP_BEGIN_CRITICAL_SECTION(self);
        result = append_encoded(self, part, trace, counted);
        if (result != NULL) {
            self->dropped_tags += dropped;
        }
        SP_END_CRITICAL_SECTION();
    }
    if (result == NULL && counted) {
        /* The trace's own error (span code's), or no memory to take it:
         * counted; an Exception is kept as text for the writer's log and
         * not raised, any other BaseException (KeyboardInterrupt,
         * SystemExit) propagates. */
        int reason =
            PyErr_ExceptionMatches(PyExc_Exception) ? REFUSED_BAD_INPUT : REFUSED_INTERRUPTED;
        SP_BEGIN_CRITICAL_SECTION(self);
        self->intake.refused[reason]++;
        SP_END_CRITICAL_SECTION();
        if (reason == REFUSED_BAD_INPUT) {
            result = refusal_noted(self, PUT_REFUSED + REFUSED_BAD_INPUT);
        }
    }
    forecast_end(&self->forecasts, part, &self->current);
    self->active_encodes--;
    if (use_scratch) {
        /* Do not keep a huge trace's buffers around. */
        part_shrink(part, self->state, RETAINED_BUFFER);
        self->scratch_in_use = 0;
    }
    else {
        part_free(&own_part);
    }
    return result;
}

static PyObject *
trace_encoder_put(TraceEncoderObject *self, PyObject *trace)
{
    return put_impl(self, trace, 0);
}

/* The AgentWriter's write(): put() that counts in the same call whatever
 * becomes of the trace.  Returns PUT_TAKEN, PUT_TAKEN_WAKE, or PUT_REFUSED
 * + the reason (a closed encoder, a limit, bad input or no memory to take
 * it: counted, not raised; the last such error's text is kept,
 * _take_last_error); a BaseException from span code that is no Exception is
 * counted (interrupted) and raised. */
static PyObject *
trace_encoder_put_counted(TraceEncoderObject *self, PyObject *trace)
{
    if (!self->intake.on) {
        PyErr_SetString(PyExc_TypeError, "_put_counted() needs _start_intake() first");
        return NULL;
    }
    if (self->intake.closed) { /* (checked again as it is appended) */
        SP_BEGIN_CRITICAL_SECTION(self);
        self->intake.refused[REFUSED_CLOSED]++;
        SP_END_CRITICAL_SECTION();
        return PyLong_FromLong(PUT_REFUSED + REFUSED_CLOSED);
    }
    return put_impl(self, trace, 1);
}

/* The writer's counters, read in one step: (taken and buffered now,
 * refused by reason...) in REFUSED_* order. */
static PyObject *
trace_encoder_intake_counts(TraceEncoderObject *self, PyObject *Py_UNUSED(ignored))
{
    PyObject *result;
    SP_BEGIN_CRITICAL_SECTION(self);
    const Py_ssize_t *refused = self->intake.refused;
    result = Py_BuildValue("(nnnnnn)", self->sealed_traces + self->current.trace_count,
                           refused[REFUSED_BUFFER_FULL], refused[REFUSED_TOO_LARGE],
                           refused[REFUSED_BAD_INPUT], refused[REFUSED_INTERRUPTED],
                           refused[REFUSED_CLOSED]);
    SP_END_CRITICAL_SECTION();
    return result;
}

/* Make this encoder an AgentWriter's intake (see WriterIntake): put_counted()
 * keeps each trace object, encode() gives (payload, count, traces), and a
 * put that takes the buffer to `wake_size` bytes (0: never) says so, once
 * per encode().  Only on an empty buffer. */
static PyObject *
trace_encoder_start_intake(TraceEncoderObject *self, PyObject *wake_size_object)
{
    Py_ssize_t wake_size = PyNumber_AsSsize_t(wake_size_object, PyExc_OverflowError);
    if (wake_size == -1 && PyErr_Occurred()) {
        return NULL;
    }
    PyObject *traces = PyList_New(0); /* (before the test: it may run a collection) */
    if (traces == NULL) {
        return NULL;
    }
    if (self->sealed_traces + self->current.trace_count > 0 || self->active_encodes > 0) {
        Py_DECREF(traces);
        PyErr_SetString(PyExc_ValueError, "_start_intake() on an encoder with traces buffered");
        return NULL;
    }
    self->intake.on = 1;
    self->intake.wake_size = wake_size > 0 ? wake_size : 0;
    Py_XSETREF(self->intake.traces, traces);
    Py_RETURN_NONE;
}

/* The text of the last bad input put_counted() refused (None if none since
 * the last call), for the writer's log; clears it. */
static PyObject *
trace_encoder_take_last_error(TraceEncoderObject *self, PyObject *Py_UNUSED(ignored))
{
    PyObject *text = self->intake.last_error;
    self->intake.last_error = NULL;
    return text != NULL ? text : Py_NewRef(Py_None);
}

/* From now on put_counted() refuses every trace (counted as closed). */
static PyObject *
trace_encoder_close_intake(TraceEncoderObject *self, PyObject *Py_UNUSED(ignored))
{
    SP_BEGIN_CRITICAL_SECTION(self);
    self->intake.closed = 1;
    SP_END_CRITICAL_SECTION();
    Py_RETURN_NONE;
}

static PyObject *
trace_encoder_encode(TraceEncoderObject *self, PyObject *Py_UNUSED(ignored))
{
    PyObject *result = NULL;
    SP_BEGIN_CRITICAL_SECTION(self);
    if (self->current.trace_count > 0 && seal_current_and_start_new(self) < 0) {
        goto done;
    }
    PyObject *empty = PyList_New(0);
    if (empty == NULL) {
        goto done;
    }
    result = self->sealed;
    self->sealed = empty;
    self->sealed_size = self->sealed_traces = 0;
    self->intake.woken = 0;
done:
    SP_END_CRITICAL_SECTION();
    return result;
}

static Py_ssize_t
trace_encoder_length(TraceEncoderObject *self)
{
    Py_ssize_t length;
    SP_BEGIN_CRITICAL_SECTION(self);
    length = self->sealed_traces + self->current.trace_count;
    SP_END_CRITICAL_SECTION();
    return length;
}

static PyObject *
trace_encoder_get_size(TraceEncoderObject *self, void *Py_UNUSED(closure))
{
    Py_ssize_t size;
    SP_BEGIN_CRITICAL_SECTION(self);
    size = buffered_size(self);
    SP_END_CRITICAL_SECTION();
    return PyLong_FromSsize_t(size);
}

/* None when payloads are not split, as the constructor takes it. */
static PyObject *
trace_encoder_get_max_payload_size(TraceEncoderObject *self, void *Py_UNUSED(closure))
{
    if (self->max_payload_size == 0) {
        Py_RETURN_NONE;
    }
    return PyLong_FromSsize_t(self->max_payload_size);
}

static PyObject *
trace_encoder_get_version(TraceEncoderObject *self, void *Py_UNUSED(closure))
{
    return version_name(self->version);
}

static PyObject *
trace_encoder_intern_stats(TraceEncoderObject *self, PyObject *Py_UNUSED(ignored))
{
    return Py_BuildValue("{s:n,s:n,s:n,s:n}", "hits", self->cache.hits, "misses",
                         self->cache.misses, "entries", self->cache.used, "meta_entries_copied",
                         self->cache.meta_entries_copied);
}

static PyMemberDef trace_encoder_members[] = {
    {"max_size", T_PYSSIZET, offsetof(TraceEncoderObject, max_size), READONLY,
     "Most bytes the buffer holds (BufferFull beyond)."},
    {"max_item_size", T_PYSSIZET, offsetof(TraceEncoderObject, max_item_size), READONLY,
     "Most bytes one trace may add (BufferItemTooLarge beyond)."},
    {"dropped_tags", T_PYSSIZET, offsetof(TraceEncoderObject, dropped_tags), READONLY,
     "Meta/metrics entries dropped in lenient mode."},
    {NULL, 0, 0, 0, NULL},
};

static PyGetSetDef trace_encoder_getset[] = {
    {"size", (getter)trace_encoder_get_size, NULL,
     "Exact byte length of the payloads encode() would return now.", NULL},
    {"version", (getter)trace_encoder_get_version, NULL, "\"v0.4\", \"v0.5\" or \"v1.0\".", NULL},
    {"max_payload_size", (getter)trace_encoder_get_max_payload_size, NULL,
     "Most bytes per payload returned by encode() (BufferItemTooLarge for a trace that "
     "alone would exceed it); None: no limit, one payload.",
     NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMethodDef trace_encoder_methods[] = {
    {"encode_traces", (PyCFunction)trace_encoder_encode_traces, METH_O,
     "encode_traces($self, traces, /)\n--\n\nOne payload (bytes) from a list of traces."},
    {"encode_trace", (PyCFunction)trace_encoder_encode_trace, METH_O,
     "encode_trace($self, trace, /)\n--\n\nOne trace encoded now (an EncodedTrace), for "
     "join_encoded()."},
    {"join_encoded", (PyCFunction)trace_encoder_join_encoded, METH_O,
     "join_encoded($self, encoded_traces, /)\n--\n\nOne payload (bytes) from encode_trace() "
     "results."},
    {"put", (PyCFunction)trace_encoder_put, METH_O,
     "put($self, trace, /)\n--\n\nEncode a trace into the buffer (all or nothing)."},
    {"_put_counted", (PyCFunction)trace_encoder_put_counted, METH_O,
     "_put_counted($self, trace, /)\n--\n\nAgentWriter's put (after _start_intake): keeps "
     "the trace object and counts what becomes of it; 0 taken, 1 taken and wake_size "
     "reached, 2 + the reason refused."},
    {"_intake_counts", (PyCFunction)trace_encoder_intake_counts, METH_NOARGS,
     "_intake_counts($self, /)\n--\n\n(buffered, buffer_full, trace_too_large, bad_input, "
     "interrupted, closed)."},
    {"_start_intake", (PyCFunction)trace_encoder_start_intake, METH_O,
     "_start_intake($self, wake_size, /)\n--\n\nMake this encoder an AgentWriter's intake "
     "(keeps trace objects, counts refusals)."},
    {"_take_last_error", (PyCFunction)trace_encoder_take_last_error, METH_NOARGS,
     "_take_last_error($self, /)\n--\n\nThe last bad input's error as text, or None; "
     "clears it."},
    {"_close_intake", (PyCFunction)trace_encoder_close_intake, METH_NOARGS,
     "_close_intake($self, /)\n--\n\n_put_counted() refuses every trace from now on."},
    {"encode", (PyCFunction)trace_encoder_encode, METH_NOARGS,
     "encode($self, /)\n--\n\nThe buffered traces as a list of (payload, trace_count) "
     "(an intake's: (payload, trace_count, traces)); empties the buffer."},
    {"_intern_stats", (PyCFunction)trace_encoder_intern_stats, METH_NOARGS,
     "_intern_stats($self, /)\n--\n\nCounters of the v0.4 string cache."},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot trace_encoder_slots[] = {
    {Py_tp_doc, "TraceEncoder(version='v0.4', fields=None, *, max_size=None, "
                "max_item_size=None, max_payload_size=None, lenient=False, intern=False, "
                "native_span_events=False, default_meta=None, default_metrics=None, "
                "strict=False)\n--\n\nC core "
                "of spanpack.TraceMsgPackEncoder "
                "(max_size None: 20 MiB; max_item_size None: max_size)."},
    {Py_tp_new, trace_encoder_new},
    {Py_tp_init, trace_encoder_init},
    {Py_tp_dealloc, trace_encoder_dealloc},
    {Py_tp_traverse, trace_encoder_traverse},
    {Py_tp_clear, trace_encoder_clear},
    {Py_tp_methods, trace_encoder_methods},
    {Py_tp_members, trace_encoder_members},
    {Py_tp_getset, trace_encoder_getset},
    {Py_sq_length, trace_encoder_length},
    {0, NULL},
};

static PyType_Spec trace_encoder_spec = {
    .name = "spanpack.TraceEncoder",
    .basicsize = sizeof(TraceEncoderObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .slots = trace_encoder_slots,
};

/* ---------------------------------------------------------------------------
 * EncodedTrace */

static PyObject *
encoded_trace_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    (void)args;
    (void)kwargs;
    PyErr_Format(PyExc_TypeError,
                 "cannot create '%.200s' instances; use "
                 "TraceMsgPackEncoder.encode_trace()",
                 type->tp_name);
    return NULL;
}

static void
encoded_trace_dealloc(EncodedTraceObject *self)
{
    PyTypeObject *type = Py_TYPE(self);
    part_free(&self->part);
    type->tp_free((PyObject *)self);
    Py_DECREF(type);
}

static Py_ssize_t
encoded_trace_length(EncodedTraceObject *self)
{
    return outbuf_len(&self->part.body);
}

static PyObject *
encoded_trace_get_version(EncodedTraceObject *self, void *Py_UNUSED(closure))
{
    return version_name(self->version);
}

static PyGetSetDef encoded_trace_getset[] = {
    {"version", (getter)encoded_trace_get_version, NULL, "Payload version it was encoded for.",
     NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot encoded_trace_slots[] = {
    {Py_tp_doc, "One trace encoded by TraceMsgPackEncoder.encode_trace(), for join_encoded(). "
                "len() is its encoded size (for v0.5 without its string table)."},
    {Py_tp_new, encoded_trace_new},
    {Py_tp_dealloc, encoded_trace_dealloc},
    {Py_tp_getset, encoded_trace_getset},
    {Py_sq_length, encoded_trace_length},
    {0, NULL},
};

static PyType_Spec encoded_trace_spec = {
    .name = "spanpack.EncodedTrace",
    .basicsize = sizeof(EncodedTraceObject),
    .flags = Py_TPFLAGS_DEFAULT,
    .slots = encoded_trace_slots,
};

/* __str__ of the limit errors: the message raise_limit() stored, or the
 * plain exception text for an instance made elsewhere (BufferFull(5)). */
static PyObject *
limit_error_str(PyObject *Py_UNUSED(module), PyObject *error)
{
    PyObject *message = PyObject_GetAttrString(error, "_message");
    if (message != NULL && PyUnicode_Check(message)) {
        return message;
    }
    Py_XDECREF(message);
    if (message == NULL && !PyErr_ExceptionMatches(PyExc_AttributeError)) {
        return NULL;
    }
    PyErr_Clear();
    return ((PyTypeObject *)PyExc_BaseException)->tp_str(error);
}

/* The text signature: without one, 3.14's inspect reads METH_O as
 * (self, object, /), unlike str() of any exception. */
static PyMethodDef limit_error_str_def = {
    "__str__", (PyCFunction)limit_error_str, METH_O,
    "__str__(self, /)\n--\n\nThe message of the limit that was hit."};

static PyObject *
new_limit_error(const char *name, const char *doc)
{
    PyObject *function = PyCFunction_New(&limit_error_str_def, NULL);
    /* An instancemethod binds like a Python function, so str(error) calls
     * limit_error_str(error). */
    PyObject *method = function != NULL ? PyInstanceMethod_New(function) : NULL;
    PyObject *dict = method != NULL ? PyDict_New() : NULL;
    PyObject *type = NULL;
    if (dict != NULL && PyDict_SetItemString(dict, "__str__", method) == 0) {
        type = PyErr_NewExceptionWithDoc(name, doc, NULL, dict);
    }
    Py_XDECREF(dict);
    Py_XDECREF(method);
    Py_XDECREF(function);
    return type;
}

int
trace_encoder_module_init(PyObject *module, SpanpackState *state)
{
    state->buffer_full_error = new_limit_error(
        "spanpack.BufferFull",
        "put() would take the buffer beyond max_size; args[0] is the rejected "
        "trace's encoded size; limit_name and limit say which limit it hit and its value.");
    state->buffer_item_too_large_error = new_limit_error(
        "spanpack.BufferItemTooLarge",
        "One trace is larger than max_item_size (or max_payload_size); args[0] "
        "is its encoded size; limit_name and limit say which limit it hit and its value.");
    if (state->buffer_full_error == NULL || state->buffer_item_too_large_error == NULL ||
        PyModule_AddObjectRef(module, "BufferFull", state->buffer_full_error) < 0 ||
        PyModule_AddObjectRef(module, "BufferItemTooLarge", state->buffer_item_too_large_error) <
            0) {
        return -1;
    }
    state->trace_encoder_type =
        (PyTypeObject *)PyType_FromModuleAndSpec(module, &trace_encoder_spec, NULL);
    if (state->trace_encoder_type == NULL ||
        PyModule_AddType(module, state->trace_encoder_type) < 0) {
        return -1;
    }
    state->encoded_part_type =
        (PyTypeObject *)PyType_FromModuleAndSpec(module, &encoded_trace_spec, NULL);
    if (state->encoded_part_type == NULL ||
        PyModule_AddType(module, state->encoded_part_type) < 0) {
        return -1;
    }
    return 0;
}
