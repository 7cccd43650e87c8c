/* Reading span fields straight from span objects.
 *
 * A span is a dict with the protocol's keys, or any object exposing the fields
 * as attributes (names configurable, e.g. ddtrace's `_meta`).  For each class,
 * where each field lives (a slot, the instance __dict__, a class attribute, a
 * property, or nowhere) is resolved once, as Python's attribute lookup would
 * resolve it, and each span is then read from there directly.  A field is
 * absent only when the object has no such attribute: an error raised by a
 * getter, AttributeError included, propagates. */
#ifndef SPANPACK_SPANFIELDS_H
#define SPANPACK_SPANFIELDS_H

#include "compat.h"
#include "layout_probes.h"

/* Every span field, in one table: its enum constant, its protocol name (also
 * the dict key and the name the encoder reads by default), the attribute of
 * ddtrace's pure-Python Span (4.x) that holds it with fields="ddtrace" (a
 * dotted path is followed step by step), and three flags:
 *   per_span:   read from every span (the other, origin, is a trace-level
 *               value, read from a trace's first span only); these form one
 *               run, SF_FIRST_PER_SPAN..SF_LAST_PER_SPAN (trace_id is read
 *               from every span to check it, though only the first span's is
 *               written, as ddtrace writes it; not where the class's getter
 *               always gives an int: SpanTypeLayout.trace_id_is_int);
 *   prefetched: a per-span field whose value is worth loading ahead (ids,
 *               times, text and tag dicts are distinct objects per span;
 *               error, meta_struct, links and events are nearly always shared
 *               singletons such as 0 or None);
 *   required:   a span without it is refused (fields="ddtrace" also requires
 *               meta and metrics: see spanfields_init).
 * The order is the enum's, and so the order fields are read in. */
/* clang-format off */
#define SPAN_FIELDS(X)                                                                             \
    /* constant      protocol name  ddtrace attribute    per_span prefetched required */            \
    X(SF_TRACE_ID,     "trace_id",    "trace_id",          1,       0,         1)                   \
    X(SF_SPAN_ID,      "span_id",     "span_id",           1,       1,         1)                   \
    X(SF_PARENT_ID,    "parent_id",   "parent_id",         1,       1,         0)                   \
    X(SF_SERVICE,      "service",     "service",           1,       1,         0)                   \
    X(SF_NAME,         "name",        "name",              1,       1,         1)                   \
    X(SF_RESOURCE,     "resource",    "resource",          1,       1,         0)                   \
    X(SF_SPAN_TYPE,    "span_type",   "span_type",         1,       1,         0)                   \
    X(SF_START,        "start_ns",    "start_ns",          1,       1,         1)                   \
    X(SF_DURATION,     "duration_ns", "duration_ns",       1,       1,         0)                   \
    X(SF_ERROR,        "error",       "error",             1,       0,         0)                   \
    X(SF_META,         "meta",        "_meta",             1,       1,         0)                   \
    X(SF_METRICS,      "metrics",     "_metrics",          1,       1,         0)                   \
    X(SF_META_STRUCT,  "meta_struct", "_meta_struct",      1,       0,         0)                   \
    X(SF_LINKS,        "links",       "_links",            1,       0,         0)                   \
    X(SF_EVENTS,       "events",      "_events",           1,       0,         0)                   \
    X(SF_ORIGIN,       "origin",      "context.dd_origin", 0,       0,         0)
/* clang-format on */

#define SF_ENUM_ENTRY(constant, name, ddtrace, per_span, prefetched, required) constant,
typedef enum { SPAN_FIELDS(SF_ENUM_ENTRY) SF_COUNT } SpanField;
#undef SF_ENUM_ENTRY

/* Bit i set for each field i with the flag (see SPAN_FIELDS). */
#define SF_FLAG_BIT_PER_SPAN(constant, name, ddtrace, per_span, prefetched, required)              \
    | ((uint32_t)(per_span) << (constant))
#define SF_FLAG_BIT_PREFETCHED(constant, name, ddtrace, per_span, prefetched, required)            \
    | ((uint32_t)(prefetched) << (constant))
#define SF_FLAG_BIT_REQUIRED(constant, name, ddtrace, per_span, prefetched, required)              \
    | ((uint32_t)(required) << (constant))
#define SF_PER_SPAN_FIELDS (0u SPAN_FIELDS(SF_FLAG_BIT_PER_SPAN))
#define SF_PREFETCHED_FIELDS (0u SPAN_FIELDS(SF_FLAG_BIT_PREFETCHED))
#define SF_REQUIRED_FIELDS (0u SPAN_FIELDS(SF_FLAG_BIT_REQUIRED))

/* The per-span fields as a range, for the loops that read every span. */
#define SF_FIRST_PER_SPAN SF_TRACE_ID
#define SF_LAST_PER_SPAN SF_EVENTS
#define SF_PER_SPAN_COUNT (SF_LAST_PER_SPAN - SF_FIRST_PER_SPAN + 1)

_Static_assert(SF_COUNT <= 32, "field sets are 32-bit masks");
_Static_assert(SF_PER_SPAN_FIELDS ==
                   (((2u << SF_LAST_PER_SPAN) - 1) & ~((1u << SF_FIRST_PER_SPAN) - 1)),
               "the per-span fields are SF_FIRST_PER_SPAN..SF_LAST_PER_SPAN");
_Static_assert((SF_PREFETCHED_FIELDS & ~SF_PER_SPAN_FIELDS) == 0,
               "only per-span fields are prefetched");

/* Protocol name of each field (also the dict key). */
/* ddtrace's SpanLink.to_dict and the functions it calls (spanfields_is_ddtrace_link). */
#define SF_LINK_FUNCTIONS 3

extern const char *const span_field_names[SF_COUNT];
/* ddtrace Span attribute of each field (fields="ddtrace"). */
extern const char *const span_field_ddtrace_attributes[SF_COUNT];

#define SPAN_LAYOUT_CACHE 4
#define SPAN_KEY_TABLE_SIZE 64 /* power of two, well above SF_COUNT */

/* Where instances of a class keep a field, decided once per class (and again
 * when the class changes), as Python's own attribute lookup would find it. */
typedef enum {
    FIELD_ABSENT,          /* no instance of the class can have it: costs nothing */
    FIELD_SLOT,            /* a __slots__ member at `offset` (an empty slot: absent) */
    FIELD_INSTANCE,        /* the instance __dict__, else a plain class attribute */
    FIELD_CLASS_VALUE,     /* a plain class attribute, and no instance __dict__ */
    FIELD_DESCRIPTOR,      /* a property or other descriptor: its getter is called */
    FIELD_GETSET,          /* a C type's getset descriptor, of a base of the class:
                            * its C getter is called directly */
    FIELD_GETATTR_STRICT,  /* getattr, every error propagates (a non-data
                            * descriptor the instance __dict__ may shadow) */
    FIELD_GETATTR,         /* getattr, AttributeError means absent: the class
                            * customises attribute access, or a dotted path */
    FIELD_ACCESSOR,        /* a method of the class called with the span alone
                            * (ddtrace's native spans: `_get_str_attributes()`),
                            * after its guard, when it has one, said yes */
    FIELD_ACCESSOR_LOOKUP, /* the same, the method found by attribute lookup
                            * on the span (a wrapped accessor, or a class
                            * whose instances may override it) */
} FieldSource;

typedef struct {
    FieldSource source;
    /* FIELD_DESCRIPTOR, FIELD_GETSET: the descriptor; FIELD_CLASS_VALUE: the value;
     * FIELD_ACCESSOR: the method; FIELD_ACCESSOR_LOOKUP: its name (strong
     * references); NULL otherwise. */
    PyObject *object;
    /* FIELD_ACCESSOR: the method that says whether there is a value at all
     * (`_has_links()`), called first; a false answer means absent;
     * FIELD_ACCESSOR_LOOKUP: its name (strong reference, or NULL: no guard). */
    PyObject *guard;
} FieldAccess;

typedef struct {
    PyTypeObject *type; /* strong reference; NULL when unused */
    unsigned int version_tag;
    /* Byte offsets of the service, name, resource and span_type slots (0:
     * not a slot), for spanfields_prefetch's peek: kept first and packed,
     * where the prefetcher reads them without a wide displacement. */
    Py_ssize_t peek_offset[4];
    /* The attribute names the accesses were resolved for: the reader's
     * `attribute`, or its `ddtrace_attribute` for ddtrace's own Span class
     * (recognised when no fields= is given). */
    PyObject *const *attributes;
    FieldAccess access[SF_COUNT];
    /* The classes of the objects in `access` that can change (heap types:
     * a descriptor class that loses __get__, a default's class that gains
     * it) and their version tags when resolved: a change to any of them
     * makes the layout stale, as a change to `type` itself does, and so does
     * an object given another class (strong references; watched_field: the
     * field whose access object each is the class of). */
    PyTypeObject *watched[SF_COUNT];
    unsigned int watched_tag[SF_COUNT];
    unsigned char watched_field[SF_COUNT];
    int watched_count;
    /* Byte offset of the field's slot in instances (FIELD_SLOT), else 0. */
    Py_ssize_t offset[SF_COUNT];
    /* Bit i set: field i is read by code that may run Python (anything but a
     * slot or an absent field). */
    uint32_t call_fields;
    /* FIELD_INSTANCE fields, which can also be read in place (pyinstance.h):
     * the class's shared keys (compared, never dereferenced unless they are
     * still the class's), how many names they held when resolved, and each
     * field's position there (-1: not there then). */
    uint32_t instance_fields;
    const void *shared_keys;
    Py_ssize_t shared_key_count;
    Py_ssize_t position[SF_COUNT];
    /* The per-span fields that cannot be read in place: call_fields less the
     * instance_fields (when there are any, the span goes through
     * read_span_calls_first). */
    uint32_t span_call_fields;
    /* The getter fields whose getter is a C function that can be called
     * straight (FIELD_GETSET, and FIELD_ACCESSOR methods without arguments
     * and their guards): its function (a getset's getter with its closure,
     * or a method's), owned by the descriptors the layout holds. */
    uint32_t direct_fields;
    /* trace_id is the getter of ddtrace's native SpanData (a Rust u128, so
     * always an int): a direct read skips the call, as only the first span's
     * value is written (read for the trace: trace_info_read) and the others'
     * are only checked to be ints; 0 otherwise. */
    int trace_id_is_int;
    /* ddtrace's Span whose `context` is ddtrace 4.16's lazy property (the
     * `_context` slot once set, else a context it builds and sets there):
     * the slot's byte offset, so that a set context is read without running
     * the property, with the property, its getter and the getter's code
     * when resolved (strong references: a property given another getter, or
     * a getter given other code, is run); 0 and NULL for any other class. */
    Py_ssize_t context_offset;
    PyObject *context_property;
    PyObject *context_getter;
    PyObject *context_code;
    getter direct_get[SF_COUNT];
    void *direct_closure[SF_COUNT];
    PyCFunction direct_method[SF_COUNT];
    PyCFunction direct_guard[SF_COUNT];
    /* The fields read by a getter: a descriptor's, the class's own attribute
     * access, or a class attribute (a value only the class gives).  Read
     * before any other field, as what a getter does to its span must show
     * in the fields read after it. */
    uint32_t getter_fields;
    /* The slot fields among the per-span ones, packed. */
    signed char slot_fields[SF_COUNT];
    int slot_field_count;
    /* The slot offsets of the per-span fields worth prefetching, packed for
     * spanfields_prefetch. */
    Py_ssize_t slot_offsets[SF_COUNT];
    int slot_count;
    /* Offsets (64-byte aligned) of the cache lines of an instance that hold
     * those slots. */
    Py_ssize_t line_offsets[SF_COUNT];
    int line_count;
    /* strict=True's check of this class, worked out at its first span: 1 when
     * none of its spans can carry anything unwritten (no instance dict, every
     * object slot of its MRO a field read), so there is nothing to check; 0
     * when each span is checked; -1 not worked out yet. */
    int strict_never_refuses;
} SpanTypeLayout;

/* What classify_attribute made of one attribute name on the last class
 * asked (strong references), kept while that class's version tag holds: the
 * attributes read once per trace (a span's context, the context's origin)
 * are then classified once, not at every trace. */
typedef struct {
    PyTypeObject *type;
    unsigned int version_tag;
    FieldAccess access;
    Py_ssize_t offset;
} AttributeMemo;

typedef struct {
    /* Attribute used for each field on objects: an interned str, or a tuple
     * of interned str for a dotted path such as "context.dd_origin". */
    PyObject *attribute[SF_COUNT];
    /* Key used for each field in dict spans (the protocol names, interned). */
    PyObject *dict_key[SF_COUNT];
    /* The same keys by address (open addressing; the field, or -1 for an
     * empty slot), to match a dict span's interned keys without lookups. */
    PyObject *key_by_address[SPAN_KEY_TABLE_SIZE];
    signed char field_by_address[SPAN_KEY_TABLE_SIZE];
    /* ddtrace's spans: when the span's `context` is ddtrace's own Context,
     * the origin is read from the context in hand: from its `_meta` dict,
     * which is what its dd_origin property returns, without running that
     * property, where dd_origin is a Python property (a pure-Python
     * Context) or the native getter that reads `_meta` (origin_read_from_meta),
     * else as its `dd_origin`.  The names, and the Context class once recognised (strong
     * reference; NULL otherwise) with which way it is read. */
    PyObject *context_name;
    PyObject *context_slot_name;
    PyObject *property_getter_name; /* "fget" */
    PyObject *context_meta_name;
    PyObject *context_origin_name;
    PyObject *origin_meta_key;
    PyTypeObject *ddtrace_context_type;
    int ddtrace_context_origin_in_meta;
    /* How each of those is read on the class last seen: the span's
     * `context` (where it is not the lazy property's slot), the context's
     * `_meta` and `dd_origin`, and the lazy property's `fget`. */
    AttributeMemo context_memo;
    AttributeMemo context_meta_memo;
    AttributeMemo context_origin_memo;
    AttributeMemo property_getter_memo;
    /* ddtrace's pure-Python SpanLink (4.2 and 4.3: a dataclass whose
     * to_dict() the link rules of links_events.c reproduce from its
     * fields), found by module, name, dataclass fields and its own
     * to_dict(): the last link class asked about (strong reference), its
     * version tag then (a class changed since is asked about again) and the
     * answer. */
    PyTypeObject *last_link_type;
    unsigned int last_link_version_tag;
    int last_link_is_ddtrace;
    /* When it is: its to_dict and the flatten_key_value and is_sequence
     * that calls (ddtrace's own functions, found in their modules' globals)
     * and their code then, checked again at each link, with their names. */
    PyObject *link_name[SF_LINK_FUNCTIONS];
    PyObject *link_function[SF_LINK_FUNCTIONS];
    PyObject *link_code[SF_LINK_FUNCTIONS];
    /* fields="ddtrace" was given (every class is read with ddtrace's names). */
    int ddtrace_fields;
    /* fields= names one attribute for meta and metrics: a mixed tags
     * mapping, which a getter may build anew at each of the two reads. */
    int tags_one_attribute;
    /* No fields= was given: ddtrace's own Span class (and its subclasses) is
     * recognised and read with ddtrace's names, `ddtrace_attribute` (the
     * form of `attribute`), found by module and name when a class is first
     * resolved, never by importing ddtrace; the class once found (strong
     * reference), else NULL. */
    int recognise_ddtrace;
    PyObject *ddtrace_attribute[SF_COUNT];
    PyTypeObject *ddtrace_span_type;
    /* The accessors of ddtrace's native spans (4.9 and later keep tags,
     * links, events and struct tags in native code): for each entry of
     * DDTRACE_ACCESSORS (spanfields.c), the method's name and its guard's
     * (interned; NULL where there is no guard). */
    PyObject *ddtrace_accessor[SF_COUNT];
    PyObject *ddtrace_accessor_guard[SF_COUNT];
    /* Fields a fields= mapping names (bit i: field i): a class that can
     * never have the attribute is refused when it is first resolved. */
    uint32_t mapped;
    /* strict=True: a span carrying what is not written (a dict key that is
     * no field; an object's slot holding a value, or instance attribute,
     * that no field reads) is refused, naming it (spanfields_check_strict). */
    int strict;
    /* The unit fields= gives start_ns and duration_ns in on objects (dict
     * spans keep the protocol's nanoseconds), as nanoseconds per unit (0 or
     * 1: nanoseconds, nothing to convert), and whether any is not 1. */
    long time_scale[SF_COUNT];
    int scales_times;
    /* The text a bool of a mixed tags mapping is written as in meta
     * ("false", "true", indexed by the bool; interned): see
     * write_mixed_entries (spanwrite.c). */
    PyObject *bool_text[2];
    /* spanpack.SpanFieldWarning (strong reference), raised once per class
     * whose first span keeps a field under another common name, and the
     * classes warned about (a set of weak references), made when needed. */
    PyObject *field_warning;
    PyObject *warned_types;
    /* Dict spans: keys that are no span field.  The interned ones looked at
     * already and nothing to warn of (harmless, or warned of), by address
     * (direct-mapped; strong references): a dict span whose other keys are
     * all here is read in place; and the keys warned of (a set of str, made
     * when needed). */
    PyObject *checked_dict_key[SPAN_KEY_TABLE_SIZE];
    PyObject *warned_dict_keys;
    /* The same for keys of any exact str, interned or not (a set of str,
     * made when needed, of at most CHECKED_DICT_KEYS_MAX): the dict spans
     * whose keys are all here are not looked at again (keys decoded from
     * JSON are not interned).  Fields are noted here too. */
    PyObject *checked_dict_key_set;
    /* Fields a span must have (bit i: field i); the others may be absent. */
    uint32_t required;
    /* The same per-span ones but trace_id (checked with its type, see
     * spanvalues_missing_required) as a list, for the check every span goes
     * through. */
    SpanField required_span_fields[SF_COUNT];
    int required_span_count;
    SpanTypeLayout layouts[SPAN_LAYOUT_CACHE];
    int next_layout; /* round-robin replacement */
    int last_layout; /* the layout used last: tried first by the prefetcher */
    /* Layouts resolved so far: a reader that runs Python code (a getter)
     * between finding a layout and using it tells by this whether the
     * layout may have been remade meanwhile (the class changed, and code in
     * that getter read a span of it with this reader). */
    unsigned long resolutions;
    /* The module's proven fast paths, for the in-place readers. */
    SpFastPaths fast_paths;
} SpanFieldReader;

/* `fields`: None, "ddtrace", or a mapping protocol field -> attribute name;
 * `field_warning`: the warning category for fields kept under other names;
 * `fast_paths`: the module's proven in-place readers. */
int spanfields_init(SpanFieldReader *reader, PyObject *fields, PyObject *field_warning,
                    const SpFastPaths *fast_paths);
void spanfields_clear(SpanFieldReader *reader);
int spanfields_traverse(SpanFieldReader *reader, visitproc visit, void *arg);

/* Field values of one span (NULL: the field is absent).  Only the entries in
 * [first, last] are set.  They are new references, or, when `borrowed`, the
 * span's own slot pointers with no reference taken: those stay valid only
 * while no Python code runs (it could reassign the slots and free the
 * values), so a writer calls spanvalues_own() before anything that may run
 * Python code. */
/* Debug builds check the borrowed-values rule where CPython lets a profile
 * function see every Python call (through 3.11; 3.12 moved profiling onto
 * sys.monitoring, too costly to switch per span): while values are borrowed,
 * any Python code that runs aborts the process with the rule's name. */
#if !defined(NDEBUG) && PY_VERSION_HEX < 0x030C0000
#define SP_CHECK_BORROWED 1
#endif

typedef struct {
    PyObject *value[SF_COUNT];
    SpanField first, last;
    int borrowed;
    /* While `borrowed`, bit i set: value[i] is a new reference nonetheless
     * (a getter's result: see spanfields_read_span). */
    uint32_t owned_mask;
    int failed; /* after a failed read: the field whose lookup raised */
#ifdef SP_CHECK_BORROWED
    Py_tracefunc saved_profile; /* the thread's own, restored when owned */
    PyObject *saved_profile_arg;
#endif
} SpanValues;

/* Read fields [first, last] of `span`.  Returns 0, or -1 with an exception
 * set (any reference already read is released) and `failed` naming the
 * field.  The first span of a class resolves its layout, which refuses a
 * fields= attribute the class can never have (TypeError) and warns of a
 * field kept under another common name (SpanFieldWarning, an error under a
 * warnings filter that says so). */
int spanfields_read(SpanFieldReader *reader, PyObject *span, SpanField first, SpanField last,
                    SpanValues *values);
void spanvalues_release(SpanValues *values);

/* The per-span fields (SF_FIRST_PER_SPAN..SF_LAST_PER_SPAN) of `span`: when
 * `may_borrow` and its class keeps them in slots or its instances' values
 * arrays (or cannot have them), borrowed; when some of them are read by a
 * call (a property's getter, a class attribute, ...), those calls are made
 * first, their results owned (`owned_mask`), and the others then borrowed
 * if the span and its class are still as they were; else as spanfields_read
 * gives them. */
int spanfields_read_span(SpanFieldReader *reader, PyObject *span, int may_borrow,
                         SpanValues *values);

/* Turn borrowed values into new references (a no-op when they already are). */
void spanvalues_own(SpanValues *values);

/* The first required per-span field that `values` (read over the per-span
 * fields) lacks, or -1; SF_COUNT when they are all there but trace_id is
 * not an int (every span's is checked: a type check on the value read with
 * the others). */
static inline int
spanvalues_missing_required(const SpanFieldReader *reader, const SpanValues *values)
{
    PyObject *trace_id = values->value[SF_TRACE_ID];
    if (SP_UNLIKELY(trace_id == NULL)) {
        return SF_TRACE_ID;
    }
    for (int k = 0; k < reader->required_span_count; k++) {
        if (values->value[reader->required_span_fields[k]] == NULL) {
            return (int)reader->required_span_fields[k];
        }
    }
    return SP_LIKELY(PyLong_Check(trace_id)) ? -1 : SF_COUNT;
}

/* The text fields a writer may want to look ahead at (e.g. to prefetch their
 * interned encodings). */
typedef struct {
    const PyObject *service, *name, *resource, *span_type;
} SpanTextPeek;

/* Ask the CPU to start loading what reading `span` will touch: the objects in
 * its slots (when its class layout is already known).  A hint only: no
 * references taken, no Python code, no errors.  `peek` (or NULL: not
 * wanted) receives the addresses in the text fields' slots (NULL when not
 * known): for more prefetching only, never to be dereferenced. */
void spanfields_prefetch(const SpanFieldReader *reader, PyObject *span, SpanTextPeek *peek);

/* Ask the CPU to start loading what reading `spans` (count at most
 * SPAN_WARM_MAX) will touch, level by level: the span objects, their values
 * arrays, their fields' objects and text, the tag dicts' tables, entries,
 * keys and values, each level's loads of all the spans in flight together.
 * Only for spans of the class read last, as its layout has them; a hint
 * only: no references taken, no Python code, no errors. */
enum { SPAN_WARM_MAX = 16 };
void spanfields_warm(const SpanFieldReader *reader, PyObject *const *spans, Py_ssize_t count);

/* Ask the CPU to start loading the parts of `span` that hold its fields,
 * assuming it is of the class read last (a hint only: `span` itself is not
 * read, so this costs no wait even when it is far from the caches). */
void spanfields_prefetch_object(const SpanFieldReader *reader, PyObject *span);

/* One attribute of `obj` (a new reference in *value, NULL when the object
 * has no such attribute), found as Python's attribute lookup finds it; an
 * error raised by a getter, AttributeError included, propagates. */
int spanfields_attribute(PyObject *obj, PyObject *name, PyObject **value);

/* One field of `span` (a new reference in *value, NULL when absent). */
int spanfields_read_one(SpanFieldReader *reader, PyObject *span, SpanField field, PyObject **value);

/* strict=True, for an object span (dict spans are checked as they are
 * read): a TypeError naming the slots holding a value and the instance
 * attributes of `span` that no field reads.  ddtrace's own Span, read whole
 * as ddtrace writes it, is not checked.  0, or -1 with an error. */
int spanfields_check_strict(SpanFieldReader *reader, PyObject *span);

/* The origin field of `span`, as spanfields_read_one gives it. */
int spanfields_read_origin(SpanFieldReader *reader, PyObject *span, PyObject **value);

/* Is `link` of ddtrace's own SpanLink class (not a subclass: its fields and
 * to_dict() are ddtrace's), its to_dict() ddtrace's function (not one set
 * on the instance, a wrapper or new code) and the module functions that
 * calls ddtrace's?  1, 0, or -1 with an error. */
int spanfields_is_ddtrace_link(SpanFieldReader *reader, PyObject *link);

#endif /* SPANPACK_SPANFIELDS_H */
