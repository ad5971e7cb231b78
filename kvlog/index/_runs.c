/*
 * The key index's compiled parts (see kvlog.index.runs and kvlog.index.entry, which wrap these
 * functions and document the layouts):
 *
 * - index runs: build packs rows of two Arrow binary columns into a run; find and find_first
 *   look one key up by binary search; entries lists the (key, value) pairs of a key range. A
 *   run is read in place (an LMDB value in the map), so these copy only what they return.
 * - index values: decode, inline and inline_prefix check an entry's CRC32C and take it apart.
 * - check_lmdb: a check of an LMDB data file's structure and of every key-index entry in it,
 *   run before LMDB itself reads a cache that may have been damaged (LMDB trusts its pages and
 *   may crash on garbage; a damaged key would hide its entry from lookups).
 *
 * Nothing here trusts its input: every offset read from a run, an index value or an LMDB page
 * is checked against the buffer before it is followed, and damage raises ValueError. A lookup
 * checks only the entries its binary search visits (O(log n)), never the whole run.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "../_crc32c.h"
#include "../_key_order.h"

#define RUN_MAGIC 0x3252564bu /* "KVR2" */
#define HEAD_BYTES 15         /* crc (u32), partition (u16), offset (u64), flags (u8): big-endian */
#define FLAG_INLINE 1
#define FLAG_LONG 2
#define DELETION_BYTES 4      /* a run's deletion: the CRC32C of its key */
#define MAX_DIRECT_KEY 480

static const char BAD_RUN[] = "not an index run";
static const char BAD_ENTRY[] = "an index entry is malformed or fails its checksum";

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

/* ---- index values ------------------------------------------------------------------------- */

/* An index value taken apart: the user key (the LMDB key, or the long key stored in the value)
 * and the inline value (NULL when the value is in a data file). */
typedef struct {
    uint16_t partition;
    uint64_t offset;
    uint8_t flags;
    const char *key;
    size_t key_len;
    const char *inline_value;
    size_t inline_len;
} Entry;

/* Check value (n bytes) against its LMDB key and take it apart; -1 if it is malformed or its
 * CRC32C (over the LMDB key, then the value after the CRC) does not match. */
static int entry_open(const char *lmdb_key, size_t key_len, const uint8_t *value, size_t n, Entry *e) {
    if (n < HEAD_BYTES) {
        return -1;
    }
    uint8_t flags = value[14];
    if (flags & ~(FLAG_INLINE | FLAG_LONG)) {
        return -1;
    }
    size_t pos = HEAD_BYTES;
    e->key = lmdb_key;
    e->key_len = key_len;
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

/* Write the head of an index value (the CRC over lmdb_key and what follows the CRC, which the
 * caller has already written: rest_len bytes after the head). */
static void entry_seal(uint8_t *value, uint16_t partition, uint64_t offset, uint8_t flags,
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

static int get_buffer(PyObject *obj, Py_buffer *view) {
    return PyObject_GetBuffer(obj, view, PyBUF_SIMPLE);
}

/* decode(lmdb_key, value) -> (key, partition, offset, inline value or None) */
static PyObject *decode(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "decode() takes an LMDB key and an index value");
        return NULL;
    }
    Py_buffer key, value;
    if (get_buffer(args[0], &key) < 0) {
        return NULL;
    }
    if (get_buffer(args[1], &value) < 0) {
        PyBuffer_Release(&key);
        return NULL;
    }
    PyObject *result = NULL;
    Entry e;
    if (entry_open(key.buf, (size_t)key.len, value.buf, (size_t)value.len, &e) < 0) {
        PyErr_SetString(PyExc_ValueError, BAD_ENTRY);
    } else if (e.inline_value != NULL) {
        result = Py_BuildValue("(y#HKy#)", e.key, (Py_ssize_t)e.key_len, e.partition,
                               (unsigned long long)e.offset, e.inline_value, (Py_ssize_t)e.inline_len);
    } else {
        result = Py_BuildValue("(y#HKO)", e.key, (Py_ssize_t)e.key_len, e.partition,
                               (unsigned long long)e.offset, Py_None);
    }
    PyBuffer_Release(&key);
    PyBuffer_Release(&value);
    return result;
}

/* inline(lmdb_key, value) -> the inline value, or None when the value is in a data file */
static PyObject *inline_of(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "inline() takes an LMDB key and an index value");
        return NULL;
    }
    if (PyBytes_CheckExact(args[0]) && PyBytes_CheckExact(args[1])) { /* the get fast path */
        Entry e;
        if (entry_open(PyBytes_AS_STRING(args[0]), (size_t)PyBytes_GET_SIZE(args[0]),
                       (const uint8_t *)PyBytes_AS_STRING(args[1]), (size_t)PyBytes_GET_SIZE(args[1]), &e) < 0) {
            PyErr_SetString(PyExc_ValueError, BAD_ENTRY);
            return NULL;
        }
        if (e.inline_value == NULL) {
            Py_RETURN_NONE;
        }
        return PyBytes_FromStringAndSize(e.inline_value, (Py_ssize_t)e.inline_len);
    }
    Py_buffer key, value;
    if (get_buffer(args[0], &key) < 0) {
        return NULL;
    }
    if (get_buffer(args[1], &value) < 0) {
        PyBuffer_Release(&key);
        return NULL;
    }
    PyObject *result = NULL;
    Entry e;
    if (entry_open(key.buf, (size_t)key.len, value.buf, (size_t)value.len, &e) < 0) {
        PyErr_SetString(PyExc_ValueError, BAD_ENTRY);
    } else if (e.inline_value == NULL) {
        result = Py_NewRef(Py_None);
    } else {
        result = PyBytes_FromStringAndSize(e.inline_value, (Py_ssize_t)e.inline_len);
    }
    PyBuffer_Release(&key);
    PyBuffer_Release(&value);
    return result;
}

/* inline_prefix(pairs: list of (lmdb_key, value)) -> [(key, inline value)] of the leading
 * entries that are short keys with inline values (shorter than pairs: pairs[len] is not one) */
static PyObject *inline_prefix(PyObject *self, PyObject *arg) {
    if (!PyList_Check(arg)) {
        PyErr_SetString(PyExc_TypeError, "inline_prefix() takes a list of (key, value) pairs");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(arg);
    PyObject *out = PyList_New(0);
    for (Py_ssize_t i = 0; out != NULL && i < n; i++) {
        PyObject *pair = PyList_GET_ITEM(arg, i);
        if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2 || !PyBytes_Check(PyTuple_GET_ITEM(pair, 0))
            || !PyBytes_Check(PyTuple_GET_ITEM(pair, 1))) {
            PyErr_SetString(PyExc_TypeError, "inline_prefix() takes (bytes, bytes) pairs");
            Py_CLEAR(out);
            break;
        }
        PyObject *key = PyTuple_GET_ITEM(pair, 0), *value = PyTuple_GET_ITEM(pair, 1);
        Entry e;
        if (entry_open(PyBytes_AS_STRING(key), (size_t)PyBytes_GET_SIZE(key),
                       (const uint8_t *)PyBytes_AS_STRING(value), (size_t)PyBytes_GET_SIZE(value), &e) < 0) {
            PyErr_SetString(PyExc_ValueError, BAD_ENTRY);
            Py_CLEAR(out);
            break;
        }
        if (e.inline_value == NULL || (e.flags & FLAG_LONG)) {
            break;
        }
        PyObject *item = Py_BuildValue("(Oy#)", key, e.inline_value, (Py_ssize_t)e.inline_len);
        if (item == NULL || PyList_Append(out, item) < 0) {
            Py_XDECREF(item);
            Py_CLEAR(out);
            break;
        }
        Py_DECREF(item);
    }
    return out;
}

/* ---- index runs --------------------------------------------------------------------------- */

typedef struct {
    uint32_t count;
    const char *key_end;   /* u32[count], read unaligned (a run is an LMDB value anywhere in a page) */
    const char *value_end; /* u32[count] */
    const char *keys;
    const char *values;
    uint32_t key_bytes;
    uint32_t value_bytes;
} Run;

/* Check a run's header and that its tables and data fill the buffer exactly; sets ValueError
 * and returns -1 if it is not one. The tables' other entries are checked where they are read. */
static int run_open(const Py_buffer *buf, Run *run) {
    const char *base = (const char *)buf->buf;
    if (buf->len < 8 || load_u32(base) != RUN_MAGIC) {
        goto bad;
    }
    uint64_t count = load_u32(base + 4);
    uint64_t tables = 8 + 8 * count;
    if (tables > (uint64_t)buf->len) {
        goto bad;
    }
    run->count = (uint32_t)count;
    run->key_end = base + 8;
    run->value_end = run->key_end + 4 * count;
    run->keys = base + tables;
    run->key_bytes = count ? load_u32(run->key_end + 4 * (count - 1)) : 0;
    run->value_bytes = count ? load_u32(run->value_end + 4 * (count - 1)) : 0;
    if (tables + run->key_bytes + run->value_bytes != (uint64_t)buf->len) {
        goto bad;
    }
    run->values = run->keys + run->key_bytes;
    return 0;
bad:
    PyErr_SetString(PyExc_ValueError, BAD_RUN);
    return -1;
}

/* Entry i's span [*start, *stop) of a table of ends within total bytes; sets ValueError and
 * returns -1 if the table is damaged there. */
static int span_of(const char *ends, uint32_t i, uint32_t total, uint32_t *start, uint32_t *stop) {
    uint32_t a = i ? load_u32(ends + 4 * (i - 1)) : 0, b = load_u32(ends + 4 * i);
    if (a > b || b > total) {
        PyErr_SetString(PyExc_ValueError, BAD_RUN);
        return -1;
    }
    *start = a;
    *stop = b;
    return 0;
}

/* The first entry whose key is >= key (run->count if none) into *at; -1 (ValueError) for a
 * damaged run. Keys that do not strictly increase along the search path are damage too. */
static int lower_bound(const Run *run, const char *key, size_t n, uint32_t *at) {
    uint32_t lo = 0, hi = run->count;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2, s, e;
        if (span_of(run->key_end, mid, run->key_bytes, &s, &e) < 0) {
            return -1;
        }
        if (key_order(run->keys + s, e - s, key, n) < 0) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    *at = lo;
    return 0;
}

/* Entry i of an open run as new references to its key and its checked value (b"" for a
 * deletion); -1 (ValueError) if it is damaged. */
static int run_entry(const Run *run, uint32_t i, PyObject **key_out, PyObject **value_out) {
    uint32_t ks, ke, vs, ve;
    if (span_of(run->key_end, i, run->key_bytes, &ks, &ke) < 0
        || span_of(run->value_end, i, run->value_bytes, &vs, &ve) < 0) {
        return -1;
    }
    const char *key = run->keys + ks;
    const uint8_t *value = (const uint8_t *)run->values + vs;
    size_t klen = ke - ks, vlen = ve - vs;
    if (klen == 0 || klen > MAX_DIRECT_KEY) {
        PyErr_SetString(PyExc_ValueError, BAD_RUN);
        return -1;
    }
    if (vlen == DELETION_BYTES) {
        if (crc32c_extend(0, key, klen) != load_be32(value)) {
            PyErr_SetString(PyExc_ValueError, BAD_ENTRY);
            return -1;
        }
        vlen = 0;
    } else {
        Entry e;
        if (entry_open(key, klen, value, vlen, &e) < 0 || (e.flags & FLAG_LONG)) {
            PyErr_SetString(PyExc_ValueError, BAD_ENTRY);
            return -1;
        }
    }
    if (key_out != NULL) {
        *key_out = PyBytes_FromStringAndSize(key, (Py_ssize_t)klen);
        if (*key_out == NULL) {
            return -1;
        }
    }
    *value_out = PyBytes_FromStringAndSize((const char *)value, (Py_ssize_t)vlen);
    if (*value_out == NULL) {
        if (key_out != NULL) {
            Py_CLEAR(*key_out);
        }
        return -1;
    }
    return 0;
}

/* The checked value of key's entry in an open run (b"": a deletion), Py_None (a new reference)
 * if absent, NULL with ValueError if the run is damaged. */
static PyObject *lookup(const Run *run, const char *key, size_t n) {
    uint32_t i, s, e;
    if (lower_bound(run, key, n, &i) < 0) {
        return NULL;
    }
    if (i < run->count) {
        if (span_of(run->key_end, i, run->key_bytes, &s, &e) < 0) {
            return NULL;
        }
        if (key_order(run->keys + s, e - s, key, n) == 0) {
            PyObject *value;
            return run_entry(run, i, NULL, &value) < 0 ? NULL : value;
        }
    }
    return Py_NewRef(Py_None);
}

static int row_in_bounds(const int32_t *ends, int64_t row, Py_ssize_t size) {
    return ends[row] >= 0 && ends[row + 1] >= ends[row] && ends[row + 1] <= size;
}

/* build(key_ends, key_data, value_ends, value_data, rows, partitions, positions, live, inline_limit)
 *   -> bytes */
static PyObject *build(PyObject *self, PyObject *args) {
    Py_buffer key_ends, key_data, value_ends, value_data, rows, partitions, positions, live;
    Py_ssize_t inline_limit;
    if (!PyArg_ParseTuple(args, "y*y*y*y*y*y*y*y*n", &key_ends, &key_data, &value_ends, &value_data,
                          &rows, &partitions, &positions, &live, &inline_limit)) {
        return NULL;
    }
    PyObject *result = NULL;
    Py_ssize_t records = key_ends.len / 4 - 1;
    Py_ssize_t n = rows.len / 8;
    const int32_t *kend = (const int32_t *)key_ends.buf, *vend = (const int32_t *)value_ends.buf;
    const int64_t *row = (const int64_t *)rows.buf, *offset = (const int64_t *)positions.buf;
    const uint16_t *partition = (const uint16_t *)partitions.buf;
    const uint8_t *alive = (const uint8_t *)live.buf;
    const char *kdata = (const char *)key_data.buf, *vdata = (const char *)value_data.buf;
    if (records < 0 || key_ends.len % 4 || value_ends.len % 4 || rows.len % 8
        || value_ends.len / 4 - 1 != records || positions.len != 8 * n || partitions.len != 2 * n
        || live.len != n) {
        PyErr_SetString(PyExc_ValueError, "build: buffers of different lengths");
        goto done;
    }
    uint64_t key_bytes = 0, value_bytes = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t r = row[i];
        if (r < 0 || r >= records || !row_in_bounds(kend, r, key_data.len)
            || !row_in_bounds(vend, r, value_data.len)) {
            PyErr_SetString(PyExc_ValueError, "build: a row outside the columns");
            goto done;
        }
        size_t klen = (size_t)(kend[r + 1] - kend[r]);
        if (klen == 0 || klen > MAX_DIRECT_KEY) {
            PyErr_SetString(PyExc_ValueError, "build: an empty key or a key longer than 480 bytes");
            goto done;
        }
        if (i > 0) {
            int64_t q = row[i - 1];
            if (key_order(kdata + kend[q], (size_t)(kend[q + 1] - kend[q]), kdata + kend[r], klen) >= 0) {
                PyErr_SetString(PyExc_ValueError, "build: keys not in strictly increasing order");
                goto done;
            }
        }
        key_bytes += klen;
        if (alive[i]) {
            Py_ssize_t vlen = vend[r + 1] - vend[r];
            value_bytes += HEAD_BYTES + (vlen <= inline_limit ? (uint64_t)vlen : 0);
        } else {
            value_bytes += DELETION_BYTES;
        }
    }
    uint64_t total = 8 + 8 * (uint64_t)n + key_bytes + value_bytes;
    if (key_bytes > UINT32_MAX || value_bytes > UINT32_MAX || (uint64_t)n > UINT32_MAX
        || total > PY_SSIZE_T_MAX) {
        PyErr_SetString(PyExc_OverflowError, "build: a run holds at most 4 GiB of keys and of values");
        goto done;
    }
    PyObject *out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)total);
    if (out == NULL) {
        goto done;
    }
    char *base = PyBytes_AS_STRING(out);
    uint32_t head[2] = {RUN_MAGIC, (uint32_t)n};
    memcpy(base, head, 8);
    Py_BEGIN_ALLOW_THREADS
    char *key_end = base + 8, *value_end = key_end + 4 * n;
    char *keys = base + 8 + 8 * n, *values = keys + key_bytes;
    uint32_t kpos = 0, vpos = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t r = row[i];
        uint32_t klen = (uint32_t)(kend[r + 1] - kend[r]);
        const char *key = keys + kpos;
        memcpy(keys + kpos, kdata + kend[r], klen);
        kpos += klen;
        memcpy(key_end + 4 * i, &kpos, 4);
        uint8_t *v = (uint8_t *)values + vpos;
        if (alive[i]) {
            Py_ssize_t vlen = vend[r + 1] - vend[r];
            int inline_value = vlen <= inline_limit;
            size_t rest = inline_value ? (size_t)vlen : 0;
            if (inline_value) {
                memcpy(v + HEAD_BYTES, vdata + vend[r], rest);
            }
            entry_seal(v, partition[i], (uint64_t)offset[i], (uint8_t)(inline_value ? FLAG_INLINE : 0),
                       key, klen, rest);
            vpos += (uint32_t)(HEAD_BYTES + rest);
        } else {
            store_be32(v, crc32c_extend(0, key, klen));
            vpos += DELETION_BYTES;
        }
        memcpy(value_end + 4 * i, &vpos, 4);
    }
    Py_END_ALLOW_THREADS
    result = out;
done:
    PyBuffer_Release(&key_ends);
    PyBuffer_Release(&key_data);
    PyBuffer_Release(&value_ends);
    PyBuffer_Release(&value_data);
    PyBuffer_Release(&rows);
    PyBuffer_Release(&partitions);
    PyBuffer_Release(&positions);
    PyBuffer_Release(&live);
    return result;
}

/* find(run, key) -> the entry's value (b"": a deletion), or None when the run has no entry. */
static PyObject *find(PyObject *self, PyObject *args) {
    Py_buffer buf, key;
    if (!PyArg_ParseTuple(args, "y*y*", &buf, &key)) {
        return NULL;
    }
    PyObject *result = NULL;
    Run run;
    if (run_open(&buf, &run) == 0) {
        result = lookup(&run, (const char *)key.buf, (size_t)key.len);
    }
    PyBuffer_Release(&buf);
    PyBuffer_Release(&key);
    return result;
}

/* find_first(runs: list, key) -> the entry of the first run (in list order) holding key, or None. */
static PyObject *find_first(PyObject *self, PyObject *args) {
    PyObject *runs;
    Py_buffer key;
    if (!PyArg_ParseTuple(args, "O!y*", &PyList_Type, &runs, &key)) {
        return NULL;
    }
    PyObject *result = Py_NewRef(Py_None);
    for (Py_ssize_t r = 0; r < PyList_GET_SIZE(runs) && result == Py_None; r++) {
        PyObject *item = Py_NewRef(PyList_GET_ITEM(runs, r));
        Py_buffer buf;
        if (PyObject_GetBuffer(item, &buf, PyBUF_SIMPLE) < 0) {
            Py_DECREF(item);
            Py_CLEAR(result);
            break;
        }
        Run run;
        if (run_open(&buf, &run) < 0) {
            Py_CLEAR(result);
        } else {
            Py_DECREF(result);
            result = lookup(&run, (const char *)key.buf, (size_t)key.len);
        }
        PyBuffer_Release(&buf);
        Py_DECREF(item);
    }
    PyBuffer_Release(&key);
    return result;
}

/* entries(run, lower, upper, limit, reverse) -> [(key, value)] with lower <= key < upper (None:
 * unbounded): at most limit (< 0: all) of them from the low end, or from the high end in
 * descending order when reverse. Each entry is checked; keys must strictly increase. */
static PyObject *entries(PyObject *self, PyObject *args) {
    Py_buffer buf, lower = {0}, upper = {0};
    Py_ssize_t limit;
    int reverse;
    if (!PyArg_ParseTuple(args, "y*z*z*np", &buf, &lower, &upper, &limit, &reverse)) {
        return NULL;
    }
    PyObject *result = NULL;
    Run run;
    uint32_t first = 0, stop = 0;
    if (run_open(&buf, &run) < 0) {
        goto done;
    }
    if (lower.buf != NULL && lower_bound(&run, lower.buf, (size_t)lower.len, &first) < 0) {
        goto done;
    }
    stop = run.count;
    if (upper.buf != NULL && lower_bound(&run, upper.buf, (size_t)upper.len, &stop) < 0) {
        goto done;
    }
    if (stop < first) {
        stop = first;
    }
    uint32_t n = stop - first;
    if (limit >= 0 && (Py_ssize_t)n > limit) {
        n = (uint32_t)limit;
    }
    PyObject *list = PyList_New(n);
    PyObject *previous = NULL; /* the key before, in the order listed (borrowed from list) */
    for (uint32_t j = 0; list != NULL && j < n; j++) {
        uint32_t i = reverse ? stop - 1 - j : first + j;
        PyObject *key, *value;
        if (run_entry(&run, i, &key, &value) < 0) {
            Py_CLEAR(list);
            break;
        }
        if (previous != NULL) {
            int order = key_order(PyBytes_AS_STRING(previous), (size_t)PyBytes_GET_SIZE(previous),
                                  PyBytes_AS_STRING(key), (size_t)PyBytes_GET_SIZE(key));
            if (reverse ? order <= 0 : order >= 0) {
                PyErr_SetString(PyExc_ValueError, BAD_RUN);
                Py_DECREF(key);
                Py_DECREF(value);
                Py_CLEAR(list);
                break;
            }
        }
        PyObject *pair = PyTuple_New(2);
        if (pair == NULL) {
            Py_DECREF(key);
            Py_DECREF(value);
            Py_CLEAR(list);
            break;
        }
        PyTuple_SET_ITEM(pair, 0, key);
        PyTuple_SET_ITEM(pair, 1, value);
        PyList_SET_ITEM(list, j, pair);
        previous = key;
    }
    result = list;
done:
    PyBuffer_Release(&buf);
    PyBuffer_Release(&lower);
    PyBuffer_Release(&upper);
    return result;
}

/* ---- LMDB data files ---------------------------------------------------------------------- */

/* LMDB 0.9's on-disk layout (lmdb's mdb.c), 64-bit little-endian: pages of psize bytes, each
 * with a 16-byte header (pgno u64, pad u16, flags u16, lower u16 and upper u16, or the number
 * of pages u32 of an overflow page); two meta pages first; B-trees of branch and leaf pages
 * whose nodes are (lo u16, hi u16, flags u16, ksize u16, key, data). */
#define MDB_MAGIC 0xBEEFC0DEu
#define MDB_DATA_VERSION 1
#define P_BRANCH 0x01
#define P_LEAF 0x02
#define P_OVERFLOW 0x04
#define P_META 0x08
#define F_BIGDATA 0x01
#define F_SUBDATA 0x02
#define F_DUPDATA 0x04
#define MDB_DUPSORT 0x04
#define MDB_PERSISTENT_FLAGS 0x7e
#define PAGEHDRSZ 16
#define NODESIZE 8
#define DB_BYTES 48
#define MAX_DEPTH 32
#define NO_PAGE (~(uint64_t)0)

/* What the values of a database are: LMDB's own data, kvlog's index entries, index runs, or
 * sealed values (a big-endian CRC32C of the key and the rest, then the rest), all checked
 * whole: a damaged key would move an entry where no lookup finds it. */
enum { KIND_PLAIN, KIND_FREE, KIND_INDEX, KIND_RUNS, KIND_SEALED };
#define MAX_SEALED 16

typedef struct {
    const uint8_t *map;
    uint64_t psize;
    uint64_t pages; /* the last used page + 1 */
    uint8_t *seen;  /* a bit per page: reached once already */
    const char *why;
    const char *index_name; /* the named databases of kind KIND_INDEX and KIND_RUNS */
    size_t index_name_len;
    const char *runs_name;
    size_t runs_name_len;
    Py_ssize_t sealed_count;
    const char *sealed_name[MAX_SEALED];
    size_t sealed_len[MAX_SEALED];
} Walk;

static inline uint16_t u16_at(const uint8_t *p) {
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}

static inline uint64_t u64_at(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

static int fail(Walk *w, const char *why) {
    w->why = why;
    return -1;
}

/* Whether run (n bytes) is a whole index run: tables in bounds, keys strictly increasing,
 * every entry passing its checksum. No Python calls: it runs without the GIL. */
static int run_whole(const uint8_t *run, uint64_t n) {
    if (n < 8 || load_u32(run) != RUN_MAGIC) {
        return 0;
    }
    uint64_t count = load_u32(run + 4), tables = 8 + 8 * count;
    if (tables > n) {
        return 0;
    }
    const char *key_end = (const char *)run + 8, *value_end = key_end + 4 * count;
    uint64_t key_bytes = count ? load_u32(key_end + 4 * (count - 1)) : 0;
    uint64_t value_bytes = count ? load_u32(value_end + 4 * (count - 1)) : 0;
    if (tables + key_bytes + value_bytes != n) {
        return 0;
    }
    const char *keys = (const char *)run + tables, *values = keys + key_bytes;
    uint32_t ks = 0, vs = 0, previous = 0, previous_len = 0;
    for (uint64_t i = 0; i < count; i++) {
        uint32_t ke = load_u32(key_end + 4 * i), ve = load_u32(value_end + 4 * i);
        if (ke < ks || ke > key_bytes || ve < vs || ve > value_bytes) {
            return 0;
        }
        uint32_t klen = ke - ks, vlen = ve - vs;
        if (klen == 0 || klen > MAX_DIRECT_KEY
            || (i && key_order(keys + previous, previous_len, keys + ks, klen) >= 0)) {
            return 0;
        }
        const uint8_t *value = (const uint8_t *)values + vs;
        if (vlen == DELETION_BYTES) {
            if (crc32c_extend(0, keys + ks, klen) != load_be32(value)) {
                return 0;
            }
        } else {
            Entry e;
            if (entry_open(keys + ks, klen, value, vlen, &e) < 0 || (e.flags & FLAG_LONG)) {
                return 0;
            }
        }
        previous = ks;
        previous_len = klen;
        ks = ke;
        vs = ve;
    }
    return 1;
}

/* Claim pages [pgno, pgno + count) for one use: in range, and not reached before. */
static int claim(Walk *w, uint64_t pgno, uint64_t count) {
    if (pgno < 2 || count == 0 || pgno >= w->pages || count > w->pages - pgno) {
        return fail(w, "a page number outside the file");
    }
    for (uint64_t p = pgno; p < pgno + count; p++) {
        if (w->seen[p >> 3] & (1u << (p & 7))) {
            return fail(w, "a page reached twice");
        }
        w->seen[p >> 3] |= (uint8_t)(1u << (p & 7));
    }
    return 0;
}

static int walk_db(Walk *w, const uint8_t *db, int kind, int depth_left);

/* The data of a leaf node (inline or on overflow pages, claimed) into *data, *size. */
static int node_data(Walk *w, const uint8_t *page, uint32_t at, const uint8_t **data, uint64_t *size) {
    const uint8_t *node = page + at;
    uint64_t dsize = (uint64_t)u16_at(node) | ((uint64_t)u16_at(node + 2) << 16);
    uint16_t ksize = u16_at(node + 6);
    uint64_t start = (uint64_t)at + NODESIZE + ksize;
    if (u16_at(node + 4) & F_BIGDATA) {
        if (start + 8 > w->psize) {
            return fail(w, "a node outside its page");
        }
        uint64_t pgno = u64_at(page + start);
        uint64_t count = (PAGEHDRSZ - 1 + dsize) / w->psize + 1;
        if (pgno < 2 || pgno >= w->pages) {
            return fail(w, "an overflow page outside the file");
        }
        const uint8_t *first = w->map + pgno * w->psize;
        uint32_t held;
        memcpy(&held, first + 12, 4);
        if (u64_at(first) != pgno || u16_at(first + 10) != P_OVERFLOW || held < count) {
            return fail(w, "a damaged overflow page");
        }
        if (claim(w, pgno, held) < 0) {
            return -1;
        }
        *data = first + PAGEHDRSZ;
    } else {
        if (start + dsize > w->psize) {
            return fail(w, "a node outside its page");
        }
        *data = page + start;
    }
    *size = dsize;
    return 0;
}

/* The kind of the named database called key (a node of the main database). */
static int kind_of(const Walk *w, const uint8_t *key, size_t n) {
    if (n == w->index_name_len && memcmp(key, w->index_name, n) == 0) {
        return KIND_INDEX;
    }
    if (n == w->runs_name_len && memcmp(key, w->runs_name, n) == 0) {
        return KIND_RUNS;
    }
    for (Py_ssize_t i = 0; i < w->sealed_count; i++) {
        if (n == w->sealed_len[i] && memcmp(key, w->sealed_name[i], n) == 0) {
            return KIND_SEALED;
        }
    }
    return KIND_PLAIN;
}

/* Check the subtree at pgno, at level (1: the root) of a tree of depth levels. */
static int walk_page(Walk *w, uint64_t pgno, int level, int depth, uint16_t db_flags, int kind,
                     int depth_left) {
    if (claim(w, pgno, 1) < 0) {
        return -1;
    }
    const uint8_t *page = w->map + pgno * w->psize;
    uint16_t flags = u16_at(page + 10), lower = u16_at(page + 12), upper = u16_at(page + 14);
    int leaf = level == depth, ordered = db_flags == 0 && kind != KIND_FREE; /* memcmp order */
    if (u64_at(page) != pgno || flags != (leaf ? P_LEAF : P_BRANCH)) {
        return fail(w, "a page of the wrong number or kind");
    }
    if (lower < PAGEHDRSZ + 2 || (lower - PAGEHDRSZ) % 2 || lower > upper || upper > w->psize) {
        return fail(w, "a page's free space out of bounds");
    }
    uint32_t keys = (uint32_t)(lower - PAGEHDRSZ) / 2;
    const uint8_t *previous = NULL;
    uint16_t previous_size = 0;
    for (uint32_t i = 0; i < keys; i++) {
        uint32_t at = u16_at(page + PAGEHDRSZ + 2 * i);
        if (at < upper || at + NODESIZE > w->psize) {
            return fail(w, "a node outside its page");
        }
        const uint8_t *node = page + at;
        uint16_t node_flags = u16_at(node + 4), ksize = u16_at(node + 6);
        if (at + NODESIZE + (uint64_t)ksize > w->psize) {
            return fail(w, "a key outside its page");
        }
        const uint8_t *key = node + NODESIZE;
        if (ordered && (leaf ? i > 0 : i > 1)) { /* a branch's first key is empty */
            if (key_order((const char *)previous, previous_size, (const char *)key, ksize) >= 0) {
                return fail(w, "keys out of order");
            }
        }
        previous = key;
        previous_size = ksize;
        if (!leaf) {
            uint64_t child = (uint64_t)u16_at(node) | ((uint64_t)u16_at(node + 2) << 16)
                             | ((uint64_t)node_flags << 32);
            if (walk_page(w, child, level + 1, depth, db_flags, kind, depth_left) < 0) {
                return -1;
            }
            continue;
        }
        if (node_flags & ~(F_BIGDATA | F_SUBDATA | F_DUPDATA)) {
            return fail(w, "a node of unknown kind");
        }
        const uint8_t *data;
        uint64_t size;
        if (node_data(w, page, at, &data, &size) < 0) {
            return -1;
        }
        if (node_flags & F_DUPDATA) {
            if (!(db_flags & MDB_DUPSORT) || (node_flags & F_BIGDATA) || kind != KIND_PLAIN) {
                return fail(w, "duplicates in a database without them");
            }
            if ((node_flags & F_SUBDATA) && (size != DB_BYTES || walk_db(w, data, KIND_PLAIN, depth_left - 1) < 0)) {
                return w->why ? -1 : fail(w, "a damaged database record");
            }
            continue; /* a sub-page of duplicates lies within the node, checked above */
        }
        if (node_flags & F_SUBDATA) {
            if (size != DB_BYTES || (node_flags & F_BIGDATA) || kind != KIND_PLAIN
                || walk_db(w, data, kind_of(w, key, ksize), depth_left - 1) < 0) {
                return w->why ? -1 : fail(w, "a damaged database record");
            }
        } else if (kind == KIND_FREE) { /* a list of free pages: count, then the page numbers */
            if (size < 8 || size % 8 || u64_at(data) != size / 8 - 1) {
                return fail(w, "a damaged free-page list");
            }
            for (uint64_t j = 1; j < size / 8; j++) {
                uint64_t free_page = u64_at(data + 8 * j);
                if (free_page < 2 || free_page >= w->pages) {
                    return fail(w, "a free page outside the file");
                }
            }
        } else if (kind == KIND_INDEX) {
            Entry e;
            if (entry_open((const char *)key, ksize, data, (size_t)size, &e) < 0) {
                return fail(w, "a key index entry that fails its checksum");
            }
        } else if (kind == KIND_RUNS) {
            if (!run_whole(data, size)) {
                return fail(w, "a damaged index run");
            }
        } else if (kind == KIND_SEALED) {
            if (size < 4 || crc32c_extend(crc32c_extend(0, key, ksize), data + 4, (size_t)size - 4)
                                 != load_be32(data)) {
                return fail(w, "a metadata value that fails its checksum");
            }
        }
    }
    return 0;
}

/* Check the database whose record (MDB_db, 48 bytes) is at db. */
static int walk_db(Walk *w, const uint8_t *db, int kind, int depth_left) {
    uint16_t flags = u16_at(db + 4), depth = u16_at(db + 6);
    uint64_t root = u64_at(db + 40);
    if (depth_left <= 0) {
        return fail(w, "databases nested too deep");
    }
    if (kind != KIND_FREE && (flags & ~MDB_PERSISTENT_FLAGS)) { /* the free one's holds the env's */
        return fail(w, "a database of unknown flags");
    }
    if (root == NO_PAGE) {
        return depth == 0 ? 0 : fail(w, "an empty database with a depth");
    }
    if (depth < 1 || depth > MAX_DEPTH) {
        return fail(w, "a database of impossible depth");
    }
    return walk_page(w, root, 1, depth, kind == KIND_FREE ? 0 : flags, kind, depth_left);
}

/* check_lmdb(data, index_name, runs_name, sealed_names) -> None if the LMDB data file is whole
 * (its B-trees' structure, and every value of the named key index, index runs and sealed
 * databases), else the first damage found */
static PyObject *check_lmdb(PyObject *self, PyObject *args) {
    Py_buffer buf, index_name, runs_name;
    PyObject *sealed;
    if (!PyArg_ParseTuple(args, "y*y*y*O!", &buf, &index_name, &runs_name, &PyTuple_Type, &sealed)) {
        return NULL;
    }
    const uint8_t *map = (const uint8_t *)buf.buf;
    uint64_t len = (uint64_t)buf.len;
    Walk w = {map, 0, 0, NULL, NULL, index_name.buf, (size_t)index_name.len, runs_name.buf,
              (size_t)runs_name.len, 0, {NULL}, {0}};
    const uint8_t *metas[2];
    if (PyTuple_GET_SIZE(sealed) > MAX_SEALED) {
        PyErr_SetString(PyExc_ValueError, "check_lmdb: at most 16 sealed databases");
        goto error;
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(sealed); i++) {
        PyObject *name = PyTuple_GET_ITEM(sealed, i); /* the tuple keeps it alive */
        if (!PyBytes_Check(name)) {
            PyErr_SetString(PyExc_TypeError, "check_lmdb: sealed database names are bytes");
            goto error;
        }
        w.sealed_name[i] = PyBytes_AS_STRING(name);
        w.sealed_len[i] = (size_t)PyBytes_GET_SIZE(name);
        w.sealed_count = i + 1;
    }
    if (len < PAGEHDRSZ + 136) {
        w.why = "too short for a meta page";
        goto out;
    }
    w.psize = (uint64_t)u16_at(map + PAGEHDRSZ + 24) | ((uint64_t)u16_at(map + PAGEHDRSZ + 26) << 16);
    if (w.psize < 256 || w.psize > 65536 || (w.psize & (w.psize - 1)) || len < 2 * w.psize) {
        w.why = "an impossible page size";
        goto out;
    }
    for (int m = 0; m < 2; m++) {
        const uint8_t *page = map + m * w.psize;
        uint32_t magic, version;
        memcpy(&magic, page + PAGEHDRSZ, 4);
        memcpy(&version, page + PAGEHDRSZ + 4, 4);
        if (!(u16_at(page + 10) & P_META) || magic != MDB_MAGIC || version != MDB_DATA_VERSION) {
            w.why = "a damaged meta page";
            goto out;
        }
        metas[m] = page + PAGEHDRSZ;
    }
    /* LMDB reads the meta page of the newer transaction: magic, version, address, map size,
     * the free and main databases' records, the last page, the transaction id. */
    const uint8_t *meta = u64_at(metas[0] + 128) < u64_at(metas[1] + 128) ? metas[1] : metas[0];
    uint64_t last = u64_at(meta + 120);
    if (last < 1 || last >= len / w.psize) {
        w.why = "a last page outside the file";
        goto out;
    }
    w.pages = last + 1;
    w.seen = PyMem_RawCalloc((size_t)(w.pages / 8 + 1), 1);
    if (w.seen == NULL) {
        PyErr_NoMemory();
        goto error;
    }
    Py_BEGIN_ALLOW_THREADS
    if (walk_db(&w, meta + 24, KIND_FREE, 3) == 0) {
        walk_db(&w, meta + 24 + DB_BYTES, KIND_PLAIN, 3); /* the main database: records of named ones */
    }
    Py_END_ALLOW_THREADS
    PyMem_RawFree(w.seen);
out:
    PyBuffer_Release(&buf);
    PyBuffer_Release(&index_name);
    PyBuffer_Release(&runs_name);
    if (w.why == NULL) {
        Py_RETURN_NONE;
    }
    return PyUnicode_FromString(w.why);
error:
    PyBuffer_Release(&buf);
    PyBuffer_Release(&index_name);
    PyBuffer_Release(&runs_name);
    return NULL;
}

/* crc32c(data, value=0, portable=False) -> the CRC32C of data continuing from value, by the CPU's
 * instruction where there is one unless portable (both must equal the crc32c package's) */
static PyObject *crc32c(PyObject *self, PyObject *args) {
    Py_buffer data;
    unsigned int value = 0;
    int portable = 0;
    if (!PyArg_ParseTuple(args, "y*|Ip", &data, &value, &portable)) {
        return NULL;
    }
    uint32_t crc = portable ? crc32c_portable(value, data.buf, (size_t)data.len)
                            : crc32c_extend(value, data.buf, (size_t)data.len);
    PyBuffer_Release(&data);
    return PyLong_FromUnsignedLong(crc);
}

static PyMethodDef methods[] = {
    {"build", build, METH_VARARGS, "A run of rows of two binary columns, in key order."},
    {"find", find, METH_VARARGS, "One key's entry in a run, or None."},
    {"find_first", find_first, METH_VARARGS, "One key's entry in the first of several runs holding it."},
    {"entries", entries, METH_VARARGS, "A run's (key, value) entries in a key range."},
    {"decode", (PyCFunction)(void (*)(void))decode, METH_FASTCALL,
     "An index value checked and taken apart: (key, partition, offset, inline value or None)."},
    {"inline", (PyCFunction)(void (*)(void))inline_of, METH_FASTCALL,
     "An index value checked: its inline value, or None when the value is in a data file."},
    {"inline_prefix", inline_prefix, METH_O,
     "The checked (key, inline value) pairs of the leading short-key inline entries of a list."},
    {"crc32c", crc32c, METH_VARARGS, "The CRC32C of the index's entries, as kvlog computes it in C."},
    {"check_lmdb", check_lmdb, METH_VARARGS,
     "None if an LMDB data file and kvlog's key index in it are whole, else what is not."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_runs", "The key index's compiled parts (see kvlog.index.runs).", -1, methods,
};

PyMODINIT_FUNC PyInit__runs(void) {
    const uint16_t probe = 1;
    if (*(const uint8_t *)&probe != 1) {
        PyErr_SetString(PyExc_ImportError, "kvlog's index runs need a little-endian host");
        return NULL;
    }
    crc32c_init();
    return PyModule_Create(&module);
}
