/*
 * The key index's compiled parts (see kvlog.index.runs and kvlog.index.entry, which wrap these
 * functions and document the layouts):
 *
 * - index runs: build packs rows of two Arrow binary columns into a run; find and find_first
 *   look one key up by binary search; entries lists the (key, value) pairs of a key range. A
 *   run is read in place (an LMDB value in the map), so these copy only what they return.
 * - index values: decode and inline check an entry's CRC32C and take it apart.
 * - lmdb_txnid reads the id of an LMDB file's newest commit from its meta pages (a get's check
 *   that the read transaction it reuses is still the newest snapshot); Getter is the common case
 *   of a get in one call, with a read transaction reused while it is the newest; StoreGet is a
 *   store's whole get in one call for a valid bytes key of an open store.
 *
 * Nothing here trusts its input: every offset read from a run or an index value is checked
 * against the buffer before it is followed, and damage raises ValueError. A lookup checks only
 * the entries its binary search visits (O(log n)), never the whole run.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "../_key_order.h"
#include "_index_entry.h"

static const char BAD_RUN[] = "not an index run";
static const char BAD_ENTRY[] = "an index entry is malformed or fails its checksum";

/* ---- index values ------------------------------------------------------------------------- */

static int get_buffer(PyObject *obj, Py_buffer *view) {
    return PyObject_GetBuffer(obj, view, PyBUF_SIMPLE);
}

/* decode(lmdb_key, value) -> (key, partition, offset, inline value or None, expiry or None) */
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
    } else {
        PyObject *expires = (e.flags & FLAG_EXPIRES) ? PyLong_FromLongLong((long long)e.expires) : Py_NewRef(Py_None);
        if (expires != NULL) {
            if (e.inline_value != NULL) {
                result = Py_BuildValue("(y#HKy#N)", e.key, (Py_ssize_t)e.key_len, e.partition,
                                       (unsigned long long)e.offset, e.inline_value, (Py_ssize_t)e.inline_len,
                                       expires);
            } else {
                result = Py_BuildValue("(y#HKON)", e.key, (Py_ssize_t)e.key_len, e.partition,
                                       (unsigned long long)e.offset, Py_None, expires);
            }
        }
    }
    PyBuffer_Release(&key);
    PyBuffer_Release(&value);
    return result;
}

/* inline(lmdb_key, value) -> the inline value, or None when the value is in a data file or the
 * entry expires (its expiry is for the caller to check: decode) */
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
        if (e.inline_value == NULL || (e.flags & FLAG_EXPIRES)) {
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
    } else if (e.inline_value == NULL || (e.flags & FLAG_EXPIRES)) {
        result = Py_NewRef(Py_None);
    } else {
        result = PyBytes_FromStringAndSize(e.inline_value, (Py_ssize_t)e.inline_len);
    }
    PyBuffer_Release(&key);
    PyBuffer_Release(&value);
    return result;
}

#include "_scan_walk.h" /* ScanWalk: a scan's entries */

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

/* build(key_ends, key_data, value_ends, value_data, rows, partitions, positions, live, inline_limit
 *       [, expires, expiring]) -> bytes; expires (i64) and expiring (u8) give row i's expiry
 *       where expiring[i] is set (FLAG_EXPIRES) */
static PyObject *build(PyObject *self, PyObject *args) {
    Py_buffer key_ends, key_data, value_ends, value_data, rows, partitions, positions, live;
    Py_buffer expires_buf = {0}, expiring_buf = {0};
    Py_ssize_t inline_limit;
    PyObject *expires_obj = Py_None, *expiring_obj = Py_None;
    if (!PyArg_ParseTuple(args, "y*y*y*y*y*y*y*y*n|OO", &key_ends, &key_data, &value_ends, &value_data,
                          &rows, &partitions, &positions, &live, &inline_limit, &expires_obj, &expiring_obj)) {
        return NULL;
    }
    PyObject *result = NULL;
    const int64_t *expires = NULL;
    const uint8_t *expiring = NULL;
    if ((expires_obj == Py_None) != (expiring_obj == Py_None)) {
        PyErr_SetString(PyExc_TypeError, "build: expires and expiring go together");
        goto done;
    }
    if (expires_obj != Py_None) {
        if (PyObject_GetBuffer(expires_obj, &expires_buf, PyBUF_SIMPLE) < 0) {
            goto done;
        }
        if (PyObject_GetBuffer(expiring_obj, &expiring_buf, PyBUF_SIMPLE) < 0) {
            goto done;
        }
        expires = (const int64_t *)expires_buf.buf;
        expiring = (const uint8_t *)expiring_buf.buf;
    }
    Py_ssize_t records = key_ends.len / 4 - 1;
    Py_ssize_t n = rows.len / 8;
    const int32_t *kend = (const int32_t *)key_ends.buf, *vend = (const int32_t *)value_ends.buf;
    const int64_t *row = (const int64_t *)rows.buf, *offset = (const int64_t *)positions.buf;
    const uint16_t *partition = (const uint16_t *)partitions.buf;
    const uint8_t *alive = (const uint8_t *)live.buf;
    const char *kdata = (const char *)key_data.buf, *vdata = (const char *)value_data.buf;
    if (records < 0 || key_ends.len % 4 || value_ends.len % 4 || rows.len % 8
        || value_ends.len / 4 - 1 != records || positions.len != 8 * n || partitions.len != 2 * n
        || live.len != n || (expires != NULL && (expires_buf.len != 8 * n || expiring_buf.len != n))) {
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
            value_bytes += HEAD_BYTES + (vlen <= inline_limit ? (uint64_t)vlen : 0)
                           + (expiring != NULL && expiring[i] ? EXPIRES_BYTES : 0);
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
            int expiry = expiring != NULL && expiring[i];
            size_t at = HEAD_BYTES;
            if (expiry) {
                store_expires(v + at, expires[i]);
                at += EXPIRES_BYTES;
            }
            if (inline_value) {
                memcpy(v + at, vdata + vend[r], (size_t)vlen);
                at += (size_t)vlen;
            }
            size_t rest = at - HEAD_BYTES;
            entry_seal(v, partition[i], (uint64_t)offset[i],
                       (uint8_t)((inline_value ? FLAG_INLINE : 0) | (expiry ? FLAG_EXPIRES : 0)), key, klen, rest);
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
    if (expires_buf.obj != NULL) {
        PyBuffer_Release(&expires_buf);
    }
    if (expiring_buf.obj != NULL) {
        PyBuffer_Release(&expiring_buf);
    }
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

#include "_run_merge.h" /* RunMerge: a scan's overlay */
#include "_runs_get.h"
#include "_runs_store_get.h"

static PyMethodDef methods[] = {
    {"build", build, METH_VARARGS, "A run of rows of two binary columns, in key order."},
    {"find", find, METH_VARARGS, "One key's entry in a run, or None."},
    {"find_first", find_first, METH_VARARGS, "One key's entry in the first of several runs holding it."},
    {"entries", entries, METH_VARARGS, "A run's (key, value) entries in a key range."},
    {"decode", (PyCFunction)(void (*)(void))decode, METH_FASTCALL,
     "An index value checked and taken apart: (key, partition, offset, inline value or None)."},
    {"inline", (PyCFunction)(void (*)(void))inline_of, METH_FASTCALL,
     "An index value checked: its inline value, or None when the value is in a data file."},
    {"crc32c", crc32c, METH_VARARGS, "The CRC32C of the index's entries, as kvlog computes it in C."},
    {"lmdb_txnid", (PyCFunction)(void (*)(void))lmdb_txnid, METH_FASTCALL,
     "The id of the newest commit of an LMDB data file, read from its two meta pages."},
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
    if (PyType_Ready(&ScanWalkType) < 0 || PyType_Ready(&RunMergeType) < 0) {
        return NULL;
    }
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && (PyModule_AddObjectRef(m, "ScanWalk", (PyObject *)&ScanWalkType) < 0
                      || PyModule_AddObjectRef(m, "RunMerge", (PyObject *)&RunMergeType) < 0
                      || runs_get_init(m) < 0 || runs_store_get_init(m) < 0)) {
        Py_CLEAR(m);
    }
    return m;
}