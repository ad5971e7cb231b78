/*
 * Index runs, compiled: a commit's key-index entries as one sorted byte string (see
 * kvlog.meta.runs, which wraps these functions and documents the layout).
 *
 * build packs rows of two Arrow binary columns into a run; find looks one key up by binary
 * search; entries lists the (key, value) pairs of a key range. A run is read in place (an LMDB
 * value in the map), so find copies only the value it returns.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "../_key_order.h"

#define RUN_MAGIC 0x3152564bu /* "KVR1" */
#define HEAD_BYTES 11
#define FLAG_INLINE 1

typedef struct {
    uint32_t count;
    const uint32_t *key_end;
    const uint32_t *value_end;
    const char *keys;
    const char *values;
} Run;

/* Parse and bounds-check a run's header; sets ValueError and returns -1 if it is not one. */
static int run_open(const Py_buffer *buf, Run *run) {
    const char *base = (const char *)buf->buf;
    uint32_t head[2];
    if (buf->len < 8) {
        goto bad;
    }
    memcpy(head, base, 8);
    if (head[0] != RUN_MAGIC || (Py_ssize_t)(8 + 8 * (Py_ssize_t)head[1]) > buf->len) {
        goto bad;
    }
    run->count = head[1];
    run->key_end = (const uint32_t *)(base + 8);
    run->value_end = run->key_end + run->count;
    run->keys = base + 8 + 8 * (Py_ssize_t)run->count;
    Py_ssize_t key_bytes = run->count ? run->key_end[run->count - 1] : 0;
    Py_ssize_t value_bytes = run->count ? run->value_end[run->count - 1] : 0;
    run->values = run->keys + key_bytes;
    if (8 + 8 * (Py_ssize_t)run->count + key_bytes + value_bytes != buf->len) {
        goto bad;
    }
    return 0;
bad:
    PyErr_SetString(PyExc_ValueError, "not an index run");
    return -1;
}

static inline uint32_t start_of(const uint32_t *end, uint32_t i) { return i ? end[i - 1] : 0; }

/* The first entry whose key is >= key (run->count if none). */
static uint32_t lower_bound(const Run *run, const char *key, size_t n) {
    uint32_t lo = 0, hi = run->count;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        uint32_t s = start_of(run->key_end, mid);
        if (key_order(run->keys + s, run->key_end[mid] - s, key, n) < 0) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    return lo;
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
    if (records < 0 || value_ends.len / 4 - 1 != records || positions.len / 8 != n
        || partitions.len / 2 != n || live.len != n) {
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
        if (klen == 0) {
            PyErr_SetString(PyExc_ValueError, "build: an empty key");
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
        }
    }
    uint64_t total = 8 + 8 * (uint64_t)n + key_bytes + value_bytes;
    if (key_bytes + value_bytes > UINT32_MAX || total > PY_SSIZE_T_MAX) {
        PyErr_SetString(PyExc_OverflowError, "build: a run holds at most 4 GiB of entries");
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
    uint32_t *key_end = (uint32_t *)(base + 8), *value_end = key_end + n;
    char *keys = base + 8 + 8 * n, *values = keys + key_bytes;
    uint32_t kpos = 0, vpos = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t r = row[i];
        uint32_t klen = (uint32_t)(kend[r + 1] - kend[r]);
        memcpy(keys + kpos, kdata + kend[r], klen);
        key_end[i] = kpos += klen;
        if (alive[i]) {
            Py_ssize_t vlen = vend[r + 1] - vend[r];
            int inline_value = vlen <= inline_limit;
            uint8_t *h = (uint8_t *)values + vpos;
            uint16_t p = partition[i];
            uint64_t o = (uint64_t)offset[i];
            h[0] = (uint8_t)(p >> 8);
            h[1] = (uint8_t)p;
            for (int b = 0; b < 8; b++) {
                h[2 + b] = (uint8_t)(o >> (56 - 8 * b));
            }
            h[10] = (uint8_t)(inline_value ? FLAG_INLINE : 0);
            vpos += HEAD_BYTES;
            if (inline_value) {
                memcpy(values + vpos, vdata + vend[r], (size_t)vlen);
                vpos += (uint32_t)vlen;
            }
        }
        value_end[i] = vpos;
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

static PyObject *lookup(const Run *run, const char *key, size_t n);

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

/* The value of key's entry in an open run as bytes, Py_None (a new reference) if absent. */
static PyObject *lookup(const Run *run, const char *key, size_t n) {
    uint32_t i = lower_bound(run, key, n);
    if (i < run->count) {
        uint32_t s = start_of(run->key_end, i);
        if (key_order(run->keys + s, run->key_end[i] - s, key, n) == 0) {
            uint32_t v = start_of(run->value_end, i);
            return PyBytes_FromStringAndSize(run->values + v, run->value_end[i] - v);
        }
    }
    return Py_NewRef(Py_None);
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
        Py_buffer buf;
        if (PyObject_GetBuffer(PyList_GET_ITEM(runs, r), &buf, PyBUF_SIMPLE) < 0) {
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
    }
    PyBuffer_Release(&key);
    return result;
}

/* entries(run, lower, upper, limit, reverse) -> [(key, value)] with lower <= key < upper (None:
 * unbounded): at most limit (< 0: all) of them from the low end, or from the high end in
 * descending order when reverse. */
static PyObject *entries(PyObject *self, PyObject *args) {
    Py_buffer buf, lower = {0}, upper = {0};
    Py_ssize_t limit;
    int reverse;
    if (!PyArg_ParseTuple(args, "y*z*z*np", &buf, &lower, &upper, &limit, &reverse)) {
        return NULL;
    }
    PyObject *result = NULL;
    Run run;
    if (run_open(&buf, &run) == 0) {
        uint32_t first = lower.buf ? lower_bound(&run, lower.buf, (size_t)lower.len) : 0;
        uint32_t stop = upper.buf ? lower_bound(&run, upper.buf, (size_t)upper.len) : run.count;
        if (stop < first) {
            stop = first;
        }
        uint32_t n = stop - first;
        if (limit >= 0 && (Py_ssize_t)n > limit) {
            n = (uint32_t)limit;
        }
        PyObject *list = PyList_New(n);
        for (uint32_t j = 0; list != NULL && j < n; j++) {
            uint32_t i = reverse ? stop - 1 - j : first + j;
            uint32_t k = start_of(run.key_end, i), v = start_of(run.value_end, i);
            PyObject *pair = Py_BuildValue("(y#y#)", run.keys + k, (Py_ssize_t)(run.key_end[i] - k),
                                           run.values + v, (Py_ssize_t)(run.value_end[i] - v));
            if (pair == NULL) {
                Py_CLEAR(list);
                break;
            }
            PyList_SET_ITEM(list, j, pair);
        }
        result = list;
    }
    PyBuffer_Release(&buf);
    PyBuffer_Release(&lower);
    PyBuffer_Release(&upper);
    return result;
}

static PyMethodDef methods[] = {
    {"build", build, METH_VARARGS, "A run of rows of two binary columns, in key order."},
    {"find", find, METH_VARARGS, "One key's entry in a run, or None."},
    {"find_first", find_first, METH_VARARGS, "One key's entry in the first of several runs holding it."},
    {"entries", entries, METH_VARARGS, "A run's (key, value) entries in a key range."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_runs", "Compiled index runs (see kvlog.meta.runs).", -1, methods,
};

PyMODINIT_FUNC PyInit__runs(void) {
    const uint16_t probe = 1;
    if (*(const uint8_t *)&probe != 1) {
        PyErr_SetString(PyExc_ImportError, "kvlog's index runs need a little-endian host");
        return NULL;
    }
    return PyModule_Create(&module);
}
