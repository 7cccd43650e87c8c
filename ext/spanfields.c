/* Span field access: attribute names, slot offsets per type, dict keys. */
#include "spanfields.h"

#include "pydict.h"

#if PY_VERSION_HEX < 0x030C0000
#include <structmember.h>
#define SP_T_OBJECT_EX T_OBJECT_EX
#define SP_READONLY READONLY
#else
#define SP_T_OBJECT_EX Py_T_OBJECT_EX
#define SP_READONLY Py_READONLY
#endif

const char *const span_field_names[SF_COUNT] = {
    [SF_TRACE_ID] = "trace_id",
    [SF_SPAN_ID] = "span_id",
    [SF_PARENT_ID] = "parent_id",
    [SF_SERVICE] = "service",
    [SF_NAME] = "name",
    [SF_RESOURCE] = "resource",
    [SF_SPAN_TYPE] = "span_type",
    [SF_START] = "start_ns",
    [SF_DURATION] = "duration_ns",
    [SF_ERROR] = "error",
    [SF_META] = "meta",
    [SF_METRICS] = "metrics",
    [SF_META_STRUCT] = "meta_struct",
    [SF_LINKS] = "links",
    [SF_EVENTS] = "events",
    [SF_ORIGIN] = "origin",
};

/* Where ddtrace's pure-Python Span (4.x) keeps each field. */
static const char *const ddtrace_attributes[SF_COUNT] = {
    [SF_META] = "_meta",   [SF_METRICS] = "_metrics", [SF_META_STRUCT] = "_meta_struct",
    [SF_LINKS] = "_links", [SF_EVENTS] = "_events",   [SF_ORIGIN] = "context.dd_origin",
};

static int
field_index(PyObject *name)
{
    for (int i = 0; i < SF_COUNT; i++) {
        if (PyUnicode_CompareWithASCIIString(name, span_field_names[i]) == 0) {
            return i;
        }
    }
    return -1;
}

/* An interned str, or a tuple of them for a dotted path. */
static PyObject *
attribute_from_name(PyObject *name)
{
    PyObject *parts = NULL, *result = NULL;
    if (!PyUnicode_Check(name) || PyUnicode_GET_LENGTH(name) == 0) {
        PyErr_Format(PyExc_TypeError, "attribute names in fields must be non-empty str, not %R",
                     name);
        return NULL;
    }
    PyObject *dot = PyUnicode_FromString(".");
    if (dot == NULL) {
        return NULL;
    }
    parts = PyUnicode_Split(name, dot, -1);
    Py_DECREF(dot);
    if (parts == NULL) {
        goto error;
    }
    Py_ssize_t count = PyList_GET_SIZE(parts);
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *part = PyList_GET_ITEM(parts, i);
        if (PyUnicode_GET_LENGTH(part) == 0) {
            PyErr_Format(PyExc_ValueError, "invalid attribute path %R in fields", name);
            goto error;
        }
        Py_INCREF(part);
        PyUnicode_InternInPlace(&part);
        PyList_SetItem(parts, i, part); /* steals part; cannot fail in range */
    }
    if (count == 1) {
        result = Py_NewRef(PyList_GET_ITEM(parts, 0));
    }
    else {
        result = PyList_AsTuple(parts);
    }
error:
    Py_XDECREF(parts);
    return result;
}

static void
list_required_span_fields(SpanFieldReader *reader)
{
    reader->required_span_count = 0;
    for (int i = SF_SPAN_ID; i <= SF_EVENTS; i++) {
        if (reader->required & (1u << i)) {
            reader->required_span_fields[reader->required_span_count++] = (SpanField)i;
        }
    }
}

static size_t
key_slot(const PyObject *key)
{
    return (size_t)(sp_hash_address(key) >> 40) & (SPAN_KEY_TABLE_SIZE - 1);
}

static void
index_dict_keys(SpanFieldReader *reader)
{
    memset(reader->field_by_address, -1, sizeof reader->field_by_address);
    for (int i = 0; i < SF_COUNT; i++) {
        size_t slot = key_slot(reader->dict_key[i]);
        while (reader->field_by_address[slot] >= 0) {
            slot = (slot + 1) & (SPAN_KEY_TABLE_SIZE - 1);
        }
        reader->key_by_address[slot] = reader->dict_key[i];
        reader->field_by_address[slot] = (signed char)i;
    }
}

/* The field whose (interned) key is `key`, or -1. */
static inline int
field_of_key(const SpanFieldReader *reader, const PyObject *key)
{
    size_t slot = key_slot(key);
    while (reader->field_by_address[slot] >= 0) {
        if (reader->key_by_address[slot] == key) {
            return reader->field_by_address[slot];
        }
        slot = (slot + 1) & (SPAN_KEY_TABLE_SIZE - 1);
    }
    return -1;
}

int
spanfields_init(SpanFieldReader *reader, PyObject *fields)
{
    memset(reader, 0, sizeof *reader);
    for (int i = 0; i < SF_COUNT; i++) {
        reader->dict_key[i] = PyUnicode_InternFromString(span_field_names[i]);
        if (reader->dict_key[i] == NULL) {
            goto error;
        }
        reader->attribute[i] = Py_NewRef(reader->dict_key[i]);
    }
    index_dict_keys(reader);
    reader->required =
        (1u << SF_TRACE_ID) | (1u << SF_SPAN_ID) | (1u << SF_NAME) | (1u << SF_START);
    list_required_span_fields(reader);
    if (fields == NULL || fields == Py_None) {
        return 0;
    }
    if (PyUnicode_Check(fields)) {
        if (PyUnicode_CompareWithASCIIString(fields, "ddtrace") != 0) {
            PyErr_Format(PyExc_ValueError, "fields must be None, \"ddtrace\" or a mapping, not %R",
                         fields);
            goto error;
        }
        for (int i = 0; i < SF_COUNT; i++) {
            if (ddtrace_attributes[i] == NULL) {
                continue;
            }
            PyObject *name = PyUnicode_FromString(ddtrace_attributes[i]);
            if (name == NULL) {
                goto error;
            }
            PyObject *attribute = attribute_from_name(name);
            Py_DECREF(name);
            if (attribute == NULL) {
                goto error;
            }
            Py_SETREF(reader->attribute[i], attribute);
        }
        reader->context_name = PyUnicode_InternFromString("context");
        reader->context_meta_name = PyUnicode_InternFromString("_meta");
        reader->origin_meta_key = PyUnicode_InternFromString("_dd.origin");
        if (reader->context_name == NULL || reader->context_meta_name == NULL ||
            reader->origin_meta_key == NULL) {
            goto error;
        }
        /* Every ddtrace Span has these; their absence means a span ddtrace
         * keeps natively (ddtrace >= 4.3), whose tags would silently vanish. */
        reader->required |= (1u << SF_META) | (1u << SF_METRICS);
        list_required_span_fields(reader);
        return 0;
    }
    if (!PyDict_Check(fields)) {
        PyErr_Format(PyExc_TypeError, "fields must be None, \"ddtrace\" or a dict, not %.200s",
                     Py_TYPE(fields)->tp_name);
        goto error;
    }
    Py_ssize_t pos = 0;
    PyObject *key, *name;
    while (PyDict_Next(fields, &pos, &key, &name)) {
        int index = PyUnicode_Check(key) ? field_index(key) : -1;
        if (index < 0) {
            PyErr_Format(PyExc_ValueError, "fields: %R is not a span field", key);
            goto error;
        }
        PyObject *attribute = attribute_from_name(name);
        if (attribute == NULL) {
            goto error;
        }
        Py_SETREF(reader->attribute[index], attribute);
    }
    return 0;
error:
    spanfields_clear(reader);
    return -1;
}

static void
layout_clear(SpanTypeLayout *layout)
{
    Py_CLEAR(layout->type);
    memset(layout->offset, 0, sizeof layout->offset);
}

void
spanfields_clear(SpanFieldReader *reader)
{
    for (int i = 0; i < SF_COUNT; i++) {
        Py_CLEAR(reader->attribute[i]);
        Py_CLEAR(reader->dict_key[i]);
    }
    Py_CLEAR(reader->context_name);
    Py_CLEAR(reader->context_meta_name);
    Py_CLEAR(reader->origin_meta_key);
    Py_CLEAR(reader->ddtrace_context_type);
    for (int i = 0; i < SPAN_LAYOUT_CACHE; i++) {
        layout_clear(&reader->layouts[i]);
    }
}

int
spanfields_traverse(SpanFieldReader *reader, visitproc visit, void *arg)
{
    for (int i = 0; i < SPAN_LAYOUT_CACHE; i++) {
        Py_VISIT(reader->layouts[i].type);
    }
    Py_VISIT(reader->ddtrace_context_type);
    return 0;
}

/* The instance offset of `name` when instances of `type` read it from a
 * __slots__ member (a data descriptor, so nothing else can shadow it), else 0.
 * The descriptor is looked up along the MRO as instance attribute access does
 * (not with getattr on the class, which a metaclass could intercept). */
static Py_ssize_t
slot_offset(PyTypeObject *type, PyObject *name)
{
    PyObject *mro = type->tp_mro;
    if (!PyUnicode_Check(name) || mro == NULL) {
        return 0; /* dotted path, or a type not ready */
    }
    PyObject *descr = NULL;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(mro) && descr == NULL; i++) {
        PyObject *base_dict = ((PyTypeObject *)PyTuple_GET_ITEM(mro, i))->tp_dict;
        if (base_dict != NULL) {
            descr = PyDict_GetItemWithError(base_dict, name);
            if (descr == NULL && PyErr_Occurred()) {
                PyErr_Clear();
                return 0;
            }
        }
    }
    if (descr == NULL) {
        return 0;
    }
    Py_INCREF(descr);
    Py_ssize_t offset = 0;
    if (Py_TYPE(descr) == &PyMemberDescr_Type) {
        PyMemberDescrObject *member = (PyMemberDescrObject *)descr;
        if (member->d_member->type == SP_T_OBJECT_EX && !(member->d_member->flags & SP_READONLY) &&
            PyType_IsSubtype(type, PyDescr_TYPE(descr))) {
            offset = member->d_member->offset;
        }
    }
    Py_DECREF(descr);
    return offset;
}

/* Fields whose values are worth loading ahead: ids, times, text and tag
 * dicts are distinct objects per span; error (a small int), meta_struct,
 * links and events are nearly always shared singletons (0, None). */
static int
prefetched_field(int field)
{
    return field != SF_ERROR && field != SF_META_STRUCT && field != SF_LINKS && field != SF_EVENTS;
}

/* Offsets for `type`, from the cache or resolved now.  Resolving may run
 * Python code (a metaclass __getattr__), so the offsets are computed first and
 * installed in one step afterwards; the caller copies what it needs before it
 * runs any Python code itself. */
static SpanTypeLayout *
layout_for(SpanFieldReader *reader, PyTypeObject *type)
{
    for (int i = 0; i < SPAN_LAYOUT_CACHE; i++) {
        SpanTypeLayout *layout = &reader->layouts[i];
        /* A changed class (e.g. a slot replaced by a property) gets a new
         * version tag, and is resolved again. */
        if (layout->type == type && layout->version_tag != 0 &&
            layout->version_tag == type->tp_version_tag) {
            reader->last_layout = i;
            return layout;
        }
    }
    Py_ssize_t offsets[SF_COUNT] = {0};
    if (type->tp_getattro == PyObject_GenericGetAttr) {
        for (int i = 0; i < SF_COUNT; i++) {
            offsets[i] = slot_offset(type, reader->attribute[i]);
        }
    }
    SpanTypeLayout *layout = NULL;
    for (int i = 0; i < SPAN_LAYOUT_CACHE && layout == NULL; i++) {
        if (reader->layouts[i].type == type) {
            layout = &reader->layouts[i];
        }
    }
    if (layout == NULL) {
        layout = &reader->layouts[reader->next_layout];
        reader->next_layout = (reader->next_layout + 1) % SPAN_LAYOUT_CACHE;
    }
    PyTypeObject *previous = layout->type;
    memcpy(layout->offset, offsets, sizeof offsets);
    layout->getattr_fields = 0;
    layout->slot_count = 0;
    for (int i = 0; i < SF_COUNT; i++) {
        if (offsets[i] == 0) {
            layout->getattr_fields |= 1u << i;
        }
        else if (i >= SF_SPAN_ID && i <= SF_EVENTS && prefetched_field(i)) {
            layout->slot_offsets[layout->slot_count++] = offsets[i];
        }
    }
    layout->line_count = 0;
    for (int k = 0; k < layout->slot_count; k++) {
        Py_ssize_t line = layout->slot_offsets[k] & ~(Py_ssize_t)63;
        int known = 0;
        for (int j = 0; j < layout->line_count; j++) {
            known |= layout->line_offsets[j] == line;
        }
        if (!known) {
            layout->line_offsets[layout->line_count++] = line;
        }
    }
    layout->type = (PyTypeObject *)Py_NewRef((PyObject *)type);
    layout->version_tag = type->tp_version_tag;
    reader->last_layout = (int)(layout - reader->layouts);
    Py_XDECREF(previous);
    return layout;
}

/* getattr along a str or a tuple path; an AttributeError anywhere (or None
 * part-way along a path) means "absent". */
/* Bit i set for every field i in [first, last]. */
static inline uint32_t
fields_mask(SpanField first, SpanField last)
{
    return ((2u << last) - 1) & ~((1u << first) - 1);
}

static int
get_attribute(PyObject *obj, PyObject *attribute, PyObject **value)
{
    if (PyUnicode_Check(attribute)) {
        *value = PyObject_GetAttr(obj, attribute);
    }
    else {
        PyObject *current = Py_NewRef(obj);
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(attribute) && current != NULL; i++) {
            PyObject *next = current == Py_None
                                 ? NULL
                                 : PyObject_GetAttr(current, PyTuple_GET_ITEM(attribute, i));
            if (current == Py_None) {
                PyErr_SetNone(PyExc_AttributeError);
            }
            Py_DECREF(current);
            current = next;
        }
        *value = current;
    }
    if (*value == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_AttributeError)) {
            return -1;
        }
        PyErr_Clear();
    }
    return 0;
}

/* `value` (a new reference, or NULL) for `key` in `dict`, which no other
 * thread can change in between on free-threaded builds. */
static int
dict_get_ref(PyObject *dict, PyObject *key, PyObject **value)
{
#if PY_VERSION_HEX >= 0x030D0000
    return PyDict_GetItemRef(dict, key, value) < 0 ? -1 : 0;
#else
    *value = Py_XNewRef(PyDict_GetItemWithError(dict, key));
    return *value == NULL && PyErr_Occurred() ? -1 : 0;
#endif
}

int
spanfields_read(SpanFieldReader *reader, PyObject *span, SpanField first, SpanField last,
                SpanValues *values)
{
    values->first = first;
    values->last = last;
    values->borrowed = 0;
    values->failed = -1;
    if (PyDict_Check(span)) {
        for (int i = (int)first; i <= (int)last; i++) {
            values->value[i] = NULL;
        }
        for (int i = (int)first; i <= (int)last; i++) {
            if (dict_get_ref(span, reader->dict_key[i], &values->value[i]) < 0) {
                values->failed = i;
                goto error;
            }
        }
        return 0;
    }
    /* Slots first, with no Python code in between (the layout cache may be
     * changed by another thread as soon as Python code runs), then getattr. */
    const SpanTypeLayout *layout = layout_for(reader, Py_TYPE(span));
    for (int i = (int)first; i <= (int)last; i++) {
        Py_ssize_t offset = layout->offset[i];
        values->value[i] = offset != 0 ? Py_XNewRef(*(PyObject **)((char *)span + offset)) : NULL;
    }
    uint32_t pending = layout->getattr_fields & fields_mask(first, last);
    while (pending != 0) {
        int i = __builtin_ctz(pending);
        pending &= pending - 1;
        if (get_attribute(span, reader->attribute[i], &values->value[i]) < 0) {
            values->failed = i;
            goto error;
        }
    }
    return 0;
error:
    for (int i = (int)first; i <= (int)last; i++) {
        Py_CLEAR(values->value[i]);
    }
    return -1;
}

int
spanfields_read_one(SpanFieldReader *reader, PyObject *span, SpanField field, PyObject **value)
{
    SpanValues values;
    if (spanfields_read(reader, span, field, field, &values) < 0) {
        return -1;
    }
    *value = values.value[field];
    return 0;
}

/* Is `type` ddtrace's own Context class (whose dd_origin property returns
 * `_meta["_dd.origin"]`)?  A subclass or look-alike could override that
 * property, so anything else is asked through it.  The class's own dict is
 * read directly: no Python code runs. */
static int
is_ddtrace_context(SpanFieldReader *reader, PyTypeObject *type)
{
    if (type == reader->ddtrace_context_type) {
        return 1;
    }
    if (reader->ddtrace_context_type != NULL || strcmp(type->tp_name, "Context") != 0 ||
        type->tp_dict == NULL) {
        return 0;
    }
    PyObject *module = PyDict_GetItemString(type->tp_dict, "__module__");
    if (module == NULL || !PyUnicode_Check(module) ||
        PyUnicode_CompareWithASCIIString(module, "ddtrace._trace.context") != 0) {
        return 0;
    }
    reader->ddtrace_context_type = (PyTypeObject *)Py_NewRef((PyObject *)type);
    return 1;
}

int
spanfields_read_origin(SpanFieldReader *reader, PyObject *span, PyObject **value)
{
    if (reader->context_name == NULL || PyDict_Check(span)) {
        return spanfields_read_one(reader, span, SF_ORIGIN, value);
    }
    PyObject *context, *meta = NULL;
    if (get_attribute(span, reader->context_name, &context) < 0) {
        return -1;
    }
    if (context == NULL || !is_ddtrace_context(reader, Py_TYPE(context))) {
        Py_XDECREF(context);
        return spanfields_read_one(reader, span, SF_ORIGIN, value);
    }
    int result = get_attribute(context, reader->context_meta_name, &meta);
    Py_DECREF(context);
    if (result < 0) {
        return -1;
    }
    if (meta == NULL || !PyDict_CheckExact(meta)) {
        Py_XDECREF(meta);
        return spanfields_read_one(reader, span, SF_ORIGIN, value);
    }
    result = dict_get_ref(meta, reader->origin_meta_key, value);
    Py_DECREF(meta);
    return result;
}

void
spanvalues_release(SpanValues *values)
{
    if (values->borrowed) {
        return;
    }
    for (int i = (int)values->first; i <= (int)values->last; i++) {
        Py_XDECREF(values->value[i]);
    }
}

/* Values read without references (see SpanValues). */
static void
mark_borrowed(SpanValues *values)
{
    values->first = SF_SPAN_ID;
    values->last = SF_EVENTS;
    values->borrowed = 1;
    values->failed = -1;
}

/* A dict span's per-span fields straight from its entries, when every key is
 * an interned str: two interned str are equal only if they are the same
 * object, so matching keys by address finds every field present, and a field
 * not matched is absent.  Borrowed values; 0 when the dict does not qualify
 * (the values are then left to be read again). */
static int
read_dict_span_in_place(const SpanFieldReader *reader, PyObject *span, SpanValues *values)
{
    DictEntries entries;
    if (!pydict_entries(span, &entries) || entries.stride != 2) {
        return 0; /* only dicts whose keys are all str */
    }
    for (int i = SF_SPAN_ID; i <= SF_EVENTS; i++) {
        values->value[i] = NULL;
    }
    PyObject *const *entry = entries.keys;
    for (Py_ssize_t i = 0; i < entries.count; i++, entry += entries.stride) {
        if (entry[1] == NULL) {
            continue; /* deleted */
        }
        if (!PyUnicode_CHECK_INTERNED(entry[0])) {
            return 0;
        }
        int field = field_of_key(reader, entry[0]);
        if (field >= SF_SPAN_ID && field <= SF_EVENTS) {
            values->value[field] = entry[1];
        }
    }
    mark_borrowed(values);
    return 1;
}

int
spanfields_read_span(SpanFieldReader *reader, PyObject *span, int may_borrow, SpanValues *values)
{
#ifndef Py_GIL_DISABLED /* without the GIL another thread could free them */
    const uint32_t span_fields = fields_mask(SF_SPAN_ID, SF_EVENTS);
    if (may_borrow && PyDict_Check(span)) {
        if (read_dict_span_in_place(reader, span, values)) {
            return 0;
        }
    }
    else if (may_borrow) {
        const SpanTypeLayout *layout = layout_for(reader, Py_TYPE(span));
        if ((layout->getattr_fields & span_fields) == 0) {
            for (int i = SF_SPAN_ID; i <= SF_EVENTS; i++) {
                values->value[i] = *(PyObject **)((char *)span + layout->offset[i]);
            }
            mark_borrowed(values);
            return 0;
        }
    }
#else
    (void)may_borrow;
#endif
    return spanfields_read(reader, span, SF_SPAN_ID, SF_EVENTS, values);
}

void
spanvalues_own(SpanValues *values)
{
    if (!values->borrowed) {
        return;
    }
    for (int i = (int)values->first; i <= (int)values->last; i++) {
        Py_XINCREF(values->value[i]);
    }
    values->borrowed = 0;
}

static void
prefetch_slots(const SpanTypeLayout *layout, PyObject *span, SpanTextPeek *peek)
{
    for (int k = 0; k < layout->slot_count; k++) {
        SP_PREFETCH(*(PyObject **)((char *)span + layout->slot_offsets[k]));
    }
#define PEEK(field)                                                                                \
    (layout->offset[field] ? *(PyObject **)((char *)span + layout->offset[field]) : NULL)
    peek->service = PEEK(SF_SERVICE);
    peek->name = PEEK(SF_NAME);
    peek->resource = PEEK(SF_RESOURCE);
    peek->span_type = PEEK(SF_SPAN_TYPE);
#undef PEEK
}

void
spanfields_prefetch_object(const SpanFieldReader *reader, PyObject *span)
{
    const SpanTypeLayout *last = &reader->layouts[reader->last_layout];
    SP_PREFETCH(span);
    for (int k = 0; k < last->line_count; k++) {
        SP_PREFETCH((char *)span + last->line_offsets[k]);
    }
}

void
spanfields_prefetch(const SpanFieldReader *reader, PyObject *span, SpanTextPeek *peek)
{
    PyTypeObject *type = Py_TYPE(span);
    /* Traces are nearly always made of one class: try the last one first. */
    const SpanTypeLayout *last = &reader->layouts[reader->last_layout];
    if (last->type == type) {
        prefetch_slots(last, span, peek);
        return;
    }
    for (int i = 0; i < SPAN_LAYOUT_CACHE; i++) {
        if (reader->layouts[i].type == type) {
            prefetch_slots(&reader->layouts[i], span, peek);
            return;
        }
    }
    memset(peek, 0, sizeof *peek);
}
