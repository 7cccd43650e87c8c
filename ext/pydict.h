/* Reading a dict's entries in place.
 *
 * PyDict_Next costs ~50 instructions an entry and allows no look-ahead.  For
 * combined tables (every dict but an instance __dict__ sharing its class's
 * keys) the entries are a plain array of (hash, key, value) or, when all keys
 * are str, (key, value) records.  Its layout is the same from 3.11 through
 * 3.15 (Include/internal/pycore_dict.h), so it is read directly there once
 * module exec has proven it (layout_probes.c); other versions, split tables
 * and free-threaded builds use PyDict_Next. */
#ifndef SPANPACK_PYDICT_H
#define SPANPACK_PYDICT_H

#include "layout_probes.h"

#ifdef SP_KNOWN_CPYTHON_LAYOUTS
#define SP_DICT_ENTRIES_IN_PLACE 1

/* struct _dictkeysobject, up to the start of its index table. */
typedef struct {
    Py_ssize_t dk_refcnt;
    uint8_t dk_log2_size;
    uint8_t dk_log2_index_bytes;
    uint8_t dk_kind; /* 0: general entries, 1: str keys, 2: split */
    uint32_t dk_version;
    Py_ssize_t dk_usable;
    Py_ssize_t dk_nentries;
    char dk_indices[];
} SpDictKeys;
#endif

/* Entries of a dict: entry i's key is at keys[i * stride], its value right
 * after; a NULL value marks a deleted entry. */
typedef struct {
    PyObject *const *keys;
    Py_ssize_t count;
    Py_ssize_t stride;
} DictEntries;

/* 1 and `entries` set when the entries of `dict` (an exact or sub- dict) can be
 * read in place (`fast` proven), else 0 (then use PyDict_Next).  Valid until
 * the dict changes: no Python code may run while they are used. */
static inline int
pydict_entries(const SpFastPaths *fast, PyObject *dict, DictEntries *entries)
{
#ifdef SP_DICT_ENTRIES_IN_PLACE
    const PyDictObject *object = (const PyDictObject *)dict;
    const SpDictKeys *keys = (const SpDictKeys *)object->ma_keys;
    if (!fast->dict_entries || object->ma_values != NULL || keys->dk_kind > 1) {
        return 0;
    }
    const char *first_entry = keys->dk_indices + ((size_t)1 << keys->dk_log2_index_bytes);
    if (keys->dk_kind == 0) {
        /* (hash, key, value) */
        entries->keys = (PyObject *const *)(first_entry + sizeof(Py_hash_t));
        entries->stride = 3;
    }
    else {
        /* (key, value) */
        entries->keys = (PyObject *const *)first_entry;
        entries->stride = 2;
    }
    entries->count = keys->dk_nentries;
    return 1;
#else
    (void)fast;
    (void)dict;
    (void)entries;
    return 0;
#endif
}

/* How many entries ahead the tag loops prefetch. */
enum { DICT_PREFETCH_DISTANCE = 4 };

/* Prefetch the key and value objects of the entry DICT_PREFETCH_DISTANCE
 * after `entry`, entry `i` of `entries`, and the line where a compact str's
 * text starts (the next one for three in four of them: pymalloc aligns to 16
 * bytes, and the header takes 48 on 3.11).  A loop over a span's tags loads
 * each key's and value's type, length and text; a fresh span's strings lie
 * scattered over the heap, and once other code has run since they were made
 * (a trace ends a request; the benchmarks collect garbage between calls) each
 * is a cache miss the loop would wait for in turn.  Measured on ddtrace
 * 4.2.3's web_50_children_40_tags: 28-36% less time a span (paired rounds),
 * no change on shapes with few tags.  (Addresses by integer: a deleted
 * entry's NULL is prefetched harmlessly, never offset as a pointer.) */
static SP_ALWAYS_INLINE void
dict_entries_prefetch_ahead(const DictEntries *entries, PyObject *const *entry, Py_ssize_t i)
{
    if (i + DICT_PREFETCH_DISTANCE < entries->count) {
        PyObject *const *ahead = entry + DICT_PREFETCH_DISTANCE * entries->stride;
        SP_PREFETCH(ahead[0]);
        SP_PREFETCH(ahead[1]);
        SP_PREFETCH((const void *)((uintptr_t)ahead[0] + sizeof(PyASCIIObject)));
        SP_PREFETCH((const void *)((uintptr_t)ahead[1] + sizeof(PyASCIIObject)));
    }
}

/* The entries the level-by-level loads of a batch follow per dict
 * (spanfields_warm, otel_map.c's batch_warm): a span's tags, not a dict so
 * large that loading it all would push the rest of the batch out. */
enum { DICT_WARM_ENTRIES = 48 };

/* Prefetch the lines of `entries` (the first DICT_WARM_ENTRIES). */
static inline void
dict_entries_prefetch_lines(const DictEntries *entries)
{
    Py_ssize_t count = entries->count < DICT_WARM_ENTRIES ? entries->count : DICT_WARM_ENTRIES;
    uintptr_t from = (uintptr_t)entries->keys;
    uintptr_t to = from + (uintptr_t)(count * entries->stride) * sizeof(PyObject *);
    for (uintptr_t line = from; line < to; line += 64) {
        SP_PREFETCH((const void *)line);
    }
}

/* Prefetch each entry's value (and key, with `keys`) and where a compact
 * str's text starts (the first DICT_WARM_ENTRIES; a deleted entry's NULL
 * prefetched harmlessly). */
static inline void
dict_entries_prefetch_objects(const DictEntries *entries, int keys)
{
    Py_ssize_t count = entries->count < DICT_WARM_ENTRIES ? entries->count : DICT_WARM_ENTRIES;
    for (Py_ssize_t j = 0; j < count; j++) {
        PyObject *const *entry = entries->keys + j * entries->stride;
        if (keys) {
            SP_PREFETCH(entry[0]);
        }
        SP_PREFETCH(entry[1]);
        sp_prefetch_at(entry[1], sizeof(PyASCIIObject));
    }
}

/* The last levels of a batch's level-by-level loads (spanfields_warm,
 * otel_map.c's batch_warm), over `count` objects already prefetched, each
 * one's loads of a level in flight with the others': the tables of those
 * that are exact dicts, then their entries' lines, then each entry's value
 * (and key, with `keys`) and text.  The others, and dicts not read in place,
 * are set to NULL in `dicts`. */
static inline void
dicts_prefetch_levels(const SpFastPaths *fast, PyObject **dicts, Py_ssize_t count, int keys)
{
    for (Py_ssize_t i = 0; i < count; i++) {
        if (dicts[i] != NULL && PyDict_CheckExact(dicts[i])) {
            SP_PREFETCH(((PyDictObject *)dicts[i])->ma_keys);
        }
        else {
            dicts[i] = NULL;
        }
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        DictEntries entries;
        if (dicts[i] == NULL || !pydict_entries(fast, dicts[i], &entries)) {
            dicts[i] = NULL;
            continue;
        }
        dict_entries_prefetch_lines(&entries);
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        DictEntries entries;
        if (dicts[i] != NULL && pydict_entries(fast, dicts[i], &entries)) {
            dict_entries_prefetch_objects(&entries, keys);
        }
    }
}

/* 1 when looking an exact str up in `dict` (a dict or subclass) can run no
 * Python code, `fast` proven: every key is an exact str (a combined table of
 * str keys, or a split one, which holds only str keys), so the lookup
 * compares text and never calls a key's __eq__.  0 when not known. */
static inline int
pydict_has_only_str_keys(const SpFastPaths *fast, PyObject *dict)
{
#ifdef SP_DICT_ENTRIES_IN_PLACE
    const PyDictObject *object = (const PyDictObject *)dict;
    return fast->dict_entries &&
           (object->ma_values != NULL || ((const SpDictKeys *)object->ma_keys)->dk_kind == 1);
#else
    (void)fast;
    (void)dict;
    return 0;
#endif
}

#endif /* SPANPACK_PYDICT_H */
