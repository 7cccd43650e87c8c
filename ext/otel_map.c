/* OpenTelemetry SDK spans mapped to Datadog spans (dict spans, or the
 * OtelSpans and OtelLinks of otel_span.h for the encoder), in C: the per-span
 * part of spanpack.otel's mapping (docs/otel.md, rules 1-22) for spans of a
 * class the Python side has approved (the SDK's ReadableSpan, read through
 * the fields its properties return).
 *
 * python/spanpack/otel.py keeps the same rules in Python: it is the
 * reference (tests/otel compare the two on every test span) and maps what
 * this file hands back as None: a span of another class, or one whose fields
 * are not what the SDK keeps.  Links and events are converted by its
 * functions (given in the plan).  Per-batch values (a resource's tags and
 * service, a scope's tags, the attribute key mapping) are worked out in
 * Python once per resource or scope object (kept across batches for the
 * SDK's immutable ones) and given here through the plan tuple. */
#include "otel_map.h"

#include "otel_span.h"
#include "pyinstance.h"
#include "pyint.h"
#include "state.h"

#include <math.h>

/* Interned names, one tuple in the module state (state->otel_names). */
#define OTEL_NAMES(X)                                                                              \
    /* ReadableSpan's fields and the SDK objects' own. */                                          \
    X(A_CONTEXT, "_context")                                                                       \
    X(A_ATTRIBUTES, "_attributes")                                                                 \
    X(A_EVENTS, "_events")                                                                         \
    X(A_LINKS, "_links")                                                                           \
    X(A_RESOURCE, "_resource")                                                                     \
    X(A_SCOPE, "_instrumentation_scope")                                                           \
    X(A_KIND, "_kind")                                                                             \
    X(A_STATUS, "_status")                                                                         \
    X(A_PARENT, "_parent")                                                                         \
    X(A_NAME, "_name")                                                                             \
    X(A_START, "_start_time")                                                                      \
    X(A_END, "_end_time")                                                                          \
    X(A_DICT, "_dict")                                                                             \
    X(A_DQ, "_dq")                                                                                 \
    X(A_STATUS_CODE, "_status_code")                                                               \
    X(A_DESCRIPTION, "_description")                                                               \
    X(A_TIMESTAMP, "_timestamp")                                                                   \
    X(A_TO_HEADER, "to_header")                                                                    \
    X(A_LOWER, "lower")                                                                            \
    X(A_EVENT_NAME, "name")                                                                        \
    X(A_EVENT_ATTRIBUTES, "attributes")                                                            \
    X(A_EVENT_TIMESTAMP, "timestamp")                                                              \
    X(A_LINK_CONTEXT, "context")                                                                   \
    /* The keys of a link and an event as spanpack.otel makes them. */                             \
    X(L_TRACESTATE, "tracestate")                                                                  \
    X(L_FLAGS, "flags")                                                                            \
    X(E_TIME_UNIX_NANO, "time_unix_nano")                                                          \
    X(A_GET, "get")                                                                                \
    X(EXCEPTION_MESSAGE, "exception.message")                                                      \
    X(EXCEPTION_TYPE, "exception.type")                                                            \
    X(EXCEPTION_STACKTRACE, "exception.stacktrace")                                                \
    X(K_HAS_EXCEPTION, "_dd.span_events.has_exception")                                            \
    X(V_EXCEPTION, "exception")                                                                    \
    X(F_LINKS, "links")                                                                            \
    X(F_EVENTS, "events")                                                                          \
    /* Span attributes the rules read. */                                                          \
    X(DATADOG_SERVICE, "datadog.service")                                                          \
    X(DATADOG_NAME, "datadog.name")                                                                \
    X(DATADOG_RESOURCE, "datadog.resource")                                                        \
    X(DATADOG_TYPE, "datadog.type")                                                                \
    X(DATADOG_ERROR, "datadog.error")                                                              \
    X(DATADOG_SPAN_KIND, "datadog.span.kind")                                                      \
    X(DATADOG_HTTP_STATUS_CODE, "datadog.http_status_code")                                        \
    X(DATADOG_ENV, "datadog.env")                                                                  \
    X(DATADOG_VERSION, "datadog.version")                                                          \
    X(DATADOG_ERROR_MSG, "datadog.error.msg")                                                      \
    X(DATADOG_ERROR_TYPE, "datadog.error.type")                                                    \
    X(DATADOG_ERROR_STACK, "datadog.error.stack")                                                  \
    X(SERVICE_NAME, "service.name")                                                                \
    X(OPERATION_NAME, "operation.name")                                                            \
    X(HTTP_METHOD, "http.method")                                                                  \
    X(HTTP_REQUEST_METHOD, "http.request.method")                                                  \
    X(DB_SYSTEM, "db.system")                                                                      \
    X(DB_SYSTEM_NAME, "db.system.name")                                                            \
    X(MESSAGING_SYSTEM, "messaging.system")                                                        \
    X(MESSAGING_OPERATION, "messaging.operation")                                                  \
    X(MESSAGING_OPERATION_TYPE, "messaging.operation.type")                                        \
    X(RPC_SYSTEM, "rpc.system")                                                                    \
    X(RPC_SERVICE, "rpc.service")                                                                  \
    X(FAAS_INVOKED_PROVIDER, "faas.invoked_provider")                                              \
    X(FAAS_INVOKED_NAME, "faas.invoked_name")                                                      \
    X(FAAS_TRIGGER, "faas.trigger")                                                                \
    X(GRAPHQL_OPERATION_TYPE, "graphql.operation.type")                                            \
    X(NETWORK_PROTOCOL_NAME, "network.protocol.name")                                              \
    X(RESOURCE_NAME, "resource.name")                                                              \
    X(HTTP_ROUTE, "http.route")                                                                    \
    X(MESSAGING_DESTINATION, "messaging.destination")                                              \
    X(MESSAGING_DESTINATION_NAME, "messaging.destination.name")                                    \
    X(RPC_METHOD, "rpc.method")                                                                    \
    X(GRAPHQL_OPERATION_NAME, "graphql.operation.name")                                            \
    X(DB_STATEMENT, "db.statement")                                                                \
    X(DB_QUERY_TEXT, "db.query.text")                                                              \
    X(SPAN_TYPE, "span.type")                                                                      \
    X(HTTP_RESPONSE_STATUS_CODE, "http.response.status_code")                                      \
    X(HTTP_STATUS_CODE, "http.status_code")                                                        \
    X(DD_MEASURED, "_dd.measured")                                                                 \
    /* Tags and metrics written. */                                                                \
    X(K_SPAN_KIND, "span.kind")                                                                    \
    X(K_ENV, "env")                                                                                \
    X(K_VERSION, "version")                                                                        \
    X(K_ERROR_MESSAGE, "error.message")                                                            \
    X(K_ERROR_TYPE, "error.type")                                                                  \
    X(K_ERROR_STACK, "error.stack")                                                                \
    X(K_OTEL_TRACE_ID, "otel.trace_id")                                                            \
    X(K_W3C_TRACESTATE, "w3c.tracestate")                                                          \
    X(K_OTEL_STATUS_CODE, "otel.status_code")                                                      \
    X(K_OTEL_STATUS_DESCRIPTION, "otel.status_description")                                        \
    X(K_HTTP_STATUS_TEXT, "http.status_text")                                                      \
    X(K_ANALYTICS_EVENT, "analytics.event")                                                        \
    X(K_SAMPLING_PRIORITY, "sampling.priority")                                                    \
    X(K_SAMPLING_PRIORITY_V1, "_sampling_priority_v1")                                             \
    X(K_EVENT_EXTRACTION, "_dd1.sr.eausr")                                                         \
    /* Values. */                                                                                  \
    X(V_EMPTY, "")                                                                                 \
    X(V_TRUE, "true")                                                                              \
    X(V_FALSE, "false")                                                                            \
    X(V_UNSET, "Unset")                                                                            \
    X(V_OK, "Ok")                                                                                  \
    X(V_ERROR, "Error")                                                                            \
    X(V_INTERNAL, "internal")                                                                      \
    X(V_SERVER, "server")                                                                          \
    X(V_CLIENT, "client")                                                                          \
    X(V_PRODUCER, "producer")                                                                      \
    X(V_CONSUMER, "consumer")                                                                      \
    X(V_DEFAULT_SERVICE, "otlpresourcenoservicename")                                              \
    X(V_HTTP_SERVER_REQUEST, "http.server.request")                                                \
    X(V_HTTP_CLIENT_REQUEST, "http.client.request")                                                \
    X(V_SERVER_REQUEST, "server.request")                                                          \
    X(V_CLIENT_REQUEST, "client.request")                                                          \
    X(V_GRAPHQL_SERVER_REQUEST, "graphql.server.request")                                          \
    X(V_AWS_CLIENT_REQUEST, "aws.client.request")                                                  \
    X(V_AWS_API, "aws-api")                                                                        \
    X(V_OTHER, "_OTHER")                                                                           \
    X(V_HTTP_METHOD_OTHER, "HTTP")                                                                 \
    X(V_WEB, "web")                                                                                \
    X(V_HTTP, "http")                                                                              \
    X(V_CUSTOM, "custom")                                                                          \
    X(V_DB, "db")                                                                                  \
    /* The dict span's keys (spanpack's SPAN_FIELDS). */                                           \
    X(F_TRACE_ID, "trace_id")                                                                      \
    X(F_SPAN_ID, "span_id")                                                                        \
    X(F_PARENT_ID, "parent_id")                                                                    \
    X(F_SERVICE, "service")                                                                        \
    X(F_NAME, "name")                                                                              \
    X(F_RESOURCE, "resource")                                                                      \
    X(F_SPAN_TYPE, "span_type")                                                                    \
    X(F_START_NS, "start_ns")                                                                      \
    X(F_DURATION_NS, "duration_ns")                                                                \
    X(F_ERROR, "error")                                                                            \
    X(F_META, "meta")                                                                              \
    X(F_METRICS, "metrics")

enum {
#define OTEL_NAME_ENUM(member, text) member,
    OTEL_NAMES(OTEL_NAME_ENUM)
#undef OTEL_NAME_ENUM
        OTEL_NAME_COUNT
};

/* The span attributes the rules read: one contiguous range of the names,
 * found in one pass over a span's attributes (otel_rule_index). */
#define RULE_FIRST DATADOG_SERVICE
#define RULE_COUNT (DD_MEASURED - DATADOG_SERVICE + 1)

static const char *const otel_name_texts[OTEL_NAME_COUNT] = {
#define OTEL_NAME_TEXT(member, text) text,
    OTEL_NAMES(OTEL_NAME_TEXT)
#undef OTEL_NAME_TEXT
};

int
otel_map_module_init(SpanpackState *state)
{
    if ((state->otel_names = interned_tuple(otel_name_texts, OTEL_NAME_COUNT)) == NULL) {
        return -1;
    }
    if ((state->otel_rule_index = PyDict_New()) == NULL) {
        return -1;
    }
    for (int i = 0; i < RULE_COUNT; i++) {
        PyObject *index = PyLong_FromLong(i);
        int rc = index == NULL
                     ? -1
                     : PyDict_SetItem(state->otel_rule_index,
                                      PyTuple_GET_ITEM(state->otel_names, RULE_FIRST + i), index);
        Py_XDECREF(index);
        if (rc < 0) {
            return -1;
        }
    }
    return 0;
}

/* The plan tuple built by spanpack.otel._c_plan(), item by item. */
enum {
    PLAN_KINDS,              /* SpanKind members, by value 0..4 */
    PLAN_STATUSES,           /* StatusCode members, by value 0..2 */
    PLAN_SDK_SPAN,           /* (ReadableSpan, the names of the properties whose fields are
                                read, those properties as found at import): a class is read
                                so when it keeps them (sdk_span_class) */
    PLAN_RESOURCE_VALUES,    /* resource -> ResourceTuple (below) */
    PLAN_SCOPE_VALUES,       /* scope -> (meta dict, tail dict) */
    PLAN_TAG_KEYS,           /* dict: attribute key -> tag key ("" to drop), filled here,
                                entries never replaced (it may be shared) */
    PLAN_TAG_KEY,            /* key -> tag key */
    PLAN_TEXT,               /* value -> str, as the rules write a value */
    PLAN_DB_TYPES,           /* dict: DB system -> span type */
    PLAN_GUARDED,            /* frozenset: tags kept once non-empty */
    PLAN_SPECIAL,            /* frozenset: tag keys a plain assignment would get wrong */
    PLAN_BOUNDED_ATTRIBUTES, /* the SDK's BoundedAttributes class */
    PLAN_BOUNDED_LIST,       /* the SDK's BoundedList class */
    PLAN_EVENT_TEXT,         /* value -> str, as an exception event's attribute is written */
    PLAN_ITEM_TYPES,         /* (SpanContext, Link, Event, TraceState): the forms made here */
    PLAN_ITEM_PROPERTIES,    /* Link's context, attributes, Event's name, timestamp, attributes */
    PLAN_LINKS,              /* links -> the dict span's links */
    PLAN_EVENTS,             /* events -> the dict span's events */
    PLAN_SIZE
};

/* PLAN_ITEM_TYPES, item by item: the SDK's classes whose properties only
 * return a field (reading them runs no other code); Link and Event are read
 * from those fields while they keep the properties of PLAN_ITEM_PROPERTIES
 * (item_property), or are a class no item has. */
enum { ITEM_SPAN_CONTEXT, ITEM_LINK, ITEM_EVENT, ITEM_TRACE_STATE, ITEM_TYPES_SIZE };
#define ITEM_TYPE(m, which) PyTuple_GET_ITEM(PLAN(m, PLAN_ITEM_TYPES), which)

/* A resource's values, as _ResourceValues.as_tuple() gives them. */
enum { RES_SERVICE, RES_VERSION, RES_ENV, RES_FIRST, RES_META, RES_METRICS, RES_SIZE };

/* Where the instances of one class keep fields read here, found once per
 * class (and again when it changes): each name's position in their values
 * array (pyinstance.h), or -1 where the generic lookup must answer (a data
 * descriptor of that name, which wins over the instance; no values array
 * proven in place on this interpreter).  An instance's own value at its
 * position is what the attribute lookup finds; without one, the lookup
 * answers (a class attribute, or AttributeError). */
#define INPLACE_MAX_FIELDS 12
typedef struct {
    PyTypeObject *type;       /* held; NULL: none yet */
    unsigned int version_tag; /* the class's when found (0: its tag was not valid) */
#ifdef SP_INSTANCE_VALUES_IN_PLACE
    const SpDictKeys *keys; /* NULL: every field read generically */
#endif
    Py_ssize_t position[INPLACE_MAX_FIELDS];
} InPlaceFields;

/* The fields of the SDK's Event and Link read here (item_property). */
enum { EVENT_NAME, EVENT_TIMESTAMP, EVENT_ATTRIBUTES, EVENT_FIELDS };
enum { LINK_CONTEXT, LINK_ATTRIBUTES, LINK_FIELDS };

/* Whether the SDK's Link or Event class still has the properties that
 * return its fields, as found at its version tag (0: look again). */
typedef struct {
    unsigned int version_tag;
    int readable;
} ItemClassCheck;

/* Room in a span's meta for the tags the rules and its attributes add. */
#define SPAN_META_ROOM 16

/* What the rules make of an attribute key, kept for the call by the key
 * object (the spans of a batch share their keys' str objects): its rule
 * attribute index, and its tag key with whether that is special.  Only for
 * exact str, whose answers depend on the text alone. */
#define KEY_MEMO_SIZE 64 /* a power of two */
typedef struct {
    PyObject *key; /* held; NULL: empty */
    int rule;      /* index in rule_values, or -1 */
    PyObject *tag; /* held: tag_key's answer; NULL until asked */
    int special;   /* tag in PLAN_SPECIAL (with tag) */
} KeyMemo;

typedef struct {
    SpanpackState *state;
    int objects;          /* make OtelSpans (else dict spans) */
    PyObject *names;      /* borrowed: the module's name tuple */
    PyObject *rule_index; /* borrowed: rule attribute name -> index */
    PyObject *plan;       /* borrowed: the caller's plan tuple */
    /* The span's values of the rule attributes (held), NULL when absent. */
    PyObject *rule_values[RULE_COUNT];
    /* The last class, resource, scope and trace state seen, each held (a
     * batch nearly always has one of each) with what was worked out. */
    PyObject *last_type;
    int last_type_readable;
    PyObject *last_resource, *resource_values;
    PyObject *last_scope, *scope_values;
    PyObject *last_trace_state, *trace_state_header;
    /* The last trace id (an exact int: ints never change) and its hex text. */
    PyObject *last_trace_id, *trace_id_hex;
    /* A dict span with every key (values None): each span's dict is a copy,
     * made at its final size in one step, its values then replaced. */
    PyObject *span_template;
    /* The resource's tags then the scope's, where each span's meta starts,
     * made again when either values_for answer changes (values_made counts). */
    PyObject *base_meta;
    unsigned long values_made, base_made;
    /* Where the classes of the span, its status, its attributes, its lists
     * and the SDK's events and links keep the fields read (InPlaceFields). */
    const SpFastPaths *fast_paths;
    InPlaceFields span_fields, status_fields, attributes_fields, list_fields;
    /* One per field of the SDK's Event and Link (each read alone, as its
     * property would be), and whether the class still has the properties
     * that return them (ItemClassCheck). */
    InPlaceFields event_fields[EVENT_FIELDS], link_fields[LINK_FIELDS];
    ItemClassCheck event_check, link_check;
    /* The int 0, held. */
    PyObject *zero;
    KeyMemo key_memo[KEY_MEMO_SIZE];
    /* lowered_format's last answer (both held) and its format. */
    PyObject *lowered_text, *lowered;
    const char *lowered_format;
} OtelMapper;

#define NAME(m, member) PyTuple_GET_ITEM((m)->names, member)
#define PLAN(m, item) PyTuple_GET_ITEM((m)->plan, item)

static void
mapper_clear(OtelMapper *m)
{
    Py_CLEAR(m->span_fields.type);
    Py_CLEAR(m->status_fields.type);
    Py_CLEAR(m->attributes_fields.type);
    Py_CLEAR(m->list_fields.type);
    for (size_t i = 0; i < sizeof(m->event_fields) / sizeof(m->event_fields[0]); i++) {
        Py_CLEAR(m->event_fields[i].type);
    }
    for (size_t i = 0; i < sizeof(m->link_fields) / sizeof(m->link_fields[0]); i++) {
        Py_CLEAR(m->link_fields[i].type);
    }
    Py_CLEAR(m->lowered_text);
    Py_CLEAR(m->zero);
    Py_CLEAR(m->lowered);
    Py_CLEAR(m->last_type);
    Py_CLEAR(m->last_resource);
    Py_CLEAR(m->resource_values);
    Py_CLEAR(m->last_scope);
    Py_CLEAR(m->scope_values);
    Py_CLEAR(m->last_trace_state);
    Py_CLEAR(m->trace_state_header);
    Py_CLEAR(m->last_trace_id);
    Py_CLEAR(m->trace_id_hex);
    Py_CLEAR(m->span_template);
    Py_CLEAR(m->base_meta);
    for (int i = 0; i < KEY_MEMO_SIZE; i++) {
        Py_CLEAR(m->key_memo[i].key);
        Py_CLEAR(m->key_memo[i].tag);
    }
}

/* The memo of the exact str `key` (key_memo): found by the object, else
 * made with its rule index (the tag key left to key_memo_tag).  NULL with
 * an error. */
static KeyMemo *
key_memo_get(OtelMapper *m, PyObject *key)
{
    KeyMemo *memo = &m->key_memo[sp_hash_address(key) >> (64 - 6)];
    _Static_assert(KEY_MEMO_SIZE == 1 << 6, "the memo's index is the hash's top 6 bits");
    if (memo->key == key) {
        return memo;
    }
    PyObject *index = PyDict_GetItemWithError(m->rule_index, key);
    if (index == NULL && PyErr_Occurred()) {
        return NULL;
    }
    long rule = index == NULL ? -1 : PyLong_AsLong(index);
    if (index != NULL && (rule < 0 || rule >= RULE_COUNT)) {
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_SystemError, "spanpack.otel: bad rule index");
        }
        return NULL;
    }
    Py_CLEAR(memo->tag);
    Py_XSETREF(memo->key, Py_NewRef(key));
    memo->rule = (int)rule;
    return memo;
}

/* The span's value of a rule attribute (borrowed), or NULL when it has none. */
static inline PyObject *
attr_get(OtelMapper *m, int name)
{
    return m->rule_values[name - RULE_FIRST];
}

static void
rule_values_clear(OtelMapper *m)
{
    for (int i = 0; i < RULE_COUNT; i++) {
        Py_CLEAR(m->rule_values[i]);
    }
}

/* One pass over the span's attributes: the rule attributes' values, held
 * (the rules may call Python code, which could change the dict). */
static int
rule_values_read(OtelMapper *m, PyObject *attrs)
{
    PyObject *key, *value;
    Py_ssize_t pos = 0;
    while (PyDict_Next(attrs, &pos, &key, &value)) {
        if (PyUnicode_CheckExact(key)) {
            KeyMemo *memo = key_memo_get(m, key);
            if (memo == NULL) {
                return -1;
            }
            if (memo->rule >= 0) {
                Py_XSETREF(m->rule_values[memo->rule], Py_NewRef(value));
            }
            continue;
        }
        if (!PyUnicode_Check(key)) {
            continue; /* (refused by the tag mapping, with its name) */
        }
        PyObject *index = PyDict_GetItemWithError(m->rule_index, key);
        if (index == NULL) {
            if (PyErr_Occurred()) {
                return -1;
            }
            continue;
        }
        long i = PyLong_AsLong(index);
        if (i < 0 || i >= RULE_COUNT) {
            PyErr_SetString(PyExc_SystemError, "spanpack.otel: bad rule index");
            return -1;
        }
        Py_XSETREF(m->rule_values[i], Py_NewRef(value));
    }
    return 0;
}

/* A value as the rules write it (new reference): str as it is, bools as
 * true/false, exact ints in decimal, anything else by spanpack.otel._text. */
static PyObject *
value_text(OtelMapper *m, PyObject *value)
{
    if (PyUnicode_CheckExact(value)) {
        return Py_NewRef(value);
    }
    if (value == Py_True) {
        return Py_NewRef(NAME(m, V_TRUE));
    }
    if (value == Py_False) {
        return Py_NewRef(NAME(m, V_FALSE));
    }
    if (PyLong_CheckExact(value)) {
        return PyObject_Str(value);
    }
    PyObject *text = PyObject_CallOneArg(PLAN(m, PLAN_TEXT), value);
    if (text != NULL && !PyUnicode_Check(text)) {
        PyErr_SetString(PyExc_TypeError, "spanpack.otel: a value's text must be str");
        Py_CLEAR(text);
    }
    return text;
}

/* The text of attrs[name] (new reference), or NULL with *found = 0 when
 * absent; NULL with an error set on failure. */
static PyObject *
attr_text(OtelMapper *m, PyObject *attrs, int name, int *found)
{
    (void)attrs;
    PyObject *value = attr_get(m, name);
    *found = value != NULL;
    if (value == NULL) {
        return NULL;
    }
    return value_text(m, value);
}

/* attrs[name] as an integer, as the rules read one: an int (not a bool), or
 * a float with no fraction below 2**63.  1 with *out set, 0 when it is no
 * such number or absent, -1 on error. */
static int
attr_number(OtelMapper *m, PyObject *attrs, int name, int *present, long long *out)
{
    (void)attrs;
    PyObject *value = attr_get(m, name);
    *present = value != NULL;
    if (value == NULL) {
        return 0;
    }
    if (PyFloat_CheckExact(value)) {
        double d = PyFloat_AS_DOUBLE(value);
        if (d != d || d != floor(d) || d >= 9223372036854775807.0 || d < -9223372036854775808.0) {
            return 0;
        }
        *out = (long long)d;
        return 1;
    }
    if (!PyLong_Check(value) || PyBool_Check(value)) {
        return 0;
    }
    int overflow = 0;
    long long n = PyLong_AsLongLongAndOverflow(value, &overflow);
    if (n == -1 && PyErr_Occurred()) {
        return -1;
    }
    if (overflow) {
        return 0; /* beyond 64 bits: no status code, error or flag */
    }
    *out = n;
    return 1;
}

static inline int
is_empty_text(PyObject *text)
{
    return PyUnicode_GET_LENGTH(text) == 0;
}

/* meta[key] = text unless key is guarded and holds a non-empty value;
 * analytics.event becomes the event extraction metric (rule 15). */
static int
put_tag(OtelMapper *m, PyObject *meta, PyObject *metrics, PyObject *key, PyObject *text)
{
    int guarded = PySet_Contains(PLAN(m, PLAN_GUARDED), key);
    if (guarded < 0) {
        return -1;
    }
    if (guarded) {
        PyObject *held = PyDict_GetItemWithError(meta, key);
        if (held == NULL && PyErr_Occurred()) {
            return -1;
        }
        if (held != NULL && PyUnicode_Check(held) && !is_empty_text(held)) {
            return 0;
        }
    }
    int analytics = PyUnicode_Compare(key, NAME(m, K_ANALYTICS_EVENT));
    if (analytics == -1 && PyErr_Occurred()) {
        return -1;
    }
    if (analytics != 0) {
        return PyDict_SetItem(meta, key, text);
    }
    PyObject *lower = PyObject_CallMethodNoArgs(text, NAME(m, A_LOWER));
    if (lower == NULL) {
        return -1;
    }
    double flag = -1.0;
    if (PyUnicode_Check(lower)) {
        if (PyUnicode_CompareWithASCIIString(lower, "true") == 0) {
            flag = 1.0;
        }
        else if (PyUnicode_CompareWithASCIIString(lower, "false") == 0) {
            flag = 0.0;
        }
    }
    Py_DECREF(lower);
    if (flag < 0) {
        return 0;
    }
    PyObject *number = PyFloat_FromDouble(flag);
    if (number == NULL) {
        return -1;
    }
    int rc = PyDict_SetItem(metrics, NAME(m, K_EVENT_EXTRACTION), number);
    Py_DECREF(number);
    return rc;
}

/* The first of names the span has with a non-empty text (new reference;
 * "" when none). */
static PyObject *
first_text(OtelMapper *m, PyObject *attrs, const int *names, int count)
{
    for (int i = 0; i < count; i++) {
        int found;
        PyObject *text = attr_text(m, attrs, names[i], &found);
        if (text == NULL) {
            if (PyErr_Occurred()) {
                return NULL;
            }
            continue;
        }
        if (!is_empty_text(text)) {
            return text;
        }
        Py_DECREF(text);
    }
    return Py_NewRef(NAME(m, V_EMPTY));
}

/* For each of names: the resource's non-empty value, else the span's (even
 * empty); "" when neither has one (new reference). */
static PyObject *
resource_then_span(OtelMapper *m, PyObject *res, PyObject *attrs, const int *names, int count)
{
    PyObject *first = PyTuple_GET_ITEM(res, RES_FIRST);
    for (int i = 0; i < count; i++) {
        if (PyDict_GET_SIZE(first) > 0) {
            PyObject *text = PyDict_GetItemWithError(first, NAME(m, names[i]));
            if (text == NULL && PyErr_Occurred()) {
                return NULL;
            }
            if (text != NULL && PyUnicode_Check(text) && !is_empty_text(text)) {
                return Py_NewRef(text);
            }
        }
        int found;
        PyObject *text = attr_text(m, attrs, names[i], &found);
        if (found || text != NULL) {
            return text; /* (NULL: an error) */
        }
        if (PyErr_Occurred()) {
            return NULL;
        }
    }
    return Py_NewRef(NAME(m, V_EMPTY));
}

/* text.lower() + suffix, or prefix + text.lower() + suffix (new reference).
 * The last answer is kept for an exact str: a batch's spans mostly name the
 * same system (the same str object) for the same rule. */
static PyObject *
lowered_format(OtelMapper *m, const char *format, PyObject *text)
{
    if (text == m->lowered_text && format == m->lowered_format) {
        return Py_NewRef(m->lowered);
    }
    PyObject *lower = PyObject_CallMethodNoArgs(text, NAME(m, A_LOWER));
    if (lower == NULL) {
        return NULL;
    }
    PyObject *result = PyUnicode_FromFormat(format, lower);
    Py_DECREF(lower);
    if (result != NULL && PyUnicode_CheckExact(text)) {
        Py_XSETREF(m->lowered_text, Py_NewRef(text));
        Py_XSETREF(m->lowered, Py_NewRef(result));
        m->lowered_format = format;
    }
    return result;
}

enum { KIND_INTERNAL, KIND_SERVER, KIND_CLIENT, KIND_PRODUCER, KIND_CONSUMER, KIND_COUNT };
enum { STATUS_UNSET, STATUS_OK, STATUS_ERROR, STATUS_COUNT };

static const int kind_names[KIND_COUNT] = {V_INTERNAL, V_SERVER, V_CLIENT, V_PRODUCER, V_CONSUMER};
static const int status_names[STATUS_COUNT] = {V_UNSET, V_OK, V_ERROR};

/* Rule 5 (new reference). */
static PyObject *
operation_name(OtelMapper *m, PyObject *attrs, int kind)
{
    PyObject *result = NULL, *a = NULL, *b = NULL;
    int is_client = kind == KIND_CLIENT, is_server = kind == KIND_SERVER;
    int found;
    if ((is_client || is_server) &&
        (attr_get(m, HTTP_METHOD) != NULL || attr_get(m, HTTP_REQUEST_METHOD) != NULL)) {
        return Py_NewRef(NAME(m, is_client ? V_HTTP_CLIENT_REQUEST : V_HTTP_SERVER_REQUEST));
    }
    static const int db_names[] = {DB_SYSTEM, DB_SYSTEM_NAME};
    if ((a = first_text(m, attrs, db_names, 2)) == NULL) {
        goto done;
    }
    if (!is_empty_text(a) && is_client) {
        result = lowered_format(m, "%U.query", a);
        goto done;
    }
    Py_CLEAR(a);
    if (kind != KIND_INTERNAL) {
        static const int operation_names[] = {MESSAGING_OPERATION, MESSAGING_OPERATION_TYPE};
        a = attr_text(m, attrs, MESSAGING_SYSTEM, &found);
        if (a == NULL && PyErr_Occurred()) {
            goto done;
        }
        if (a != NULL && !is_empty_text(a)) {
            if ((b = first_text(m, attrs, operation_names, 2)) == NULL) {
                goto done;
            }
            if (!is_empty_text(b)) {
                PyObject *joined = PyUnicode_FromFormat("%U.%U", a, b);
                if (joined != NULL) {
                    result = PyObject_CallMethodNoArgs(joined, NAME(m, A_LOWER));
                    Py_DECREF(joined);
                }
                goto done;
            }
            Py_CLEAR(b);
        }
        Py_CLEAR(a);
    }
    a = attr_text(m, attrs, RPC_SYSTEM, &found);
    if (a == NULL && PyErr_Occurred()) {
        goto done;
    }
    if (a != NULL && !is_empty_text(a) && (is_client || is_server)) {
        int aws = PyUnicode_Compare(a, NAME(m, V_AWS_API));
        if (aws == -1 && PyErr_Occurred()) {
            goto done;
        }
        if (is_client && aws == 0) {
            b = attr_text(m, attrs, RPC_SERVICE, &found);
            if (b == NULL && PyErr_Occurred()) {
                goto done;
            }
            result = b != NULL && !is_empty_text(b) ? lowered_format(m, "aws.%U.request", b)
                                                    : Py_NewRef(NAME(m, V_AWS_CLIENT_REQUEST));
            goto done;
        }
        result = lowered_format(m, is_client ? "%U.client.request" : "%U.server.request", a);
        goto done;
    }
    Py_CLEAR(a);
    if (is_client) {
        a = attr_text(m, attrs, FAAS_INVOKED_PROVIDER, &found);
        if (a == NULL && PyErr_Occurred()) {
            goto done;
        }
        b = attr_text(m, attrs, FAAS_INVOKED_NAME, &found);
        if (b == NULL && PyErr_Occurred()) {
            goto done;
        }
        if (a != NULL && b != NULL && !is_empty_text(a) && !is_empty_text(b)) {
            PyObject *joined = PyUnicode_FromFormat("%U.%U.invoke", a, b);
            if (joined != NULL) {
                result = PyObject_CallMethodNoArgs(joined, NAME(m, A_LOWER));
                Py_DECREF(joined);
            }
            goto done;
        }
        Py_CLEAR(a);
        Py_CLEAR(b);
    }
    if (is_server) {
        a = attr_text(m, attrs, FAAS_TRIGGER, &found);
        if (a == NULL && PyErr_Occurred()) {
            goto done;
        }
        if (a != NULL && !is_empty_text(a)) {
            result = lowered_format(m, "%U.invoke", a);
            goto done;
        }
        Py_CLEAR(a);
    }
    a = attr_text(m, attrs, GRAPHQL_OPERATION_TYPE, &found);
    if (a == NULL && PyErr_Occurred()) {
        goto done;
    }
    if (a != NULL && !is_empty_text(a)) {
        result = Py_NewRef(NAME(m, V_GRAPHQL_SERVER_REQUEST));
        goto done;
    }
    Py_CLEAR(a);
    if (is_server || is_client) {
        a = attr_text(m, attrs, NETWORK_PROTOCOL_NAME, &found);
        if (a == NULL && PyErr_Occurred()) {
            goto done;
        }
        if (a != NULL && !is_empty_text(a)) {
            result = lowered_format(m, is_server ? "%U.server.request" : "%U.client.request", a);
        }
        else {
            result = Py_NewRef(NAME(m, is_server ? V_SERVER_REQUEST : V_CLIENT_REQUEST));
        }
        goto done;
    }
    result = Py_NewRef(NAME(m, kind_names[kind]));
done:
    Py_XDECREF(a);
    Py_XDECREF(b);
    return result;
}

/* first + separator + second as one str (new reference): PyUnicode_FromFormat
 * parses its format on every call, which the rules' hot paths cannot afford. */
static PyObject *
text_join(PyObject *first, Py_UCS4 separator, PyObject *second)
{
    Py_ssize_t first_length = PyUnicode_GET_LENGTH(first),
               second_length = PyUnicode_GET_LENGTH(second);
    Py_UCS4 max_char = PyUnicode_MAX_CHAR_VALUE(first);
    if (PyUnicode_MAX_CHAR_VALUE(second) > max_char) {
        max_char = PyUnicode_MAX_CHAR_VALUE(second);
    }
    if (separator > max_char) {
        max_char = separator;
    }
    PyObject *joined = PyUnicode_New(first_length + 1 + second_length, max_char);
    if (joined == NULL) {
        return NULL;
    }
    if (PyUnicode_CopyCharacters(joined, 0, first, 0, first_length) < 0 ||
        PyUnicode_WriteChar(joined, first_length, separator) < 0 ||
        PyUnicode_CopyCharacters(joined, first_length + 1, second, 0, second_length) < 0) {
        Py_DECREF(joined);
        return NULL;
    }
    return joined;
}

/* "<first> <second>", or first alone when second is empty (steals both). */
static PyObject *
joined_or_first(PyObject *first, PyObject *second)
{
    PyObject *result;
    if (second == NULL) {
        Py_DECREF(first);
        return NULL;
    }
    result = is_empty_text(second) ? Py_NewRef(first) : text_join(first, ' ', second);
    Py_DECREF(first);
    Py_DECREF(second);
    return result;
}

/* Rule 6 (new reference). */
static PyObject *
resource_name(OtelMapper *m, PyObject *res, PyObject *attrs, int kind, PyObject *span_name)
{
    static const int resource_names[] = {RESOURCE_NAME};
    static const int method_names[] = {HTTP_REQUEST_METHOD, HTTP_METHOD};
    static const int route_names[] = {HTTP_ROUTE};
    static const int operation_names[] = {MESSAGING_OPERATION_TYPE, MESSAGING_OPERATION};
    static const int destination_names[] = {MESSAGING_DESTINATION, MESSAGING_DESTINATION_NAME};
    static const int rpc_method_names[] = {RPC_METHOD};
    static const int rpc_service_names[] = {RPC_SERVICE};
    static const int graphql_type_names[] = {GRAPHQL_OPERATION_TYPE};
    static const int graphql_name_names[] = {GRAPHQL_OPERATION_NAME};
    static const int db_names[] = {DB_SYSTEM_NAME, DB_SYSTEM};
    static const int statement_names[] = {DB_STATEMENT};
    static const int query_names[] = {DB_QUERY_TEXT};
    PyObject *found = resource_then_span(m, res, attrs, resource_names, 1);
    if (found == NULL || !is_empty_text(found)) {
        return found;
    }
    Py_DECREF(found);
    if ((found = resource_then_span(m, res, attrs, method_names, 2)) == NULL) {
        return NULL;
    }
    if (!is_empty_text(found)) {
        int other = PyUnicode_Compare(found, NAME(m, V_OTHER));
        if (other == -1 && PyErr_Occurred()) {
            Py_DECREF(found);
            return NULL;
        }
        if (other == 0) {
            Py_SETREF(found, Py_NewRef(NAME(m, V_HTTP_METHOD_OTHER)));
        }
        if (kind != KIND_SERVER) {
            return found;
        }
        return joined_or_first(found, resource_then_span(m, res, attrs, route_names, 1));
    }
    Py_DECREF(found);
    /* Messaging, RPC, GraphQL: the first found, followed by its second. */
    static const struct {
        const int *first, *second;
        int first_count, second_count;
    } joined[] = {
        {operation_names, destination_names, 2, 2},
        {rpc_method_names, rpc_service_names, 1, 1},
        {graphql_type_names, graphql_name_names, 1, 1},
    };
    for (size_t i = 0; i < sizeof joined / sizeof joined[0]; i++) {
        found = resource_then_span(m, res, attrs, joined[i].first, joined[i].first_count);
        if (found == NULL) {
            return NULL;
        }
        if (!is_empty_text(found)) {
            return joined_or_first(
                found, resource_then_span(m, res, attrs, joined[i].second, joined[i].second_count));
        }
        Py_DECREF(found);
    }
    if ((found = resource_then_span(m, res, attrs, db_names, 2)) == NULL) {
        return NULL;
    }
    if (!is_empty_text(found)) {
        Py_SETREF(found, resource_then_span(m, res, attrs, statement_names, 1));
        if (found == NULL || !is_empty_text(found)) {
            return found;
        }
        Py_SETREF(found, resource_then_span(m, res, attrs, query_names, 1));
        if (found == NULL || !is_empty_text(found)) {
            return found;
        }
    }
    Py_DECREF(found);
    return Py_NewRef(span_name);
}

/* Rule 7 (new reference). */
static PyObject *
span_type(OtelMapper *m, PyObject *res, PyObject *attrs, int kind)
{
    static const int type_names[] = {SPAN_TYPE};
    static const int db_names[] = {DB_SYSTEM_NAME, DB_SYSTEM};
    PyObject *found = resource_then_span(m, res, attrs, type_names, 1);
    if (found == NULL || !is_empty_text(found)) {
        return found;
    }
    Py_DECREF(found);
    if (kind == KIND_SERVER) {
        return Py_NewRef(NAME(m, V_WEB));
    }
    if (kind != KIND_CLIENT) {
        return Py_NewRef(NAME(m, V_CUSTOM));
    }
    PyObject *db = resource_then_span(m, res, attrs, db_names, 2);
    if (db == NULL || is_empty_text(db)) {
        Py_XDECREF(db);
        return PyErr_Occurred() ? NULL : Py_NewRef(NAME(m, V_HTTP));
    }
    PyObject *type = PyDict_GetItemWithError(PLAN(m, PLAN_DB_TYPES), db);
    Py_DECREF(db);
    if (type == NULL) {
        return PyErr_Occurred() ? NULL : Py_NewRef(NAME(m, V_DB));
    }
    return Py_NewRef(type);
}

static int
set_float(PyObject *dict, PyObject *key, double value)
{
    PyObject *number = PyFloat_FromDouble(value);
    if (number == NULL) {
        return -1;
    }
    int rc = PyDict_SetItem(dict, key, number);
    Py_DECREF(number);
    return rc;
}

/* spanpack.otel's _TAG_KEY_KEPT_LENGTH. */
#define TAG_KEY_KEPT_LENGTH 256

/* The mapped key of an attribute (a new reference; NULL with an error). */
static PyObject *
tag_key(OtelMapper *m, PyObject *key)
{
    /* Only an exact str is looked up or kept: the cache may be shared by
     * batches (spanpack.otel keeps it), and a subclass's own __eq__ and
     * __hash__ would answer for other keys there; and only a key of up to
     * TAG_KEY_KEPT_LENGTH characters, so that what is kept stays small. */
    int exact = PyUnicode_CheckExact(key) && PyUnicode_GET_LENGTH(key) <= TAG_KEY_KEPT_LENGTH;
    PyObject *cache = PLAN(m, PLAN_TAG_KEYS);
    PyObject *mapped = exact ? PyDict_GetItemWithError(cache, key) : NULL;
    if (mapped != NULL || PyErr_Occurred()) {
        return Py_XNewRef(mapped);
    }
    mapped = PyObject_CallOneArg(PLAN(m, PLAN_TAG_KEY), key);
    if (mapped == NULL) {
        return NULL;
    }
    if (!PyUnicode_Check(mapped)) {
        PyErr_SetString(PyExc_TypeError, "spanpack.otel: a tag key must be str");
        Py_DECREF(mapped);
        return NULL;
    }
    if (!exact) {
        return mapped;
    }
    /* An entry is never replaced: another batch sharing the cache may
     * hold the one there. */
    PyObject *kept = PyDict_SetDefault(cache, key, mapped);
    Py_DECREF(mapped);
    return Py_XNewRef(kept);
}

/* An attribute key's tag key (new reference in *tag) and whether that is
 * one of PLAN_SPECIAL, by the key's memo for an exact str.  0, or -1 with
 * an error (a key that is no str: TypeError naming it). */
static int
key_tag(OtelMapper *m, PyObject *key, PyObject **tag, int *special)
{
    KeyMemo *memo = NULL;
    if (PyUnicode_CheckExact(key)) {
        if ((memo = key_memo_get(m, key)) == NULL) {
            return -1;
        }
        if (memo->tag != NULL) {
            *tag = Py_NewRef(memo->tag);
            *special = memo->special;
            return 0;
        }
    }
    PyObject *mapped = PyUnicode_Check(key) ? tag_key(m, key) : NULL;
    if (mapped == NULL) {
        if (!PyErr_Occurred()) {
            PyErr_Format(PyExc_TypeError, "span attribute key %R is not a str", key);
        }
        return -1;
    }
    int found = is_empty_text(mapped) ? 0 : PySet_Contains(PLAN(m, PLAN_SPECIAL), mapped);
    if (found < 0) {
        Py_DECREF(mapped);
        return -1;
    }
    /* (tag_key may have run Python code: the memo is kept only if still this key's) */
    if (memo != NULL && memo->key == key) {
        Py_XSETREF(memo->tag, Py_NewRef(mapped));
        memo->special = found;
    }
    *tag = mapped;
    *special = found;
    return 0;
}

/* Rule 15: the span's attributes to tags and metrics. */
static int
map_attributes(OtelMapper *m, PyObject *attrs, PyObject *meta, PyObject *metrics)
{
    PyObject *key, *value;
    Py_ssize_t pos = 0;
    while (PyDict_Next(attrs, &pos, &key, &value)) {
        Py_INCREF(key);
        Py_INCREF(value);
        PyObject *text = NULL;
        int rc = -1, special;
        PyObject *mapped = NULL;
        if (key_tag(m, key, &mapped, &special) < 0) {
            goto next;
        }
        if (is_empty_text(mapped)) {
            rc = 0;
            goto next;
        }
        if (PyUnicode_CheckExact(value)) {
            rc = special ? put_tag(m, meta, metrics, mapped, value)
                         : PyDict_SetItem(meta, mapped, value);
        }
        else if (PyLong_CheckExact(value) || PyFloat_CheckExact(value)) {
            double number =
                PyFloat_CheckExact(value) ? PyFloat_AS_DOUBLE(value) : PyLong_AsDouble(value);
            if (number == -1.0 && PyErr_Occurred()) {
                goto next;
            }
            if (special) {
                int guarded = PySet_Contains(PLAN(m, PLAN_GUARDED), mapped);
                int held = guarded > 0 ? PyDict_Contains(metrics, mapped) : 0;
                if (guarded < 0 || held < 0) {
                    goto next;
                }
                if (held) {
                    rc = 0;
                    goto next;
                }
                int priority = PyUnicode_Compare(mapped, NAME(m, K_SAMPLING_PRIORITY));
                if (priority == -1 && PyErr_Occurred()) {
                    goto next;
                }
                if (priority == 0) {
                    Py_SETREF(mapped, Py_NewRef(NAME(m, K_SAMPLING_PRIORITY_V1)));
                }
            }
            rc = set_float(metrics, mapped, number);
        }
        else if ((text = value_text(m, value)) != NULL) {
            rc = put_tag(m, meta, metrics, mapped, text);
        }
    next:
        Py_XDECREF(text);
        Py_XDECREF(mapped);
        Py_DECREF(key);
        Py_DECREF(value);
        if (rc < 0) {
            return -1;
        }
    }
    return 0;
}

/* Rule 22 for a span with no events: 1 for an error status, with an
 * error.message from the description or the HTTP status code tag. */
static int
status_error(OtelMapper *m, PyObject *meta, PyObject *description)
{
    int has = PyDict_Contains(meta, NAME(m, K_ERROR_MESSAGE));
    if (has != 0) {
        return has;
    }
    if (description != NULL && PyUnicode_Check(description) && !is_empty_text(description)) {
        return PyDict_SetItem(meta, NAME(m, K_ERROR_MESSAGE), description);
    }
    static const int code_keys[] = {HTTP_RESPONSE_STATUS_CODE, HTTP_STATUS_CODE};
    for (int i = 0; i < 2; i++) {
        PyObject *code = PyDict_GetItemWithError(meta, NAME(m, code_keys[i]));
        if (code == NULL) {
            if (PyErr_Occurred()) {
                return -1;
            }
            continue;
        }
        PyObject *text = PyDict_GetItemWithError(meta, NAME(m, K_HTTP_STATUS_TEXT));
        if (text == NULL && PyErr_Occurred()) {
            return -1;
        }
        if (text == NULL) {
            return PyDict_SetItem(meta, NAME(m, K_ERROR_MESSAGE), code);
        }
        PyObject *message = PyUnicode_FromFormat("%S %S", code, text);
        if (message == NULL) {
            return -1;
        }
        int rc = PyDict_SetItem(meta, NAME(m, K_ERROR_MESSAGE), message);
        Py_DECREF(message);
        return rc;
    }
    return 0;
}

/* The index of member in the plan's tuple at item, or -1. */
static int
member_index(OtelMapper *m, int item, PyObject *member)
{
    PyObject *members = PLAN(m, item);
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(members); i++) {
        if (PyTuple_GET_ITEM(members, i) == member) {
            return (int)i;
        }
    }
    return -1;
}

/* The plan's values for a resource or scope, the last one's kept. */
static PyObject *
values_for(OtelMapper *m, PyObject *object, PyObject **last, PyObject **values, int item,
           Py_ssize_t size)
{
    if (*last == object && *values != NULL) {
        return *values;
    }
    PyObject *made = PyObject_CallOneArg(PLAN(m, item), object);
    if (made == NULL) {
        return NULL;
    }
    int good = PyTuple_CheckExact(made) && PyTuple_GET_SIZE(made) == size;
    for (Py_ssize_t i = 0; good && i < size; i++) {
        PyObject *value = PyTuple_GET_ITEM(made, i);
        if (size == RES_SIZE) {
            good = i <= RES_ENV ? PyUnicode_Check(value) : PyDict_CheckExact(value);
        }
        else {
            good = PyDict_CheckExact(value);
        }
    }
    if (!good) {
        PyErr_SetString(PyExc_TypeError, "spanpack.otel: bad per-batch values");
        Py_DECREF(made);
        return NULL;
    }
    Py_XSETREF(*values, made);
    Py_XSETREF(*last, Py_NewRef(object));
    m->values_made++;
    return made;
}

/* Find where `type` keeps the `count` fields named by `name_ids` (see
 * InPlaceFields). */
static void
inplace_find(OtelMapper *m, InPlaceFields *where, PyTypeObject *type, const int *name_ids,
             int count)
{
    Py_XSETREF(where->type, (PyTypeObject *)Py_NewRef((PyObject *)type));
#ifdef SP_INSTANCE_VALUES_IN_PLACE
    where->keys = NULL;
    const SpDictKeys *keys = pyinstance_shared_keys(m->fast_paths, type);
    unsigned int first_tag = 0;
    for (int i = 0; keys != NULL && i < count; i++) {
        PyObject *name = NAME(m, name_ids[i]);
        /* (_PyType_Lookup never raises; its answer is borrowed, only looked
         * at.  It may run Python code, a key's __eq__ in a class __dict__,
         * which may change the class: its tag is taken after the first
         * lookup, which gives the class one, and compared after the last.) */
        PyObject *found = _PyType_Lookup(type, name);
        if (i == 0) {
            first_tag = sp_type_version_tag(type);
        }
        /* A data descriptor wins over the instance; so may an object whose
         * class can still gain __get__ / __set__ (a heap class not
         * immutable: that changes no tag of `type`).  Only an object of an
         * immutable class without __set__ leaves the instance's value first. */
        where->position[i] =
            found != NULL && (Py_TYPE(found)->tp_descr_set != NULL ||
                              !(Py_TYPE(found)->tp_flags & Py_TPFLAGS_IMMUTABLETYPE))
                ? -1
                : pyinstance_position(keys, name);
    }
    where->version_tag = sp_type_version_tag(type);
    if (where->version_tag != 0 && where->version_tag == first_tag &&
        type->tp_getattro == PyObject_GenericGetAttr) {
        where->keys = keys;
    }
#else
    (void)m;
    (void)name_ids;
    (void)count;
    where->version_tag = sp_type_version_tag(type);
#endif
}

/* `obj`'s values array (its capacity in *capacity), the class found first
 * when `where` knows another or the class changed since; NULL when the
 * fields are read generically. */
static PyObject *const *
inplace_values(OtelMapper *m, InPlaceFields *where, PyObject *obj, const int *name_ids, int count,
               Py_ssize_t *capacity)
{
    PyTypeObject *type = Py_TYPE(obj);
    unsigned int tag = sp_type_version_tag(type);
    if (type != where->type || tag == 0 || tag != where->version_tag) {
        inplace_find(m, where, type, name_ids, count);
    }
#ifdef SP_INSTANCE_VALUES_IN_PLACE
    /* (Code run by the lookups may have given `obj` another class.) */
    if (where->keys != NULL && Py_TYPE(obj) == type &&
        where->keys == pyinstance_shared_keys(m->fast_paths, type)) {
        return pyinstance_values(obj, where->keys, capacity);
    }
#else
    (void)capacity;
#endif
    return NULL;
}

/* The `count` fields of `obj` named by `name_ids`, as new references in
 * `out`: read in place where its values array holds them, else by the
 * generic lookup, after which the array is found again (the lookup may run
 * code that moves it).  0, or -1 with an error (AttributeError for a field
 * it lacks), the fields read before it left in `out` for the caller. */
static int
inplace_read(OtelMapper *m, InPlaceFields *where, PyObject *obj, const int *name_ids, int count,
             PyObject **out)
{
    Py_ssize_t capacity = 0;
    PyObject *const *values = inplace_values(m, where, obj, name_ids, count, &capacity);
    for (int i = 0; i < count; i++) {
        Py_ssize_t position = values != NULL ? where->position[i] : -1;
        PyObject *own = position >= 0 && position < capacity ? values[position] : NULL;
        if (own != NULL) {
            out[i] = Py_NewRef(own);
            continue;
        }
        if ((out[i] = PyObject_GetAttr(obj, NAME(m, name_ids[i]))) == NULL) {
            return -1;
        }
        values = inplace_values(m, where, obj, name_ids, count, &capacity);
    }
    return 0;
}

/* A span's events or links as a sequence (new reference: the SDK's
 * BoundedList by the deque it keeps), None kept as None; NULL on error. */
static PyObject *
list_items(OtelMapper *m, PyObject *list)
{
    if ((PyObject *)Py_TYPE(list) == PLAN(m, PLAN_BOUNDED_LIST)) {
        static const int deque_name[] = {A_DQ};
        PyObject *items;
        return inplace_read(m, &m->list_fields, list, deque_name, 1, &items) < 0 ? NULL : items;
    }
    return Py_NewRef(list);
}

/* The length of list_items' answer (0 for None), -1 on error. */
static Py_ssize_t
items_length(PyObject *items)
{
    return items == Py_None ? 0 : PyObject_Length(items);
}

/* Attributes (stolen) as spanpack.otel's _plain gives them to iterate (a
 * new reference; NULL with an error): None as a new empty dict, the SDK's
 * BoundedAttributes by the dict it keeps (read in place), else themselves. */
static PyObject *
attributes_plain(OtelMapper *m, PyObject *attributes)
{
    static const int dict_name[] = {A_DICT};
    if (attributes == Py_None) {
        Py_DECREF(attributes);
        return PyDict_New();
    }
    if ((PyObject *)Py_TYPE(attributes) == PLAN(m, PLAN_BOUNDED_ATTRIBUTES)) {
        PyObject *dict;
        int rc = inplace_read(m, &m->attributes_fields, attributes, dict_name, 1, &dict);
        Py_DECREF(attributes);
        return rc < 0 ? NULL : dict;
    }
    return attributes;
}

/* 1 when spans of `type` are read through the fields the SDK's ReadableSpan
 * properties return: a subclass of ReadableSpan with the generic attribute
 * lookup whose lookup finds each of those properties as spanpack.otel found
 * them on ReadableSpan at import (not overridden, not patched since); else
 * 0, the span then mapped by the rules in Python through its properties
 * (spanpack.otel's _reader_for asks the same). */
static int
sdk_span_class(OtelMapper *m, PyTypeObject *type)
{
    PyObject *sdk = PLAN(m, PLAN_SDK_SPAN);
    PyTypeObject *readable_span = (PyTypeObject *)PyTuple_GET_ITEM(sdk, 0);
    PyObject *names = PyTuple_GET_ITEM(sdk, 1);
    PyObject *properties = PyTuple_GET_ITEM(sdk, 2);
    if (type->tp_getattro != PyObject_GenericGetAttr || !PyType_IsSubtype(type, readable_span)) {
        return 0;
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(names); i++) {
        /* (borrowed, only compared with an object the plan holds) */
        if (_PyType_Lookup(type, PyTuple_GET_ITEM(names, i)) != PyTuple_GET_ITEM(properties, i)) {
            return 0;
        }
    }
    return 1;
}

/* The SDK's Event and Link keep what their properties return in fields of
 * their own (spanpack.otel shows it at import on the running SDK, or gives
 * classes no item has): an Event's name, timestamp and attributes, a Link's
 * context and attributes. */
static const int event_field_names[EVENT_FIELDS] = {A_NAME, A_TIMESTAMP, A_ATTRIBUTES};
static const int event_properties[EVENT_FIELDS] = {A_EVENT_NAME, A_EVENT_TIMESTAMP,
                                                   A_EVENT_ATTRIBUTES};
static const int link_field_names[LINK_FIELDS] = {A_CONTEXT, A_ATTRIBUTES};
static const int link_properties[LINK_FIELDS] = {A_LINK_CONTEXT, A_EVENT_ATTRIBUTES};

/* 1 when the SDK's Link or Event class (`type`) has, where an attribute
 * lookup finds them, the property objects spanpack.otel showed to return
 * the fields (PLAN_ITEM_PROPERTIES), else 0; checked again whenever the
 * class (or a base) changes its version tag, so a property replaced in the
 * middle of a batch, by code the mapping runs, is seen at the next item. */
static int
item_fields_readable(OtelMapper *m, PyTypeObject *type, int is_link)
{
    ItemClassCheck *check = is_link ? &m->link_check : &m->event_check;
    unsigned int tag = sp_type_version_tag(type);
    if (tag != 0 && tag == check->version_tag) {
        return check->readable;
    }
    PyObject *expected = PLAN(m, PLAN_ITEM_PROPERTIES);
    int first = is_link ? 0 : LINK_FIELDS;
    int count = is_link ? LINK_FIELDS : EVENT_FIELDS;
    const int *names = is_link ? link_properties : event_properties;
    int readable = 1;
    unsigned int first_tag = 0;
    for (int i = 0; i < count; i++) {
        /* (borrowed, only compared; see inplace_find on what it may run) */
        PyObject *found = _PyType_Lookup(type, NAME(m, names[i]));
        if (i == 0) {
            first_tag = sp_type_version_tag(type);
        }
        readable = readable && found == PyTuple_GET_ITEM(expected, first + i);
    }
    tag = sp_type_version_tag(type);
    check->version_tag = tag == first_tag ? tag : 0;
    check->readable = readable;
    return readable;
}

/* One property of an event or a link (`is_link`) as a new reference, NULL
 * with an error: for the SDK's own class, with its own properties and the
 * generic attribute lookup, the field the property returns (in place where
 * the values array holds it: no Python frame per property); otherwise the
 * property itself.  Each call reads that one field, as the property would. */
static PyObject *
item_property(OtelMapper *m, PyObject *item, int is_link, int which)
{
    PyTypeObject *type = Py_TYPE(item);
    if ((PyObject *)type == ITEM_TYPE(m, is_link ? ITEM_LINK : ITEM_EVENT) &&
        type->tp_getattro == PyObject_GenericGetAttr && item_fields_readable(m, type, is_link)) {
        PyObject *value;
        int rc = is_link ? inplace_read(m, &m->link_fields[which], item, &link_field_names[which],
                                        1, &value)
                         : inplace_read(m, &m->event_fields[which], item, &event_field_names[which],
                                        1, &value);
        return rc < 0 ? NULL : value;
    }
    int property = is_link ? link_properties[which] : event_properties[which];
    return PyObject_GetAttr(item, NAME(m, property));
}

/* The truth of `value == "exception"` (op Py_EQ) or `value != "exception"`
 * (Py_NE) as Python answers it, -1 with an error: an exact str compared
 * here, anything else by its own comparison (which may raise). */
static int
compared_with_exception(OtelMapper *m, PyObject *value, int op)
{
    PyObject *exception = NAME(m, V_EXCEPTION);
    if (PyUnicode_CheckExact(value)) {
        /* (The name is interned, so ready; a legacy str not yet ready is
         * compared by CPython, which readies it.  Two str: never fails.) */
        int equal = SP_UNICODE_IS_READY(value) ? sp_same_str_text(value, exception)
                                               : PyUnicode_Compare(value, exception) == 0;
        return op == Py_EQ ? equal : !equal;
    }
    PyObject *answer = PyObject_RichCompare(value, exception, op);
    if (answer == NULL) {
        return -1;
    }
    int truth = PyObject_IsTrue(answer);
    Py_DECREF(answer);
    return truth;
}

/* Rule 17: 1 when an event is named exactly "exception", 0 when none, -1 on error. */
static int
has_exception_event(OtelMapper *m, PyObject *events)
{
    PyObject *iterator = PyObject_GetIter(events);
    if (iterator == NULL) {
        return -1;
    }
    int found = 0;
    PyObject *event;
    while (found == 0 && (event = PyIter_Next(iterator)) != NULL) {
        PyObject *name = item_property(m, event, 0, EVENT_NAME);
        Py_DECREF(event);
        if (name == NULL) {
            found = -1;
            break;
        }
        found = compared_with_exception(m, name, Py_EQ);
        Py_DECREF(name);
    }
    Py_DECREF(iterator);
    return found < 0 || PyErr_Occurred() ? -1 : found;
}

/* Rule 22's exception events: each event named "exception" in any case sets
 * error.message/type/stack from its exception.* attributes. */
static int
exception_tags(OtelMapper *m, PyObject *events, PyObject *meta)
{
    static const int attributes[][2] = {
        {EXCEPTION_MESSAGE, K_ERROR_MESSAGE},
        {EXCEPTION_TYPE, K_ERROR_TYPE},
        {EXCEPTION_STACKTRACE, K_ERROR_STACK},
    };
    PyObject *iterator = PyObject_GetIter(events);
    if (iterator == NULL) {
        return -1;
    }
    int rc = 0;
    PyObject *event;
    while (rc == 0 && (event = PyIter_Next(iterator)) != NULL) {
        PyObject *name = item_property(m, event, 0, EVENT_NAME);
        PyObject *lower = name == NULL ? NULL : PyObject_CallMethodNoArgs(name, NAME(m, A_LOWER));
        PyObject *event_attributes = NULL;
        int exception = 0;
        if (lower == NULL) {
            rc = -1;
        }
        else {
            int differs = compared_with_exception(m, lower, Py_NE);
            rc = differs < 0 ? -1 : 0;
            exception = differs == 0;
        }
        if (rc == 0 && exception) {
            event_attributes = item_property(m, event, 0, EVENT_ATTRIBUTES);
            if (event_attributes != NULL) {
                event_attributes = attributes_plain(m, event_attributes);
            }
            rc = event_attributes == NULL ? -1 : 0;
        }
        for (int i = 0; rc == 0 && exception && event_attributes != Py_None && i < 3; i++) {
            PyObject *key = NAME(m, attributes[i][0]);
            PyObject *value =
                PyDict_Check(event_attributes)
                    ? Py_XNewRef(PyDict_GetItemWithError(event_attributes, key))
                    : PyObject_CallMethodOneArg(event_attributes, NAME(m, A_GET), key);
            if (value == NULL) {
                rc = PyErr_Occurred() ? -1 : 0;
                continue;
            }
            PyObject *text = Py_None == value ? NULL
                             : PyUnicode_CheckExact(value)
                                 ? Py_NewRef(value)
                                 : PyObject_CallOneArg(PLAN(m, PLAN_EVENT_TEXT), value);
            if (value != Py_None) {
                rc = text == NULL ? -1 : PyDict_SetItem(meta, NAME(m, attributes[i][1]), text);
            }
            Py_XDECREF(text);
            Py_DECREF(value);
        }
        Py_XDECREF(event_attributes);
        Py_XDECREF(lower);
        Py_XDECREF(name);
        Py_DECREF(event);
    }
    Py_DECREF(iterator);
    return rc < 0 || PyErr_Occurred() ? -1 : 0;
}

/* An item's attributes as attributes_plain gives them; NULL with no error
 * when that is no exact dict (then spanpack.otel converts the list), NULL
 * with an error on failure.  `bounded` (may be NULL): 1 when the dict is
 * the one an SDK BoundedAttributes keeps, else 0. */
static PyObject *
plain_attributes(OtelMapper *m, PyObject *item, int is_link, int *bounded)
{
    PyObject *attributes =
        item_property(m, item, is_link, is_link ? LINK_ATTRIBUTES : EVENT_ATTRIBUTES);
    if (bounded != NULL) {
        *bounded = attributes != NULL &&
                   (PyObject *)Py_TYPE(attributes) == PLAN(m, PLAN_BOUNDED_ATTRIBUTES);
    }
    if (attributes != NULL) {
        attributes = attributes_plain(m, attributes);
    }
    if (attributes != NULL && !PyDict_CheckExact(attributes)) {
        Py_CLEAR(attributes);
    }
    return attributes;
}

/* str() of an exact int: in C for one of up to 64 bits (CPython's
 * general conversion cost 470 instructions a link attribute); the same text. */
static PyObject *
int_text(const OtelMapper *m, PyObject *value)
{
    uint64_t magnitude;
    int negative;
    if (pyint_magnitude64(m->fast_paths, value, &magnitude, &negative) != 0) {
        return PyObject_Str(value);
    }
    char digits[24];
    char *end = digits + sizeof digits, *start = signed_decimal64_put(end, magnitude, negative);
    return PyUnicode_FromStringAndSize(start, end - start);
}

/* A link attribute's value as spanpack.otel's _text writes it (new
 * reference): a str as it is, an int's digits, a bool as true/false, the
 * rest by _text itself. */
static PyObject *
link_value_text(OtelMapper *m, PyObject *value)
{
    if (PyUnicode_CheckExact(value)) {
        return Py_NewRef(value);
    }
    if (PyLong_CheckExact(value)) {
        return int_text(m, value);
    }
    if (PyBool_Check(value)) {
        return Py_NewRef(NAME(m, value == Py_True ? V_TRUE : V_FALSE));
    }
    return PyObject_CallOneArg(PLAN(m, PLAN_TEXT), value);
}

/* A trace state's header as spanpack.otel writes it (a link's tracestate,
 * a span's w3c.tracestate when not empty): "" for a state that is false
 * (empty), else its to_header(); the last one's kept.  A new reference, or
 * NULL with an error. */
static PyObject *
trace_state_header(OtelMapper *m, PyObject *state)
{
    /* (Only the SDK's TraceState is immutable: another class's truth and
     * header are asked for each link, as spanpack.otel asks.) */
    int cacheable = (PyObject *)Py_TYPE(state) == ITEM_TYPE(m, ITEM_TRACE_STATE);
    if (!cacheable || state != m->last_trace_state || m->trace_state_header == NULL) {
        int truth = PyObject_IsTrue(state);
        PyObject *header = truth < 0    ? NULL
                           : truth == 0 ? Py_NewRef(NAME(m, V_EMPTY))
                                        : PyObject_CallMethodNoArgs(state, NAME(m, A_TO_HEADER));
        if (header == NULL) {
            return NULL;
        }
        if (!cacheable) {
            return header;
        }
        Py_XSETREF(m->trace_state_header, header);
        Py_XSETREF(m->last_trace_state, Py_NewRef(state));
    }
    return Py_NewRef(m->trace_state_header);
}

/* A link of link_make's values as an OtelLink (into *out): the values of
 * the to_dict() form links_events.c's link_values_read makes of link_make's
 * dict (ids in range, attributes when there are any, tracestate when not
 * empty, flags).  1 when made; 0 (nothing made) where those rules decline
 * (an id out of range, text that is not an exact str: the dict goes, and
 * the encoder's rules judge it); -1 with an error. */
static int
link_object_make(OtelMapper *m, PyObject *context, PyObject *attributes, PyObject *header,
                 PyObject *flags, PyObject **out)
{
    PyObject *trace_id = PyTuple_GET_ITEM(context, 0), *span_id = PyTuple_GET_ITEM(context, 1);
    if (!PyLong_CheckExact(trace_id) || !PyLong_CheckExact(span_id) ||
        !PyUnicode_CheckExact(header) || !PyLong_CheckExact(flags)) {
        return 0;
    }
    LinkValues values = {0};
    uint64_t span_high = 0;
    int wide = pyint_u128(m->fast_paths, trace_id, &values.trace_high, &values.trace_low);
    if (wide == 0) {
        wide = pyint_u128(m->fast_paths, span_id, &span_high, &values.span_id);
    }
    if (wide != 0 || span_high != 0) {
        return wide < 0 ? -1 : 0; /* negative or wider than the id */
    }
    Py_ssize_t position = 0;
    PyObject *key, *value;
    while (PyDict_Next(attributes, &position, &key, &value)) {
        if (!PyUnicode_CheckExact(key) || !PyUnicode_CheckExact(value)) {
            return 0; /* flattened or refused by the encoder's rules */
        }
    }
    values.attributes = PyDict_GET_SIZE(attributes) > 0 ? attributes : NULL;
    values.tracestate = PyUnicode_GET_LENGTH(header) > 0 ? header : NULL;
    values.flags = flags;
    *out = otel_link_new(m->state, &values);
    return *out == NULL ? -1 : 1;
}

/* One link as spanpack.otel's _links makes it (a new dict in *out; for
 * OtelSpans, an OtelLink where link_object_make can), or *out NULL when it
 * is of another form than the SDK's (then spanpack.otel converts the list).
 * 0, or -1 with an error. */
static int
link_make(OtelMapper *m, PyObject *link, PyObject **out)
{
    *out = NULL;
    PyObject *attributes = NULL, *converted = NULL, *header = NULL, *flags = NULL, *dict = NULL;
    PyObject *key, *value;
    int rc = -1;
    PyObject *context = item_property(m, link, 1, LINK_CONTEXT);
    if (context == NULL) {
        goto done;
    }
    /* SpanContext: (trace_id, span_id, is_remote, trace_flags, trace_state, is_valid),
     * its properties self[i]: only the SDK's own class (a subclass may
     * override a property or __getitem__, another tuple order its items). */
    if ((PyObject *)Py_TYPE(context) != ITEM_TYPE(m, ITEM_SPAN_CONTEXT) ||
        PyTuple_GET_SIZE(context) != 6 || !PyLong_Check(PyTuple_GET_ITEM(context, 3))) {
        rc = 0;
        goto done;
    }
    if ((attributes = plain_attributes(m, link, 1, NULL)) == NULL) {
        rc = PyErr_Occurred() ? -1 : 0;
        goto done;
    }
    if ((converted = PyDict_New()) == NULL) {
        goto done;
    }
    /* _text (a value's __str__, __repr__...) and the key's __hash__ may run
     * Python code that changes the dict: raise as its items() iterator
     * raises then (dictiter_iternextitem). */
    Py_ssize_t position = 0, used = PyDict_GET_SIZE(attributes), left = used;
    while (PyDict_Next(attributes, &position, &key, &value)) {
        if (left-- == 0) {
            PyErr_SetString(PyExc_RuntimeError, "dictionary keys changed during iteration");
            goto done;
        }
        Py_INCREF(key);
        Py_INCREF(value);
        PyObject *text = link_value_text(m, value);
        int set = text == NULL ? -1 : PyDict_SetItem(converted, key, text);
        Py_XDECREF(text);
        Py_DECREF(value);
        Py_DECREF(key);
        if (set < 0) {
            goto done;
        }
        if (PyDict_GET_SIZE(attributes) != used) {
            PyErr_SetString(PyExc_RuntimeError, "dictionary changed size during iteration");
            goto done;
        }
    }
    PyObject *state = PyTuple_GET_ITEM(context, 4);
    header = state == Py_None ? Py_NewRef(NAME(m, V_EMPTY)) : trace_state_header(m, state);
    flags = header == NULL ? NULL : PyNumber_Long(PyTuple_GET_ITEM(context, 3));
    if (flags == NULL) {
        goto done;
    }
    if (m->objects) {
        int made = link_object_make(m, context, converted, header, flags, out);
        if (made != 0) {
            rc = made < 0 ? -1 : 0;
            goto done;
        }
    }
    if ((dict = PyDict_New()) == NULL ||
        PyDict_SetItem(dict, NAME(m, F_TRACE_ID), PyTuple_GET_ITEM(context, 0)) < 0 ||
        PyDict_SetItem(dict, NAME(m, F_SPAN_ID), PyTuple_GET_ITEM(context, 1)) < 0 ||
        PyDict_SetItem(dict, NAME(m, A_EVENT_ATTRIBUTES), converted) < 0 ||
        PyDict_SetItem(dict, NAME(m, L_TRACESTATE), header) < 0 ||
        PyDict_SetItem(dict, NAME(m, L_FLAGS), flags) < 0) {
        goto done;
    }
    *out = Py_NewRef(dict);
    rc = 0;
done:
    Py_XDECREF(dict);
    Py_XDECREF(flags);
    Py_XDECREF(header);
    Py_XDECREF(converted);
    Py_XDECREF(attributes);
    Py_XDECREF(context);
    return rc;
}

/* 1 when an exact dict holds an exact tuple among its values, else 0. */
static int
holds_a_tuple(PyObject *dict)
{
    Py_ssize_t position = 0;
    PyObject *key, *value;
    while (PyDict_Next(dict, &position, &key, &value)) {
        if (PyTuple_CheckExact(value)) {
            return 1;
        }
    }
    return 0;
}

/* An event's attributes (non-empty) as the event writers take them: arrays
 * as lists (the SDK keeps tuples).  A new dict, a copy the caller may
 * change; when `shared` (for an OtelEvent, whose attributes no caller sees,
 * of a dict kept by an SDK BoundedAttributes, which the SDK makes immutable
 * for the events its spans record), the dict itself where it holds no
 * tuple.  NULL with an error. */
static PyObject *
event_attributes(PyObject *attributes, int shared)
{
    if (shared && !holds_a_tuple(attributes)) {
        return Py_NewRef(attributes);
    }
    PyObject *copy = PyDict_Copy(attributes);
    if (copy == NULL) {
        return NULL;
    }
    Py_ssize_t position = 0;
    PyObject *key, *value;
    while (PyDict_Next(attributes, &position, &key, &value)) {
        if (!PyTuple_CheckExact(value)) {
            continue;
        }
        Py_INCREF(key);
        PyObject *list = PySequence_List(value);
        int set = list == NULL ? -1 : PyDict_SetItem(copy, key, list);
        Py_XDECREF(list);
        Py_DECREF(key);
        if (set < 0) {
            Py_DECREF(copy);
            return NULL;
        }
    }
    return copy;
}

/* One event as spanpack.otel's _events makes it (a new dict in *out; for
 * OtelSpans, an OtelEvent of the same fields), or *out NULL when it is of
 * another form than the SDK's (then spanpack.otel converts the list).  0,
 * or -1 with an error. */
static int
event_make(OtelMapper *m, PyObject *event, PyObject **out)
{
    *out = NULL;
    PyObject *timestamp = NULL, *attributes = NULL, *written = NULL, *dict = NULL;
    int rc = -1;
    PyObject *name = NULL;
    int bounded;
    /* (Read in the order spanpack.otel reads them.) */
    if ((attributes = plain_attributes(m, event, 0, &bounded)) == NULL) {
        rc = PyErr_Occurred() ? -1 : 0;
        goto done;
    }
    if ((name = item_property(m, event, 0, EVENT_NAME)) == NULL ||
        (timestamp = item_property(m, event, 0, EVENT_TIMESTAMP)) == NULL) {
        goto done;
    }
    if (!PyLong_CheckExact(timestamp)) {
        rc = 0;
        goto done;
    }
    /* max(timestamp, 0) (an exact int: its sign says) */
    PyObject *time = pyint_sign(timestamp) < 0 ? m->zero : timestamp;
    if (PyDict_GET_SIZE(attributes) > 0 &&
        (written = event_attributes(attributes, m->objects && bounded)) == NULL) {
        goto done;
    }
    if (m->objects) {
        *out = otel_event_new(m->state, name, time, written);
        rc = *out == NULL ? -1 : 0;
        goto done;
    }
    if ((dict = PyDict_New()) == NULL || PyDict_SetItem(dict, NAME(m, A_EVENT_NAME), name) < 0 ||
        PyDict_SetItem(dict, NAME(m, E_TIME_UNIX_NANO), time) < 0 ||
        (written != NULL && PyDict_SetItem(dict, NAME(m, A_EVENT_ATTRIBUTES), written) < 0)) {
        goto done;
    }
    *out = Py_NewRef(dict);
    rc = 0;
done:
    Py_XDECREF(dict);
    Py_XDECREF(written);
    Py_XDECREF(attributes);
    Py_XDECREF(timestamp);
    Py_XDECREF(name);
    return rc;
}

/* One item of another form than the SDK's, as spanpack.otel's _links or
 * _events converts it (a new reference; NULL with an error). */
static PyObject *
item_converted_in_python(OtelMapper *m, int item, PyObject *one)
{
    PyObject *single = PyTuple_Pack(1, one);
    PyObject *list = single != NULL ? PyObject_CallOneArg(PLAN(m, item), single) : NULL;
    Py_XDECREF(single);
    if (list == NULL) {
        return NULL;
    }
    PyObject *made = NULL;
    if (PyList_Check(list) && PyList_GET_SIZE(list) == 1) {
        made = Py_NewRef(PyList_GET_ITEM(list, 0));
    }
    else {
        PyErr_SetString(PyExc_TypeError, "spanpack.otel: a converter gave no list of one item");
    }
    Py_DECREF(list);
    return made;
}

/* Rules 23-24: a span's links or events (`items`, from list_items) as
 * spanpack.otel's _links and _events make them: here for items of the SDK's
 * classes and forms, by them one at a time otherwise (an item of another
 * class is read by them only: its properties may run code, run once, as
 * there).  A new list, or NULL with an error. */
static PyObject *
items_converted(OtelMapper *m, int item, PyObject *items)
{
    PyObject *made = PyList_New(0);
    PyObject *iterator = made != NULL ? PyObject_GetIter(items) : NULL;
    PyObject *one;
    PyObject *sdk_type = ITEM_TYPE(m, item == PLAN_LINKS ? ITEM_LINK : ITEM_EVENT);
    int rc = iterator != NULL ? 0 : -1;
    while (rc == 0 && (one = PyIter_Next(iterator)) != NULL) {
        PyObject *dict = NULL;
        if ((PyObject *)Py_TYPE(one) == sdk_type) {
            rc = item == PLAN_LINKS ? link_make(m, one, &dict) : event_make(m, one, &dict);
        }
        if (rc == 0 && dict == NULL) {
            /* (the SDK's properties return a field: read again there, no code runs twice) */
            dict = item_converted_in_python(m, item, one);
            rc = dict == NULL ? -1 : 0;
        }
        Py_DECREF(one);
        if (rc == 0) {
            rc = PyList_Append(made, dict);
            Py_DECREF(dict);
        }
    }
    Py_XDECREF(iterator);
    if (rc < 0 || PyErr_Occurred()) {
        Py_XDECREF(made);
        return NULL;
    }
    return made;
}

/* The span's fields, read as the SDK keeps them. */
typedef struct {
    PyObject *context, *attributes, *events, *links, *resource, *scope, *kind, *status, *parent,
        *name, *start, *end, *status_code, *description;
} SdkFields;

static const int sdk_field_names[] = {A_CONTEXT,  A_ATTRIBUTES, A_EVENTS, A_LINKS,
                                      A_RESOURCE, A_SCOPE,      A_KIND,   A_STATUS,
                                      A_PARENT,   A_NAME,       A_START,  A_END};
#define SDK_FIELD_COUNT ((int)(sizeof(sdk_field_names) / sizeof(sdk_field_names[0])))
_Static_assert(sizeof(sdk_field_names) / sizeof(sdk_field_names[0]) <= INPLACE_MAX_FIELDS,
               "InPlaceFields holds every field of a span");

/* A loop, not unrolled: 14 inlined Py_CLEARs made 1.5 KB of code that every
 * span runs through once. */
static SP_NOINLINE void
sdk_fields_clear(SdkFields *f)
{
    PyObject **all = (PyObject **)f;
#pragma GCC unroll 1
    for (size_t i = 0; i < sizeof(SdkFields) / sizeof(PyObject *); i++) {
        Py_CLEAR(all[i]);
    }
}

/* 1 when read, 0 when the span is not as the SDK keeps it (map in Python), -1 on error. */
static int
sdk_fields_read(OtelMapper *m, PyObject *span, SdkFields *f)
{
    static const int status_names[] = {A_STATUS_CODE, A_DESCRIPTION};
    PyObject **all = (PyObject **)f;
    if (inplace_read(m, &m->span_fields, span, sdk_field_names, SDK_FIELD_COUNT, all) < 0) {
        if (!PyErr_ExceptionMatches(PyExc_AttributeError)) {
            return -1;
        }
        PyErr_Clear();
        return 0;
    }
    if ((f->attributes = attributes_plain(m, f->attributes)) == NULL) {
        return -1;
    }
    if (!PyDict_Check(f->attributes)) {
        return 0;
    }
    PyObject *status[2] = {NULL, NULL};
    int status_read = inplace_read(m, &m->status_fields, f->status, status_names, 2, status);
    f->status_code = status[0];
    f->description = status[1];
    if (status_read < 0) {
        if (!PyErr_ExceptionMatches(PyExc_AttributeError)) {
            return -1;
        }
        PyErr_Clear();
        return 0;
    }
    /* The SDK's SpanContext, a tuple: (trace_id, span_id, is_remote, trace_flags,
     * trace_state, is_valid), read by position (its properties do no more;
     * a subclass's may), with the SDK's immutable TraceState (or None). */
    PyObject *context_type = ITEM_TYPE(m, ITEM_SPAN_CONTEXT);
    PyObject *state =
        (PyObject *)Py_TYPE(f->context) == context_type && PyTuple_GET_SIZE(f->context) == 6
            ? PyTuple_GET_ITEM(f->context, 4)
            : NULL;
    if (state == NULL ||
        (state != Py_None && (PyObject *)Py_TYPE(state) != ITEM_TYPE(m, ITEM_TRACE_STATE)) ||
        !PyLong_CheckExact(PyTuple_GET_ITEM(f->context, 0)) ||
        !PyLong_CheckExact(PyTuple_GET_ITEM(f->context, 1)) ||
        (f->parent != Py_None &&
         ((PyObject *)Py_TYPE(f->parent) != context_type || PyTuple_GET_SIZE(f->parent) != 6 ||
          !PyLong_CheckExact(PyTuple_GET_ITEM(f->parent, 1)))) ||
        !PyUnicode_Check(f->name) || (f->start != Py_None && !PyLong_CheckExact(f->start)) ||
        (f->end != Py_None && !PyLong_CheckExact(f->end))) {
        return 0;
    }
    return 1;
}

/* How many spans batch_warm loads ahead at a time, and how many events and
 * links of each: the fields of 32 SDK spans, their events', links' and
 * attribute dicts and values take well under the 1 MiB of a core's L2 on the
 * machines measured. */
enum { WARM_SPANS = 32, WARM_ITEMS = 4 };
#define WARM_LISTS (2 * WARM_SPANS)
#define WARM_ITEM_MAX (WARM_LISTS * WARM_ITEMS)
#define WARM_ATTRIBUTES (WARM_SPANS + WARM_ITEM_MAX)

#ifdef SP_INSTANCE_VALUES_IN_PLACE
/* The sdk_field_names entries worth loading ahead: the objects of each span
 * (the resource, scope and kind are shared by a batch). */
enum { WARM_CONTEXT = 0, WARM_ATTRIBUTES_FIELD = 1, WARM_EVENTS = 2, WARM_LINKS = 3 };
static const int warm_fields[] = {0 /* context */, 1 /* attributes */, 2 /* events */,
                                  3 /* links */,   7 /* status */,     8 /* parent */,
                                  9 /* name */,    10 /* start */,     11 /* end */};

/* An object's values array in place when `where` knows its class as it is
 * now (else NULL); reads only the object and its class, runs no code. */
static inline PyObject *const *
warm_values(const OtelMapper *m, const InPlaceFields *where, PyObject *obj, Py_ssize_t *capacity)
{
    PyTypeObject *type = Py_TYPE(obj);
    if (where->keys == NULL || type != where->type ||
        sp_type_version_tag(type) != where->version_tag ||
        where->keys != pyinstance_shared_keys(m->fast_paths, type)) {
        return NULL;
    }
    return pyinstance_values(obj, where->keys, capacity);
}

/* Prefetch the ids of `context` when it is the SDK's SpanContext. */
static inline void
warm_context_ids(const OtelMapper *m, PyObject *context)
{
    if (context != NULL && (PyObject *)Py_TYPE(context) == ITEM_TYPE(m, ITEM_SPAN_CONTEXT) &&
        PyTuple_GET_SIZE(context) == 6) {
        SP_PREFETCH(PyTuple_GET_ITEM(context, 0));
        SP_PREFETCH(PyTuple_GET_ITEM(context, 1));
    }
}

/* The value at field `k`'s position (`where->position[k]`) in a values
 * array, or NULL. */
static inline PyObject *
warm_at(const InPlaceFields *where, int k, PyObject *const *values, Py_ssize_t capacity)
{
    Py_ssize_t position = where->position[k];
    return values != NULL && position >= 0 && position < capacity ? values[position] : NULL;
}

#endif

/* Start loading what mapping spans [first, end) of a batch reads, level by
 * level: the span objects, their values arrays, their fields' objects, the
 * context's ids, the events' and links' deques and items (the first
 * WARM_ITEMS of each), their fields, and every attributes object's values
 * array, dict, table, values and text.  Mapping a span follows chains of
 * pointers six to ten deep, and once other code has run since the spans were
 * made (an exporter's batch waits; the benchmarks collect garbage between
 * calls) each link is a cache miss the mapping would wait for in turn; here
 * each level's loads of all the spans are in flight together.  Only hints: it
 * reads through the classes the mapper has found as they are (the first span
 * is mapped before any is warmed), runs no Python code, takes no reference
 * it keeps, and a span of another shape is left to the mapping. */
static void
batch_warm(const OtelMapper *m, PyObject *const *spans, Py_ssize_t first, Py_ssize_t end)
{
#ifdef SP_INSTANCE_VALUES_IN_PLACE
    PyObject *const *values[WARM_SPANS];
    Py_ssize_t capacity[WARM_SPANS];
    PyObject *lists[WARM_LISTS];
    unsigned char list_is_links[WARM_LISTS];
    PyObject *items[WARM_ITEM_MAX];
    unsigned char item_is_link[WARM_ITEM_MAX];
    PyObject *const *item_values[WARM_ITEM_MAX];
    Py_ssize_t item_capacity[WARM_ITEM_MAX];
    PyObject *attributes[WARM_ATTRIBUTES];
    int list_count = 0, item_count = 0, attribute_count = 0;
    const InPlaceFields *fields = &m->span_fields;
    Py_ssize_t count = end - first;
    spans += first;
    if (fields->keys == NULL || count <= 0 || count > WARM_SPANS) {
        return;
    }
    /* 1: the span objects, and their values pointer (up to 3.12: before the
     * object) or values (from 3.13: after it). */
    for (Py_ssize_t i = 0; i < count; i++) {
        SP_PREFETCH(spans[i]);
        pyinstance_prefetch_values(spans[i], fields->type);
    }
    /* 2: their values arrays. */
    for (Py_ssize_t i = 0; i < count; i++) {
        values[i] = warm_values(m, fields, spans[i], &capacity[i]);
        if (values[i] != NULL) {
            SP_PREFETCH(values[i]);
            sp_prefetch_at(values[i], 64);
        }
    }
    /* 3: their fields' objects. */
    for (Py_ssize_t i = 0; i < count; i++) {
        for (size_t k = 0; k < sizeof warm_fields / sizeof warm_fields[0]; k++) {
            PyObject *field = warm_at(fields, warm_fields[k], values[i], capacity[i]);
            if (field != NULL) {
                SP_PREFETCH(field);
            }
        }
    }
    /* 4: the context's ids; the events' and links' values arrays; the
     * attributes objects to follow. */
    PyObject *list_type = PLAN(m, PLAN_BOUNDED_LIST);
    for (Py_ssize_t i = 0; i < count; i++) {
        warm_context_ids(m, warm_at(fields, WARM_CONTEXT, values[i], capacity[i]));
        PyObject *own = warm_at(fields, WARM_ATTRIBUTES_FIELD, values[i], capacity[i]);
        if (own != NULL) {
            attributes[attribute_count++] = own;
        }
        for (int k = WARM_EVENTS; k <= WARM_LINKS; k++) {
            PyObject *list = warm_at(fields, k, values[i], capacity[i]);
            Py_ssize_t size;
            PyObject *const *list_values = list != NULL && (PyObject *)Py_TYPE(list) == list_type
                                               ? warm_values(m, &m->list_fields, list, &size)
                                               : NULL;
            if (list_values != NULL) {
                SP_PREFETCH(list_values);
                list_is_links[list_count] = k == WARM_LINKS;
                lists[list_count++] = list;
            }
        }
    }
    /* 5: the deques the lists keep. */
    for (int l = 0; l < list_count; l++) {
        Py_ssize_t size;
        PyObject *const *list_values = warm_values(m, &m->list_fields, lists[l], &size);
        lists[l] = warm_at(&m->list_fields, 0, list_values, size);
        if (lists[l] != NULL) {
            SP_PREFETCH(lists[l]);
        }
    }
    /* 6: their first items (collections.deque's own item lookup: no code
     * runs, and the deque holds each item once our reference is dropped). */
    PyObject *deque_type = m->state->deque_type;
    for (int l = 0; l < list_count; l++) {
        PyObject *deque = lists[l];
        if (deque == NULL || (PyObject *)Py_TYPE(deque) != deque_type) {
            continue;
        }
        Py_ssize_t length = Py_SIZE(deque) < WARM_ITEMS ? Py_SIZE(deque) : WARM_ITEMS;
        for (Py_ssize_t j = 0; j < length; j++) {
            PyObject *item = PySequence_GetItem(deque, j);
            if (item == NULL) {
                PyErr_Clear();
                break;
            }
            Py_DECREF(item);
            SP_PREFETCH(item);
            item_is_link[item_count] = list_is_links[l];
            items[item_count++] = item;
        }
    }
    /* 7: the items' values arrays (the SDK's Event and Link). */
    for (int j = 0; j < item_count; j++) {
        const InPlaceFields *where =
            item_is_link[j] ? &m->link_fields[LINK_ATTRIBUTES] : &m->event_fields[EVENT_ATTRIBUTES];
        item_values[j] = warm_values(m, where, items[j], &item_capacity[j]);
        if (item_values[j] != NULL) {
            SP_PREFETCH(item_values[j]);
        }
    }
    /* 8: the items' fields: an event's name and time, a link's context, and
     * the attributes of both. */
    for (int j = 0; j < item_count; j++) {
        const InPlaceFields *attributes_at =
            item_is_link[j] ? &m->link_fields[LINK_ATTRIBUTES] : &m->event_fields[EVENT_ATTRIBUTES];
        PyObject *own = warm_at(attributes_at, 0, item_values[j], item_capacity[j]);
        if (own != NULL) {
            SP_PREFETCH(own);
            attributes[attribute_count++] = own;
        }
        PyObject *other[2] = {NULL, NULL};
        const InPlaceFields *other_at[2] = {
            item_is_link[j] ? &m->link_fields[LINK_CONTEXT] : &m->event_fields[EVENT_NAME],
            item_is_link[j] ? NULL : &m->event_fields[EVENT_TIMESTAMP]};
        for (int k = 0; k < 2; k++) {
            /* (Each field's position found for the item's class, on the same keys.) */
            if (other_at[k] != NULL && other_at[k]->type == Py_TYPE(items[j]) &&
                other_at[k]->keys == attributes_at->keys) {
                other[k] = warm_at(other_at[k], 0, item_values[j], item_capacity[j]);
            }
        }
        for (int k = 0; k < 2; k++) {
            if (other[k] != NULL) {
                SP_PREFETCH(other[k]);
            }
        }
        items[j] = item_is_link[j] ? other[0] : NULL; /* a link's context, for 9 */
    }
    /* 9: the attributes' values arrays (the SDK's BoundedAttributes), a
     * plain dict as it is; a link context's ids. */
    PyObject *attributes_type = PLAN(m, PLAN_BOUNDED_ATTRIBUTES);
    for (int j = 0; j < item_count; j++) {
        warm_context_ids(m, items[j]);
    }
    for (int a = 0; a < attribute_count; a++) {
        Py_ssize_t size;
        PyObject *const *own_values =
            (PyObject *)Py_TYPE(attributes[a]) == attributes_type
                ? warm_values(m, &m->attributes_fields, attributes[a], &size)
                : NULL;
        if (own_values != NULL) {
            SP_PREFETCH(own_values);
        }
        else if (!PyDict_CheckExact(attributes[a])) {
            attributes[a] = NULL;
        }
    }
    /* 10: their dicts. */
    for (int a = 0; a < attribute_count; a++) {
        if (attributes[a] != NULL && !PyDict_CheckExact(attributes[a])) {
            Py_ssize_t size;
            PyObject *const *own_values =
                warm_values(m, &m->attributes_fields, attributes[a], &size);
            attributes[a] = warm_at(&m->attributes_fields, 0, own_values, size);
            if (attributes[a] != NULL) {
                SP_PREFETCH(attributes[a]);
            }
        }
    }
    /* 11-13: the dicts' tables, entries, values and text (the keys are
     * shared by the batch). */
    dicts_prefetch_levels(m->fast_paths, attributes, attribute_count, 0);
#else
    (void)m;
    (void)spans;
    (void)first;
    (void)end;
#endif
}

static int
time_ns(PyObject *value, long long *out)
{
    if (value == Py_None) {
        *out = 0;
        return 1;
    }
    int overflow = 0;
    *out = PyLong_AsLongLongAndOverflow(value, &overflow);
    if (*out == -1 && PyErr_Occurred()) {
        return -1;
    }
    return overflow ? 0 : 1;
}

/* A tag of rules 8-11 on a meta that holds the resource's and the scope's
 * tags already: the agent sets it before those, so a scope tag of the key
 * stands, and a resource tag of the key stands unless the key is guarded
 * (rule 12: the earlier non-empty value is kept). */
static int
set_early(OtelMapper *m, PyObject *meta, PyObject *res, PyObject *scope, PyObject *key,
          PyObject *text)
{
    int held = PyDict_Contains(PyTuple_GET_ITEM(scope, 0), key);
    if (held != 0) {
        return held < 0 ? -1 : 0;
    }
    int guarded = PySet_Contains(PLAN(m, PLAN_GUARDED), key);
    if (guarded < 0) {
        return -1;
    }
    if (!guarded && (held = PyDict_Contains(PyTuple_GET_ITEM(res, RES_META), key)) != 0) {
        return held < 0 ? -1 : 0;
    }
    return PyDict_SetItem(meta, key, text);
}

/* Rule 11: attrs[name] as the tag key, when not empty. */
static int
set_early_if_found(OtelMapper *m, PyObject *meta, PyObject *res, PyObject *scope, PyObject *attrs,
                   int name, int key)
{
    int found;
    PyObject *text = attr_text(m, attrs, name, &found);
    if (text == NULL) {
        return PyErr_Occurred() ? -1 : 0;
    }
    int rc = is_empty_text(text) ? 0 : set_early(m, meta, res, scope, NAME(m, key), text);
    Py_DECREF(text);
    return rc;
}

/* The meta every span of this resource and scope starts from (borrowed):
 * the resource's tags, the scope's, then the scope's name and version tags
 * (set again after the span's attributes: scope_tail_set). */
static PyObject *
base_meta(OtelMapper *m, PyObject *res, PyObject *scope)
{
    if (m->base_meta == NULL || m->base_made != m->values_made) {
        /* Made at the size a span's meta grows to (each span's is a copy, at
         * this size): filling it entry by entry keeps that size, where an
         * update of an empty dict would take the source's. */
        PyObject *sources[3] = {PyTuple_GET_ITEM(res, RES_META), PyTuple_GET_ITEM(scope, 0),
                                PyTuple_GET_ITEM(scope, 1)};
        PyObject *base =
            _PyDict_NewPresized(PyDict_GET_SIZE(sources[0]) + PyDict_GET_SIZE(sources[1]) +
                                PyDict_GET_SIZE(sources[2]) + SPAN_META_ROOM);
        for (int i = 0; i < 3 && base != NULL; i++) {
            Py_ssize_t position = 0;
            PyObject *key, *value;
            while (base != NULL && PyDict_Next(sources[i], &position, &key, &value)) {
                Py_INCREF(key);
                Py_INCREF(value);
                if (PyDict_SetItem(base, key, value) < 0) {
                    Py_CLEAR(base);
                }
                Py_DECREF(key);
                Py_DECREF(value);
            }
        }
        if (base == NULL) {
            return NULL;
        }
        Py_XSETREF(m->base_meta, base);
        m->base_made = m->values_made;
    }
    return m->base_meta;
}

/* The scope's name and version tags (`tail`) over whatever the span's
 * attributes set under their keys: meta.update(tail), where meta holds them
 * already (base_meta), so only a value an attribute replaced is set. */
static int
scope_tail_set(PyObject *meta, PyObject *tail)
{
    Py_ssize_t position = 0;
    PyObject *key, *value;
    while (PyDict_Next(tail, &position, &key, &value)) {
        PyObject *held = PyDict_GetItemWithError(meta, key);
        if (held == NULL && PyErr_Occurred()) {
            return -1;
        }
        if (held != value && PyDict_SetItem(meta, key, value) < 0) {
            return -1;
        }
    }
    return 0;
}

/* The dict span's keys, in the order spanpack's encoder documents them. */
static const int span_keys[OS_FIELD_COUNT] = {
    [OS_TRACE_ID] = F_TRACE_ID,   [OS_SPAN_ID] = F_SPAN_ID,   [OS_PARENT_ID] = F_PARENT_ID,
    [OS_SERVICE] = F_SERVICE,     [OS_NAME] = F_NAME,         [OS_RESOURCE] = F_RESOURCE,
    [OS_SPAN_TYPE] = F_SPAN_TYPE, [OS_START_NS] = F_START_NS, [OS_DURATION_NS] = F_DURATION_NS,
    [OS_ERROR] = F_ERROR,         [OS_META] = F_META,         [OS_METRICS] = F_METRICS,
    [OS_LINKS] = F_LINKS,         [OS_EVENTS] = F_EVENTS};
/* The keys every dict span has (links and events only when it has some). */
#define SPAN_KEYS_ALWAYS OS_LINKS

static PyObject *
span_template_new(PyObject *names)
{
    PyObject *template = PyDict_New();
    if (template == NULL) {
        return NULL;
    }
    for (int i = 0; i < SPAN_KEYS_ALWAYS; i++) {
        if (PyDict_SetItem(template, PyTuple_GET_ITEM(names, span_keys[i]), Py_None) < 0) {
            Py_DECREF(template);
            return NULL;
        }
    }
    return template;
}

/* The mapped span (into *out): an OtelSpan (m->objects), else a dict span
 * whose keys are the module's interned field names.  `links` and `events`
 * are the converted lists, or NULL when the span has none. */
static int
span_build(OtelMapper *m, SdkFields *f, PyObject *service, PyObject *name, PyObject *resource,
           PyObject *type, long long start, long long end, long long error, PyObject *meta,
           PyObject *metrics, PyObject *links, PyObject *events, PyObject **out)
{
    PyObject *start_ns = PyLong_FromLongLong(start);
    PyObject *duration_ns = PyLong_FromLongLong(end > start ? end - start : 0);
    PyObject *error_flag = PyLong_FromLongLong(error);
    PyObject *made = NULL;
    int rc = -1;
    if (start_ns == NULL || duration_ns == NULL || error_flag == NULL) {
        goto done;
    }
    PyObject *parent_id = f->parent == Py_None ? m->zero : PyTuple_GET_ITEM(f->parent, 1);
    PyObject *values[OS_FIELD_COUNT] = {
        [OS_TRACE_ID] = PyTuple_GET_ITEM(f->context, 0),
        [OS_SPAN_ID] = PyTuple_GET_ITEM(f->context, 1),
        [OS_PARENT_ID] = parent_id,
        [OS_SERVICE] = service,
        [OS_NAME] = name,
        [OS_RESOURCE] = resource,
        [OS_SPAN_TYPE] = type,
        [OS_START_NS] = start_ns,
        [OS_DURATION_NS] = duration_ns,
        [OS_ERROR] = error_flag,
        [OS_META] = meta,
        [OS_METRICS] = metrics,
        [OS_LINKS] = links,
        [OS_EVENTS] = events,
    };
    if (m->objects) {
        made = otel_span_new(m->state, values);
        if (made == NULL) {
            goto done;
        }
    }
    else {
        /* A copy of the template is made at its final size in one step. */
        made = PyDict_Copy(m->span_template);
        if (made == NULL) {
            goto done;
        }
        for (int i = 0; i < OS_FIELD_COUNT; i++) {
            if (values[i] != NULL && PyDict_SetItem(made, NAME(m, span_keys[i]), values[i]) < 0) {
                goto done;
            }
        }
    }
    *out = made;
    made = NULL;
    rc = 0;
done:
    Py_XDECREF(made);
    Py_XDECREF(start_ns);
    Py_XDECREF(duration_ns);
    Py_XDECREF(error_flag);
    return rc;
}

/* One span: a new dict span, Py_None (new reference) when Python must map
 * it, NULL on error. */
static PyObject *
map_span(OtelMapper *m, PyObject *span)
{
    SdkFields f = {0};
    PyObject *result = NULL, *meta = NULL, *metrics = NULL;
    PyObject *service = NULL, *name = NULL, *resource = NULL, *type = NULL, *text = NULL;
    PyObject *events = NULL, *links = NULL, *converted_links = NULL, *converted_events = NULL;
    int found;

    if ((PyObject *)Py_TYPE(span) != m->last_type) {
        PyTypeObject *span_type = (PyTypeObject *)Py_NewRef((PyObject *)Py_TYPE(span));
        int readable = sdk_span_class(m, span_type);
        Py_XSETREF(m->last_type, (PyObject *)span_type);
        m->last_type_readable = readable;
    }
    if (!m->last_type_readable) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    int read = sdk_fields_read(m, span, &f);
    if (read <= 0) {
        result = read < 0 ? NULL : Py_NewRef(Py_None);
        goto done;
    }
    int kind = member_index(m, PLAN_KINDS, f.kind);
    int status = member_index(m, PLAN_STATUSES, f.status_code);
    if ((events = list_items(m, f.events)) == NULL || (links = list_items(m, f.links)) == NULL) {
        goto done;
    }
    Py_ssize_t event_count = items_length(events), link_count = items_length(links);
    if (event_count < 0 || link_count < 0) {
        goto done;
    }
    long long start, end;
    int start_ok = time_ns(f.start, &start), end_ok = time_ns(f.end, &end);
    if (start_ok < 0 || end_ok < 0) {
        goto done;
    }
    if (kind < 0 || status < 0 || !start_ok || !end_ok) {
        result = Py_NewRef(Py_None); /* the rules in Python */
        goto done;
    }
    PyObject *res = values_for(m, f.resource, &m->last_resource, &m->resource_values,
                               PLAN_RESOURCE_VALUES, RES_SIZE);
    PyObject *scope =
        values_for(m, f.scope, &m->last_scope, &m->scope_values, PLAN_SCOPE_VALUES, 2);
    if (res == NULL || scope == NULL) {
        goto done;
    }
    PyObject *attrs = f.attributes;
    PyObject *base = base_meta(m, res, scope);
    if (base == NULL || rule_values_read(m, attrs) < 0 || (meta = PyDict_Copy(base)) == NULL ||
        (metrics = PyDict_New()) == NULL) {
        goto done;
    }

    /* Rules 3, 8, 21: the datadog.* attributes first. */
    long long error = status == STATUS_ERROR;
    {
        int present;
        long long number;
        int got = attr_number(m, attrs, DATADOG_ERROR, &present, &number);
        if (got < 0) {
            goto done;
        }
        if (got > 0) {
            error = number;
        }
    }
    static const int dd_fields[] = {DATADOG_SERVICE, DATADOG_NAME, DATADOG_RESOURCE, DATADOG_TYPE};
    PyObject **dd_values[] = {&service, &name, &resource, &type};
    for (int i = 0; i < 4; i++) {
        PyObject *value = attr_text(m, attrs, dd_fields[i], &found);
        if (value == NULL && PyErr_Occurred()) {
            goto done;
        }
        if (value != NULL && is_empty_text(value)) {
            Py_CLEAR(value);
        }
        *dd_values[i] = value;
    }
    if ((text = attr_text(m, attrs, DATADOG_SPAN_KIND, &found)) == NULL && PyErr_Occurred()) {
        goto done;
    }
    if (set_early(m, meta, res, scope, NAME(m, K_SPAN_KIND),
                  text != NULL ? text : NAME(m, kind_names[kind])) < 0) {
        goto done;
    }
    Py_CLEAR(text);

    /* Rules 4-7. */
    if (service == NULL) {
        if ((text = attr_text(m, attrs, SERVICE_NAME, &found)) == NULL && PyErr_Occurred()) {
            goto done;
        }
        if (text != NULL && !is_empty_text(text)) {
            service = text;
            text = NULL;
        }
        else {
            PyObject *from_resource = PyTuple_GET_ITEM(res, RES_SERVICE);
            service = Py_NewRef(is_empty_text(from_resource) ? NAME(m, V_DEFAULT_SERVICE)
                                                             : from_resource);
        }
        Py_CLEAR(text);
    }
    if (name == NULL) {
        name = attr_text(m, attrs, OPERATION_NAME, &found);
        if (name == NULL && (PyErr_Occurred() || (name = operation_name(m, attrs, kind)) == NULL)) {
            goto done;
        }
    }
    if (resource == NULL && (resource = resource_name(m, res, attrs, kind, f.name)) == NULL) {
        goto done;
    }
    if (type == NULL && (type = span_type(m, res, attrs, kind)) == NULL) {
        goto done;
    }

    /* Rule 9. */
    {
        static const int code_names[] = {DATADOG_HTTP_STATUS_CODE, HTTP_RESPONSE_STATUS_CODE,
                                         HTTP_STATUS_CODE};
        long long code = 0;
        for (int i = 0; i < 3; i++) {
            int present;
            long long number;
            int got = attr_number(m, attrs, code_names[i], &present, &number);
            if (got < 0) {
                goto done;
            }
            if (got > 0 && number >= 0 && number <= 0xFFFFFFFFLL) {
                code = number;
                break;
            }
            if (present && i == 0) {
                break; /* the Datadog attribute decides even when it is no number */
            }
        }
        if (code != 0) {
            char digits[24];
            const char *start = decimal64_put(digits + sizeof digits, (uint64_t)code);
            PyObject *code_text =
                PyUnicode_FromStringAndSize(start, digits + sizeof digits - start);
            int rc = code_text == NULL
                         ? -1
                         : set_early(m, meta, res, scope, NAME(m, HTTP_STATUS_CODE), code_text);
            Py_XDECREF(code_text);
            if (rc < 0) {
                goto done;
            }
        }
    }
    /* Rule 10. */
    {
        int present;
        long long number = 0;
        int got = attr_number(m, attrs, DD_MEASURED, &present, &number);
        if (got < 0) {
            goto done;
        }
        if (((got > 0 && number == 1) || kind == KIND_CLIENT || kind == KIND_PRODUCER) &&
            set_float(metrics, NAME(m, DD_MEASURED), 1.0) < 0) {
            goto done;
        }
    }
    /* Rule 11. */
    static const int dd_tags[][2] = {
        {DATADOG_ENV, K_ENV},
        {DATADOG_VERSION, K_VERSION},
        {DATADOG_HTTP_STATUS_CODE, HTTP_STATUS_CODE},
        {DATADOG_ERROR_MSG, K_ERROR_MESSAGE},
        {DATADOG_ERROR_TYPE, K_ERROR_TYPE},
        {DATADOG_ERROR_STACK, K_ERROR_STACK},
    };
    for (int i = 0; i < 6; i++) {
        if (set_early_if_found(m, meta, res, scope, attrs, dd_tags[i][0], dd_tags[i][1]) < 0) {
            goto done;
        }
    }
    /* Rules 12-13 (the resource's and the scope's tags are in meta already):
     * the resource's metrics, the trace id, version. */
    {
        if (PyDict_Update(metrics, PyTuple_GET_ITEM(res, RES_METRICS)) < 0) {
            goto done;
        }
        PyObject *trace_id = PyTuple_GET_ITEM(f.context, 0);
        if (trace_id != m->last_trace_id) {
            /* (a batch's spans come trace by trace: one text per trace) */
            uint64_t low, high;
            int wide = pyint_u128(m->fast_paths, trace_id, &high, &low);
            if (wide < 0) {
                goto done;
            }
            if (wide) { /* not a 128-bit id: the rules in Python say what it becomes */
                result = Py_NewRef(Py_None);
                goto done;
            }
            char hex[32];
            hex64_put(hex, high);
            hex64_put(hex + 16, low);
            PyObject *hex_text = PyUnicode_FromStringAndSize(hex, 32);
            if (hex_text == NULL) {
                goto done;
            }
            Py_XSETREF(m->trace_id_hex, hex_text);
            Py_XSETREF(m->last_trace_id, Py_NewRef(trace_id));
        }
        if (PyDict_SetItem(meta, NAME(m, K_OTEL_TRACE_ID), m->trace_id_hex) < 0) {
            goto done;
        }
        PyObject *version = PyTuple_GET_ITEM(res, RES_VERSION);
        int has_version = PyDict_Contains(meta, NAME(m, K_VERSION));
        if (has_version < 0 || (!has_version && !is_empty_text(version) &&
                                PyDict_SetItem(meta, NAME(m, K_VERSION), version) < 0)) {
            goto done;
        }
    }
    /* Rules 14-15. */
    if (map_attributes(m, attrs, meta, metrics) < 0) {
        goto done;
    }
    /* Rule 16. */
    {
        int has_env = PyDict_Contains(meta, NAME(m, K_ENV));
        if (has_env < 0) {
            goto done;
        }
        if (!has_env) {
            static const int env_names[] = {DATADOG_ENV};
            PyObject *env = resource_then_span(m, res, attrs, env_names, 1);
            if (env == NULL) {
                goto done;
            }
            if (is_empty_text(env)) {
                Py_SETREF(env, Py_NewRef(PyTuple_GET_ITEM(res, RES_ENV)));
            }
            int rc = is_empty_text(env) ? 0 : PyDict_SetItem(meta, NAME(m, K_ENV), env);
            Py_DECREF(env);
            if (rc < 0) {
                goto done;
            }
        }
    }
    /* Rule 17. */
    if (event_count > 0) {
        int exception = has_exception_event(m, events);
        if (exception < 0 ||
            (exception && PyDict_SetItem(meta, NAME(m, K_HAS_EXCEPTION), NAME(m, V_TRUE)) < 0)) {
            goto done;
        }
    }
    /* Rules 18-20. */
    {
        PyObject *state = PyTuple_GET_ITEM(f.context, 4);
        if (state != Py_None) {
            PyObject *header = trace_state_header(m, state);
            if (header != NULL && !PyUnicode_Check(header)) {
                PyErr_SetString(PyExc_TypeError, "spanpack.otel: a trace state header must be str");
                Py_CLEAR(header);
            }
            int rc = header == NULL
                         ? -1
                         : (is_empty_text(header)
                                ? 0
                                : PyDict_SetItem(meta, NAME(m, K_W3C_TRACESTATE), header));
            Py_XDECREF(header);
            if (rc < 0) {
                goto done;
            }
        }
        if (scope_tail_set(meta, PyTuple_GET_ITEM(scope, 1)) < 0 ||
            PyDict_SetItem(meta, NAME(m, K_OTEL_STATUS_CODE), NAME(m, status_names[status])) < 0) {
            goto done;
        }
    }
    /* Rule 22. */
    {
        int all_set = 1;
        static const int error_keys[] = {K_ERROR_MESSAGE, K_ERROR_TYPE, K_ERROR_STACK};
        for (int i = 0; i < 3 && all_set; i++) {
            int has = PyDict_Contains(meta, NAME(m, error_keys[i]));
            if (has < 0) {
                goto done;
            }
            all_set = has;
        }
        PyObject *description = f.description;
        int described =
            description != Py_None && PyUnicode_Check(description) && !is_empty_text(description);
        if (status == STATUS_ERROR) {
            if (described &&
                PyDict_SetItem(meta, NAME(m, K_OTEL_STATUS_DESCRIPTION), description) < 0) {
                goto done;
            }
            if (!all_set) {
                error = 1;
                if ((event_count > 0 && exception_tags(m, events, meta) < 0) ||
                    status_error(m, meta, description) < 0) {
                    goto done;
                }
            }
        }
        else if (!all_set) {
            error = 0;
        }
    }

    /* Rules 23-24. */
    if ((link_count > 0 && (converted_links = items_converted(m, PLAN_LINKS, links)) == NULL) ||
        (event_count > 0 && (converted_events = items_converted(m, PLAN_EVENTS, events)) == NULL)) {
        goto done;
    }
    if (span_build(m, &f, service, name, resource, type, start, end, error, meta, metrics,
                   converted_links, converted_events, &result) < 0) {
        goto done;
    }
done:
    Py_XDECREF(converted_links);
    Py_XDECREF(converted_events);
    Py_XDECREF(text);
    Py_XDECREF(service);
    Py_XDECREF(name);
    Py_XDECREF(resource);
    Py_XDECREF(type);
    Py_XDECREF(meta);
    Py_XDECREF(metrics);
    Py_XDECREF(events);
    Py_XDECREF(links);
    rule_values_clear(m);
    sdk_fields_clear(&f);
    return result;
}

PyObject *
otel_map_spans(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 && nargs != 3) {
        PyErr_SetString(PyExc_TypeError,
                        "_otel_map_spans(spans, plan, as_objects=False) takes 2 or 3 arguments");
        return NULL;
    }
    int objects = nargs == 3 ? PyObject_IsTrue(args[2]) : 0;
    if (objects < 0) {
        return NULL;
    }
    PyObject *plan = args[1];
    if (!PyTuple_CheckExact(plan) || PyTuple_GET_SIZE(plan) != PLAN_SIZE ||
        !PyTuple_Check(PyTuple_GET_ITEM(plan, PLAN_KINDS)) ||
        PyTuple_GET_SIZE(PyTuple_GET_ITEM(plan, PLAN_KINDS)) != KIND_COUNT ||
        !PyTuple_Check(PyTuple_GET_ITEM(plan, PLAN_STATUSES)) ||
        PyTuple_GET_SIZE(PyTuple_GET_ITEM(plan, PLAN_STATUSES)) != STATUS_COUNT ||
        !PyDict_CheckExact(PyTuple_GET_ITEM(plan, PLAN_TAG_KEYS)) ||
        !PyTuple_CheckExact(PyTuple_GET_ITEM(plan, PLAN_SDK_SPAN)) ||
        PyTuple_GET_SIZE(PyTuple_GET_ITEM(plan, PLAN_SDK_SPAN)) != 3 ||
        !PyType_Check(PyTuple_GET_ITEM(PyTuple_GET_ITEM(plan, PLAN_SDK_SPAN), 0)) ||
        !PyTuple_CheckExact(PyTuple_GET_ITEM(PyTuple_GET_ITEM(plan, PLAN_SDK_SPAN), 1)) ||
        !PyTuple_CheckExact(PyTuple_GET_ITEM(PyTuple_GET_ITEM(plan, PLAN_SDK_SPAN), 2)) ||
        PyTuple_GET_SIZE(PyTuple_GET_ITEM(PyTuple_GET_ITEM(plan, PLAN_SDK_SPAN), 1)) !=
            PyTuple_GET_SIZE(PyTuple_GET_ITEM(PyTuple_GET_ITEM(plan, PLAN_SDK_SPAN), 2)) ||
        !PyDict_CheckExact(PyTuple_GET_ITEM(plan, PLAN_DB_TYPES)) ||
        !PyAnySet_Check(PyTuple_GET_ITEM(plan, PLAN_GUARDED)) ||
        !PyAnySet_Check(PyTuple_GET_ITEM(plan, PLAN_SPECIAL)) ||
        !PyTuple_CheckExact(PyTuple_GET_ITEM(plan, PLAN_ITEM_TYPES)) ||
        PyTuple_GET_SIZE(PyTuple_GET_ITEM(plan, PLAN_ITEM_TYPES)) != ITEM_TYPES_SIZE ||
        !PyTuple_CheckExact(PyTuple_GET_ITEM(plan, PLAN_ITEM_PROPERTIES)) ||
        PyTuple_GET_SIZE(PyTuple_GET_ITEM(plan, PLAN_ITEM_PROPERTIES)) !=
            LINK_FIELDS + EVENT_FIELDS) {
        PyErr_SetString(PyExc_TypeError, "_otel_map_spans: not a plan from spanpack.otel");
        return NULL;
    }
    PyObject *spans = PySequence_Fast(args[0], "spans must be a sequence");
    if (spans == NULL) {
        return NULL;
    }
    SpanpackState *state = spanpack_state_from_module(module);
    OtelMapper m = {.state = state,
                    .objects = objects,
                    .names = state->otel_names,
                    .rule_index = state->otel_rule_index,
                    .plan = plan,
                    .fast_paths = &state->fast_paths};
    Py_ssize_t count = PySequence_Fast_GET_SIZE(spans);
    PyObject *out = PyList_New(count);
    if (out == NULL || (!objects && (m.span_template = span_template_new(m.names)) == NULL) ||
        (m.zero = PyLong_FromLong(0)) == NULL) {
        goto error;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        /* Mapping a span may run Python code (a subclass's descriptor, the
         * events and links converters), which may change the caller's list. */
        if (PySequence_Fast_GET_SIZE(spans) != count) {
            PyErr_SetString(PyExc_RuntimeError, "spanpack.otel: spans changed size during mapping");
            goto error;
        }
        /* Chunks of spans warmed from the second on, once the first has
         * had the mapper find its classes. */
        if (i % WARM_SPANS == 1) {
            batch_warm(&m, PySequence_Fast_ITEMS(spans), i,
                       i + WARM_SPANS < count ? i + WARM_SPANS : count);
        }
        PyObject *span = Py_NewRef(PySequence_Fast_GET_ITEM(spans, i));
        PyObject *mapped = map_span(&m, span);
        Py_DECREF(span);
        if (mapped == NULL) {
            goto error;
        }
        PyList_SET_ITEM(out, i, mapped);
    }
    mapper_clear(&m);
    Py_DECREF(spans);
    return out;
error:
    mapper_clear(&m);
    Py_XDECREF(out);
    Py_DECREF(spans);
    return NULL;
}

/* ---------------------------------------------------------------------------
 * Traces of a batch (spanpack.otel.map_spans' grouping, its reference in
 * Python: _group_traces, _set_priority, _local_root) */

/* A mapped span's `field` (borrowed): an OtelSpan's slot, or a dict span's
 * value of the field's key; NULL with KeyError when absent, as dd_span[key]
 * would raise. */
static PyObject *
span_item(OtelMapper *m, PyObject *dd_span, OtelSpanField field)
{
    PyObject *key = NAME(m, span_keys[field]);
    PyObject *value = Py_TYPE(dd_span) == m->state->otel_span_type
                          ? otel_span_field(dd_span, field)
                          : PyDict_GetItemWithError(dd_span, key);
    if (value == NULL && !PyErr_Occurred()) {
        PyErr_SetObject(PyExc_KeyError, key);
    }
    return value;
}

/* The position of the trace's local root: its first span whose parent is
 * not in the trace, else 0.  -1 on error. */
static Py_ssize_t
local_root(OtelMapper *m, PyObject *trace)
{
    Py_ssize_t count = PyList_GET_SIZE(trace);
    if (count <= 1) {
        return 0;
    }
    Py_ssize_t root = -1;
    PyObject *ids = PySet_New(NULL);
    for (Py_ssize_t i = 0; ids != NULL && i < count; i++) {
        PyObject *span_id = span_item(m, PyList_GET_ITEM(trace, i), OS_SPAN_ID);
        if (span_id == NULL || PySet_Add(ids, span_id) < 0) {
            Py_CLEAR(ids);
        }
    }
    for (Py_ssize_t i = 0; ids != NULL && root < 0 && i < count; i++) {
        PyObject *parent = span_item(m, PyList_GET_ITEM(trace, i), OS_PARENT_ID);
        int inside = parent == NULL ? -1 : PySet_Contains(ids, parent);
        if (inside < 0) {
            Py_CLEAR(ids);
        }
        else if (!inside) {
            root = i;
        }
    }
    if (ids == NULL) {
        return -1;
    }
    Py_DECREF(ids);
    return root < 0 ? 0 : root;
}

/* The trace's sampling priority (the last of its spans' `key` metrics,
 * else `fallback`) set on its local root.  0, or -1 with an error. */
static int
priority_set(OtelMapper *m, PyObject *trace, PyObject *key, PyObject *fallback)
{
    PyObject *priority = Py_NewRef(fallback), *metrics;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(trace); i++) {
        if ((metrics = span_item(m, PyList_GET_ITEM(trace, i), OS_METRICS)) == NULL) {
            goto error;
        }
        if (!PyDict_Check(metrics)) {
            PyErr_Format(PyExc_TypeError,
                         "spanpack.otel: a span's metrics must be a dict, not %.200s",
                         Py_TYPE(metrics)->tp_name);
            goto error;
        }
        PyObject *found = PyDict_GetItemWithError(metrics, key);
        if (found == NULL && PyErr_Occurred()) {
            goto error;
        }
        if (found != NULL && found != Py_None) {
            Py_SETREF(priority, Py_NewRef(found));
        }
    }
    Py_ssize_t root = local_root(m, trace);
    metrics = root < 0 ? NULL : span_item(m, PyList_GET_ITEM(trace, root), OS_METRICS);
    if (metrics == NULL || PyObject_SetItem(metrics, key, priority) < 0) {
        goto error;
    }
    Py_DECREF(priority);
    return 0;
error:
    Py_DECREF(priority);
    return -1;
}

PyObject *
otel_group_traces(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3 || !PyList_CheckExact(args[0]) || !PyUnicode_CheckExact(args[1])) {
        PyErr_SetString(PyExc_TypeError,
                        "_otel_group_traces(dd_spans: list, priority_key: str, default_priority)");
        return NULL;
    }
    SpanpackState *state = spanpack_state_from_module(module);
    OtelMapper m = {.state = state, .names = state->otel_names};
    PyObject *dd_spans = args[0], *key = args[1], *fallback = args[2];
    PyObject *by_trace = PyDict_New(), *traces = PyList_New(0);
    if (by_trace == NULL || traces == NULL) {
        goto error;
    }
    /* (A copy of the list: the loop reads it while lookups run.) */
    PyObject *spans = PyList_GetSlice(dd_spans, 0, PyList_GET_SIZE(dd_spans));
    if (spans == NULL) {
        goto error;
    }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(spans); i++) {
        PyObject *dd_span = PyList_GET_ITEM(spans, i);
        if (!PyDict_Check(dd_span) && Py_TYPE(dd_span) != state->otel_span_type) {
            PyErr_Format(PyExc_TypeError, "spanpack.otel: a mapped span expected, not %.200s",
                         Py_TYPE(dd_span)->tp_name);
            Py_DECREF(spans);
            goto error;
        }
        PyObject *trace_id = span_item(&m, dd_span, OS_TRACE_ID);
        PyObject *trace = trace_id == NULL ? NULL : PyDict_GetItemWithError(by_trace, trace_id);
        int rc = -1;
        if (trace != NULL) {
            rc = PyList_Append(trace, dd_span);
        }
        else if (trace_id != NULL && !PyErr_Occurred() && (trace = PyList_New(1)) != NULL) {
            PyList_SET_ITEM(trace, 0, Py_NewRef(dd_span));
            rc = PyDict_SetItem(by_trace, trace_id, trace) < 0 || PyList_Append(traces, trace) < 0
                     ? -1
                     : 0;
            Py_DECREF(trace);
        }
        if (rc < 0) {
            Py_DECREF(spans);
            goto error;
        }
    }
    Py_DECREF(spans);
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(traces); i++) {
        if (priority_set(&m, PyList_GET_ITEM(traces, i), key, fallback) < 0) {
            goto error;
        }
    }
    Py_DECREF(by_trace);
    return traces;
error:
    Py_XDECREF(by_trace);
    Py_XDECREF(traces);
    return NULL;
}
