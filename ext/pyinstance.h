/* Reading an instance's attributes in place.
 *
 * From 3.11 the instances of most classes keep their attributes not in a
 * dict of their own but in a values array indexed like the class's shared
 * keys (each attribute name has a fixed position there, and positions never
 * move), until something asks for the instance's __dict__.  Reading
 * values[position] is what CPython's own specialised attribute loads do.
 * Where the array lives differs per version (Include/internal/pycore_object.h
 * and pycore_dict.h of 3.11 to 3.15: from 3.13 it is inline, at
 * obj + tp_basicsize, which from 3.14 is also past a class's slots), so it is
 * read directly only there, once module exec has proven it on every class
 * form (layout_probes.c); elsewhere, and for instances whose array is gone,
 * callers use the generic lookup. */
#ifndef SPANPACK_PYINSTANCE_H
#define SPANPACK_PYINSTANCE_H

#include "pydict.h"

#if defined(SP_DICT_ENTRIES_IN_PLACE)
#define SP_INSTANCE_VALUES_IN_PLACE 1

/* struct _dictvalues */
typedef struct {
#if PY_VERSION_HEX >= 0x030D0000
    uint8_t capacity;
    uint8_t size;
    uint8_t embedded;
    uint8_t valid;
#endif
    PyObject *values[1];
} SpDictValues;

/* The shared keys of `type`'s instances, or NULL (also when the values
 * array is not proven on this interpreter: then nothing is read in place). */
static inline const SpDictKeys *
pyinstance_shared_keys(const SpFastPaths *fast, PyTypeObject *type)
{
    if (!fast->instance_values || !(type->tp_flags & Py_TPFLAGS_HEAPTYPE) ||
        !(type->tp_flags & Py_TPFLAGS_MANAGED_DICT)) {
        return NULL;
    }
    const SpDictKeys *keys = (const SpDictKeys *)((PyHeapTypeObject *)type)->ht_cached_keys;
    return keys != NULL && keys->dk_kind == 2 ? keys : NULL;
}

/* The position of `name` (an exact str) in `keys`, or -1. */
static inline Py_ssize_t
pyinstance_position(const SpDictKeys *keys, PyObject *name)
{
    PyObject *const *entry =
        (PyObject *const *)(keys->dk_indices + ((size_t)1 << keys->dk_log2_index_bytes));
    for (Py_ssize_t i = 0; i < keys->dk_nentries; i++, entry += 2) {
        PyObject *key = entry[0];
        /* Shared keys are exact str (setattr interns names), compared
         * without running any code. */
        if (key == name ||
            (key != NULL && PyUnicode_CheckExact(key) && PyUnicode_Compare(key, name) == 0)) {
            return i;
        }
    }
    return -1;
}

/* Prefetch where `obj`'s values array is found: the pointer to it before
 * the object (up to 3.12), or the array itself after it (from 3.13, at the
 * size of `type`, the object's class, given so that the object itself is
 * not read). */
static inline void
pyinstance_prefetch_values(PyObject *obj, PyTypeObject *type)
{
#if PY_VERSION_HEX >= 0x030D0000
    sp_prefetch_at(obj, type->tp_basicsize);
#else
    (void)type;
    sp_prefetch_at(obj, -4 * (Py_ssize_t)sizeof(PyObject *));
#endif
}

/* The values array of `obj` (whose class's shared keys are `keys`), and how
 * many positions it holds; NULL when the instance keeps a dict of another
 * shape. */
static inline PyObject *const *
pyinstance_values(PyObject *obj, const SpDictKeys *keys, Py_ssize_t *capacity)
{
    const SpDictValues *values = NULL;
    PyObject *dict;
#if PY_VERSION_HEX >= 0x030D0000
    if (Py_TYPE(obj)->tp_flags & Py_TPFLAGS_INLINE_VALUES) {
        values = (const SpDictValues *)((char *)obj + Py_TYPE(obj)->tp_basicsize);
        if (values->valid) {
            *capacity = values->capacity;
            return values->values;
        }
    }
    dict = ((PyObject **)obj)[-3];
#elif PY_VERSION_HEX >= 0x030C0000
    char *tagged = ((char **)obj)[-3]; /* dict, or values - 1 */
    if ((uintptr_t)tagged & 1) {
        values = (const SpDictValues *)(tagged + 1);
        *capacity = keys->dk_nentries + keys->dk_usable;
        return values->values;
    }
    dict = (PyObject *)tagged;
#else
    values = ((const SpDictValues **)obj)[-4];
    if (values != NULL) {
        *capacity = keys->dk_nentries + keys->dk_usable;
        return values->values;
    }
    dict = ((PyObject **)obj)[-3];
#endif
    /* A __dict__ asked for: still split (the same keys, values of its own)
     * unless it was changed in ways the shared keys cannot follow. */
    if (dict == NULL || (const SpDictKeys *)((PyDictObject *)dict)->ma_keys != keys ||
        ((PyDictObject *)dict)->ma_values == NULL) {
        return NULL;
    }
    values = (const SpDictValues *)((PyDictObject *)dict)->ma_values;
#if PY_VERSION_HEX >= 0x030D0000
    *capacity = values->capacity;
#else
    *capacity = keys->dk_nentries + keys->dk_usable;
#endif
    return values->values;
}
#endif

#endif /* SPANPACK_PYINSTANCE_H */
