/* String interning: the v0.4 encoded-string cache and the v0.5 string table. */
#include "intern.h"

/* ---- v0.4 encoded-string cache ---- */

_Static_assert(sizeof(StrCacheSlot) == STRCACHE_SLOT_ALIGN, "a cache slot is one cache line");

int
strcache_init(EncodedStrCache *cache)
{
    memset(cache, 0, sizeof *cache);
    size_t slots_size = STRCACHE_SLOTS * sizeof(StrCacheSlot);
    size_t tags_size = STRCACHE_SLOTS * sizeof(StrCacheTags);
    cache->memory =
        PyMem_Calloc(1, STRCACHE_SLOT_ALIGN + slots_size + tags_size + STRCACHE_SLOTS / 2);
    if (cache->memory == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    uintptr_t address = (uintptr_t)cache->memory;
    uintptr_t aligned = (address + STRCACHE_SLOT_ALIGN - 1) & ~(uintptr_t)(STRCACHE_SLOT_ALIGN - 1);
    cache->slots = (StrCacheSlot *)((char *)cache->memory + (aligned - address));
    cache->tags = (StrCacheTags *)((char *)cache->slots + slots_size);
    cache->next_victim = (unsigned char *)cache->tags + tags_size;
    cache->meta_entries = PyMem_Calloc(META_MEMO_ENTRIES, sizeof(MetaMemoEntry));
    if (cache->meta_entries == NULL) {
        PyMem_Free(cache->memory);
        memset(cache, 0, sizeof *cache);
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

void
strcache_clear(EncodedStrCache *cache)
{
    if (cache->slots == NULL) {
        return;
    }
    for (size_t i = 0; i < STRCACHE_SLOTS; i++) {
        cache->tags[i].cached = 0;
        Py_CLEAR(cache->slots[i].key);
    }
    cache->used = 0;
    for (size_t i = 0; cache->meta_entries != NULL && i < META_MEMO_ENTRIES; i++) {
        Py_CLEAR(cache->meta_entries[i].key);
        Py_CLEAR(cache->meta_entries[i].value);
    }
}

void
strcache_free(EncodedStrCache *cache)
{
    strcache_clear(cache);
    PyMem_Free(cache->memory);
    PyMem_Free(cache->meta_entries);
    cache->meta_entries = NULL;
    cache->memory = NULL;
    cache->slots = NULL;
    cache->tags = NULL;
    cache->next_victim = NULL;
}

int
strcache_admit(EncodedStrCache *cache, PyObject *key, size_t index, const char *encoded,
               Py_ssize_t size)
{
    if (cache->slots == NULL) {
        return 0;
    }
    /* A free slot of the pair, else the pair's slots in turn: a string that
     * stopped repeating is evicted by the time a second newcomer arrives,
     * whichever slot it holds. */
    if (cache->slots[index].key != NULL) {
        if (cache->slots[index ^ 1].key == NULL) {
            index ^= 1;
        }
        else {
            unsigned char *victim = &cache->next_victim[index / 2];
            index = (index & ~(size_t)1) | *victim;
            *victim ^= 1;
        }
    }
    /* Evicting a str runs no Python code (its dealloc is plain C). */
    StrCacheSlot *slot = &cache->slots[index];
    PyObject *evicted = slot->key;
    slot->key = Py_NewRef(key);
    slot->size = (uint32_t)size;
    copy_bytes(slot->bytes, encoded, size);
    cache->tags[index].cached = strcache_tag_of(key);
    if (evicted != NULL) {
        Py_DECREF(evicted);
    }
    else {
        cache->used++;
    }
    return 0;
}

/* ---- v0.5 string table ---- */

#define STRTABLE_INITIAL_CAPACITY 64

/* Resize a byte-per-entry array (marks, lent) that the table has, if any:
 * entries to come start at 0 (adding an entry leaves these bytes alone). */
static int
grow_entry_bytes(unsigned char **bytes, uint32_t old_capacity, uint32_t capacity)
{
    if (*bytes == NULL) {
        return 0;
    }
    unsigned char *grown = PyMem_Realloc(*bytes, capacity);
    if (grown == NULL) {
        return -1;
    }
    if (capacity > old_capacity) {
        memset(grown + old_capacity, 0, capacity - old_capacity);
    }
    *bytes = grown;
    return 0;
}

/* Room for `capacity` entries.  Each array is replaced only once its larger
 * copy exists, so on failure the table is still whole at its old capacity. */
static int
strtable_alloc(StringTable *table, uint32_t capacity)
{
#if SIZEOF_SIZE_T < 8
    /* The array sizes below (and the index's, twice as many slots) must not
     * wrap around; with a 64-bit size_t a uint32_t count cannot make them. */
    if ((size_t)capacity > PY_SSIZE_T_MAX / 2 / sizeof(Py_hash_t)) {
        return -1;
    }
#endif
    size_t slots = 1;
    while (slots < (size_t)capacity * 2) {
        slots <<= 1;
    }
    PyObject **strings = PyMem_Realloc(table->strings, capacity * sizeof(PyObject *));
    if (strings == NULL) {
        return -1;
    }
    table->strings = strings;
    Py_hash_t *hashes = PyMem_Realloc(table->hashes, capacity * sizeof(Py_hash_t));
    if (hashes == NULL) {
        return -1;
    }
    table->hashes = hashes;
    if (grow_entry_bytes(&table->marks, table->capacity, capacity) < 0 ||
        grow_entry_bytes(&table->lent, table->capacity, capacity) < 0) {
        return -1;
    }
    uint32_t *index_of = PyMem_Calloc(slots, sizeof(uint32_t));
    if (index_of == NULL) {
        return -1;
    }
    PyMem_Free(table->index_of);
    table->index_of = index_of;
    table->mask = slots - 1;
    table->capacity = capacity;
    return 0;
}

static void
strtable_insert_slot(StringTable *table, uint32_t index)
{
    size_t i = (size_t)table->hashes[index] & table->mask;
    while (table->index_of[i] != 0) {
        i = (i + 1) & table->mask;
    }
    table->index_of[i] = index + 1;
}

/* Remove entry `index` from the hash index: linear-probing deletion, moving
 * later members of its cluster back so every lookup still finds them. */
static void
strtable_unlink(StringTable *table, uint32_t index)
{
    size_t hole = (size_t)table->hashes[index] & table->mask;
    while (table->index_of[hole] != index + 1) {
        hole = (hole + 1) & table->mask;
    }
    table->index_of[hole] = 0;
    size_t next = hole;
    for (;;) {
        next = (next + 1) & table->mask;
        uint32_t entry = table->index_of[next];
        if (entry == 0) {
            return;
        }
        size_t home = (size_t)table->hashes[entry - 1] & table->mask;
        /* Move it into the hole unless its home lies cyclically in (hole, next]. */
        int home_after_hole =
            hole <= next ? (home > hole && home <= next) : (home > hole || home <= next);
        if (!home_after_hole) {
            table->index_of[hole] = entry;
            table->index_of[next] = 0;
            hole = next;
        }
    }
}

/* Rebuild the hash index from the entries (after growth or rollback). */
static void
strtable_rehash(StringTable *table)
{
    memset(table->index_of, 0, (table->mask + 1) * sizeof(uint32_t));
    for (uint32_t index = 0; index < table->count; index++) {
        strtable_insert_slot(table, index);
    }
}

int
strtable_init(StringTable *table, Py_ssize_t encoded_capacity, const uint64_t hash_key[2])
{
    memset(table, 0, sizeof *table);
    table->hash_key[0] = hash_key[0];
    table->hash_key[1] = hash_key[1];
    if (outbuf_init_raw(&table->encoded, encoded_capacity) < 0) {
        return -1;
    }
    table->index_by_object = PyMem_Calloc(STRTABLE_OBJECT_SLOTS, sizeof(StrTableObjectSlot));
    if (table->index_by_object == NULL || strtable_alloc(table, STRTABLE_INITIAL_CAPACITY) < 0) {
        strtable_free(table);
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

static int
use_entry_bytes(unsigned char **bytes, uint32_t capacity)
{
    if (*bytes == NULL) {
        *bytes = PyMem_Calloc(capacity, 1);
        if (*bytes == NULL) {
            PyErr_NoMemory();
            return -1;
        }
    }
    return 0;
}

int
strtable_use_marks(StringTable *table)
{
    return use_entry_bytes(&table->marks, table->capacity);
}

int
strtable_use_lending(StringTable *table)
{
    return use_entry_bytes(&table->lent, table->capacity);
}

/* Drop the table's references to entries [from, to): those it lent are the
 * borrower's now, and only their flags are cleared. */
static void
strtable_release(StringTable *table, uint32_t from, uint32_t to)
{
    if (table->lent == NULL) {
        for (uint32_t i = from; i < to; i++) {
            Py_DECREF(table->strings[i]);
        }
        return;
    }
    for (uint32_t i = from; i < to; i++) {
        if (!table->lent[i]) {
            Py_DECREF(table->strings[i]);
        }
    }
    memset(table->lent + from, 0, to - from);
}

void
strtable_reclaim(StringTable *table)
{
    if (table->lent == NULL) {
        return;
    }
    for (uint32_t i = 0; i < table->count; i++) {
        if (table->lent[i]) {
            table->lent[i] = 0;
            Py_INCREF(table->strings[i]);
        }
    }
}

void
strtable_free(StringTable *table)
{
    strtable_release(table, 0, table->count);
    PyMem_Free(table->strings);
    PyMem_Free(table->hashes);
    PyMem_Free(table->marks);
    PyMem_Free(table->lent);
    PyMem_Free(table->index_of);
    PyMem_Free(table->index_by_object);
    if (table->encoded.start != NULL) {
        outbuf_free(&table->encoded);
    }
    memset(table, 0, sizeof *table);
}

/* strtable_add, inlined into strtable_insert (a call there costs as much
 * as a lookup). */
static SP_ALWAYS_INLINE int
strtable_add_inline(StringTable *table, PyObject *str, Py_hash_t hash, strtable_encode_fn encode,
                    void *arg, uint32_t *index, StringTable *lender, uint32_t lender_index)
{
    if (table->count == UINT32_MAX - 1) {
        PyErr_SetString(PyExc_ValueError, "string table is full");
        return -1;
    }
    Py_ssize_t encoded_before = outbuf_len(&table->encoded);
    if (encode != NULL && encode(arg, str, &table->encoded) < 0) {
        outbuf_truncate(&table->encoded, encoded_before);
        return -1;
    }
    if (table->count == table->capacity) {
        uint32_t grown = table->capacity <= UINT32_MAX / 2 ? table->capacity * 2 : UINT32_MAX;
        if (strtable_alloc(table, grown) < 0) {
            outbuf_truncate(&table->encoded, encoded_before);
            PyErr_NoMemory();
            return -1;
        }
        strtable_rehash(table);
    }
    unsigned char *lent =
        lender != NULL && lender->lent != NULL ? &lender->lent[lender_index] : NULL;
    (void)strtable_push(table, str, hash, lent, index); /* there is room now */
    return 0;
}

int
strtable_insert(StringTable *table, PyObject *str, Py_hash_t hash, strtable_encode_fn encode,
                void *arg, uint32_t *index)
{
    if (hash == -1) {
        hash = strtable_key_hash(table, str);
        if (strtable_find(table, str, hash, index)) {
            return 0;
        }
    }
    return strtable_add_inline(table, str, hash, encode, arg, index, NULL, 0);
}

int
strtable_add(StringTable *table, PyObject *str, Py_hash_t hash, strtable_encode_fn encode,
             void *arg, uint32_t *index)
{
    return strtable_add_inline(table, str, hash, encode, arg, index, NULL, 0);
}

int
strtable_add_from(StringTable *table, StringTable *local, uint32_t local_index,
                  strtable_encode_fn encode, void *arg, uint32_t *index)
{
    return strtable_add_inline(table, local->strings[local_index], local->hashes[local_index],
                               encode, arg, index, local, local_index);
}

void
strtable_rollback(StringTable *table, uint32_t count, Py_ssize_t encoded_len)
{
    if (count >= table->count) {
        return;
    }
    uint32_t old_count = table->count;
    table->count = count;
    outbuf_truncate(&table->encoded, encoded_len);
    if ((size_t)(old_count - count) * 64 > table->mask + 1) {
        /* Many entries for the size of the index go: rebuilding it (a memset
         * of its slots, and the entries kept inserted again) is cheaper. */
        strtable_rehash(table);
    }
    else {
        /* Few entries for the size of the index go (a failed trace, or a
         * small trace in a put() table kept large): unlink just those, so
         * they cost their own number, not the index's size. */
        for (uint32_t index = count; index < old_count; index++) {
            strtable_unlink(table, index);
        }
    }
    strtable_release(table, count, old_count);
    if (table->marks != NULL) {
        /* The next strings to take these indexes start unmarked. */
        memset(table->marks + count, 0, old_count - count);
    }
}

/* ---- v0.5 string references not yet written ---- */

int
holes_grow(HoleList *holes)
{
    Py_ssize_t capacity = holes->capacity ? holes->capacity * 2 : 64;
    StringHole *items = PyMem_Realloc(holes->items, (size_t)capacity * sizeof(StringHole));
    if (items == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    holes->items = items;
    holes->capacity = capacity;
    return 0;
}

void
holes_free(HoleList *holes)
{
    PyMem_Free(holes->items);
    holes->items = NULL;
    holes->count = holes->capacity = 0;
}
