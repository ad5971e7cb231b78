/*
 * kvlog's key order, shared by its C extensions: memcmp order, a prefix first. It is LMDB's
 * default key order and Python's bytes order.
 */
#ifndef KVLOG_KEY_ORDER_H
#define KVLOG_KEY_ORDER_H

#include <stddef.h>
#include <string.h>

/* < 0, 0 or > 0 as key a (an bytes) sorts before, with or after key b (bn bytes). */
static inline int key_order(const char *a, size_t an, const char *b, size_t bn) {
    int c = memcmp(a, b, an < bn ? an : bn);
    if (c) {
        return c;
    }
    return an < bn ? -1 : (an > bn ? 1 : 0);
}

#endif
