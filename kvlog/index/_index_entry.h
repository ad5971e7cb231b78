/*
 * kvlog's index entries and index runs as bytes, shared by the key index's C extensions
 * (kvlog/index/_runs.c reads and writes them; kvlog/index/_cache_check.c checks them in a
 * whole cache file). kvlog.index.entry and kvlog.index.runs document the layouts.
 *
 * An index value is the CRC32C (big-endian u32) of the LMDB key followed by everything after
 * the CRC, then partition (u16), offset (u64) and flags (u8), big-endian; then the expiry time
 * (i64 ms since the epoch, FLAG_EXPIRES); then the long key's length (u32) and bytes
 * (FLAG_LONG); then the inline value (FLAG_INLINE). Words are read
 * little-endian: the extensions refuse to import on a big-endian host.
 */
#ifndef KVLOG_INDEX_ENTRY_H
#define KVLOG_INDEX_ENTRY_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "../_crc32c.h"

#define RUN_MAGIC 0x3252564bu /* "KVR2" */
#define HEAD_BYTES 15         /* crc (u32), partition (u16), offset (u64), flags (u8): big-endian */
#define FLAG_INLINE 1
#define FLAG_LONG 2
#define FLAG_EXPIRES 4
#define EXPIRES_BYTES 8
#define DELETION_BYTES 4      /* a run's deletion: the CRC32C of its key */
#define MAX_DIRECT_KEY 480

static inline uint32_t load_u32(const void *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

static inline uint32_t load_be32(const uint8_t *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

static inline void store_be32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

/* An index value taken apart: the user key (the LMDB key, or the long key stored in the value)
 * and the inline value (NULL when the value is in a data file). */
typedef struct {
    uint16_t partition;
    uint64_t offset;
    uint8_t flags;
    int64_t expires; /* FLAG_EXPIRES: the expiry time, ms since the epoch */
    const char *key;
    size_t key_len;
    const char *inline_value;
    size_t inline_len;
} Entry;

/* Check value (n bytes) against its LMDB key and take it apart; -1 if it is malformed or its
 * CRC32C (over the LMDB key, then the value after the CRC) does not match. */
static inline int entry_open(const char *lmdb_key, size_t key_len, const uint8_t *value, size_t n, Entry *e) {
    if (n < HEAD_BYTES) {
        return -1;
    }
    uint8_t flags = value[14];
    if (flags & ~(FLAG_INLINE | FLAG_LONG | FLAG_EXPIRES)) {
        return -1;
    }
    size_t pos = HEAD_BYTES;
    e->key = lmdb_key;
    e->key_len = key_len;
    e->expires = 0;
    if (flags & FLAG_EXPIRES) {
        if (n - pos < EXPIRES_BYTES) {
            return -1;
        }
        uint64_t when = 0;
        for (int b = 0; b < EXPIRES_BYTES; b++) {
            when = (when << 8) | value[pos + b];
        }
        e->expires = (int64_t)when;
        pos += EXPIRES_BYTES;
    }
    if (flags & FLAG_LONG) {
        if (n - pos < 4) {
            return -1;
        }
        uint32_t long_len = load_be32(value + pos);
        pos += 4;
        if (long_len > n - pos) {
            return -1;
        }
        e->key = (const char *)value + pos;
        e->key_len = long_len;
        pos += long_len;
    }
    if (flags & FLAG_INLINE) {
        e->inline_value = (const char *)value + pos;
        e->inline_len = n - pos;
    } else {
        if (pos != n) {
            return -1;
        }
        e->inline_value = NULL;
        e->inline_len = 0;
    }
    uint32_t crc = crc32c_extend(crc32c_extend(0, lmdb_key, key_len), value + 4, n - 4);
    if (crc != load_be32(value)) {
        return -1;
    }
    e->partition = (uint16_t)((value[4] << 8) | value[5]);
    e->offset = 0;
    for (int b = 0; b < 8; b++) {
        e->offset = (e->offset << 8) | value[6 + b];
    }
    e->flags = flags;
    return 0;
}

/* Write an expiry time at p, big-endian (after the head of an index value with FLAG_EXPIRES). */
static inline void store_expires(uint8_t *p, int64_t expires) {
    uint64_t when = (uint64_t)expires;
    for (int b = 0; b < EXPIRES_BYTES; b++) {
        p[b] = (uint8_t)(when >> (56 - 8 * b));
    }
}

/* Write the head of an index value (the CRC over lmdb_key and what follows the CRC, which the
 * caller has already written: rest_len bytes after the head). */
static inline void entry_seal(uint8_t *value, uint16_t partition, uint64_t offset, uint8_t flags,
                              const char *lmdb_key, size_t key_len, size_t rest_len) {
    value[4] = (uint8_t)(partition >> 8);
    value[5] = (uint8_t)partition;
    for (int b = 0; b < 8; b++) {
        value[6 + b] = (uint8_t)(offset >> (56 - 8 * b));
    }
    value[14] = flags;
    uint32_t crc = crc32c_extend(crc32c_extend(0, lmdb_key, key_len), value + 4, HEAD_BYTES - 4 + rest_len);
    store_be32(value, crc);
}

#endif
