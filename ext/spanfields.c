/* Span field access: attribute names, slot offsets per type, dict keys. */
#include "spanfields.h"

#include "pyinstance.h"

#if PY_VERSION_HEX < 0x030C0000
#include <structmember.h>
#define SP_T_OBJECT_EX T_OBJECT_EX
#define SP_AUDIT_READ READ_RESTRICTED
#else
#define SP_T_OBJECT_EX Py_T_OBJECT_EX
#define SP_AUDIT_READ Py_AUDIT_READ
#endif

#define SF_NAME_ENTRY(constant, name, ddtrace, per_span, prefetched, required) [constant] = name,
const char *const span_field_names[SF_COUNT] = {SPAN_FIELDS(SF_NAME_ENTRY)};
#undef SF_NAME_ENTRY

#define SF_DDTRACE_ENTRY(constant, name, ddtrace, per_span, prefetched, required)                  \
    [constant] = ddtrace,
const char *const span_field_ddtrace_attributes[SF_COUNT] = {SPAN_FIELDS(SF_DDTRACE_ENTRY)};
#undef SF_DDTRACE_ENTRY

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

/* An interned str, or a tuple of them for a dotted path (`name` held by the
 * caller: errors name it with %R). */
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
        goto done;
    }
    Py_ssize_t count = PyList_GET_SIZE(parts);
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *part = PyList_GET_ITEM(parts, i);
        if (PyUnicode_GET_LENGTH(part) == 0) {
            PyErr_Format(PyExc_ValueError, "invalid attribute path %R in fields", name);
            goto done;
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
done:
    Py_XDECREF(parts);
    return result;
}

/* Nanoseconds per unit named by `unit` ("s", "ms", "us" or "µs", "ns"), or
 * 0 for anything else. */
static long
time_unit_scale(PyObject *unit)
{
    static const struct {
        const char *name;
        long scale;
    } UNITS[] = {
        {"s", 1000000000L}, {"ms", 1000000L}, {"us", 1000L}, {"\xc2\xb5s", 1000L}, {"ns", 1L}};
    if (!PyUnicode_Check(unit)) {
        return 0;
    }
    const char *text = PyUnicode_AsUTF8(unit);
    if (text == NULL) {
        PyErr_Clear(); /* (a lone surrogate: no unit) */
        return 0;
    }
    for (size_t i = 0; i < sizeof UNITS / sizeof UNITS[0]; i++) {
        if (strcmp(text, UNITS[i].name) == 0) {
            return UNITS[i].scale;
        }
    }
    return 0;
}

static void
list_required_span_fields(SpanFieldReader *reader)
{
    reader->required_span_count = 0;
    /* (trace_id is checked apart, with its type: spanvalues_missing_required.) */
    for (int i = SF_FIRST_PER_SPAN; i <= SF_LAST_PER_SPAN; i++) {
        if (i != SF_TRACE_ID && (reader->required & (1u << i))) {
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

/* ddtrace's attribute names (SPAN_FIELDS), in the form of reader->attribute. */
static int
ddtrace_attributes(PyObject **attributes)
{
    for (int i = 0; i < SF_COUNT; i++) {
        PyObject *name = PyUnicode_FromString(span_field_ddtrace_attributes[i]);
        if (name == NULL) {
            return -1;
        }
        attributes[i] = attribute_from_name(name);
        Py_DECREF(name);
        if (attributes[i] == NULL) {
            return -1;
        }
    }
    return 0;
}

/* Where ddtrace's native spans (4.9 and later: tags, links, events and
 * struct tags kept in native code) give the fields that are not
 * attributes there: the accessor ddtrace's own encoder calls for the value,
 * and the one it asks first whether there is any (NULL: none). */
static const struct {
    SpanField field;
    const char *accessor, *guard;
} DDTRACE_ACCESSORS[] = {
    {SF_META, "_get_str_attributes", NULL},
    {SF_METRICS, "_get_numeric_attributes", NULL},
    {SF_META_STRUCT, "_get_meta_structs", "_has_meta_structs"},
    {SF_LINKS, "_get_links", "_has_links"},
    {SF_EVENTS, "_get_events", "_has_events"},
};
#define DDTRACE_ACCESSOR_COUNT ((int)(sizeof DDTRACE_ACCESSORS / sizeof DDTRACE_ACCESSORS[0]))

/* ddtrace's names (see SpanFieldReader): its Span's attributes (one per
 * field, in the form of reader->attribute), its native spans' accessors,
 * and what is read from its Context. */
static int
ddtrace_names(SpanFieldReader *reader)
{
    if (ddtrace_attributes(reader->ddtrace_attribute) < 0) {
        return -1;
    }
    for (int k = 0; k < DDTRACE_ACCESSOR_COUNT; k++) {
        SpanField field = DDTRACE_ACCESSORS[k].field;
        const char *guard = DDTRACE_ACCESSORS[k].guard;
        reader->ddtrace_accessor[field] = PyUnicode_InternFromString(DDTRACE_ACCESSORS[k].accessor);
        if (reader->ddtrace_accessor[field] == NULL ||
            (guard != NULL &&
             (reader->ddtrace_accessor_guard[field] = PyUnicode_InternFromString(guard)) == NULL)) {
            return -1;
        }
    }
    reader->context_name = PyUnicode_InternFromString("context");
    reader->context_slot_name = PyUnicode_InternFromString("_context");
    reader->property_getter_name = PyUnicode_InternFromString("fget");
    reader->context_meta_name = PyUnicode_InternFromString("_meta");
    reader->context_origin_name = PyUnicode_InternFromString("dd_origin");
    reader->origin_meta_key = PyUnicode_InternFromString("_dd.origin");
    return reader->context_name == NULL || reader->context_slot_name == NULL ||
                   reader->property_getter_name == NULL || reader->context_meta_name == NULL ||
                   reader->context_origin_name == NULL || reader->origin_meta_key == NULL
               ? -1
               : 0;
}

int
spanfields_init(SpanFieldReader *reader, PyObject *fields, PyObject *field_warning,
                const SpFastPaths *fast_paths)
{
    memset(reader, 0, sizeof *reader);
    reader->fast_paths = *fast_paths;
    reader->field_warning = Py_NewRef(field_warning);
    for (int i = 0; i < SF_COUNT; i++) {
        reader->dict_key[i] = PyUnicode_InternFromString(span_field_names[i]);
        if (reader->dict_key[i] == NULL) {
            goto error;
        }
        reader->attribute[i] = Py_NewRef(reader->dict_key[i]);
    }
    index_dict_keys(reader);
    reader->bool_text[0] = PyUnicode_InternFromString("false");
    reader->bool_text[1] = PyUnicode_InternFromString("true");
    if (reader->bool_text[0] == NULL || reader->bool_text[1] == NULL) {
        goto error;
    }
    reader->required = SF_REQUIRED_FIELDS;
    list_required_span_fields(reader);
    if (fields == NULL || fields == Py_None) {
        reader->recognise_ddtrace = 1;
        if (ddtrace_names(reader) < 0) {
            goto error;
        }
        return 0;
    }
    if (PyUnicode_Check(fields)) {
        if (PyUnicode_CompareWithASCIIString(fields, "ddtrace") != 0) {
            PyErr_Format(PyExc_ValueError, "fields must be None, \"ddtrace\" or a mapping, not %R",
                         fields);
            goto error;
        }
        reader->ddtrace_fields = 1;
        if (ddtrace_names(reader) < 0) {
            goto error;
        }
        for (int i = 0; i < SF_COUNT; i++) {
            Py_SETREF(reader->attribute[i], Py_NewRef(reader->ddtrace_attribute[i]));
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
        /* The entry is held while an error may name it: formatting with %R
         * runs pending signal handlers, which could empty `fields`. */
        Py_INCREF(key);
        Py_INCREF(name);
        int index = PyUnicode_Check(key) ? field_index(key) : -1;
        PyObject *attribute = NULL;
        if (index < 0) {
            PyErr_Format(PyExc_ValueError, "fields: %R is not a span field", key);
        }
        else if (PyTuple_Check(name)) {
            /* (attribute, unit): a time kept in another unit. */
            long scale = PyTuple_GET_SIZE(name) == 2 && (index == SF_START || index == SF_DURATION)
                             ? time_unit_scale(PyTuple_GET_ITEM(name, 1))
                             : 0;
            if (scale == 0) {
                PyErr_Format(PyExc_ValueError,
                             "fields maps %R to %R: only start_ns and duration_ns take an "
                             "(attribute, unit) pair, with unit \"s\", \"ms\", \"us\" or \"ns\"",
                             key, name);
            }
            else {
                attribute = attribute_from_name(PyTuple_GET_ITEM(name, 0));
                reader->time_scale[index] = scale;
                reader->scales_times |= scale != 1;
            }
        }
        else {
            attribute = attribute_from_name(name);
        }
        Py_DECREF(key);
        Py_DECREF(name);
        if (attribute == NULL) {
            goto error;
        }
        Py_SETREF(reader->attribute[index], attribute);
        reader->mapped |= 1u << index;
    }
    int same =
        PyObject_RichCompareBool(reader->attribute[SF_META], reader->attribute[SF_METRICS], Py_EQ);
    if (same < 0) {
        goto error;
    }
    reader->tags_one_attribute = same;
    return 0;
error:
    spanfields_clear(reader);
    return -1;
}

static void
layout_clear(SpanTypeLayout *layout)
{
    Py_CLEAR(layout->type);
    for (int i = 0; i < SF_COUNT; i++) {
        Py_CLEAR(layout->access[i].object);
        Py_CLEAR(layout->access[i].guard);
    }
    for (int k = 0; k < layout->watched_count; k++) {
        Py_CLEAR(layout->watched[k]);
    }
    layout->watched_count = 0;
    memset(layout->offset, 0, sizeof layout->offset);
    layout->context_offset = 0;
    Py_CLEAR(layout->context_property);
    Py_CLEAR(layout->context_getter);
    Py_CLEAR(layout->context_code);
}

static void attribute_memo_clear(AttributeMemo *memo);

void
spanfields_clear(SpanFieldReader *reader)
{
    for (int i = 0; i < SF_COUNT; i++) {
        Py_CLEAR(reader->attribute[i]);
        Py_CLEAR(reader->dict_key[i]);
    }
    Py_CLEAR(reader->bool_text[0]);
    Py_CLEAR(reader->bool_text[1]);
    Py_CLEAR(reader->context_name);
    Py_CLEAR(reader->context_slot_name);
    Py_CLEAR(reader->property_getter_name);
    Py_CLEAR(reader->context_meta_name);
    Py_CLEAR(reader->context_origin_name);
    Py_CLEAR(reader->origin_meta_key);
    Py_CLEAR(reader->ddtrace_context_type);
    attribute_memo_clear(&reader->context_memo);
    attribute_memo_clear(&reader->context_meta_memo);
    attribute_memo_clear(&reader->context_origin_memo);
    attribute_memo_clear(&reader->property_getter_memo);
    Py_CLEAR(reader->last_link_type);
    for (int i = 0; i < SF_LINK_FUNCTIONS; i++) {
        Py_CLEAR(reader->link_name[i]);
        Py_CLEAR(reader->link_function[i]);
        Py_CLEAR(reader->link_code[i]);
    }
    for (int i = 0; i < SF_COUNT; i++) {
        Py_CLEAR(reader->ddtrace_attribute[i]);
        Py_CLEAR(reader->ddtrace_accessor[i]);
        Py_CLEAR(reader->ddtrace_accessor_guard[i]);
    }
    Py_CLEAR(reader->ddtrace_span_type);
    Py_CLEAR(reader->field_warning);
    Py_CLEAR(reader->warned_types);
    for (int i = 0; i < SPAN_KEY_TABLE_SIZE; i++) {
        Py_CLEAR(reader->checked_dict_key[i]);
    }
    Py_CLEAR(reader->warned_dict_keys);
    Py_CLEAR(reader->checked_dict_key_set);
    for (int i = 0; i < SPAN_LAYOUT_CACHE; i++) {
        layout_clear(&reader->layouts[i]);
    }
}

int
spanfields_traverse(SpanFieldReader *reader, visitproc visit, void *arg)
{
    for (int i = 0; i < SPAN_LAYOUT_CACHE; i++) {
        Py_VISIT(reader->layouts[i].type);
        for (int k = 0; k < SF_COUNT; k++) {
            Py_VISIT(reader->layouts[i].access[k].object);
            Py_VISIT(reader->layouts[i].access[k].guard);
        }
        for (int k = 0; k < reader->layouts[i].watched_count; k++) {
            Py_VISIT(reader->layouts[i].watched[k]);
        }
        Py_VISIT(reader->layouts[i].context_property);
        Py_VISIT(reader->layouts[i].context_getter);
        Py_VISIT(reader->layouts[i].context_code);
    }
    Py_VISIT(reader->ddtrace_context_type);
    const AttributeMemo *memos[] = {&reader->context_memo, &reader->context_meta_memo,
                                    &reader->context_origin_memo, &reader->property_getter_memo};
    for (size_t i = 0; i < sizeof memos / sizeof memos[0]; i++) {
        Py_VISIT(memos[i]->type);
        Py_VISIT(memos[i]->access.object);
    }
    Py_VISIT(reader->last_link_type);
    for (int i = 0; i < SF_LINK_FUNCTIONS; i++) {
        Py_VISIT(reader->link_function[i]);
        Py_VISIT(reader->link_code[i]);
    }
    Py_VISIT(reader->ddtrace_span_type);
    Py_VISIT(reader->field_warning);
    Py_VISIT(reader->warned_types);
    Py_VISIT(reader->warned_dict_keys);
    Py_VISIT(reader->checked_dict_key_set);
    return 0;
}

/* ---------------------------------------------------------------------------
 * Where a class keeps an attribute */

static int
has_instance_dict(PyTypeObject *type)
{
#ifdef Py_TPFLAGS_MANAGED_DICT
    if (type->tp_flags & Py_TPFLAGS_MANAGED_DICT) {
        return 1;
    }
#endif
    return type->tp_dictoffset != 0;
}

/* A __slots__ member of `type` read straight from the instance: an object
 * slot whose getter does nothing but read it (an empty one raises
 * AttributeError: the attribute is really absent). */
static Py_ssize_t
member_slot_offset(PyTypeObject *type, PyObject *descr)
{
    if (Py_TYPE(descr) != &PyMemberDescr_Type) {
        return 0;
    }
    const PyMemberDef *member = ((PyMemberDescrObject *)descr)->d_member;
    if (member->type != SP_T_OBJECT_EX || (member->flags & SP_AUDIT_READ) ||
        !PyType_IsSubtype(type, PyDescr_TYPE(descr))) {
        return 0;
    }
    return member->offset;
}

/* How instances of `type` (held by the caller) give `attribute`: what
 * object.__getattribute__ does, decided from the class alone.  The class
 * lookup may run Python code (a key's __eq__ in a class __dict__), so the
 * result is a new reference in access->object and nothing else is trusted
 * across it.  Never fails. */
static void
classify_attribute(PyTypeObject *type, PyObject *attribute, FieldAccess *access, Py_ssize_t *offset)
{
    access->object = NULL;
    access->guard = NULL;
    *offset = 0;
    if (!PyUnicode_Check(attribute) || type->tp_getattro != PyObject_GenericGetAttr) {
        access->source = FIELD_GETATTR; /* dotted path, or customised access */
        return;
    }
    /* _PyType_Lookup holds the MRO across its dict lookups and never sets an
     * error; its result is borrowed, so it is owned at once. */
    PyObject *found = Py_XNewRef(_PyType_Lookup(type, attribute));
    int instance_dict = has_instance_dict(type);
    if (found == NULL) {
        access->source = instance_dict ? FIELD_INSTANCE : FIELD_ABSENT;
        return;
    }
    PyTypeObject *kind = Py_TYPE(found);
    if (kind->tp_descr_get != NULL && kind->tp_descr_set != NULL) {
        /* A data descriptor: it wins over the instance __dict__. */
        *offset = member_slot_offset(type, found);
        if (*offset != 0) {
            access->source = FIELD_SLOT;
            Py_DECREF(found);
            return;
        }
        /* A C type's attribute (a native span's name, ids, times): its
         * getter can be called without getset_get's type check, made here
         * once for the class. */
        access->source = kind == &PyGetSetDescr_Type &&
                                 ((PyGetSetDescrObject *)found)->d_getset->get != NULL &&
                                 PyType_IsSubtype(type, PyDescr_TYPE(found))
                             ? FIELD_GETSET
                             : FIELD_DESCRIPTOR;
        access->object = found;
        return;
    }
    if (kind->tp_descr_get != NULL) {
        /* A non-data descriptor (a method, cached_property): the instance
         * __dict__ shadows it, and its getter's errors are real. */
        access->source = instance_dict ? FIELD_GETATTR_STRICT : FIELD_DESCRIPTOR;
        if (instance_dict) {
            Py_DECREF(found);
        }
        else {
            access->object = found;
        }
        return;
    }
    /* A plain class attribute: a default the instance __dict__ may shadow. */
    access->source = instance_dict ? FIELD_INSTANCE : FIELD_CLASS_VALUE;
    access->object = found;
}

/* An attribute from the instance __dict__ or, failing that, the class (no
 * descriptor involved: see classify_attribute); NULL without error when
 * neither has it. */
static int
instance_attribute(PyObject *obj, PyObject *name, PyObject **value)
{
#if PY_VERSION_HEX >= 0x030E0000
    return PyObject_GetOptionalAttr(obj, name, value) < 0 ? -1 : 0;
#else
    *value = _PyObject_GenericGetAttrWithDict(obj, name, NULL, 1);
    return *value == NULL && PyErr_Occurred() ? -1 : 0;
#endif
}

static int get_attribute_path(PyObject *obj, PyObject *path, PyObject **value);

/* An accessor method (FIELD_ACCESSOR) called on `obj`: a C method without
 * arguments, of a base of `type` (checked once, when the layout was made),
 * directly, as its descriptor would call it once it has checked the class;
 * anything else through the descriptor. */
static inline PyObject *
call_accessor(PyObject *method, PyObject *obj, PyTypeObject *type)
{
    if (Py_IS_TYPE(method, &PyMethodDescr_Type) && Py_IS_TYPE(obj, type)) {
        PyMethodDef *def = ((PyMethodDescrObject *)method)->d_method;
        if (def->ml_flags == METH_NOARGS) {
            return def->ml_meth(obj, NULL);
        }
    }
    return PyObject_Vectorcall(method, &obj, 1, NULL);
}

/* Read one attribute of `obj` (of class `type`, held by the caller) as
 * `access` says.  May run Python code, except for slots and absent fields. */
static int
read_access(PyObject *obj, PyTypeObject *type, const FieldAccess *access, Py_ssize_t offset,
            PyObject *attribute, PyObject **value)
{
    *value = NULL;
    switch (access->source) {
    case FIELD_ABSENT:
        return 0;
    case FIELD_SLOT:
        *value = Py_XNewRef(*(PyObject **)((char *)obj + offset));
        return 0;
    case FIELD_CLASS_VALUE:
        *value = Py_NewRef(access->object);
        return 0;
    case FIELD_INSTANCE:
        return instance_attribute(obj, attribute, value);
    case FIELD_DESCRIPTOR: {
        descrgetfunc get = Py_TYPE(access->object)->tp_descr_get;
        /* (A class that lost __get__ since: ask Python, as it would be.) */
        *value = get != NULL ? get(access->object, obj, (PyObject *)type)
                             : PyObject_GetAttr(obj, attribute);
        return *value == NULL ? -1 : 0;
    }
    case FIELD_GETATTR_STRICT:
        *value = PyObject_GetAttr(obj, attribute);
        return *value == NULL ? -1 : 0;
    case FIELD_GETSET: {
        /* (`type` is a subclass of the descriptor's, checked once; an object
         * of another class is checked as getset_get would.) */
        PyGetSetDef *def = ((PyGetSetDescrObject *)access->object)->d_getset;
        if (SP_LIKELY(Py_IS_TYPE(obj, type))) {
            *value = def->get(obj, def->closure);
        }
        else {
            *value = Py_TYPE(access->object)->tp_descr_get(access->object, obj, (PyObject *)type);
        }
        return *value == NULL ? -1 : 0;
    }
    case FIELD_ACCESSOR:
        if (access->guard != NULL) {
            PyObject *any = call_accessor(access->guard, obj, type);
            int truth = any != NULL ? PyObject_IsTrue(any) : -1;
            Py_XDECREF(any);
            if (truth <= 0) {
                return truth; /* 0: none, so absent */
            }
        }
        *value = call_accessor(access->object, obj, type);
        return *value == NULL ? -1 : 0;
    case FIELD_ACCESSOR_LOOKUP:
        if (access->guard != NULL) {
            PyObject *any = PyObject_CallMethodNoArgs(obj, access->guard);
            int truth = any != NULL ? PyObject_IsTrue(any) : -1;
            Py_XDECREF(any);
            if (truth <= 0) {
                return truth; /* 0: none, so absent */
            }
        }
        *value = PyObject_CallMethodNoArgs(obj, access->object);
        return *value == NULL ? -1 : 0;
    case FIELD_GETATTR:
        if (!PyUnicode_Check(attribute)) {
            return get_attribute_path(obj, attribute, value);
        }
        *value = PyObject_GetAttr(obj, attribute);
        if (*value == NULL && PyErr_ExceptionMatches(PyExc_AttributeError)) {
            /* What hasattr() says: the class's own __getattr__ or
             * __getattribute__ decides what exists. */
            PyErr_Clear();
        }
        return *value == NULL && PyErr_Occurred() ? -1 : 0;
    }
    Py_UNREACHABLE();
}

int
spanfields_attribute(PyObject *obj, PyObject *name, PyObject **value)
{
    PyTypeObject *type = (PyTypeObject *)Py_NewRef((PyObject *)Py_TYPE(obj));
    FieldAccess access;
    Py_ssize_t offset;
    classify_attribute(type, name, &access, &offset);
    int result = read_access(obj, type, &access, offset, name, value);
    Py_XDECREF(access.object);
    Py_DECREF(type);
    return result;
}

static void
attribute_memo_clear(AttributeMemo *memo)
{
    memo->version_tag = 0;
    Py_CLEAR(memo->access.object);
    Py_CLEAR(memo->type);
}

/* spanfields_attribute, with what the class gives for `name` kept in
 * `memo` (always the same name) while its version tag holds.  The tag is
 * taken before the class lookup: a class changed during it is classified
 * again at the next read. */
static int
memo_attribute(AttributeMemo *memo, PyObject *obj, PyObject *name, PyObject **value)
{
    PyTypeObject *type = (PyTypeObject *)Py_NewRef((PyObject *)Py_TYPE(obj));
    unsigned int tag = sp_type_version_tag(type);
    FieldAccess access;
    Py_ssize_t offset;
    if (type == memo->type && tag != 0 && tag == memo->version_tag) {
        access = memo->access;
        offset = memo->offset;
        Py_XINCREF(access.object);
    }
    else {
        classify_attribute(type, name, &access, &offset);
        AttributeMemo old = *memo;
        memo->type = (PyTypeObject *)Py_NewRef((PyObject *)type);
        /* Kept only when what was found cannot change without the class's
         * tag changing: nothing, or an object of a static type (a slot,
         * getset or property).  An object of a Python class (a descriptor
         * of one's own, a plain value) depends on that class too, which can
         * gain or lose __get__ and __set__: tag 0, never used. */
        memo->version_tag =
            access.object == NULL || !(Py_TYPE(access.object)->tp_flags & Py_TPFLAGS_HEAPTYPE) ? tag
                                                                                               : 0;
        memo->access = access;
        memo->offset = offset;
        Py_XINCREF(access.object);
        attribute_memo_clear(&old); /* (last: its references may run code) */
    }
    /* (Read with references of its own: the read may run code that reads
     * another class through this memo.) */
    int result = read_access(obj, type, &access, offset, name, value);
    Py_XDECREF(access.object);
    Py_DECREF(type);
    return result;
}

/* A dotted path (a tuple of names): each step read as spanfields_attribute
 * reads it; a missing attribute or None part-way means absent. */
static int
get_attribute_path(PyObject *obj, PyObject *path, PyObject **value)
{
    PyObject *current = Py_NewRef(obj);
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(path) && current != NULL; i++) {
        PyObject *next = NULL;
        if (current != Py_None &&
            spanfields_attribute(current, PyTuple_GET_ITEM(path, i), &next) < 0) {
            Py_DECREF(current);
            return -1;
        }
        Py_DECREF(current);
        current = next;
    }
    *value = current;
    return 0;
}

/* A C method without arguments, called straight (the class was checked to
 * be a subclass of its own when the layout was made), or NULL. */
static PyCFunction
direct_method(PyObject *method)
{
    if (method == NULL || !Py_IS_TYPE(method, &PyMethodDescr_Type)) {
        return NULL;
    }
    const PyMethodDef *def = ((PyMethodDescrObject *)method)->d_method;
    return def->ml_flags == METH_NOARGS ? def->ml_meth : NULL;
}

/* The layout's direct_* parts (see SpanTypeLayout). */
static void
index_direct_calls(SpanTypeLayout *layout)
{
    layout->direct_fields = 0;
    for (int i = 0; i < SF_COUNT; i++) {
        const FieldAccess *access = &layout->access[i];
        layout->direct_get[i] = NULL;
        layout->direct_closure[i] = NULL;
        layout->direct_method[i] = NULL;
        layout->direct_guard[i] = NULL;
        if (access->source == FIELD_GETSET) {
            const PyGetSetDef *def = ((PyGetSetDescrObject *)access->object)->d_getset;
            layout->direct_get[i] = def->get;
            layout->direct_closure[i] = def->closure;
            layout->direct_fields |= 1u << i;
        }
        else if (access->source == FIELD_ACCESSOR) {
            layout->direct_method[i] = direct_method(access->object);
            layout->direct_guard[i] = direct_method(access->guard);
            if (layout->direct_method[i] != NULL &&
                (access->guard == NULL || layout->direct_guard[i] != NULL)) {
                layout->direct_fields |= 1u << i;
            }
        }
    }
}

/* The derived parts of a layout: which fields need calls, the packed slot
 * list, and what to prefetch. */
static void
layout_index(const SpFastPaths *fast_paths, SpanTypeLayout *layout, PyTypeObject *type,
             PyObject *const *attributes)
{
    layout->instance_fields = 0;
    layout->shared_keys = NULL;
    layout->shared_key_count = 0;
#ifdef SP_INSTANCE_VALUES_IN_PLACE
    const SpDictKeys *keys = pyinstance_shared_keys(fast_paths, type);
    if (keys != NULL) {
        layout->shared_keys = keys;
        layout->shared_key_count = keys->dk_nentries;
        for (int i = 0; i < SF_COUNT; i++) {
            if (layout->access[i].source == FIELD_INSTANCE && PyUnicode_CheckExact(attributes[i])) {
                layout->instance_fields |= 1u << i;
                layout->position[i] = pyinstance_position(keys, attributes[i]);
            }
        }
    }
#else
    (void)fast_paths;
    (void)type;
    (void)attributes;
#endif
    layout->call_fields = 0;
    layout->getter_fields = 0;
    layout->slot_field_count = 0;
    layout->slot_count = 0;
    for (int i = 0; i < SF_COUNT; i++) {
        FieldSource source = layout->access[i].source;
        if (source != FIELD_SLOT && source != FIELD_ABSENT) {
            layout->call_fields |= 1u << i;
        }
        if (source != FIELD_SLOT && source != FIELD_ABSENT && source != FIELD_INSTANCE) {
            layout->getter_fields |= 1u << i;
        }
        if (source != FIELD_SLOT || !(SF_PER_SPAN_FIELDS & (1u << i))) {
            continue;
        }
        layout->slot_fields[layout->slot_field_count++] = (signed char)i;
        if (SF_PREFETCHED_FIELDS & (1u << i)) {
            layout->slot_offsets[layout->slot_count++] = layout->offset[i];
        }
    }
    layout->span_call_fields = layout->call_fields & ~layout->instance_fields & SF_PER_SPAN_FIELDS;
    index_direct_calls(layout);
    static const SpanField peeked[4] = {SF_SERVICE, SF_NAME, SF_RESOURCE, SF_SPAN_TYPE};
    for (int k = 0; k < 4; k++) {
        layout->peek_offset[k] = layout->offset[peeked[k]]; /* 0 unless a slot */
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
}

/* Have the layout's descriptors and defaults kept their classes, and those
 * classes stayed as they were?  (The objects are held, but a class can gain
 * or lose __get__, and an object can be given another class.) */
static inline int
watched_unchanged(const SpanTypeLayout *layout)
{
    for (int k = 0; k < layout->watched_count; k++) {
        PyTypeObject *kind = layout->watched[k];
        if (Py_TYPE(layout->access[layout->watched_field[k]].object) != kind ||
            sp_type_version_tag(kind) != layout->watched_tag[k]) {
            return 0;
        }
    }
    return 1;
}

/* Note (owning them: an object given another class no longer keeps its
 * old one alive) the classes of the layout's objects that can change.  0
 * when one of them has no version tag to watch (then the layout is never
 * reused).  The layout watches nothing on entry. */
static int
watch_object_types(SpanTypeLayout *layout)
{
    for (int i = 0; i < SF_COUNT; i++) {
        PyObject *object = layout->access[i].object;
        if (object == NULL || !(Py_TYPE(object)->tp_flags & Py_TPFLAGS_HEAPTYPE)) {
            continue; /* static types (property, int, str...) never change */
        }
        PyTypeObject *kind = Py_TYPE(object);
        unsigned int tag = sp_type_version_tag(kind);
        if (tag == 0) {
            return 0;
        }
        layout->watched[layout->watched_count] = (PyTypeObject *)Py_NewRef((PyObject *)kind);
        layout->watched_field[layout->watched_count] = (unsigned char)i;
        layout->watched_tag[layout->watched_count++] = tag;
    }
    return 1;
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

/* ---------------------------------------------------------------------------
 * Checking a class's names (once, when its layout is resolved) */

/* Is `type` the class `name` of module `module`?  Looking `__module__` up
 * in the class's own dict may compare keys, which runs Python code: the
 * class and its dict are held across it.  1, 0, or -1 with an error. */
static int
class_named(PyTypeObject *type, const char *module, const char *name)
{
    /* (A class made in C may have its module in tp_name: "module.Name".) */
    const char *last_dot = strrchr(type->tp_name, '.');
    const char *short_name = last_dot != NULL ? last_dot + 1 : type->tp_name;
    if (strcmp(short_name, name) != 0 || type->tp_dict == NULL) {
        return 0;
    }
    int result = -1;
    PyObject *found = NULL;
    Py_INCREF(type);
    PyObject *type_dict = Py_NewRef(type->tp_dict);
    PyObject *module_key = PyUnicode_InternFromString("__module__");
    if (module_key == NULL || dict_get_ref(type_dict, module_key, &found) < 0) {
        goto done;
    }
    result = found != NULL && PyUnicode_Check(found) &&
             PyUnicode_CompareWithASCIIString(found, module) == 0;
done:
    Py_XDECREF(found);
    Py_XDECREF(module_key);
    Py_DECREF(type_dict);
    Py_DECREF(type);
    return result;
}

/* Is `type` ddtrace's own Span class or a subclass of it (held by the
 * caller)?  ddtrace's encoder reads every Span through the same private
 * attributes (`_meta`, `_metrics`, ...), so spanpack does too.  Found by
 * module and name, never by importing ddtrace; the class is kept once
 * found.  1, 0, or -1 with an error. */
static int
is_ddtrace_span_class(SpanFieldReader *reader, PyTypeObject *type)
{
    PyObject *mro = Py_XNewRef(type->tp_mro);
    int result = 0;
    for (Py_ssize_t i = 0; mro != NULL && i < PyTuple_GET_SIZE(mro) && result == 0; i++) {
        PyTypeObject *base = (PyTypeObject *)PyTuple_GET_ITEM(mro, i);
        if (base == reader->ddtrace_span_type) {
            result = 1;
        }
        else if (reader->ddtrace_span_type == NULL) {
            result = class_named(base, "ddtrace._trace.span", "Span");
            if (result > 0 && reader->ddtrace_span_type == NULL) {
                reader->ddtrace_span_type = (PyTypeObject *)Py_NewRef((PyObject *)base);
            }
        }
    }
    Py_XDECREF(mro);
    return result;
}

/* The version of the ddtrace loaded in this process, for messages: its
 * `__version__` (never importing it), else "of an unknown version".  A new
 * reference, or NULL with an error. */
static PyObject *
ddtrace_version_text(void)
{
    PyObject *name = PyUnicode_FromString("ddtrace");
    PyObject *module = name != NULL ? PyImport_GetModule(name) : NULL;
    PyObject *version = module != NULL ? PyObject_GetAttrString(module, "__version__") : NULL;
    PyObject *text = NULL;
    if (version != NULL && PyUnicode_Check(version)) {
        text = PyUnicode_FromFormat("%U", version);
    }
    else if (name != NULL) {
        PyErr_Clear(); /* no module, or no version: said so instead */
        text = PyUnicode_FromString("of an unknown version");
    }
    Py_XDECREF(version);
    Py_XDECREF(module);
    Py_XDECREF(name);
    return text;
}

/* "module.QualifiedName" of a class, for messages (a new reference). */
static PyObject *
class_display_name(PyTypeObject *type)
{
    PyObject *module = PyObject_GetAttrString((PyObject *)type, "__module__");
    PyObject *qualname = module ? PyObject_GetAttrString((PyObject *)type, "__qualname__") : NULL;
    PyObject *result = NULL;
    if (qualname != NULL) {
        result = PyUnicode_Check(module) && PyUnicode_CompareWithASCIIString(module, "builtins")
                     ? PyUnicode_FromFormat("%S.%S", module, qualname)
                     : PyObject_Str(qualname);
    }
    Py_XDECREF(module);
    Py_XDECREF(qualname);
    return result;
}

typedef enum { NAME_ABSENT, NAME_PRESENT, NAME_UNKNOWN } NameState;

/* Does `span` (of class `type`, both held by the caller) have attribute
 * `name`, decided without running its getters: a property counts as
 * present, a method or a class's own __getattr__ as unknown.  A NameState,
 * or -1 with an error. */
static int
name_state(PyObject *span, PyTypeObject *type, PyObject *name)
{
    FieldAccess access;
    Py_ssize_t offset;
    classify_attribute(type, name, &access, &offset);
    int state = NAME_UNKNOWN;
    PyObject *value = NULL;
    switch (access.source) {
    case FIELD_ABSENT:
        state = NAME_ABSENT;
        break;
    case FIELD_SLOT:
        state = *(PyObject **)((char *)span + offset) != NULL ? NAME_PRESENT : NAME_ABSENT;
        break;
    case FIELD_INSTANCE:
        if (instance_attribute(span, name, &value) < 0) {
            state = -1;
            break;
        }
        state = value != NULL ? NAME_PRESENT : NAME_ABSENT;
        Py_XDECREF(value);
        break;
    case FIELD_CLASS_VALUE:
    case FIELD_ACCESSOR:
    case FIELD_ACCESSOR_LOOKUP:
    case FIELD_GETSET:
        state = NAME_PRESENT;
        break;
    case FIELD_DESCRIPTOR:
        state = Py_TYPE(access.object)->tp_descr_set != NULL ? NAME_PRESENT : NAME_UNKNOWN;
        break;
    case FIELD_GETATTR_STRICT:
    case FIELD_GETATTR:
        break;
    }
    Py_XDECREF(access.object);
    return state;
}

/* The other names a span class commonly keeps a field under (checked in
 * this order; a field whose own name is absent from a class's first span
 * while one of these is present is reported). */
#define FIELD_ALIAS_MAX 5
static const struct {
    SpanField field;
    const char *names[FIELD_ALIAS_MAX + 1]; /* NULL-terminated */
} FIELD_ALIASES[] = {
    {SF_META, {"tags", "attributes", "attrs", "labels", "_meta", NULL}},
    {SF_METRICS, {"measures", "measurements", "numeric_tags", "_metrics", NULL}},
    {SF_DURATION, {"duration", NULL}},
    {SF_PARENT_ID, {"parent", "parent_span_id", NULL}},
    {SF_SPAN_TYPE, {"type", NULL}},
};

/* The first of `field`'s other names that `span` has, or NULL (a new
 * reference; *failed set on error). */
static PyObject *
present_alias(PyObject *span, PyTypeObject *type, int alias, int *failed)
{
    for (const char *const *name = FIELD_ALIASES[alias].names; *name != NULL; name++) {
        PyObject *candidate = PyUnicode_InternFromString(*name);
        int state = candidate != NULL ? name_state(span, type, candidate) : -1;
        if (state == NAME_PRESENT) {
            return candidate;
        }
        Py_XDECREF(candidate);
        if (state < 0) {
            *failed = 1;
            return NULL;
        }
    }
    return NULL;
}

/* Warn, once per class, when the first span of `type` lacks a field but has
 * an attribute under one of its other common names: that data would not be
 * written, without a sign.  A field the fields= mapping names is not
 * checked (mapping it silences the warning), nor a required one (its
 * absence is an error), nor anything for ddtrace's Span.  0, or -1 with an
 * error (the warning itself under an "error" filter) and *failed set to the
 * first field reported. */
static int
warn_other_names(SpanFieldReader *reader, PyTypeObject *type, PyObject *span,
                 PyObject *const *attributes, int *failed)
{
    PyObject *found = NULL, *parts = NULL, *weak = NULL, *name = NULL, *message = NULL;
    PyObject *separator = NULL, *listed = NULL;
    int result = -1, first = -1, added = 0;
    if (reader->field_warning == NULL || span == NULL) {
        return 0;
    }
    weak = PyWeakref_NewRef((PyObject *)type, NULL);
    if (weak == NULL) {
        goto done;
    }
    if (reader->warned_types != NULL) {
        int seen = PySet_Contains(reader->warned_types, weak);
        if (seen != 0) {
            result = seen < 0 ? -1 : 0;
            goto done;
        }
    }
    found = PyDict_New();
    parts = PyList_New(0);
    if (found == NULL || parts == NULL) {
        goto done;
    }
    for (int k = 0; k < (int)(sizeof FIELD_ALIASES / sizeof FIELD_ALIASES[0]); k++) {
        SpanField field = FIELD_ALIASES[k].field;
        if (((reader->mapped | reader->required) & (1u << field)) != 0 ||
            !PyUnicode_Check(attributes[field])) {
            continue;
        }
        int state = name_state(span, type, attributes[field]);
        if (state < 0) {
            goto done;
        }
        if (state != NAME_ABSENT) {
            continue;
        }
        int alias_failed = 0;
        PyObject *alias = present_alias(span, type, k, &alias_failed);
        if (alias_failed) {
            goto done;
        }
        if (alias == NULL) {
            continue;
        }
        PyObject *part = PyUnicode_FromFormat("%R but no %R", alias, attributes[field]);
        int set = part != NULL && PyList_Append(parts, part) == 0
                      ? PyDict_SetItemString(found, span_field_names[field], alias)
                      : -1;
        Py_XDECREF(part);
        Py_DECREF(alias);
        if (set < 0) {
            goto done;
        }
        if (first < 0) {
            first = (int)field;
        }
    }
    if (first < 0) {
        result = 0;
        goto done;
    }
    if (reader->warned_types == NULL && (reader->warned_types = PySet_New(NULL)) == NULL) {
        goto done;
    }
    /* Noted before warning: a warnings hook that encodes this class again
     * is not warned again. */
    if (PySet_Add(reader->warned_types, weak) < 0) {
        goto done;
    }
    added = 1;
    name = class_display_name(type);
    separator = PyUnicode_FromString(", ");
    listed = name != NULL && separator != NULL ? PyUnicode_Join(separator, parts) : NULL;
    if (listed == NULL) {
        goto done;
    }
    int several = PyDict_GET_SIZE(found) > 1;
    message =
        PyUnicode_FromFormat("span class %U has %U, which spanpack does not write: encode "
                             "with fields=%R to write %s, or map the field%s to silence "
                             "this warning",
                             name, listed, found, several ? "them" : "it", several ? "s" : "");
    if (message == NULL) {
        goto done;
    }
    const char *text = PyUnicode_AsUTF8(message);
    result = text != NULL ? PyErr_WarnEx(reader->field_warning, text, 1) : -1;
done:
    if (result < 0) {
        *failed = first >= 0 ? first : -1;
        if (added) {
            /* Raised instead of shown (an "error" filter): say it again at
             * the next encode, as Python's own warnings do. */
            PyObject *type_, *value, *traceback;
            PyErr_Fetch(&type_, &value, &traceback);
            if (PySet_Discard(reader->warned_types, weak) < 0) {
                PyErr_Clear();
            }
            PyErr_Restore(type_, value, traceback);
        }
    }
    Py_XDECREF(message);
    Py_XDECREF(listed);
    Py_XDECREF(separator);
    Py_XDECREF(name);
    Py_XDECREF(parts);
    Py_XDECREF(found);
    Py_XDECREF(weak);
    return result;
}

/* A fields= mapping that names an attribute `type` can never have (no slot,
 * class attribute, __getattr__ or instance __dict__) is a typo that would
 * lose the field on every span: a TypeError naming both, *failed the
 * field.  For a dotted path the first step is checked. */
static int
check_mapped_names(SpanFieldReader *reader, PyTypeObject *type, const FieldAccess *access,
                   int *failed)
{
    for (int i = 0; i < SF_COUNT; i++) {
        if (!(reader->mapped & (1u << i))) {
            continue;
        }
        PyObject *attribute = reader->attribute[i];
        PyObject *first = PyTuple_Check(attribute) ? PyTuple_GET_ITEM(attribute, 0) : attribute;
        FieldSource source = access[i].source;
        if (first != attribute) {
            FieldAccess step;
            Py_ssize_t offset;
            classify_attribute(type, first, &step, &offset);
            source = step.source;
            Py_XDECREF(step.object);
        }
        if (source != FIELD_ABSENT) {
            continue;
        }
        PyObject *name = class_display_name(type);
        if (name != NULL) {
            PyErr_Format(PyExc_TypeError,
                         "fields maps %s to %R, an attribute span class %U can never have (no "
                         "slot, class attribute, __getattr__ or instance __dict__ holds it)",
                         span_field_names[i], first, name);
            Py_DECREF(name);
        }
        *failed = i;
        return -1;
    }
    return 0;
}

/* Refuse a ddtrace span class whose `field` spanpack cannot read (`why`):
 * a TypeError naming the ddtrace version, the class and the field, *failed
 * the field.  Always -1. */
static int
ddtrace_layout_unknown(PyTypeObject *type, int field, const char *why, PyObject *detail,
                       int *failed)
{
    *failed = field;
    PyObject *version = ddtrace_version_text();
    PyObject *name = version != NULL ? class_display_name(type) : NULL;
    if (name != NULL) {
        PyErr_Format(PyExc_TypeError,
                     "ddtrace %U: span class %U keeps its %s in a way spanpack does not know (%s "
                     "%R), so its spans cannot be written whole; spanpack reads the Span of "
                     "ddtrace 4.x releases, whose tags are attributes or behind accessors",
                     version, name, span_field_names[field], why, detail);
    }
    Py_XDECREF(name);
    Py_XDECREF(version);
    return -1;
}

/* A method ddtrace's class defines and its encoder calls with the span
 * alone: a C method of a base of `type`, or a Python function, found on the
 * class. */
static inline int
is_plain_method(PyTypeObject *type, PyObject *found)
{
    return found != NULL && ((Py_IS_TYPE(found, &PyMethodDescr_Type) &&
                              PyType_IsSubtype(type, PyDescr_TYPE(found))) ||
                             PyFunction_Check(found));
}

/* The accesses of ddtrace's own Span class (or a subclass of it), as the
 * ddtrace in this process keeps its fields.  Each of the fields that
 * DDTRACE_ACCESSORS lists is read from ddtrace's attribute where the class
 * has it (`_meta`, `_links`, ...: `access` as resolved from ddtrace's
 * attribute names; ddtrace's pure-Python Span and its first native ones,
 * and 4.8's `_meta`/`_metrics`), else through ddtrace's accessor, as its
 * encoder calls it once the attribute is gone: a C method of a base or a
 * Python function called straight (FIELD_ACCESSOR), any other callable the
 * class gives (a wrapper, a partialmethod) and anything on a class whose
 * instances have a __dict__ (which may override it) by attribute lookup
 * (FIELD_ACCESSOR_LOOKUP).  Anything else is refused, never read in part: a
 * field with neither, an accessor that is a data descriptor or no callable,
 * a field every ddtrace Span has missing.  0, or -1 with a TypeError
 * (*failed the field). */
static int
resolve_ddtrace_fields(SpanFieldReader *reader, PyTypeObject *type, FieldAccess *access,
                       int *failed)
{
    int lookup = has_instance_dict(type);
    for (int k = 0; k < DDTRACE_ACCESSOR_COUNT; k++) {
        SpanField field = DDTRACE_ACCESSORS[k].field;
        if (access[field].source != FIELD_ABSENT && access[field].source != FIELD_INSTANCE) {
            continue; /* kept as an attribute: read as ddtrace's encoder reads it */
        }
        /* (ddtrace's Span keeps none in an instance __dict__: a subclass's
         * __dict__ may hold such a name, but not ddtrace's tags.) */
        PyObject *names[2] = {reader->ddtrace_accessor[field],
                              reader->ddtrace_accessor_guard[field]};
        PyObject *found[2] = {NULL, NULL};
        int plain = !lookup;
        for (int j = 0; j < 2; j++) {
            if (names[j] == NULL) {
                continue;
            }
            /* _PyType_Lookup's result is borrowed: owned at once (see
             * classify_attribute). */
            found[j] = Py_XNewRef(_PyType_Lookup(type, names[j]));
            /* What the span's attribute lookup gives must be called: a
             * callable, or what a non-data descriptor binds; a data
             * descriptor (a property) is a field, not an accessor. */
            PyTypeObject *kind = found[j] != NULL ? Py_TYPE(found[j]) : NULL;
            const char *why = found[j] == NULL ? "no accessor"
                              : kind->tp_descr_set != NULL ||
                                      (kind->tp_descr_get == NULL && !PyCallable_Check(found[j]))
                                  ? "not a method:"
                                  : NULL;
            if (why != NULL) {
                Py_XDECREF(found[0]);
                Py_XDECREF(found[1]);
                return ddtrace_layout_unknown(type, field, why, names[j], failed);
            }
            plain &= is_plain_method(type, found[j]);
        }
        Py_XDECREF(access[field].object);
        if (plain) {
            access[field] = (FieldAccess){FIELD_ACCESSOR, found[0], found[1]};
        }
        else {
            Py_XDECREF(found[0]);
            Py_XDECREF(found[1]);
            access[field] =
                (FieldAccess){FIELD_ACCESSOR_LOOKUP, Py_NewRef(names[0]), Py_XNewRef(names[1])};
        }
    }
    /* The fields every ddtrace Span has, whichever way it keeps them. */
    for (int i = SF_FIRST_PER_SPAN; i <= SF_LAST_PER_SPAN; i++) {
        if (access[i].source == FIELD_ABSENT) {
            return ddtrace_layout_unknown(type, i, "no accessor and no attribute",
                                          reader->ddtrace_attribute[i], failed);
        }
    }
    return 0;
}

/* Is a ddtrace span class's trace_id read by the getter of ddtrace's native
 * SpanData, which returns its Rust u128 as an int (ddtrace's
 * src/native/span/span_data.rs; the class is in ddtrace.internal._native up
 * to 4.9, ddtrace.internal.native._native in 4.16)?  1, 0, or -1 with an
 * error. */
static int
native_trace_id(const FieldAccess *access, int *failed)
{
    if (access->source != FIELD_GETSET) {
        return 0;
    }
    PyTypeObject *owner = PyDescr_TYPE(access->object);
    int result = class_named(owner, "ddtrace.internal.native._native", "SpanData");
    if (result == 0) {
        result = class_named(owner, "ddtrace.internal._native", "SpanData");
    }
    if (result < 0) {
        *failed = -1;
    }
    return result;
}

/* Is `function` the function `qualname` of module `module`, with code of
 * that name from a file of that module (whose path ends with `path`, a '/'
 * first, with '/' for any separator)?  Code given to the function from elsewhere
 * (`__code__` assigned) is not.  1, 0, or -1 with an error. */
static int
function_named(PyObject *function, const char *module, const char *qualname, const char *path)
{
    if (!PyFunction_Check(function)) {
        return 0;
    }
    const char *last_dot = strrchr(qualname, '.');
    const char *short_name = last_dot != NULL ? last_dot + 1 : qualname;
    PyObject *module_name = PyFunction_GET_MODULE(function); /* borrowed */
    PyCodeObject *code = (PyCodeObject *)PyFunction_GET_CODE(function);
    PyObject *own_qualname = PyObject_GetAttrString(function, "__qualname__");
    PyObject *file = NULL, *suffix = NULL;
    int result = -1;
    if (own_qualname == NULL) {
        goto done;
    }
    result = module_name != NULL && PyUnicode_Check(module_name) &&
             PyUnicode_CompareWithASCIIString(module_name, module) == 0 &&
             PyUnicode_Check(own_qualname) &&
             PyUnicode_CompareWithASCIIString(own_qualname, qualname) == 0 &&
             PyUnicode_Check(code->co_name) &&
             PyUnicode_CompareWithASCIIString(code->co_name, short_name) == 0 &&
             PyUnicode_CheckExact(code->co_filename);
    if (result <= 0) {
        goto done;
    }
    result = -1;
    PyObject *backslash = PyUnicode_FromString("\\");
    PyObject *slash = backslash != NULL ? PyUnicode_FromString("/") : NULL;
    file = slash != NULL ? PyUnicode_Replace(code->co_filename, backslash, slash, -1) : NULL;
    Py_XDECREF(slash);
    Py_XDECREF(backslash);
    suffix = PyUnicode_FromString(path);
    if (file == NULL || suffix == NULL) {
        goto done;
    }
    Py_ssize_t match = PyUnicode_Tailmatch(file, suffix, 0, PY_SSIZE_T_MAX, 1);
    result = match < 0 ? -1 : match > 0;
done:
    Py_XDECREF(suffix);
    Py_XDECREF(file);
    Py_XDECREF(own_qualname);
    return result;
}

/* Is the ddtrace imported a 4.16 release (the one whose Span.context was
 * read to be the lazy property resolve_context_slot stands in for)?  1, 0,
 * or -1 with an error. */
static int
ddtrace_is_4_16(void)
{
    PyObject *version = ddtrace_version_text();
    PyObject *prefix = version != NULL ? PyUnicode_FromString("4.16.") : NULL;
    Py_ssize_t match =
        prefix != NULL ? PyUnicode_Tailmatch(version, prefix, 0, PY_SSIZE_T_MAX, -1) : -1;
    Py_XDECREF(prefix);
    Py_XDECREF(version);
    return match < 0 ? -1 : match > 0;
}

/* For ddtrace's Span class or a subclass (`type`, held by the caller): when
 * its `context` is ddtrace 4.16's lazy property, `ddtrace._trace.span`'s
 * `Span.context` (returns the `_context` slot when set, else builds the
 * context, sets the slot and returns it), the slot's offset and the
 * property, its getter and the getter's code (new references) into the
 * layout's fields; else they stay 0 and NULL.  Another release's property
 * may do more, and is run.  Only for the generic attribute lookup (an own
 * __getattribute__ could answer otherwise).  0, or -1 with an error. */
static int
resolve_context_slot(SpanFieldReader *reader, PyTypeObject *type, Py_ssize_t *offset,
                     PyObject **property_found, PyObject **getter, PyObject **code)
{
    *offset = 0;
    *property_found = *getter = *code = NULL;
    if (type->tp_getattro != PyObject_GenericGetAttr) {
        return 0;
    }
    int known_release = ddtrace_is_4_16();
    if (known_release <= 0) {
        return known_release;
    }
    /* _PyType_Lookup's results are borrowed: owned at once. */
    PyObject *property = Py_XNewRef(_PyType_Lookup(type, reader->context_name));
    PyObject *slot = Py_XNewRef(_PyType_Lookup(type, reader->context_slot_name));
    PyObject *fget = NULL;
    int result = 0;
    Py_ssize_t slot_offset = slot != NULL ? member_slot_offset(type, slot) : 0;
    if (property == NULL || !Py_IS_TYPE(property, &PyProperty_Type) || slot_offset <= 0) {
        goto done;
    }
    fget = PyObject_GetAttr(property, reader->property_getter_name);
    if (fget == NULL) {
        result = -1;
        goto done;
    }
    result = function_named(fget, "ddtrace._trace.span", "Span.context", "/ddtrace/_trace/span.py");
    if (result > 0) {
        *offset = slot_offset;
        *property_found = Py_NewRef(property);
        *getter = Py_NewRef(fget);
        *code = Py_NewRef(PyFunction_GET_CODE(fget));
        result = 0;
    }
done:
    Py_XDECREF(fget);
    Py_XDECREF(slot);
    Py_XDECREF(property);
    return result;
}

/* The layout of `type`, from the cache or resolved now (from `span`, an
 * instance, or NULL: the first span of a class is checked for misnamed
 * fields).  Resolving may run Python code (a key's __eq__ in a class
 * __dict__, which could even switch the span's class and free `type`; a
 * warning's filters and hooks): the class is held, the accesses are
 * computed first and installed in one step afterwards, and the caller
 * copies what it needs before it runs any Python code itself.  NULL with an
 * error, *failed naming the field (-1: none), when the class's names are
 * refused or a warning raised. */
static SP_NOINLINE SpanTypeLayout *layout_resolve(SpanFieldReader *reader, PyTypeObject *type,
                                                  PyObject *span, int *failed);

/* Is `layout` the one for `type` as the class is now?  A changed class (e.g.
 * a slot replaced by a property) gets a new version tag, and is resolved
 * again. */
static inline int
layout_current(const SpanTypeLayout *layout, PyTypeObject *type)
{
    return layout->type == type && layout->version_tag != 0 &&
           layout->version_tag == sp_type_version_tag(type) && watched_unchanged(layout);
}

static inline SpanTypeLayout *
layout_for(SpanFieldReader *reader, PyTypeObject *type, PyObject *span, int *failed)
{
    for (int i = 0; i < SPAN_LAYOUT_CACHE; i++) {
        SpanTypeLayout *layout = &reader->layouts[i];
        if (layout_current(layout, type)) {
            reader->last_layout = i;
            return layout;
        }
    }
    return layout_resolve(reader, type, span, failed);
}

static SP_NOINLINE SpanTypeLayout *
layout_resolve(SpanFieldReader *reader, PyTypeObject *type, PyObject *span, int *failed)
{
    reader->resolutions++;
    Py_INCREF(type);
    PyObject *const *attributes = reader->attribute;
    int ddtrace_span = reader->recognise_ddtrace || reader->ddtrace_fields
                           ? is_ddtrace_span_class(reader, type)
                           : 0;
    if (ddtrace_span < 0) {
        *failed = -1;
        Py_DECREF(type);
        return NULL;
    }
    if (ddtrace_span) {
        attributes = reader->ddtrace_attribute; /* (with fields="ddtrace", the same names) */
    }
    FieldAccess access[SF_COUNT];
    Py_ssize_t offsets[SF_COUNT];
    /* The first lookup gives the class a version tag; a change to the class
     * while the others run (Python code) changes it, and this layout is then
     * resolved again at the next span. */
    classify_attribute(type, attributes[0], &access[0], &offsets[0]);
    unsigned int version_tag = sp_type_version_tag(type);
    for (int i = 1; i < SF_COUNT; i++) {
        classify_attribute(type, attributes[i], &access[i], &offsets[i]);
    }
    int trace_id_is_int = 0;
    Py_ssize_t context_offset = 0;
    PyObject *context_property = NULL, *context_getter = NULL, *context_code = NULL;
    if (check_mapped_names(reader, type, access, failed) < 0 ||
        (ddtrace_span && resolve_ddtrace_fields(reader, type, access, failed) < 0) ||
        (ddtrace_span && (trace_id_is_int = native_trace_id(&access[SF_TRACE_ID], failed)) < 0) ||
        (ddtrace_span && resolve_context_slot(reader, type, &context_offset, &context_property,
                                              &context_getter, &context_code) < 0) ||
        (!ddtrace_span && warn_other_names(reader, type, span, attributes, failed) < 0)) {
        for (int i = 0; i < SF_COUNT; i++) {
            Py_XDECREF(access[i].object);
            Py_XDECREF(access[i].guard);
        }
        Py_XDECREF(context_property);
        Py_XDECREF(context_getter);
        Py_XDECREF(context_code);
        Py_DECREF(type);
        return NULL;
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
    /* Swap in the new entry, then release the old one's references: that
     * may run finalizers, which find the cache consistent. */
    SpanTypeLayout previous = *layout;
    memcpy(layout->access, access, sizeof access);
    memcpy(layout->offset, offsets, sizeof offsets);
    layout->attributes = attributes;
    layout_index(&reader->fast_paths, layout, type, attributes);
    layout->trace_id_is_int = trace_id_is_int;
    layout->strict_never_refuses = -1;
    layout->context_offset = context_offset;
    layout->context_property = context_property; /* (the references made above) */
    layout->context_getter = context_getter;
    layout->context_code = context_code;
    layout->type = type;       /* takes the reference held above */
    layout->watched_count = 0; /* `previous` releases what it watched */
    int watchable = watch_object_types(layout);
    layout->version_tag = watchable && version_tag == sp_type_version_tag(type) ? version_tag : 0;
    reader->last_layout = (int)(layout - reader->layouts);
    /* Releasing the replaced entry's objects can run finalizers, which may
     * use this reader and evict the entry just made: then make it again. */
    layout_clear(&previous);
    if (layout->type != type) {
        return layout_for(reader, type, span, failed);
    }
    return layout;
}

/* Bit i set for every field i in [first, last]. */
static inline uint32_t
fields_mask(SpanField first, SpanField last)
{
    return ((2u << last) - 1) & ~((1u << first) - 1);
}

/* The `fields` (FIELD_INSTANCE ones) of `span` read from its values array
 * in place: borrowed, each the instance's own value, else the class default,
 * else NULL.  0 when they cannot be read so (then read them generically). */
static inline int
read_instance_fields(SpanTypeLayout *layout, PyObject *span, uint32_t fields, PyObject **value)
{
#ifdef SP_INSTANCE_VALUES_IN_PLACE
    const SpDictKeys *keys = layout->shared_keys;
    Py_ssize_t capacity;
    PyObject *const *values;
    if (keys == NULL || (values = pyinstance_values(span, keys, &capacity)) == NULL) {
        return 0;
    }
    if (keys->dk_nentries != layout->shared_key_count) {
        /* New names since the layout was made: find the fields not there
         * then again at the next span (positions never move). */
        layout->version_tag = 0;
        return 0;
    }
    while (fields != 0) {
        int i = __builtin_ctz(fields);
        fields &= fields - 1;
        Py_ssize_t position = layout->position[i];
        PyObject *own = position >= 0 && position < capacity ? values[position] : NULL;
        value[i] = own != NULL ? own : layout->access[i].object;
    }
    return 1;
#else
    (void)layout;
    (void)span;
    (void)fields;
    (void)value;
    return 0;
#endif
}

/* The fields `calls` of `span` (of class `type`, held by the caller) that
 * `layout` reads by a call, as new references, each one's bit set in *done.
 * The accesses are owned first: a call may evict `layout` from the cache.
 * With `stop_at_change`, the calls stop after one that changed the span's
 * class or had the reader make a layout: the calls left may read otherwise
 * now (what a getter does to its class shows in the getters after it). */
static int
read_calls(SpanFieldReader *reader, const SpanTypeLayout *layout, PyObject *span,
           PyTypeObject *type, uint32_t calls, int stop_at_change, SpanValues *values,
           uint32_t *done)
{
    PyObject *const *attributes = layout->attributes;
    FieldAccess access[SF_COUNT];
    for (uint32_t bits = calls; bits != 0; bits &= bits - 1) {
        int i = __builtin_ctz(bits);
        access[i] = layout->access[i];
        Py_XINCREF(access[i].object);
        Py_XINCREF(access[i].guard);
    }
    unsigned long resolutions = reader->resolutions;
    int result = 0, stopped = 0;
    *done = 0;
    for (uint32_t bits = calls; bits != 0; bits &= bits - 1) {
        int i = __builtin_ctz(bits);
        if (result == 0 && !stopped) {
            if (read_access(span, type, &access[i], 0, attributes[i], &values->value[i]) < 0) {
                values->failed = i;
                result = -1;
            }
            else {
                *done |= 1u << i;
                stopped =
                    stop_at_change && (reader->resolutions != resolutions ||
                                       Py_TYPE(span) != type || !layout_current(layout, type));
            }
        }
        Py_XDECREF(access[i].object);
        Py_XDECREF(access[i].guard);
    }
    return result;
}

/* read_calls for `calls`, all among layout->direct_fields, of `span`, of
 * the layout's class: each C getter called straight.  They run no Python
 * code but a finalizer's (an allocation may collect garbage), which could
 * have the reader remake `layout` or change the span's class: the calls
 * stop there (the accesses are then owned by no one here), *done saying
 * which were made. */
static int
read_direct_calls(const SpanFieldReader *reader, const SpanTypeLayout *layout, PyObject *span,
                  uint32_t calls, SpanValues *values, uint32_t *done)
{
    unsigned long resolutions = reader->resolutions;
    PyTypeObject *type = layout->type;
    uint32_t made = 0; /* (*done, stored on the way out) */
    int result = 0;
    if ((calls & (1u << SF_TRACE_ID)) != 0 && layout->trace_id_is_int) {
        /* Checked to be an int when the layout was made, never written. */
        values->value[SF_TRACE_ID] = PyLong_FromLong(0);
        if (values->value[SF_TRACE_ID] == NULL) {
            values->failed = SF_TRACE_ID;
            result = -1;
            goto done;
        }
        made = 1u << SF_TRACE_ID;
        calls &= ~made;
    }
    for (uint32_t bits = calls; bits != 0; bits &= bits - 1) {
        int i = __builtin_ctz(bits);
        if (reader->resolutions != resolutions || Py_TYPE(span) != type) {
            goto done;
        }
        PyObject *value;
        if (layout->direct_get[i] != NULL) {
            value = layout->direct_get[i](span, layout->direct_closure[i]);
        }
        else {
            if (layout->direct_guard[i] != NULL) {
                PyObject *any = layout->direct_guard[i](span, NULL);
                int truth = any == Py_True    ? 1
                            : any == Py_False ? 0
                            : any != NULL     ? PyObject_IsTrue(any)
                                              : -1;
                Py_XDECREF(any);
                if (truth <= 0) {
                    if (truth < 0) {
                        values->failed = i;
                        result = -1;
                        goto done;
                    }
                    made |= 1u << i; /* none: absent */
                    continue;
                }
                if (reader->resolutions != resolutions || Py_TYPE(span) != type) {
                    goto done;
                }
            }
            value = layout->direct_method[i](span, NULL);
        }
        if (value == NULL) {
            values->failed = i;
            result = -1;
            goto done;
        }
        values->value[i] = value;
        made |= 1u << i;
    }
done:
    *done = made;
    return result;
}

/* Each field in `fields` of the non-dict `span` as a new reference, into
 * values->value (NULL on entry; absent fields stay NULL).  The fields a
 * getter reads come first (what those getters change in the span is seen in
 * the others, as when they are borrowed: read_span_calls_first), then the rest,
 * by the class the span has then.  Returns 0, or -1 with an exception set and
 * values->failed naming the field (references already read stay in
 * values->value, for the caller to release). */
static int
read_fields_owned(SpanFieldReader *reader, PyObject *span, uint32_t fields, SpanValues *values)
{
    /* A call may switch the span's class (freeing it) or evict this layout
     * from the cache: the class is owned, the accesses are owned before any
     * call, and the slots read before any Python code runs. */
    PyTypeObject *type = (PyTypeObject *)Py_NewRef((PyObject *)Py_TYPE(span));
    SpanTypeLayout *layout = layout_for(reader, type, span, &values->failed); /* of `type` */
    if (layout == NULL) {
        Py_DECREF(type);
        return -1;
    }
    uint32_t calls = layout->getter_fields & fields;
    if (calls != 0) {
        unsigned long resolutions = reader->resolutions;
        uint32_t done;
        int result = read_calls(reader, layout, span, type, calls, 1, values, &done);
        fields &= ~done;
        /* A layout made meanwhile may be this entry remade for the changed
         * class: current again, but with getters `calls` did not have. */
        if (result == 0 && fields != 0 &&
            (done != calls || reader->resolutions != resolutions ||
             !(Py_TYPE(span) == type && layout_current(layout, type)))) {
            /* A call changed the span's class: the rest as it is now (fewer
             * fields each time, so this ends). */
            result = read_fields_owned(reader, span, fields, values);
            fields = 0;
        }
        if (result < 0 || fields == 0) {
            Py_DECREF(type);
            return result;
        }
    }
    /* The rest: slots, the values array in place, or (when it cannot be read
     * so) the instance __dict__, whose lookup may run a key's __eq__. */
    uint32_t pending = layout->call_fields & fields;
    uint32_t in_place = layout->instance_fields & pending;
    if (in_place != 0 && read_instance_fields(layout, span, in_place, values->value)) {
        for (uint32_t bits = in_place; bits != 0; bits &= bits - 1) {
            Py_XINCREF(values->value[__builtin_ctz(bits)]);
        }
        pending &= ~in_place;
    }
    for (uint32_t bits = fields & ~pending; bits != 0; bits &= bits - 1) {
        int i = __builtin_ctz(bits);
        if (layout->access[i].source == FIELD_SLOT) {
            values->value[i] = Py_XNewRef(*(PyObject **)((char *)span + layout->offset[i]));
        }
    }
    uint32_t done;
    int result = read_calls(reader, layout, span, type, pending, 0, values, &done);
    Py_DECREF(type);
    return result;
}

/* ---------------------------------------------------------------------------
 * Dict spans: keys that are no span field */

/* Keys under which a dict span commonly holds what spanpack would write
 * under another name (the names FIELD_ALIASES lists for classes), or a
 * value it has no field for (SF_COUNT: the span kind, which goes in meta). */
static const struct {
    const char *key;
    SpanField field;
} DICT_KEY_ALIASES[] = {
    {"tags", SF_META},
    {"attributes", SF_META},
    {"attrs", SF_META},
    {"labels", SF_META},
    {"_meta", SF_META},
    {"measures", SF_METRICS},
    {"measurements", SF_METRICS},
    {"numeric_tags", SF_METRICS},
    {"_metrics", SF_METRICS},
    {"duration", SF_DURATION},
    {"parent", SF_PARENT_ID},
    {"parent_span_id", SF_PARENT_ID},
    {"type", SF_SPAN_TYPE},
    {"service_name", SF_SERVICE},
    {"resource_name", SF_RESOURCE},
    {"kind", SF_COUNT},
    {"span_kind", SF_COUNT},
    {"span.kind", SF_COUNT},
};

static inline size_t
checked_key_slot(const PyObject *key)
{
    return (size_t)(sp_hash_address(key) >> 40) & (SPAN_KEY_TABLE_SIZE - 1);
}

/* Was the interned key `key` looked at already, with nothing to warn of? */
static inline int
dict_key_checked(const SpanFieldReader *reader, const PyObject *key)
{
    return reader->checked_dict_key[checked_key_slot(key)] == key;
}

/* strict=True: TypeError naming the names in `names` (a list, stolen) that
 * are no span field ("<what> 'a', 'b', which spanpack does not write").
 * `read_attributes` (one per field, a name or a dotted path; NULL: the
 * protocol's field names) says which are read.  0 when there are none,
 * else -1. */
static int
refuse_unwritten(PyObject *names, const char *what, PyObject *const *read_attributes)
{
    PyObject *unwritten = PyList_New(0);
    int result = unwritten == NULL ? -1 : 0;
    for (Py_ssize_t k = 0; result == 0 && k < PyList_GET_SIZE(names); k++) {
        PyObject *name = PyList_GET_ITEM(names, k);
        int read = 0;
        if (PyUnicode_Check(name)) {
            for (int i = 0; i < SF_COUNT && !read; i++) {
                PyObject *attribute = read_attributes != NULL ? read_attributes[i] : NULL;
                if (attribute != NULL && PyTuple_Check(attribute)) {
                    attribute = PyTuple_GET_ITEM(attribute, 0); /* a dotted path's first step */
                }
                read = attribute != NULL
                           ? PyUnicode_Compare(name, attribute) == 0
                           : PyUnicode_CompareWithASCIIString(name, span_field_names[i]) == 0;
            }
        }
        if (!read) {
            result = PyList_Append(unwritten, name);
        }
    }
    if (result == 0 && PyList_GET_SIZE(unwritten) > 0) {
        /* Named as "'a', 'b'": the list's repr without its brackets. */
        PyObject *listed = PyObject_Repr(unwritten);
        PyObject *inner = listed != NULL
                              ? PyUnicode_Substring(listed, 1, PyUnicode_GET_LENGTH(listed) - 1)
                              : NULL;
        if (inner != NULL) {
            PyErr_Format(PyExc_TypeError, "%s %U, which spanpack does not write (strict=True)",
                         what, inner);
        }
        Py_XDECREF(inner);
        Py_XDECREF(listed);
        result = -1;
    }
    Py_XDECREF(unwritten);
    Py_DECREF(names);
    return result;
}

#define CHECKED_DICT_KEYS_MAX 4096

/* Does the dict `span` have a str key not looked at already (see
 * checked_dict_key_set)?  Runs no Python code: the set holds exact str
 * only, and only exact str keys are looked up in it. */
static int
dict_keys_to_look_at(const SpanFieldReader *reader, PyObject *span)
{
    Py_ssize_t pos = 0;
    PyObject *key, *value;
    while (PyDict_Next(span, &pos, &key, &value)) {
        if (!PyUnicode_Check(key) ||
            (PyUnicode_CHECK_INTERNED(key) && dict_key_checked(reader, key))) {
            continue; /* not a str: no field, nothing to say of it */
        }
        if (!PyUnicode_CheckExact(key) || reader->checked_dict_key_set == NULL) {
            return 1;
        }
        int checked = PySet_Contains(reader->checked_dict_key_set, key);
        if (checked <= 0) {
            PyErr_Clear(); /* (cannot fail for a str; looked at again if it did) */
            return 1;
        }
    }
    return 0;
}

/* Note the dict key `key` as one with nothing (more) to say of, when it is
 * an exact str and the set has room.  0, or -1 with an error. */
static int
note_dict_key_checked(SpanFieldReader *reader, PyObject *key)
{
    if (!PyUnicode_CheckExact(key)) {
        return 0;
    }
    if (reader->checked_dict_key_set == NULL &&
        (reader->checked_dict_key_set = PySet_New(NULL)) == NULL) {
        return -1;
    }
    return PySet_GET_SIZE(reader->checked_dict_key_set) < CHECKED_DICT_KEYS_MAX
               ? PySet_Add(reader->checked_dict_key_set, key)
               : 0;
}

/* Warn, once per key and encoder, of each key of the dict `span` that holds
 * what spanpack does not write: a field's common other name while the span
 * lacks the field (a required field's absence is an error of its own), or
 * the span kind.  Keys with nothing to warn of (and the ones warned of) are
 * noted, when interned, so that later spans with the same keys are read in
 * place.  0, or -1 with an error (the warning itself under an "error"
 * filter), values->failed the field concerned (-1: none). */
static SP_NOINLINE int
check_dict_span_keys(SpanFieldReader *reader, PyObject *span, SpanValues *values)
{
    if (!reader->strict && !dict_keys_to_look_at(reader, span)) {
        return 0;
    }
    /* A snapshot: a warning runs Python code, which may change the dict. */
    PyObject *keys = PyDict_Keys(span);
    if (keys == NULL) {
        return -1;
    }
    if (reader->strict) {
        return refuse_unwritten(keys, "dict span has", NULL);
    }
    int result = 0;
    for (Py_ssize_t k = 0; k < PyList_GET_SIZE(keys) && result == 0; k++) {
        PyObject *key = PyList_GET_ITEM(keys, k);
        if (!PyUnicode_Check(key) ||
            (PyUnicode_CHECK_INTERNED(key) && dict_key_checked(reader, key))) {
            continue;
        }
        if (field_index(key) >= 0) {
            result = note_dict_key_checked(reader, key);
            continue;
        }
        int alias = -1;
        for (int a = 0; a < (int)(sizeof DICT_KEY_ALIASES / sizeof DICT_KEY_ALIASES[0]); a++) {
            if (PyUnicode_CompareWithASCIIString(key, DICT_KEY_ALIASES[a].key) == 0) {
                alias = a;
                break;
            }
        }
        SpanField field = alias >= 0 ? DICT_KEY_ALIASES[alias].field : SF_COUNT;
        if (alias >= 0 && field != SF_COUNT &&
            (values->value[field] != NULL || (reader->required & (1u << field)))) {
            continue; /* the field is there too (or missing it is an error): not noted */
        }
        if (alias >= 0) {
            int warned = reader->warned_dict_keys != NULL
                             ? PySet_Contains(reader->warned_dict_keys, key)
                             : 0;
            if (warned == 0) {
                PyObject *message =
                    field == SF_COUNT
                        ? PyUnicode_FromFormat("dict span has key %R, which spanpack does not "
                                               "write: give the span kind as meta['span.kind']",
                                               key)
                        : PyUnicode_FromFormat("dict span has key %R but no %R, which spanpack "
                                               "does not write: name the key %R to write it",
                                               key, reader->dict_key[field],
                                               reader->dict_key[field]);
                const char *text = message != NULL ? PyUnicode_AsUTF8(message) : NULL;
                warned = text != NULL ? PyErr_WarnEx(reader->field_warning, text, 1) : -1;
                Py_XDECREF(message);
                if (warned == 0) {
                    if (reader->warned_dict_keys == NULL &&
                        (reader->warned_dict_keys = PySet_New(NULL)) == NULL) {
                        warned = -1;
                    }
                    else {
                        warned = PySet_Add(reader->warned_dict_keys, key);
                    }
                }
            }
            if (warned < 0) {
                values->failed = field == SF_COUNT ? -1 : (int)field;
                result = -1;
                break;
            }
        }
        if (PyUnicode_CHECK_INTERNED(key)) {
            Py_XSETREF(reader->checked_dict_key[checked_key_slot(key)], Py_NewRef(key));
        }
        result = note_dict_key_checked(reader, key);
    }
    Py_DECREF(keys);
    return result;
}

int
spanfields_read(SpanFieldReader *reader, PyObject *span, SpanField first, SpanField last,
                SpanValues *values)
{
    values->first = first;
    values->last = last;
    values->borrowed = 0;
    values->owned_mask = 0;
    values->failed = -1;
    for (int i = (int)first; i <= (int)last; i++) {
        values->value[i] = NULL;
    }
    if (PyDict_Check(span)) {
        Py_ssize_t found = 0;
        for (int i = (int)first; i <= (int)last; i++) {
            if (dict_get_ref(span, reader->dict_key[i], &values->value[i]) < 0) {
                values->failed = i;
                goto error;
            }
            found += values->value[i] != NULL;
        }
        /* Keys that are no field, looked at with the per-span fields. */
        if (first == SF_FIRST_PER_SPAN && last == SF_LAST_PER_SPAN &&
            PyDict_GET_SIZE(span) > found && check_dict_span_keys(reader, span, values) < 0) {
            goto error;
        }
        return 0;
    }
    if (read_fields_owned(reader, span, fields_mask(first, last), values) == 0) {
        return 0;
    }
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

/* Does ddtrace's Context class `type` give dd_origin as `_meta`'s
 * "_dd.origin" entry?  Its pure-Python property returns
 * `self._meta.get("_dd.origin")`, and so does the native class's getter
 * (ddtrace 4.1x, Rust: `get_dd_origin` looks the key up in the dict its
 * `_meta` getter returns); `_meta` must then be read as such a getter too.
 * Any other dd_origin (a future one that computes it) is asked itself. */
static int
origin_read_from_meta(SpanFieldReader *reader, PyTypeObject *type)
{
    PyObject *origin = Py_XNewRef(_PyType_Lookup(type, reader->context_origin_name));
    PyObject *meta = Py_XNewRef(_PyType_Lookup(type, reader->context_meta_name));
    int in_meta = origin != NULL && (Py_IS_TYPE(origin, &PyProperty_Type) ||
                                     (Py_IS_TYPE(origin, &PyGetSetDescr_Type) && meta != NULL &&
                                      Py_IS_TYPE(meta, &PyGetSetDescr_Type) &&
                                      PyDescr_TYPE(meta) == PyDescr_TYPE(origin)));
    Py_XDECREF(origin);
    Py_XDECREF(meta);
    return in_meta;
}

/* Is `type` ddtrace's own Context class (whose dd_origin property returns
 * `_meta["_dd.origin"]`, or a native getter)?  A subclass or look-alike
 * could override that property, so anything else is asked through it.  1,
 * 0, or -1 with an error. */
static int
is_ddtrace_context(SpanFieldReader *reader, PyTypeObject *type)
{
    if (type == reader->ddtrace_context_type) {
        return 1;
    }
    if (reader->ddtrace_context_type != NULL) {
        return 0;
    }
    int result = class_named(type, "ddtrace._trace.context", "Context");
    if (result > 0 && reader->ddtrace_context_type == NULL) {
        reader->ddtrace_context_origin_in_meta = origin_read_from_meta(reader, type);
        reader->ddtrace_context_type = (PyTypeObject *)Py_NewRef((PyObject *)type);
    }
    return result;
}

/* Is the object slot `member` one of the fields `read` (a layout's
 * attribute names; NULL for the field's own name), as refuse_unwritten
 * judges a slot's name?  Compares without running any code; a name that is
 * not ASCII is not judged here (0: its spans are checked one by one). */
static int
member_is_read(const PyMemberDef *member, PyObject *const *read)
{
    for (const char *c = member->name; *c != '\0'; c++) {
        if ((unsigned char)*c >= 0x80) {
            return 0;
        }
    }
    for (int i = 0; i < SF_COUNT; i++) {
        PyObject *attribute = read[i];
        if (attribute != NULL && PyTuple_Check(attribute)) {
            attribute = PyTuple_GET_ITEM(attribute, 0); /* a dotted path's first step */
        }
        if (attribute == NULL ? strcmp(member->name, span_field_names[i]) == 0
                              : PyUnicode_CompareWithASCIIString(attribute, member->name) == 0) {
            return 1;
        }
    }
    return 0;
}

/* Whether no span of `type` can carry anything unwritten: no instance
 * dict, and every object slot of its MRO (but __dunder__ ones) one of the
 * fields `read`, so that spanfields_check_strict would refuse none. */
static int
strict_never_refuses(PyTypeObject *type, PyObject *const *read)
{
    if (has_instance_dict(type)) {
        return 0;
    }
    PyObject *mro = type->tp_mro;
    for (Py_ssize_t m = 0; mro != NULL && m < PyTuple_GET_SIZE(mro); m++) {
        PyTypeObject *base = (PyTypeObject *)PyTuple_GET_ITEM(mro, m);
        for (const PyMemberDef *member = base->tp_members; member != NULL && member->name != NULL;
             member++) {
            if (member->type == SP_T_OBJECT_EX && strncmp(member->name, "__", 2) != 0 &&
                !member_is_read(member, read)) {
                return 0;
            }
        }
    }
    return 1;
}

int
spanfields_check_strict(SpanFieldReader *reader, PyObject *span)
{
    PyTypeObject *type = (PyTypeObject *)Py_NewRef((PyObject *)Py_TYPE(span));
    PyObject *names = NULL, *instance_dict = NULL, *what = NULL;
    int failed = -1, result = -1;
    SpanTypeLayout *layout = layout_for(reader, type, span, &failed);
    if (layout == NULL) {
        goto done;
    }
    if (layout->attributes == reader->ddtrace_attribute) {
        result = 0; /* ddtrace's Span: read whole, as ddtrace writes it */
        goto done;
    }
    if (layout->strict_never_refuses < 0) {
        layout->strict_never_refuses = strict_never_refuses(type, layout->attributes);
    }
    if (layout->strict_never_refuses) {
        result = 0;
        goto done;
    }
    /* The attribute names read: copied, as finding the instance's own
     * attributes below may run Python code that remakes the layout. */
    PyObject *read[SF_COUNT];
    for (int i = 0; i < SF_COUNT; i++) {
        read[i] = Py_NewRef(layout->attributes[i]);
    }
    names = PyList_New(0);
    /* The slots holding a value, of every class of the MRO. */
    PyObject *mro = names != NULL ? Py_XNewRef(type->tp_mro) : NULL;
    for (Py_ssize_t m = 0; mro != NULL && m < PyTuple_GET_SIZE(mro) && names != NULL; m++) {
        PyTypeObject *base = (PyTypeObject *)PyTuple_GET_ITEM(mro, m);
        for (const PyMemberDef *member = base->tp_members; member != NULL && member->name != NULL;
             member++) {
            if (member->type != SP_T_OBJECT_EX || strncmp(member->name, "__", 2) == 0 ||
                *(PyObject **)((char *)span + member->offset) == NULL) {
                continue;
            }
            PyObject *name = PyUnicode_FromString(member->name);
            if (name == NULL || PyList_Append(names, name) < 0) {
                Py_CLEAR(names);
            }
            Py_XDECREF(name);
        }
    }
    Py_XDECREF(mro);
    /* The instance's own attributes. */
    if (names != NULL && has_instance_dict(type)) {
        instance_dict = PyObject_GenericGetDict(span, NULL);
        PyObject *keys = instance_dict != NULL ? PyDict_Keys(instance_dict) : NULL;
        Py_ssize_t end = PyList_GET_SIZE(names);
        if (keys == NULL || PyList_SetSlice(names, end, end, keys) < 0) {
            Py_CLEAR(names);
        }
        Py_XDECREF(keys);
    }
    if (names != NULL) {
        PyObject *class_name = class_display_name(type);
        what = class_name != NULL ? PyUnicode_FromFormat("span of class %U carries", class_name)
                                  : NULL;
        Py_XDECREF(class_name);
        const char *text = what != NULL ? PyUnicode_AsUTF8(what) : NULL;
        result = text != NULL ? refuse_unwritten(names, text, read) : -1;
        names = NULL; /* stolen */
    }
    for (int i = 0; i < SF_COUNT; i++) {
        Py_DECREF(read[i]);
    }
done:
    Py_XDECREF(what);
    Py_XDECREF(instance_dict);
    Py_XDECREF(names);
    Py_DECREF(type);
    return result;
}

/* The fields of ddtrace's SpanLink dataclass, all of them. */
static const char *const DDTRACE_LINK_FIELDS[] = {"trace_id", "span_id",    "tracestate",
                                                  "flags",    "attributes", "_dropped_attributes"};

/* Does the dataclass `type` have exactly the fields of ddtrace's SpanLink?
 * 1, 0, or -1 with an error. */
static int
has_ddtrace_link_fields(PyTypeObject *type)
{
    PyObject *fields = PyObject_GetAttrString((PyObject *)type, "__dataclass_fields__");
    if (fields == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_AttributeError)) {
            return -1;
        }
        PyErr_Clear();
        return 0;
    }
    size_t count = sizeof(DDTRACE_LINK_FIELDS) / sizeof(DDTRACE_LINK_FIELDS[0]);
    int result = PyDict_CheckExact(fields) && PyDict_GET_SIZE(fields) == (Py_ssize_t)count;
    for (size_t i = 0; result == 1 && i < count; i++) {
        PyObject *name = PyUnicode_FromString(DDTRACE_LINK_FIELDS[i]);
        result = name == NULL ? -1 : PyDict_Contains(fields, name);
        Py_XDECREF(name);
    }
    Py_DECREF(fields);
    return result;
}

/* Is `function` the function `name` that the module `module`'s own source
 * defines: a Python function whose globals are that module's (their
 * __name__), whose code is named `name` and was compiled from that module's
 * __file__?  A wrapper (functools.wraps copies __module__ and
 * __qualname__), a function from elsewhere or one whose __code__ was
 * replaced is not.  1, 0, or -1 with an error. */
static int
is_module_function(PyObject *function, const char *module, const char *name)
{
    if (function == NULL || !PyFunction_Check(function)) {
        return 0;
    }
    PyObject *globals = PyFunction_GET_GLOBALS(function);
    PyCodeObject *code = (PyCodeObject *)PyFunction_GET_CODE(function);
    if (!PyDict_Check(globals) || !PyUnicode_Check(code->co_name) ||
        PyUnicode_CompareWithASCIIString(code->co_name, name) != 0) {
        return 0;
    }
    PyObject *module_name = NULL, *file = NULL;
    Py_INCREF(globals);
    int result = -1;
    PyObject *name_key = PyUnicode_InternFromString("__name__");
    PyObject *file_key = PyUnicode_InternFromString("__file__");
    if (name_key == NULL || file_key == NULL || dict_get_ref(globals, name_key, &module_name) < 0 ||
        dict_get_ref(globals, file_key, &file) < 0) {
        goto done;
    }
    result = module_name != NULL && PyUnicode_Check(module_name) &&
             PyUnicode_CompareWithASCIIString(module_name, module) == 0 && file != NULL &&
             PyUnicode_CheckExact(file) && PyUnicode_CheckExact(code->co_filename);
    if (result) {
        result = PyUnicode_Compare(file, code->co_filename);
        result = result == -1 && PyErr_Occurred() ? -1 : result == 0;
    }
done:
    Py_XDECREF(name_key);
    Py_XDECREF(file_key);
    Py_XDECREF(module_name);
    Py_XDECREF(file);
    Py_DECREF(globals);
    return result;
}

static const char *const DDTRACE_LINK_FUNCTION_NAMES[SF_LINK_FUNCTIONS] = {
    "to_dict", "flatten_key_value", "is_sequence"};
static const char *const DDTRACE_LINK_FUNCTION_MODULES[SF_LINK_FUNCTIONS] = {
    "ddtrace._trace._span_link", "ddtrace.internal.utils.formats",
    "ddtrace.internal.utils.formats"};

/* The function named `reader->link_name[i]` in `namespace` (a class's or a
 * function's globals), when it is ddtrace's own (is_module_function).
 * 1 with *function a new reference, 0, or -1 with an error. */
static int
ddtrace_link_function(SpanFieldReader *reader, PyObject *namespace, int i, PyObject **function)
{
    *function = NULL;
    if (!PyDict_Check(namespace) || dict_get_ref(namespace, reader->link_name[i], function) < 0) {
        return PyErr_Occurred() ? -1 : 0;
    }
    int result = is_module_function(*function, DDTRACE_LINK_FUNCTION_MODULES[i],
                                    DDTRACE_LINK_FUNCTION_NAMES[i]);
    if (result <= 0) {
        Py_CLEAR(*function);
    }
    return result;
}

/* Are `type`'s own to_dict and the flatten_key_value and is_sequence it
 * calls ddtrace's own functions?  Kept in the reader (with their code) to
 * be checked again at each link.  1, 0, or -1 with an error. */
static int
has_ddtrace_link_functions(SpanFieldReader *reader, PyTypeObject *type)
{
    for (int i = 0; i < SF_LINK_FUNCTIONS; i++) {
        if (reader->link_name[i] == NULL) {
            reader->link_name[i] = PyUnicode_InternFromString(DDTRACE_LINK_FUNCTION_NAMES[i]);
            if (reader->link_name[i] == NULL) {
                return -1;
            }
        }
    }
    PyObject *found[SF_LINK_FUNCTIONS] = {NULL};
    PyObject *type_dict = Py_NewRef(type->tp_dict);
    int result = ddtrace_link_function(reader, type_dict, 0, &found[0]);
    Py_DECREF(type_dict);
    for (int i = 1; result > 0 && i < SF_LINK_FUNCTIONS; i++) {
        result = ddtrace_link_function(reader, PyFunction_GET_GLOBALS(found[i - 1]), i, &found[i]);
    }
    for (int i = 0; i < SF_LINK_FUNCTIONS; i++) {
        Py_XSETREF(reader->link_function[i], result > 0 ? Py_NewRef(found[i]) : NULL);
        Py_XSETREF(reader->link_code[i],
                   result > 0 ? Py_NewRef(PyFunction_GET_CODE(found[i])) : NULL);
        Py_XDECREF(found[i]);
    }
    return result;
}

/* Is `link`'s to_dict still the function found with its class (not one in
 * the instance's __dict__), and are it and the functions it calls still the
 * same functions with the same code?  1, 0, or -1 with an error. */
static int
ddtrace_link_unchanged(SpanFieldReader *reader, PyObject *link)
{
    if (reader->link_function[0] == NULL) {
        return 0;
    }
    for (int i = 0; i < SF_LINK_FUNCTIONS; i++) {
        if (PyFunction_GET_CODE(reader->link_function[i]) != reader->link_code[i]) {
            return 0;
        }
    }
    for (int i = 1; i < SF_LINK_FUNCTIONS; i++) {
        PyObject *now = NULL;
        PyObject *globals = Py_NewRef(PyFunction_GET_GLOBALS(reader->link_function[i - 1]));
        int found = dict_get_ref(globals, reader->link_name[i], &now);
        Py_DECREF(globals);
        if (found < 0) {
            return -1;
        }
        Py_XDECREF(now); /* (only compared) */
        if (now == NULL || now != reader->link_function[i]) {
            return 0;
        }
    }
    PyObject *method = PyObject_GetAttr(link, reader->link_name[0]);
    if (method == NULL) {
        return -1; /* as link.to_dict() would raise */
    }
    int result = PyMethod_Check(method) &&
                 PyMethod_GET_FUNCTION(method) == reader->link_function[0] &&
                 PyMethod_GET_SELF(method) == link;
    Py_DECREF(method);
    return result;
}

int
spanfields_is_ddtrace_link(SpanFieldReader *reader, PyObject *link)
{
    PyTypeObject *type = Py_TYPE(link);
    unsigned int tag = sp_type_version_tag(type);
    if (type == reader->last_link_type && tag != 0 && tag == reader->last_link_version_tag) {
        return reader->last_link_is_ddtrace ? ddtrace_link_unchanged(reader, link) : 0;
    }
    Py_INCREF(type);
    int result = class_named(type, "ddtrace._trace._span_link", "SpanLink");
    if (result > 0) {
        result = has_ddtrace_link_fields(type);
    }
    if (result > 0) {
        result = has_ddtrace_link_functions(reader, type);
    }
    if (result >= 0) {
        Py_XSETREF(reader->last_link_type, type); /* (takes the reference) */
        /* (Taken after the checks, which may run code that changes the
         * class: then it is asked about again at the next link.) */
        reader->last_link_version_tag = tag == sp_type_version_tag(type) ? tag : 0;
        reader->last_link_is_ddtrace = result;
    }
    else {
        reader->last_link_version_tag = 0; /* (its functions may be gone) */
        reader->last_link_is_ddtrace = 0;
        Py_DECREF(type);
    }
    return result > 0 ? ddtrace_link_unchanged(reader, link) : result;
}

/* `span.context` of a span of a ddtrace class (new reference, or NULL
 * when absent): the `_context` slot where the class has ddtrace 4.16's
 * lazy property (resolve_context_slot) that still has its getter, with its
 * code, and the slot is set: what the property would return; else the
 * attribute, read as any. */
static int
read_ddtrace_context(SpanFieldReader *reader, PyObject *span, PyObject **context)
{
    int failed = -1;
    SpanTypeLayout *layout = layout_for(reader, Py_TYPE(span), span, &failed);
    if (layout == NULL) {
        return -1;
    }
    PyObject *set =
        layout->context_offset > 0 ? *(PyObject **)((char *)span + layout->context_offset) : NULL;
    if (set != NULL && set != Py_None) {
        /* (Reading fget runs no Python code: a member of the property.) */
        PyObject *getter;
        if (memo_attribute(&reader->property_getter_memo, layout->context_property,
                           reader->property_getter_name, &getter) < 0) {
            return -1;
        }
        int same =
            getter == layout->context_getter && PyFunction_GET_CODE(getter) == layout->context_code;
        Py_XDECREF(getter);
        if (same) {
            *context = Py_NewRef(set);
            return 0;
        }
    }
    return memo_attribute(&reader->context_memo, span, reader->context_name, context);
}

int
spanfields_read_origin(SpanFieldReader *reader, PyObject *span, PyObject **value)
{
    if (PyDict_Check(span) ||
        !(reader->ddtrace_fields || (reader->ddtrace_span_type != NULL &&
                                     PyObject_TypeCheck(span, reader->ddtrace_span_type)))) {
        return spanfields_read_one(reader, span, SF_ORIGIN, value);
    }
    PyObject *context, *meta = NULL;
    if (read_ddtrace_context(reader, span, &context) < 0) {
        return -1;
    }
    int ddtrace_context = context != NULL ? is_ddtrace_context(reader, Py_TYPE(context)) : 0;
    if (ddtrace_context <= 0) {
        Py_XDECREF(context);
        return ddtrace_context < 0 ? -1 : spanfields_read_one(reader, span, SF_ORIGIN, value);
    }
    if (!reader->ddtrace_context_origin_in_meta) {
        int result = memo_attribute(&reader->context_origin_memo, context,
                                    reader->context_origin_name, value);
        Py_DECREF(context);
        return result;
    }
    int result =
        memo_attribute(&reader->context_meta_memo, context, reader->context_meta_name, &meta);
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

#ifdef SP_CHECK_BORROWED
static int
borrowed_values_guard(PyObject *arg, PyFrameObject *frame, int what, PyObject *call_arg)
{
    (void)arg;
    (void)frame;
    (void)call_arg;
    if (what == PyTrace_CALL) {
        Py_FatalError("spanpack: Python code ran while span values were held without "
                      "references (own them first: see span_hold_values)");
    }
    return 0;
}

static void
guard_begin(SpanValues *values)
{
    PyThreadState *thread = PyThreadState_Get();
    values->saved_profile = thread->c_profilefunc;
    values->saved_profile_arg = Py_XNewRef(thread->c_profileobj);
    PyEval_SetProfile(borrowed_values_guard, NULL);
}

static void
guard_end(SpanValues *values)
{
    PyEval_SetProfile(values->saved_profile, values->saved_profile_arg);
    Py_CLEAR(values->saved_profile_arg);
}
#endif

/* Drop the references of the values of `fields`. */
static SP_NOINLINE void
release_fields(SpanValues *values, uint32_t fields)
{
    for (uint32_t bits = fields; bits != 0; bits &= bits - 1) {
        Py_XDECREF(values->value[__builtin_ctz(bits)]);
    }
}

void
spanvalues_release(SpanValues *values)
{
    /* The loops apart, so that the usual case, borrowed values and no
     * getter's result among them, sets up no stack frame. */
    if (!values->borrowed) {
        release_fields(values, fields_mask(values->first, values->last));
        return;
    }
#ifdef SP_CHECK_BORROWED
    guard_end(values);
#endif
    if (SP_UNLIKELY(values->owned_mask != 0)) {
        release_fields(values, values->owned_mask);
    }
}

/* Debug builds: the guard goes in before any value is read without a
 * reference, since installing it runs Python code (audit hooks see
 * sys.setprofile); it comes out again when the span is not read that way
 * after all. */
static inline void
borrow_begin(SpanValues *values)
{
#ifdef SP_CHECK_BORROWED
    guard_begin(values);
#else
    (void)values;
#endif
}

static inline void
borrow_cancel(SpanValues *values)
{
#ifdef SP_CHECK_BORROWED
    guard_end(values);
#else
    (void)values;
#endif
}

/* Values read without references (see SpanValues), after borrow_begin. */
static void
mark_borrowed(SpanValues *values)
{
    values->first = SF_FIRST_PER_SPAN;
    values->last = SF_LAST_PER_SPAN;
    values->borrowed = 1;
    values->owned_mask = 0;
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
    if (!pydict_entries(&reader->fast_paths, span, &entries) || entries.stride != 2) {
        return 0; /* only dicts whose keys are all str */
    }
    for (int i = SF_FIRST_PER_SPAN; i <= SF_LAST_PER_SPAN; i++) {
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
        if (field >= SF_FIRST_PER_SPAN && field <= SF_LAST_PER_SPAN) {
            values->value[field] = entry[1];
        }
        else if (field < 0 && !dict_key_checked(reader, entry[0])) {
            return 0; /* a key to look at first: spanfields_read does */
        }
    }
    mark_borrowed(values);
    return 1;
}

#ifndef Py_GIL_DISABLED /* (spanfields_read_span borrows only under the GIL) */
/* The per-span fields of `span` that `layout` (current for its class) keeps
 * in slots and in the values array, borrowed, over values whose other
 * per-span entries are set already; 0 when the values array cannot be read
 * in place (nothing is read then). */
static inline int
read_span_in_place(SpanTypeLayout *layout, PyObject *span, SpanValues *values)
{
    if (layout->slot_field_count == SF_PER_SPAN_COUNT) {
        /* Every field a slot: one straight run of loads. */
        for (int i = SF_FIRST_PER_SPAN; i <= SF_LAST_PER_SPAN; i++) {
            values->value[i] = *(PyObject **)((char *)span + layout->offset[i]);
        }
        return 1;
    }
    uint32_t instance_fields = layout->instance_fields & SF_PER_SPAN_FIELDS;
    if (instance_fields != 0 &&
        !read_instance_fields(layout, span, instance_fields, values->value)) {
        return 0;
    }
    for (int k = 0; k < layout->slot_field_count; k++) {
        int field = layout->slot_fields[k];
        values->value[field] = *(PyObject **)((char *)span + layout->offset[field]);
    }
    return 1;
}

/* spanfields_read_span for a span some of whose per-span fields cannot be
 * read in place (layout->span_call_fields).  Those a getter reads (a
 * property's, a descriptor's, a class attribute, a class's own attribute
 * access: `calls`) come first, their results owned: any Python code they run
 * has run before the other fields are read, so those can then be borrowed
 * from the slots and the values array as on the fast path (were they read
 * first, each would need a reference across the calls).  When other fields
 * need a lookup too (an instance __dict__ not readable in place), a call
 * changed the span's class, or the values array is no longer readable in
 * place, the others are read as spanfields_read reads them. */
static SP_NOINLINE int
read_span_calls_first(SpanFieldReader *reader, SpanTypeLayout *layout, PyObject *span,
                      SpanValues *values)
{
    uint32_t calls = layout->getter_fields & SF_PER_SPAN_FIELDS;
    values->first = SF_FIRST_PER_SPAN;
    values->last = SF_LAST_PER_SPAN;
    values->borrowed = 0;
    values->owned_mask = 0;
    values->failed = -1;
    for (int i = SF_FIRST_PER_SPAN; i <= SF_LAST_PER_SPAN; i++) {
        values->value[i] = NULL;
    }
    PyTypeObject *type = (PyTypeObject *)Py_NewRef((PyObject *)Py_TYPE(span));
    int result = 0;
    if (layout->type != type) {
        /* Resolving it ran Python code that changed the span's class. */
        result = read_fields_owned(reader, span, SF_PER_SPAN_FIELDS, values);
        goto done;
    }
    unsigned long resolutions = reader->resolutions;
    uint32_t done_calls;
    result = (calls & ~layout->direct_fields) == 0
                 ? read_direct_calls(reader, layout, span, calls, values, &done_calls)
                 : read_calls(reader, layout, span, type, calls, 1, values, &done_calls);
    if (result < 0) {
        goto done;
    }
    /* Borrowed reads by `layout` only if the calls left it as it was: no
     * layout made meanwhile (the same entry remade for a changed class
     * could keep one of `calls` in a slot, and the borrowed read would
     * overwrite that call's owned result) and the class unchanged. */
    if (done_calls == calls && (layout->span_call_fields & ~calls) == 0 &&
        reader->resolutions == resolutions && Py_TYPE(span) == type &&
        layout_current(layout, type)) {
        borrow_begin(values);
        /* (In debug builds borrow_begin ran Python code.) */
        if (Py_TYPE(span) == type && read_span_in_place(layout, span, values)) {
            mark_borrowed(values);
            values->owned_mask = calls;
            Py_DECREF(type);
            return 0;
        }
        borrow_cancel(values);
    }
    result = read_fields_owned(reader, span, SF_PER_SPAN_FIELDS & ~done_calls, values);
done:
    Py_DECREF(type);
    if (result < 0) {
        for (int i = SF_FIRST_PER_SPAN; i <= SF_LAST_PER_SPAN; i++) {
            Py_CLEAR(values->value[i]);
        }
    }
    return result;
}
#endif

int
spanfields_read_span(SpanFieldReader *reader, PyObject *span, int may_borrow, SpanValues *values)
{
#ifndef Py_GIL_DISABLED /* without the GIL another thread could free them */
    if (may_borrow && PyDict_Check(span)) {
        borrow_begin(values);
        if (read_dict_span_in_place(reader, span, values)) {
            return 0;
        }
        borrow_cancel(values);
    }
    else if (may_borrow) {
        SpanTypeLayout *layout = layout_for(reader, Py_TYPE(span), span, &values->failed);
        if (layout == NULL) {
            values->first = SF_FIRST_PER_SPAN;
            values->last = SF_LAST_PER_SPAN;
            values->borrowed = 0;
            for (int i = SF_FIRST_PER_SPAN; i <= SF_LAST_PER_SPAN; i++) {
                values->value[i] = NULL;
            }
            return -1;
        }
        if (layout->span_call_fields != 0) {
            return read_span_calls_first(reader, layout, span, values);
        }
        borrow_begin(values);
        /* Every field a slot, absent, or in the instance's values array:
         * nothing to call.  (Resolving the layout, and in debug builds
         * borrow_begin, ran Python code, which may have switched the span's
         * class or replaced this cache entry.) */
        if (layout->type == Py_TYPE(span)) {
            if (layout->slot_field_count != SF_PER_SPAN_COUNT) {
                for (int i = SF_FIRST_PER_SPAN; i <= SF_LAST_PER_SPAN; i++) {
                    values->value[i] = NULL; /* the fields the class cannot have */
                }
            }
            if (read_span_in_place(layout, span, values)) {
                mark_borrowed(values);
                return 0;
            }
        }
        borrow_cancel(values);
    }
#else
    (void)may_borrow;
#endif
    return spanfields_read(reader, span, SF_FIRST_PER_SPAN, SF_LAST_PER_SPAN, values);
}

void
spanvalues_own(SpanValues *values)
{
    if (!values->borrowed) {
        return;
    }
    for (int i = (int)values->first; i <= (int)values->last; i++) {
        if (!(values->owned_mask & (1u << i))) {
            Py_XINCREF(values->value[i]);
        }
    }
    values->borrowed = 0;
    values->owned_mask = 0;
#ifdef SP_CHECK_BORROWED
    guard_end(values);
#endif
}

/* The pointer in the slot at `offset`, or NULL for offset 0 (no slot).
 * Offset 0 still loads the object's first word (always there), dropped
 * without a branch; memcpy, as that word is no pointer. */
static inline const PyObject *
peek_slot(PyObject *span, Py_ssize_t offset)
{
    const PyObject *value;
    memcpy(&value, (const char *)span + offset, sizeof value);
    return offset != 0 ? value : NULL;
}

static void
prefetch_slots(const SpanTypeLayout *layout, PyObject *span, SpanTextPeek *peek)
{
    for (int k = 0; k < layout->slot_count; k++) {
        SP_PREFETCH(*(PyObject **)((char *)span + layout->slot_offsets[k]));
    }
    if (peek != NULL) {
        peek->service = peek_slot(span, layout->peek_offset[0]);
        peek->name = peek_slot(span, layout->peek_offset[1]);
        peek->resource = peek_slot(span, layout->peek_offset[2]);
        peek->span_type = peek_slot(span, layout->peek_offset[3]);
    }
}

/* A span's field `i` as the layout finds it in the span's slot or values
 * array (NULL: neither), for spanfields_warm only: read without a reference,
 * never dereferenced there but to be prefetched. */
static inline PyObject *
warm_field_value(const SpanTypeLayout *layout, PyObject *span, PyObject *const *values,
                 Py_ssize_t capacity, int i)
{
    if (layout->access[i].source == FIELD_SLOT) {
        return *(PyObject **)((char *)span + layout->offset[i]);
    }
    if (values != NULL && (layout->instance_fields & (1u << i)) && layout->position[i] >= 0 &&
        layout->position[i] < capacity) {
        return values[layout->position[i]];
    }
    return NULL;
}

void
spanfields_warm(const SpanFieldReader *reader, PyObject *const *spans, Py_ssize_t count)
{
#ifdef Py_GIL_DISABLED
    /* (Borrowed objects another thread may free: as the other in-place
     * readers, not without the GIL.) */
    (void)reader;
    (void)spans;
    (void)count;
#else
    const SpanTypeLayout *layout = &reader->layouts[reader->last_layout];
    PyTypeObject *type = layout->type;
    if (type == NULL || count <= 0 || count > SPAN_WARM_MAX) {
        return;
    }
    PyObject *const *values[SPAN_WARM_MAX] = {NULL};
    Py_ssize_t capacity[SPAN_WARM_MAX] = {0};
    PyObject *dicts[2 * SPAN_WARM_MAX]; /* each span's meta, then its metrics */
#ifdef SP_INSTANCE_VALUES_IN_PLACE
    const SpDictKeys *keys = layout->shared_keys;
    int in_place = keys != NULL && layout->instance_fields != 0 &&
                   keys == pyinstance_shared_keys(&reader->fast_paths, type);
#endif
    /* 1: the span objects' lines that hold fields, and where an instance's
     * values pointer (up to 3.12: before the object) or values (from 3.13:
     * after it) lie. */
    for (Py_ssize_t i = 0; i < count; i++) {
        SP_PREFETCH(spans[i]);
        for (int k = 0; k < layout->line_count; k++) {
            sp_prefetch_at(spans[i], layout->line_offsets[k]);
        }
#ifdef SP_INSTANCE_VALUES_IN_PLACE
        if (in_place) {
            pyinstance_prefetch_values(spans[i], type);
        }
#endif
    }
    /* 2: the values arrays of the spans of the layout's class. */
#ifdef SP_INSTANCE_VALUES_IN_PLACE
    for (Py_ssize_t i = 0; in_place && i < count; i++) {
        if (Py_TYPE(spans[i]) == type &&
            (values[i] = pyinstance_values(spans[i], keys, &capacity[i])) != NULL) {
            SP_PREFETCH(values[i]);
            sp_prefetch_at(values[i], 64);
        }
    }
#endif
    /* 3: the fields' objects, and the text of the text fields. */
    for (Py_ssize_t i = 0; i < count; i++) {
        dicts[2 * i] = dicts[2 * i + 1] = NULL;
        if (Py_TYPE(spans[i]) != type) {
            continue;
        }
        for (uint32_t bits = SF_PREFETCHED_FIELDS; bits != 0; bits &= bits - 1) {
            int f = __builtin_ctz(bits);
            PyObject *value = warm_field_value(layout, spans[i], values[i], capacity[i], f);
            if (value == NULL) {
                continue;
            }
            SP_PREFETCH(value);
            if (f == SF_META || f == SF_METRICS) {
                dicts[2 * i + (f == SF_METRICS)] = value;
            }
            else if (f >= SF_SERVICE && f <= SF_SPAN_TYPE) {
                sp_prefetch_at(value, sizeof(PyASCIIObject));
            }
        }
    }
    /* 4-6: the tag dicts' tables, entries, keys, values and text. */
    dicts_prefetch_levels(&reader->fast_paths, dicts, 2 * count, 1);
#endif
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
    if (peek != NULL) {
        memset(peek, 0, sizeof *peek);
    }
}
