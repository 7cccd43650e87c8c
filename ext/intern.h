/* String interning for span payloads.
 *
 * EncodedStrCache (v0.4): maps a str object to the exact msgpack bytes it
 *   encodes to, so a repeated service name or tag key costs one pointer-hash
 *   probe and a copy instead of a UTF-8 conversion, length checks and header
 *   choice.  Keyed by identity; each key is held by a strong reference so its
 *   address cannot be reused by a different string while cached.  Bounded:
 *   when full it is emptied and refilled.
 *
 * StringTable (v0.5): the payload's string table.  Maps str content to its
 *   index, keeps the encoded table entries in order, and can be rolled back to
 *   an earlier size when a trace fails half-way. */
#ifndef SPANPACK_INTERN_H
#define SPANPACK_INTERN_H

#include <stdint.h>
#include <string.h>

#include "outbuf.h"

/* ---- v0.4 encoded-string cache ---- */

#define STRCACHE_SLOTS 4096    /* power of two */
#define STRCACHE_MAX_ENTRY 512 /* longer encodings are not cached */
#define STRCACHE_ARENA_BYTES (512 * 1024)

typedef struct {
    PyObject *key; /* strong reference; NULL when the slot is empty */
    uint32_t offset;
    uint32_t size;
} StrCacheSlot;

typedef struct {
    StrCacheSlot *slots; /* NULL: cache disabled */
    Py_ssize_t used;
    char *arena;
    Py_ssize_t arena_used;
    /* Counters, exposed for tests and the on/off benchmark. */
    Py_ssize_t hits;
    Py_ssize_t misses;
} EncodedStrCache;

int strcache_init(EncodedStrCache *cache);
void strcache_clear(EncodedStrCache *cache);
void strcache_free(EncodedStrCache *cache);

static inline size_t
strcache_slot_of(const EncodedStrCache *cache, PyObject *key)
{
    (void)cache;
    uintptr_t bits = (uintptr_t)key >> 4;
    return (size_t)((bits * 0x9E3779B97F4A7C15ULL) >> 32) & (STRCACHE_SLOTS - 1);
}

/* The cached encoding of `key`, or NULL (the caller then encodes it and may
 * call strcache_store). */
static inline const StrCacheSlot *
strcache_lookup(EncodedStrCache *cache, PyObject *key)
{
    size_t i = strcache_slot_of(cache, key);
    for (;;) {
        const StrCacheSlot *slot = &cache->slots[i];
        if (slot->key == key) {
            cache->hits++;
            return slot;
        }
        if (slot->key == NULL) {
            cache->misses++;
            return NULL;
        }
        i = (i + 1) & (STRCACHE_SLOTS - 1);
    }
}

static inline const char *
strcache_bytes(const EncodedStrCache *cache, const StrCacheSlot *slot)
{
    return cache->arena + slot->offset;
}

/* Remember that `key` encodes to `encoded`; a no-op for entries too large. */
void strcache_store(EncodedStrCache *cache, PyObject *key, const char *encoded, Py_ssize_t size);

/* ---- v0.5 string table ---- */

typedef struct {
    PyObject **strings; /* by index; exact str or bytes, strong references */
    Py_hash_t *hashes;  /* by index */
    uint32_t count;
    uint32_t capacity;
    uint32_t *index_of; /* open addressing: 0 empty, else index + 1 */
    size_t mask;
    OutBuf encoded; /* the table's str entries, msgpack-encoded, in index order */
} StringTable;

/* Writes the msgpack form of a new table entry `str` to `out`. */
typedef int (*strtable_encode_fn)(void *arg, PyObject *str, OutBuf *out);

/* encoded_capacity: initial room for encoded entries (tables that never
 * encode, such as an encoded trace's local table, pass 1). */
int strtable_init(StringTable *table, Py_ssize_t encoded_capacity);
void strtable_free(StringTable *table);

static inline int
strtable_bytes_equal(const char *a, const char *b, size_t size)
{
    /* Short keys dominate: compare with two overlapping loads, not a call. */
    if (size >= 8 && size <= 16) {
        uint64_t a1, a2, b1, b2;
        memcpy(&a1, a, 8);
        memcpy(&b1, b, 8);
        memcpy(&a2, a + size - 8, 8);
        memcpy(&b2, b + size - 8, 8);
        return a1 == b1 && a2 == b2;
    }
    if (size >= 4 && size < 8) {
        uint32_t a1, a2, b1, b2;
        memcpy(&a1, a, 4);
        memcpy(&b1, b, 4);
        memcpy(&a2, a + size - 4, 4);
        memcpy(&b2, b + size - 4, 4);
        return a1 == b1 && a2 == b2;
    }
    return memcmp(a, b, size) == 0;
}

/* Keys are exact str or exact bytes; a str never equals a bytes. */
static inline int
strtable_key_equal(PyObject *a, PyObject *b)
{
    if (a == b) {
        return 1;
    }
    if (Py_TYPE(a) != Py_TYPE(b)) {
        return 0;
    }
    if (PyBytes_CheckExact(a)) {
        return PyBytes_GET_SIZE(a) == PyBytes_GET_SIZE(b) &&
               memcmp(PyBytes_AS_STRING(a), PyBytes_AS_STRING(b), (size_t)PyBytes_GET_SIZE(a)) == 0;
    }
    Py_ssize_t length = PyUnicode_GET_LENGTH(a);
    if (length != PyUnicode_GET_LENGTH(b) || PyUnicode_KIND(a) != PyUnicode_KIND(b)) {
        return 0;
    }
    return strtable_bytes_equal(PyUnicode_DATA(a), PyUnicode_DATA(b),
                                (size_t)length * PyUnicode_KIND(a));
}

/* 1 and *index set when `str` (with this hash) is in the table, else 0. */
static inline int
strtable_find(const StringTable *table, PyObject *str, Py_hash_t hash, uint32_t *index)
{
    size_t i = (size_t)hash & table->mask;
    uint32_t entry;
    while ((entry = table->index_of[i]) != 0) {
        uint32_t candidate = entry - 1;
        if (table->hashes[candidate] == hash &&
            strtable_key_equal(table->strings[candidate], str)) {
            *index = candidate;
            return 1;
        }
        i = (i + 1) & table->mask;
    }
    return 0;
}

/* Add `str` (hash -1: not computed yet), encoding it with `encode` unless
 * NULL.  The slow path of strtable_index. */
int strtable_insert(StringTable *table, PyObject *str, Py_hash_t hash, strtable_encode_fn encode,
                    void *arg, uint32_t *index);

/* Index of `str` (an exact str or exact bytes), adding it when new.  The
 * encoded form of a new entry is written by `encode(arg, str, out)` unless
 * encode is NULL. */
static inline int
strtable_index(StringTable *table, PyObject *str, strtable_encode_fn encode, void *arg,
               uint32_t *index)
{
    /* str and bytes cache their hash; str's is read without a call. */
    Py_hash_t hash = PyUnicode_CheckExact(str) ? ((PyASCIIObject *)str)->hash : -1;
    if (hash != -1 && strtable_find(table, str, hash, index)) {
        return 0;
    }
    return strtable_insert(table, str, hash, encode, arg, index);
}

/* Forget every entry from `count` on (count must not exceed table->count),
 * truncating the encoded entries to `encoded_len`. */
void strtable_rollback(StringTable *table, uint32_t count, Py_ssize_t encoded_len);

/* Empty the table (keeping its memory up to a modest size). */
void strtable_reset(StringTable *table);

#endif /* SPANPACK_INTERN_H */
