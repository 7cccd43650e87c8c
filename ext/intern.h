/* String interning for span payloads.
 *
 * EncodedStrCache (v0.4): maps a str object to the exact msgpack bytes it
 *   encodes to, so a repeated service name or tag key costs one pointer-hash
 *   probe and a fixed-size copy instead of a UTF-8 conversion, length checks
 *   and header choice.  By the object's address: each string has its own
 *   slot, and the other slot of that slot's pair takes a second string, so
 *   two repeated strings whose addresses pick one slot are both cached.  A
 *   newcomer takes a free slot of its pair, else evicts the pair's slots in
 *   turn, so the cache is bounded and never needs clearing.  Each key is held
 *   by a strong reference so its address cannot be reused by a different
 *   string while cached.  A string is admitted the second time it is seen at
 *   its slot's mark (the address last seen there uncached, holding no
 *   reference) within a reuse window (STRCACHE_REUSE_WINDOW misses), so
 *   values that never repeat cost one tag store, not an eviction; a
 *   remembered string keeps the mark against two newcomers, so up to three
 *   strings that take turns at one slot are each admitted.  The caller skips
 *   the cache for a str whose only reference is its span's (span_v04.c): it
 *   cannot be in the cache, which holds a reference of its own.  A miss of a
 *   string probed tag first (a tag value) reads only the tag array (8 bytes a
 *   slot, a pair in one line), its hit the tag and the one-line slot; names
 *   and keys go to their own slot first, where they are usually found.
 *
 * StringTable (v0.5): the payload's string table.  Maps str content to its
 *   index, keeps the encoded table entries in order, and can be rolled back to
 *   an earlier size when a trace fails half-way.
 *
 * HoleList (v0.5): string references an encoded trace leaves unwritten, to be
 *   filled with a payload table's indexes when the trace is joined. */
#ifndef SPANPACK_INTERN_H
#define SPANPACK_INTERN_H

#include "compat.h" /* Python.h before any system header */

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "mpwrite.h"
#include "outbuf.h"

/* ---- v0.4 encoded-string cache ---- */

#define STRCACHE_SLOTS 4096 /* power of two; strcache_write's shift assumes 64-byte slots */
/* Encodings (header included) up to this size are cached; with the key and
 * size a slot is one 64-byte cache line (52 bytes on 64-bit platforms). */
#define STRCACHE_SLOT_ALIGN 64
#define STRCACHE_ENTRY_BYTES                                                                       \
    ((Py_ssize_t)(STRCACHE_SLOT_ALIGN - sizeof(PyObject *) - sizeof(uint32_t)))

_Static_assert(STRCACHE_ENTRY_BYTES >= 32 && STRCACHE_ENTRY_BYTES <= COPY_BLOCKS_MAX,
               "a cache entry is copied with copy_blocks");

typedef struct {
    PyObject *key; /* strong reference; NULL when the slot is empty */
    uint32_t size;
    char bytes[STRCACHE_ENTRY_BYTES];
} StrCacheSlot;

/* Per slot, in a compact array of its own (32 KiB) so that a probe for a
 * string that is not cached, and its admission, touch no slot. */
typedef struct {
    uint32_t cached; /* the key's tag (its address >> 4) while the slot holds one, else 0 */
    /* The mark: the low 14 bits of the tag of the string last seen uncached
     * whose own slot this is, shifted left by 2, and in the low 2 bits how
     * many more newcomers it holds the mark against (strcache_store); 0 for
     * none.  A wrong match only admits a string early. */
    uint16_t seen_tag;
    uint16_t seen_at; /* the miss count (low 16 bits) when the mark was set */
} StrCacheTags;

/* For a string the cache is not asked to remember. */
#define STRCACHE_NO_SLOT ((size_t)-1)

/* The meta entries of the span written last, by position in its meta dict:
 * a span whose entry at a position holds the same key and value objects
 * gets that entry's bytes copied whole (span_v04.c), instead of two cache
 * probes and their checks.  Only exact str are remembered, held by strong
 * references (so neither address can be reused by other text meanwhile),
 * whose entry is short enough that no key is cut (whose check needs the
 * map's other keys): the bytes are then a function of the two texts.
 * Consecutive spans share such entries where their meta dicts are built
 * the same way from shared values (a copied template: spanpack.otel's
 * resource and scope tags, a tracer's per-process tags). */
#define META_MEMO_ENTRIES 32
#define META_MEMO_ENTRY_BYTES 110
/* A position whose entries keep changing (a tag with per-span values held
 * elsewhere too) stops being remembered after this many misses in a row,
 * but for one remembered every 256 misses, in case the spans change. */
#define META_MEMO_MISSES_REMEMBERED 4
#define META_MEMO_IDLE_SPANS 16

typedef struct {
    char bytes[META_MEMO_ENTRY_BYTES];
    uint8_t size;
    uint8_t misses;  /* in a row, wrapping */
    PyObject *key;   /* strong reference, or NULL */
    PyObject *value; /* strong reference, or NULL */
} MetaMemoEntry;     /* 128 bytes on 64-bit platforms */

/* An entry is copied as this many bytes from its start whatever its size
 * (the bytes past its size are overwritten by what is written next): one
 * fixed copy, with no branch on the size. */
#define META_MEMO_COPY (META_MEMO_ENTRY_BYTES + 2)
_Static_assert(offsetof(MetaMemoEntry, bytes) == 0 &&
                   offsetof(MetaMemoEntry, key) >= META_MEMO_COPY,
               "the fixed copy reads the entry's start: the bytes, the size and the miss count");

typedef struct {
    StrCacheSlot *slots; /* NULL: cache disabled; aligned to STRCACHE_SLOT_ALIGN */
    StrCacheTags *tags;
    unsigned char *next_victim; /* per pair: which slot (0 or 1) a full pair evicts */
    void *memory;               /* the allocation the three arrays lie in */
    Py_ssize_t used;
    MetaMemoEntry *meta_entries; /* META_MEMO_ENTRIES of them */
    /* Spans in a row (wrapping) whose meta had fewer than a quarter of its
     * entries copied: past META_MEMO_IDLE_SPANS, the meta of only one span
     * in 64 goes through the memo, so spans whose entries rarely repeat pay
     * almost nothing for it. */
    unsigned int meta_memo_idle;
    /* Counters, exposed for tests and the on/off benchmark (a meta entry
     * copied whole counts its key and value as hits, and is counted in
     * meta_entries_copied too). */
    Py_ssize_t hits;
    Py_ssize_t misses;
    Py_ssize_t meta_entries_copied;
} EncodedStrCache;

int strcache_init(EncodedStrCache *cache);

/* Remember the entry (`key`, `value`) written as `size` bytes at `bytes` for
 * its position (`entry`, which did not hold it), when it qualifies (see
 * MetaMemoEntry): exact str, more references each than `uncached_refs` (one
 * that only its span holds is that span's own, never seen again), and
 * short, and the position has not missed too often in a row. */
static inline void
meta_memo_remember(MetaMemoEntry *entry, PyObject *key, PyObject *value, const char *bytes,
                   Py_ssize_t size, Py_ssize_t uncached_refs)
{
    entry->misses++;
    if (entry->misses > META_MEMO_MISSES_REMEMBERED && entry->misses != 0) {
        return;
    }
    if (size > META_MEMO_ENTRY_BYTES || !PyUnicode_CheckExact(key) ||
        !PyUnicode_CheckExact(value) || Py_REFCNT(key) <= uncached_refs ||
        Py_REFCNT(value) <= uncached_refs) {
        return;
    }
    PyObject *old_key = entry->key, *old_value = entry->value;
    entry->key = Py_NewRef(key);
    entry->value = Py_NewRef(value);
    entry->size = (uint8_t)size;
    copy_bytes(entry->bytes, bytes, size);
    Py_XDECREF(old_key); /* exact str: no code runs */
    Py_XDECREF(old_value);
}
void strcache_clear(EncodedStrCache *cache);
void strcache_free(EncodedStrCache *cache);

static inline uint32_t
strcache_tag_of(const PyObject *key)
{
    return (uint32_t)((uintptr_t)key >> 4);
}

/* `key`'s own slot (strcache_write computes it the same way); the other
 * slot of its pair is index ^ 1. */
static inline size_t
strcache_index_of(const PyObject *key)
{
    return (size_t)(sp_hash_address(key) >> 32) & (STRCACHE_SLOTS - 1);
}

/* Start loading what a probe for `key` reads: its tags, and with `slot` its
 * slot too (for strings likely cached).  A hint; `key` is not dereferenced. */
static inline void
strcache_prefetch(const EncodedStrCache *cache, const PyObject *key, int slot)
{
    size_t index = strcache_index_of(key);
    SP_PREFETCH(&cache->tags[index]);
    if (slot) {
        SP_PREFETCH(&cache->slots[index]);
    }
}

/* Append the cached encoding of `key` to `out`: 1 when it was cached, -1 on
 * error, 0 when not: the caller then encodes it and calls strcache_store
 * with *own_index, the key's own slot.  `check_tag`: for strings often not
 * cached, whose misses then need not load the own slot; strings usually
 * cached go straight to it. */
static inline int
strcache_write(EncodedStrCache *cache, PyObject *key, OutBuf *out, int check_tag, size_t *own_index)
{
    /* The own slot's byte offset, scaled in the shift: a hit needs no index. */
    size_t offset =
        (size_t)(sp_hash_address(key) >> (32 - 6)) & ((STRCACHE_SLOTS - 1) * sizeof(StrCacheSlot));
    const StrCacheSlot *slot = (const StrCacheSlot *)((const char *)cache->slots + offset);
    size_t index = offset / sizeof(StrCacheSlot);
    /* A tag rules out most misses without loading a slot; the key itself
     * decides.  The own slot first: where a string usually is. */
    if ((check_tag && cache->tags[index].cached != strcache_tag_of(key)) || slot->key != key) {
        /* The pair's other slot; its tag is on the same line. */
        if (cache->tags[index ^ 1].cached != strcache_tag_of(key) ||
            cache->slots[index ^ 1].key != key) {
            cache->misses++;
            *own_index = index;
            return 0;
        }
        slot = &cache->slots[index ^ 1];
    }
    cache->hits++;
    /* Copy the whole fixed-size entry (two overlapping 32-byte blocks, not
     * a memcpy: outbuf.h's copy_blocks) and keep only its `size` bytes. */
    if (outbuf_reserve(out, STRCACHE_ENTRY_BYTES) < 0) {
        return -1;
    }
    copy_blocks(out->pos, slot->bytes, STRCACHE_ENTRY_BYTES);
    out->pos += slot->size;
    return 1;
}

/* Put `key` (an exact str seen before at its slot's mark, cached in neither
 * slot of its pair, own slot `index`), which encodes to `encoded`, in the
 * cache.  Returns 0. */
int strcache_admit(EncodedStrCache *cache, PyObject *key, size_t index, const char *encoded,
                   Py_ssize_t size);

/* A string is admitted only when seen again within this many misses: keys
 * and names recur within a span or a trace, while a benchmark that encodes
 * the same spans again brings every per-span string back once a round, and
 * caching those costs more (admissions, evictions, hits on slot lines spread
 * over the whole table) than encoding them. */
#define STRCACHE_REUSE_WINDOW 1024

/* How many newcomers a marked string keeps the mark against: of up to three
 * repeated strings that take turns at one own slot, each is admitted in turn
 * (with one, two strings that alternate would be, three never). */
#define STRCACHE_MARK_HOLDS 2

/* After a miss: cache `key` (own slot `index`), which encodes to `encoded`,
 * if it was seen at its slot's mark within the reuse window; a no-op for
 * encodings too large.  Returns 0 (so that callers can end with it).  A
 * string seen for the first time (most misses: unique values, keys built
 * per span) only changes the mark, inline. */
static inline int
strcache_store(EncodedStrCache *cache, PyObject *key, size_t index, const char *encoded,
               Py_ssize_t size)
{
    if (size > STRCACHE_ENTRY_BYTES) {
        return 0;
    }
    uint16_t now = (uint16_t)cache->misses;
    uint16_t mark = (uint16_t)((strcache_tag_of(key) << 2) | STRCACHE_MARK_HOLDS);
    StrCacheTags *tags = &cache->tags[index];
    uint16_t seen = tags->seen_tag;
    if ((uint16_t)(now - tags->seen_at) < STRCACHE_REUSE_WINDOW) {
        if (((seen ^ mark) & ~3) == 0) {
            tags->seen_tag = 0; /* free for the next newcomer */
            return strcache_admit(cache, key, index, encoded, size);
        }
        /* A string remembered here keeps the mark against a newcomer while
         * it has holds left. */
        if (seen & 3) {
            tags->seen_tag = (uint16_t)(seen - 1);
            return 0;
        }
    }
    /* First sighting (or the last one too long ago): this one takes the mark. */
    tags->seen_tag = mark;
    tags->seen_at = now;
    return 0;
}

/* ---- v0.5 string table ---- */

/* The table's own hash of a key's bytes (a str's code units at its kind's
 * width, a bytes' bytes), not CPython's: most keys a tracer writes are
 * per-span values whose str was never hashed, and CPython's SipHash-1-3 of
 * them (with the calls around it) was a quarter of a v0.5 span with 40
 * such tags.  Multiply-and-fold mixing of 16 bytes at a time.  Both factors
 * of every product are keyed (the table's hash_key, drawn from the
 * process's hash secret at module exec, as CPython keys str hashes): text
 * that zeroed a factor would collide whatever else it holds, and only the
 * key says which text that is.  Equal keys have equal bytes (a str's
 * representation is canonical), so they hash alike; a str and a bytes of
 * the same bytes may too, and are told apart by strtable_key_equal. */
static inline uint64_t
text_hash_fold(uint64_t a, uint64_t b)
{
#ifdef __SIZEOF_INT128__
    __uint128_t product = (__uint128_t)a * b;
    return (uint64_t)product ^ (uint64_t)(product >> 64);
#else
    uint64_t a_low = (uint32_t)a, a_high = a >> 32, b_low = (uint32_t)b, b_high = b >> 32;
    uint64_t low_low = a_low * b_low, high_low = a_high * b_low;
    uint64_t low_high = a_low * b_high, high_high = a_high * b_high;
    uint64_t middle = (low_low >> 32) + (uint32_t)high_low + low_high;
    uint64_t high = high_high + (high_low >> 32) + (middle >> 32);
    uint64_t low = (middle << 32) | (uint32_t)low_low;
    return low ^ high;
#endif
}

static inline uint64_t
text_hash_load64(const unsigned char *p)
{
    uint64_t value;
    memcpy(&value, p, 8);
    return value;
}

static inline uint64_t
text_hash_load32(const unsigned char *p)
{
    uint32_t value;
    memcpy(&value, p, 4);
    return value;
}

/* An odd constant with well-spread bits (the golden ratio's fractional
 * bits), for the last fold with the size. */
#define TEXT_HASH_MIX 0x9E3779B97F4A7C15ULL

static SP_ALWAYS_INLINE Py_hash_t
text_hash(const void *data, size_t size, const uint64_t key[2])
{
    const unsigned char *p = data;
    uint64_t first, last, running = key[1];
    if (SP_LIKELY(size <= 16)) {
        /* The first and last 8 (or 4) bytes, overlapping when shorter. */
        if (size >= 8) {
            first = text_hash_load64(p);
            last = text_hash_load64(p + size - 8);
        }
        else if (size >= 4) {
            first = text_hash_load32(p);
            last = text_hash_load32(p + size - 4);
        }
        else if (size > 0) {
            first = ((uint64_t)p[0] << 16) | ((uint64_t)p[size >> 1] << 8) | p[size - 1];
            last = 0;
        }
        else {
            first = last = 0;
        }
    }
    else {
        /* 16 bytes at a time while more than 16 are left, then the last 16. */
        const unsigned char *tail = p + size - 16;
        for (; p < tail; p += 16) {
            running =
                text_hash_fold(text_hash_load64(p) ^ key[0], text_hash_load64(p + 8) ^ running);
        }
        first = text_hash_load64(tail);
        last = text_hash_load64(tail + 8);
    }
    Py_hash_t hash = (Py_hash_t)text_hash_fold(TEXT_HASH_MIX ^ size,
                                               text_hash_fold(first ^ key[0], last ^ running));
    /* -1 stands for "not computed" in strtable_insert. */
    return hash == -1 ? -2 : hash;
}

typedef struct {
    const PyObject *object; /* NULL: none */
    uint32_t index;
} StrTableObjectSlot;

typedef struct {
    PyObject **strings; /* by index; exact str or bytes, strong references */
    Py_hash_t *hashes;  /* by index */
    /* By index, in tables that use them (strtable_use_marks; else NULL): a
     * byte for the writer, 0 when the entry is added (kept 0 beyond count by
     * growth and rollback, so inserting costs nothing; v1.0: what the text
     * means as a tag key, found once per entry, not per use). */
    unsigned char *marks;
    /* By index, in tables that lend (strtable_use_lending; else NULL): 1
     * while the entry's reference belongs to the table it was added to with
     * strtable_add_from (kept 0 beyond count, like marks). */
    unsigned char *lent;
    uint32_t count;
    uint32_t capacity;
    uint32_t *index_of; /* open addressing: 0 empty, else index + 1 */
    size_t mask;
    /* STRTABLE_OBJECT_SLOTS slots by an object's address: the object last
     * found by its text there (strtable_find_text; no reference: compared,
     * never dereferenced) and its entry, trusted only while that entry still
     * is that object. */
    StrTableObjectSlot *index_by_object;
    uint64_t hash_key[2]; /* text_hash's key: the module state's, for every table */
    OutBuf encoded;       /* the table's str entries, msgpack-encoded, in index order */
} StringTable;

#define STRTABLE_OBJECT_SLOTS 256 /* a power of two */

/* Writes the msgpack form of a new table entry `str` to `out`. */
typedef int (*strtable_encode_fn)(void *arg, PyObject *str, OutBuf *out);

/* encoded_capacity: initial room for encoded entries (tables that never
 * encode, such as an encoded trace's local table, pass 1). */
int strtable_init(StringTable *table, Py_ssize_t encoded_capacity, const uint64_t hash_key[2]);
/* The most memory one entry of a table's capacity takes (beyond a table's
 * fixed STRTABLE_OBJECT_SLOTS index slots by object): its string and
 * hash, its mark and lent bytes, and up to four 4-byte index slots. */
#define STRTABLE_MAX_ENTRY_BYTES (sizeof(PyObject *) + sizeof(Py_hash_t) + 2 + 4 * sizeof(uint32_t))
/* Give the table its marks (every entry's 0); -1 and MemoryError if there
 * is no memory for them. */
int strtable_use_marks(StringTable *table);
/* Let strtable_add_from take over this table's references: a trace's own
 * table (put()) that is emptied right after its join, when a string new to
 * the payload would otherwise cost a reference taken by the payload and one
 * dropped by the trace's table (several instructions each from CPython 3.12
 * on, PEP 683). */
int strtable_use_lending(StringTable *table);
/* Take back every reference lent, before the table they went to drops its
 * entries (a rolled-back or refused join). */
void strtable_reclaim(StringTable *table);
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

/* The table's hash of an exact str's text. */
static SP_ALWAYS_INLINE Py_hash_t
strtable_str_hash(const StringTable *table, PyObject *str)
{
    return text_hash(PyUnicode_DATA(str),
                     (size_t)PyUnicode_GET_LENGTH(str) * (size_t)PyUnicode_KIND(str),
                     table->hash_key);
}

/* strtable_str_hash of `value` when it is an exact str of at most
 * `max_length` code points (text looked up as it is), else -1.  (A str a
 * legacy API made and nothing has made ready yet, CPython 3.11 and older,
 * shows no length or text until it is: -1, for the slow path.) */
static SP_ALWAYS_INLINE Py_hash_t
strtable_short_str_hash(const StringTable *table, PyObject *value, Py_ssize_t max_length)
{
    if (SP_LIKELY(PyUnicode_CheckExact(value)) && SP_UNICODE_IS_READY(value) &&
        PyUnicode_GET_LENGTH(value) <= max_length) {
        return strtable_str_hash(table, value);
    }
    return -1;
}

/* The table's hash of a key (an exact str or exact bytes). */
static inline Py_hash_t
strtable_key_hash(const StringTable *table, PyObject *key)
{
    if (PyBytes_CheckExact(key)) {
        return text_hash(PyBytes_AS_STRING(key), (size_t)PyBytes_GET_SIZE(key), table->hash_key);
    }
    return strtable_str_hash(table, key);
}

/* 1 and *index set when `str` (with this hash) is in the table, else 0.
 * Always inlined: it is most of the cost of a string reference. */
static SP_ALWAYS_INLINE int
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

/* The slot of index_by_object for `object`. */
static inline StrTableObjectSlot *
strtable_object_slot(const StringTable *table, const PyObject *object)
{
    return &table->index_by_object[sp_hash_address(object) >> (64 - 8)];
}

_Static_assert(STRTABLE_OBJECT_SLOTS == 1 << 8, "strtable_object_slot takes 8 bits");

/* 1 and *index set when `value` (any object) is in the table as this very
 * object, found by its address; 0 says nothing about its text. */
static SP_ALWAYS_INLINE int
strtable_find_object(const StringTable *table, const PyObject *value, uint32_t *index)
{
    /* The address first: most misses (values new to the table) end there. */
    const StrTableObjectSlot *slot = strtable_object_slot(table, value);
    if (slot->object == value && slot->index < table->count &&
        table->strings[slot->index] == value) {
        *index = slot->index;
        return 1;
    }
    return 0;
}

/* The second half of strtable_find_text, for a value strtable_find_object
 * just did not find. */
static SP_ALWAYS_INLINE int
strtable_find_text_not_object(StringTable *table, PyObject *value, Py_ssize_t max_length,
                              Py_hash_t *hash, uint32_t *index)
{
    *hash = strtable_short_str_hash(table, value, max_length);
    if (*hash != -1 && strtable_find(table, value, *hash, index)) {
        *strtable_object_slot(table, value) = (StrTableObjectSlot){value, *index};
        return 1;
    }
    return 0;
}

/* strtable_find for text given as `value`, any object: 1 and *index set
 * when it is in the table as itself (a name, a key, a constant value: most
 * repeated text is the same object again, which costs no hash of its text)
 * or, for an exact str of at most `max_length` code points, by its text;
 * else 0 with *hash that str's table hash (-1 for any other value, not
 * looked up by text).  A str found by its text is remembered by address. */
static SP_ALWAYS_INLINE int
strtable_find_text(StringTable *table, PyObject *value, Py_ssize_t max_length, Py_hash_t *hash,
                   uint32_t *index)
{
    return strtable_find_object(table, value, index) ||
           strtable_find_text_not_object(table, value, max_length, hash, index);
}

/* Could the next strtable_insert fail (the table must grow, or is full)?
 * Writers holding borrowed values own them first: the error is an exception
 * object. */
static inline int
strtable_insert_may_fail(const StringTable *table)
{
    return table->count >= table->capacity || table->count == UINT32_MAX - 1;
}

/* Add `str` (hash -1: not computed yet, and maybe in the table already),
 * encoding it with `encode` unless NULL.  The slow path of strtable_index. */
int strtable_insert(StringTable *table, PyObject *str, Py_hash_t hash, strtable_encode_fn encode,
                    void *arg, uint32_t *index);

/* Add `str`, known to be absent, with its hash (not -1): strtable_insert
 * without the lookup. */
int strtable_add(StringTable *table, PyObject *str, Py_hash_t hash, strtable_encode_fn encode,
                 void *arg, uint32_t *index);

/* strtable_add of entry `local_index` of `local`, taking over `local`'s
 * reference when it lends. */
int strtable_add_from(StringTable *table, StringTable *local, uint32_t local_index,
                      strtable_encode_fn encode, void *arg, uint32_t *index);

/* strtable_add with no encoding, inlined for the usual case that needs no
 * growth (a call costs as much as the add): 1 when the table must grow or
 * is full (nothing done: call strtable_add or strtable_add_from), else 0.
 * `lent`: the lender's flag for this string, set instead of taking a
 * reference; NULL to take one. */
static SP_ALWAYS_INLINE int
strtable_push(StringTable *table, PyObject *str, Py_hash_t hash, unsigned char *lent,
              uint32_t *index)
{
    if (SP_UNLIKELY(strtable_insert_may_fail(table))) {
        return 1;
    }
    uint32_t new_index = table->count++;
    if (lent != NULL) {
        *lent = 1;
    }
    else {
        Py_INCREF(str);
    }
    table->strings[new_index] = str;
    table->hashes[new_index] = hash;
    size_t slot = (size_t)hash & table->mask;
    while (table->index_of[slot] != 0) {
        slot = (slot + 1) & table->mask;
    }
    table->index_of[slot] = new_index + 1;
    *index = new_index;
    return 0;
}

/* strtable_add with no encoding: inline unless the table must grow. */
static SP_ALWAYS_INLINE int
strtable_append(StringTable *table, PyObject *str, Py_hash_t hash, uint32_t *index)
{
    if (strtable_push(table, str, hash, NULL, index) == 0) {
        return 0;
    }
    return strtable_add(table, str, hash, NULL, NULL, index);
}

/* strtable_add_from with no encoding: inline unless the table must grow. */
static SP_ALWAYS_INLINE int
strtable_append_from(StringTable *table, StringTable *local, uint32_t local_index, uint32_t *index)
{
    unsigned char *lent = local->lent != NULL ? &local->lent[local_index] : NULL;
    if (strtable_push(table, local->strings[local_index], local->hashes[local_index], lent,
                      index) == 0) {
        return 0;
    }
    return strtable_add_from(table, local, local_index, NULL, NULL, index);
}

/* Index of `str` (an exact str or exact bytes), adding it when new.  The
 * encoded form of a new entry is written by `encode(arg, str, out)` unless
 * encode is NULL. */
static inline int
strtable_index(StringTable *table, PyObject *str, strtable_encode_fn encode, void *arg,
               uint32_t *index)
{
    Py_hash_t hash = strtable_key_hash(table, str);
    if (strtable_find(table, str, hash, index)) {
        return 0;
    }
    return strtable_insert(table, str, hash, encode, arg, index);
}

/* strtable_index of entry `local_index` of `local`, by the hash kept there
 * (every table's key is the module state's, drawn from the process's hash
 * secret: one key in the process). */
static inline int
strtable_index_from(StringTable *table, const StringTable *local, uint32_t local_index,
                    strtable_encode_fn encode, void *arg, uint32_t *index)
{
    PyObject *str = local->strings[local_index];
    Py_hash_t hash = local->hashes[local_index];
    if (strtable_find(table, str, hash, index)) {
        return 0;
    }
    return strtable_insert(table, str, hash, encode, arg, index);
}

/* Forget every entry from `count` on (count must not exceed table->count),
 * truncating the encoded entries to `encoded_len`. */
void strtable_rollback(StringTable *table, uint32_t count, Py_ssize_t encoded_len);

/* ---- v0.5 string references not yet written ---- */

/* A v0.5 string reference not yet written: the body leaves it out and the
 * join writes the payload-table index in its place. */
typedef struct {
    Py_ssize_t offset;    /* position in the body */
    uint32_t local_index; /* index into the encoded trace's own table */
} StringHole;

typedef struct {
    StringHole *items;
    Py_ssize_t count;
    Py_ssize_t capacity;
} HoleList;

int holes_grow(HoleList *holes);

static SP_ALWAYS_INLINE int
holes_push(HoleList *holes, Py_ssize_t offset, uint32_t local_index)
{
    if (SP_UNLIKELY(holes->count == holes->capacity) && holes_grow(holes) < 0) {
        return -1;
    }
    holes->items[holes->count].offset = offset;
    holes->items[holes->count].local_index = local_index;
    holes->count++;
    return 0;
}
void holes_free(HoleList *holes);

/* ---- v0.5 put(): the payload indexes a trace's strings will get ----
 *
 * put() encodes a trace against its own table (Python code may run
 * meanwhile, which may change the payload) and joins it afterwards.  Most
 * of the time nothing touches the payload in between, so each string's
 * payload index is known while the trace is encoded: a string the payload
 * has is written as its index there (and never enters the trace's table);
 * a string new to it goes into the trace's table, written as the index it
 * will get when the trace's new strings are added in order (`base` for the
 * first).  If the payload is the same one, with the same number of strings,
 * when the trace is joined, the join only adds the new strings and copies
 * the body whole; otherwise it walks the body and rewrites each string
 * reference: below `base` an entry of the payload the forecast was made for
 * (kept by ForecastTables when that payload was finished meanwhile), from
 * `base` on an entry of the trace's own table. */
struct ForecastTables;

/* Every v0.5 table starts with "" (0) and "_dd.origin" (1), a trace's own
 * as well as a payload's. */
#define V05_FIXED_ENTRIES 2

typedef struct {
    /* The payload's table, read while the trace is encoded (and its object
     * slots written: under the GIL only); NULL: no forecast. */
    StringTable *payload;
    /* The id of the payload now at that place (finishing one starts the
     * next there), and the one forecast for (PayloadBuilder.id). */
    const uint64_t *current_id;
    uint64_t payload_id;
    uint32_t base; /* the payload table's count when the trace started */
    /* The trace's origin as written (0: none): it enters a payload's table
     * before any span's strings. */
    uint32_t origin_ref;
    /* Where the table of the payload forecast for is kept once it is
     * finished before the trace is joined. */
    const struct ForecastTables *tables;
} IndexForecast;

/* The payload's table while it is as the forecast found it (same payload,
 * same count: entries are only added, or removed again in the same step
 * that no Python code interrupts), else NULL: from then on every string
 * goes into the trace's table. */
static SP_ALWAYS_INLINE StringTable *
forecast_payload_table(const IndexForecast *forecast)
{
    return *forecast->current_id == forecast->payload_id &&
                   forecast->payload->count == forecast->base
               ? forecast->payload
               : NULL;
}

/* The index written for entry `local_index` of the trace's own table: the
 * two fixed entries as they are, the others after the payload's `base`. */
static SP_ALWAYS_INLINE int
forecast_local_index(const IndexForecast *forecast, uint32_t local_index, uint32_t *index)
{
    if (local_index < V05_FIXED_ENTRIES) {
        *index = local_index;
        return 0;
    }
    uint64_t forecast_index = (uint64_t)forecast->base + (local_index - V05_FIXED_ENTRIES);
    if (SP_UNLIKELY(forecast_index >= UINT32_MAX - 1)) {
        PyErr_SetString(PyExc_ValueError, "string table is full");
        return -1;
    }
    *index = (uint32_t)forecast_index;
    return 0;
}

#endif /* SPANPACK_INTERN_H */
