/*
 * CRC32C (Castagnoli, reflected polynomial 0x82F63B78) for kvlog's C extensions: the checksum
 * of every key-index entry. It gives the values of kvlog.format.checksum.crc32c (the crc32c
 * package), including its continuation: crc32c_extend(crc32c_extend(0, a), b) is the CRC of a
 * followed by b.
 *
 * Table-driven (slicing by 8, about 1.5 GB/s) everywhere; on x86-64 CPUs with SSE 4.2 the
 * CPU's crc32 instruction instead (several times faster: a get checks up to
 * inline_value_bytes of inline value). Each extension that includes this header calls
 * crc32c_init() once, when it is imported. Words are read little-endian: the extensions refuse
 * to import on a big-endian host.
 */
#ifndef KVLOG_CRC32C_H
#define KVLOG_CRC32C_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

static uint32_t crc32c_table[8][256];

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define CRC32C_HARDWARE 1
static int crc32c_hardware; /* the CPU has SSE 4.2's crc32 */

__attribute__((target("sse4.2"))) static uint32_t crc32c_sse42(uint32_t crc, const uint8_t *p, size_t n) {
    uint64_t c = (uint32_t)~crc;
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        c = __builtin_ia32_crc32di(c, w);
        p += 8;
        n -= 8;
    }
    uint32_t c32 = (uint32_t)c;
    while (n--) {
        c32 = __builtin_ia32_crc32qi(c32, *p++);
    }
    return ~c32;
}
#endif

static void crc32c_init(void) {
#ifdef CRC32C_HARDWARE
    __builtin_cpu_init();
    crc32c_hardware = __builtin_cpu_supports("sse4.2");
#endif
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = n;
        for (int k = 0; k < 8; k++) {
            c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
        }
        crc32c_table[0][n] = c;
    }
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = crc32c_table[0][n];
        for (int t = 1; t < 8; t++) {
            c = crc32c_table[0][c & 0xff] ^ (c >> 8);
            crc32c_table[t][n] = c;
        }
    }
}

/* The CRC32C of data[0..n) continuing from crc (0 to start), by the tables alone. */
static inline uint32_t crc32c_portable(uint32_t crc, const void *data, size_t n) {
    const uint8_t *p = (const uint8_t *)data;
    uint32_t c = ~crc;
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        w ^= c;
        c = crc32c_table[7][w & 0xff] ^ crc32c_table[6][(w >> 8) & 0xff]
            ^ crc32c_table[5][(w >> 16) & 0xff] ^ crc32c_table[4][(w >> 24) & 0xff]
            ^ crc32c_table[3][(w >> 32) & 0xff] ^ crc32c_table[2][(w >> 40) & 0xff]
            ^ crc32c_table[1][(w >> 48) & 0xff] ^ crc32c_table[0][w >> 56];
        p += 8;
        n -= 8;
    }
    while (n--) {
        c = crc32c_table[0][(c ^ *p++) & 0xff] ^ (c >> 8);
    }
    return ~c;
}

/* The CRC32C of data[0..n) continuing from crc (0 to start). */
static inline uint32_t crc32c_extend(uint32_t crc, const void *data, size_t n) {
#ifdef CRC32C_HARDWARE
    if (crc32c_hardware) {
        return crc32c_sse42(crc, (const uint8_t *)data, n);
    }
#endif
    return crc32c_portable(crc, data, n);
}

#endif
