/*
 * Merging index runs (see kvlog.index.merge, which wraps this and documents its use, and
 * kvlog.index.runs, which documents the layout of a run): merge lists, in key order, the entry
 * of the newest run for each key of several runs (its puts and its deletions apart), so that
 * settling writes the B-tree in key order, each key once.
 *
 * Nothing here trusts its input: every offset read from a run is checked against the buffer
 * before it is followed, every entry returned is checked (its CRC32C), keys must strictly
 * increase within each run, and damage raises ValueError.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "../_key_order.h"
#include "_index_entry.h"

static const char BAD_RUN[] = "not an index run";
static const char BAD_ENTRY[] = "an index entry is malformed or fails its checksum";

/* One run being merged: its tables and data, and the entry it is at. */
typedef struct {
    Py_buffer buf;
    uint32_t count;
    const char *key_end; /* u32[count], read unaligned */
    const char *value_end;
    const char *keys;
    const char *values;
    uint32_t key_bytes;
    uint32_t value_bytes;
    uint32_t at;        /* the current entry (count: done) */
    const char *key;    /* the current entry's key */
    size_t key_len;
    uint64_t prefix;    /* its first 8 bytes, big-endian, zero-padded: most comparisons end here */
} Cursor;

static int bad(const char *what) {
    PyErr_SetString(PyExc_ValueError, what);
    return -1;
}

/* Open buf (already acquired) as a run; -1 (ValueError) if its header and tables do not fill it. */
static int cursor_open(Cursor *c) {
    const char *base = (const char *)c->buf.buf;
    if (c->buf.len < 8 || load_u32(base) != RUN_MAGIC) {
        return bad(BAD_RUN);
    }
    uint64_t count = load_u32(base + 4);
    uint64_t tables = 8 + 8 * count;
    if (tables > (uint64_t)c->buf.len) {
        return bad(BAD_RUN);
    }
    c->count = (uint32_t)count;
    c->key_end = base + 8;
    c->value_end = c->key_end + 4 * count;
    c->keys = base + tables;
    c->key_bytes = count ? load_u32(c->key_end + 4 * (count - 1)) : 0;
    c->value_bytes = count ? load_u32(c->value_end + 4 * (count - 1)) : 0;
    if (tables + c->key_bytes + c->value_bytes != (uint64_t)c->buf.len) {
        return bad(BAD_RUN);
    }
    c->values = c->keys + c->key_bytes;
    return 0;
}

static int span_of(const char *ends, uint32_t i, uint32_t total, uint32_t *start, uint32_t *stop) {
    uint32_t a = i ? load_u32(ends + 4 * (i - 1)) : 0, b = load_u32(ends + 4 * i);
    if (a > b || b > total) {
        return bad(BAD_RUN);
    }
    *start = a;
    *stop = b;
    return 0;
}

/* Point the cursor's key at entry c->at (nothing when done); -1 for damage, including a key
 * that does not sort after the one before it (previous, NULL for none). */
static int cursor_load(Cursor *c, const char *previous, size_t previous_len) {
    if (c->at >= c->count) {
        c->key = NULL;
        return 0;
    }
    uint32_t s, e;
    if (span_of(c->key_end, c->at, c->key_bytes, &s, &e) < 0) {
        return -1;
    }
    if (e == s || e - s > MAX_DIRECT_KEY) {
        return bad(BAD_RUN);
    }
    c->key = c->keys + s;
    c->key_len = e - s;
    uint8_t head[8] = {0};
    memcpy(head, c->key, c->key_len < 8 ? c->key_len : 8);
    c->prefix = 0;
    for (int b = 0; b < 8; b++) {
        c->prefix = c->prefix << 8 | head[b];
    }
    if (previous != NULL && key_order(previous, previous_len, c->key, c->key_len) >= 0) {
        return bad(BAD_RUN);
    }
    return 0;
}

/* Move to the first entry whose key is >= lower (n bytes). */
static int cursor_seek(Cursor *c, const char *lower, size_t n) {
    uint32_t lo = 0, hi = c->count;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2, s, e;
        if (span_of(c->key_end, mid, c->key_bytes, &s, &e) < 0) {
            return -1;
        }
        if (key_order(c->keys + s, e - s, lower, n) < 0) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    c->at = lo;
    return cursor_load(c, NULL, 0);
}

static int cursor_next(Cursor *c) {
    const char *previous = c->key;
    size_t previous_len = c->key_len;
    c->at++;
    return cursor_load(c, previous, previous_len);
}

/* Append the current entry to puts as a (key, value) tuple, its value checked, or its key to
 * deletions; the key appended, borrowed from the list (NULL with an exception on failure). */
static PyObject *cursor_take(const Cursor *c, PyObject *puts, PyObject *deletions) {
    uint32_t vs, ve;
    if (span_of(c->value_end, c->at, c->value_bytes, &vs, &ve) < 0) {
        return NULL;
    }
    const uint8_t *value = (const uint8_t *)c->values + vs;
    size_t vlen = ve - vs;
    PyObject *item, *key;
    if (vlen == DELETION_BYTES) {
        if (crc32c_extend(0, c->key, c->key_len) != load_be32(value)) {
            bad(BAD_ENTRY);
            return NULL;
        }
        item = key = PyBytes_FromStringAndSize(c->key, (Py_ssize_t)c->key_len);
        if (item == NULL || PyList_Append(deletions, item) < 0) {
            Py_XDECREF(item);
            return NULL;
        }
    } else {
        Entry e;
        if (entry_open(c->key, c->key_len, value, vlen, &e) < 0 || (e.flags & FLAG_LONG)) {
            bad(BAD_ENTRY);
            return NULL;
        }
        key = PyBytes_FromStringAndSize(c->key, (Py_ssize_t)c->key_len);
        PyObject *data = PyBytes_FromStringAndSize((const char *)value, (Py_ssize_t)vlen);
        item = key != NULL && data != NULL ? PyTuple_New(2) : NULL;
        if (item == NULL) {
            Py_XDECREF(key);
            Py_XDECREF(data);
            return NULL;
        }
        PyTuple_SET_ITEM(item, 0, key);
        PyTuple_SET_ITEM(item, 1, data);
        if (PyList_Append(puts, item) < 0) {
            Py_DECREF(item);
            return NULL;
        }
    }
    Py_DECREF(item); /* the list holds it */
    return key;
}

/* Heap order of cursors a and b: by key, then the newer run (the lower index) first. */
static int before(const Cursor *cursors, uint32_t a, uint32_t b) {
    if (cursors[a].prefix != cursors[b].prefix) {
        return cursors[a].prefix < cursors[b].prefix;
    }
    int order = key_order(cursors[a].key, cursors[a].key_len, cursors[b].key, cursors[b].key_len);
    return order < 0 || (order == 0 && a < b);
}

static void sift_down(const Cursor *cursors, uint32_t *heap, uint32_t n, uint32_t i) {
    for (;;) {
        uint32_t smallest = i, l = 2 * i + 1, r = l + 1;
        if (l < n && before(cursors, heap[l], heap[smallest])) {
            smallest = l;
        }
        if (r < n && before(cursors, heap[r], heap[smallest])) {
            smallest = r;
        }
        if (smallest == i) {
            return;
        }
        uint32_t t = heap[i];
        heap[i] = heap[smallest];
        heap[smallest] = t;
        i = smallest;
    }
}

/* merge(runs, lower, limit) -> ([(key, value), ...], [deleted key, ...]): see kvlog.index.merge. */
static PyObject *merge(PyObject *self, PyObject *args) {
    PyObject *runs;
    Py_buffer lower = {0};
    Py_ssize_t limit;
    if (!PyArg_ParseTuple(args, "O!z*n", &PyList_Type, &runs, &lower, &limit)) {
        return NULL;
    }
    Py_ssize_t k = PyList_GET_SIZE(runs);
    PyObject *out = NULL;
    Cursor *cursors = PyMem_Calloc((size_t)(k ? k : 1), sizeof(Cursor));
    uint32_t *heap = PyMem_Calloc((size_t)(k ? k : 1), sizeof(uint32_t));
    Py_ssize_t opened = 0;
    if (cursors == NULL || heap == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    uint32_t n = 0;
    for (; opened < k; opened++) {
        Cursor *c = &cursors[opened];
        if (PyObject_GetBuffer(PyList_GET_ITEM(runs, opened), &c->buf, PyBUF_SIMPLE) < 0) {
            goto done;
        }
        if (cursor_open(c) < 0) {
            opened++;
            goto done;
        }
        int found = lower.buf != NULL ? cursor_seek(c, lower.buf, (size_t)lower.len)
                                      : (c->at = 0, cursor_load(c, NULL, 0));
        if (found < 0) {
            opened++;
            goto done;
        }
        if (c->key != NULL) {
            heap[n++] = (uint32_t)opened;
        }
    }
    for (uint32_t i = n / 2; i-- > 0;) {
        sift_down(cursors, heap, n, i);
    }
    PyObject *puts = PyList_New(0), *deletions = PyList_New(0);
    Py_ssize_t taken = 0;
    int failed = puts == NULL || deletions == NULL;
    while (!failed && n > 0 && (limit < 0 || taken < limit)) {
        PyObject *listed = cursor_take(&cursors[heap[0]], puts, deletions);
        if (listed == NULL) {
            failed = 1;
            break;
        }
        taken++;
        const char *key = PyBytes_AS_STRING(listed);
        size_t key_len = (size_t)PyBytes_GET_SIZE(listed);
        /* Move every cursor at this key (the newest was listed; older runs' entries lose). */
        while (n > 0 && key_order(cursors[heap[0]].key, cursors[heap[0]].key_len, key, key_len) == 0) {
            Cursor *c = &cursors[heap[0]];
            if (cursor_next(c) < 0) {
                failed = 1;
                break;
            }
            if (c->key == NULL) {
                heap[0] = heap[--n];
            }
            sift_down(cursors, heap, n, 0);
        }
    }
    if (!failed) {
        out = PyTuple_Pack(2, puts, deletions);
    }
    Py_XDECREF(puts);
    Py_XDECREF(deletions);
done:
    for (Py_ssize_t i = 0; i < opened; i++) {
        PyBuffer_Release(&cursors[i].buf);
    }
    PyMem_Free(cursors);
    PyMem_Free(heap);
    PyBuffer_Release(&lower);
    return out;
}

static PyMethodDef methods[] = {
    {"merge", merge, METH_VARARGS,
     "The newest run's entry of each key of several runs (newest first), in key order: puts and deletions."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_merge", "Merging index runs (see kvlog.index.merge).", -1, methods,
};

PyMODINIT_FUNC PyInit__merge(void) {
    const uint16_t probe = 1;
    if (*(const uint8_t *)&probe != 1) {
        PyErr_SetString(PyExc_ImportError, "kvlog's index runs need a little-endian host");
        return NULL;
    }
    crc32c_init();
    return PyModule_Create(&module);
}
