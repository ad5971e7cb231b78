/*
 * Per-record loops between Python objects and Arrow binary columns, compiled.
 *
 * kvlog.format.columns wraps these functions and documents them. pack_binary turns a list of
 * bytes objects (None: null) into the three buffers of an Arrow binary column in one pass per
 * buffer; index_values turns rows of two Arrow binary columns into the (key, index value) pairs
 * that LMDB's putmulti takes, each sealed with its CRC32C. Both hold the GIL: they create or
 * read Python objects. latest_rows sorts a binary column's keys (stable) and keeps each key's
 * last row, without the GIL. Every offset read from a column is checked against its buffer.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "../_crc32c.h"
#include "../_key_order.h"

/* An index value's head: CRC32C (over the LMDB key, then the value after the CRC), partition,
 * offset, flags, all big-endian (kvlog.meta.cache documents the layout). */
#define HEAD_BYTES 15
#define FLAG_INLINE 1

/* pack_binary(items: list, order: int64 buffer or None) -> (offsets, data, validity or None, nulls) */
static PyObject *pack_binary(PyObject *self, PyObject *args) {
    PyObject *items, *order_obj;
    if (!PyArg_ParseTuple(args, "O!O", &PyList_Type, &items, &order_obj)) {
        return NULL;
    }
    Py_buffer order = {0};
    const int64_t *picked = NULL;
    Py_ssize_t count = PyList_GET_SIZE(items);
    Py_ssize_t n = count;
    if (order_obj != Py_None) {
        if (PyObject_GetBuffer(order_obj, &order, PyBUF_C_CONTIGUOUS) < 0) {
            return NULL;
        }
        picked = (const int64_t *)order.buf;
        n = order.len / 8;
    }
    PyObject *result = NULL, *offsets = NULL, *data = NULL, *validity = NULL;
    Py_ssize_t total = 0, nulls = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t at = picked ? picked[i] : i;
        if (at < 0 || at >= count) {
            PyErr_SetString(PyExc_IndexError, "order holds a position outside the items");
            goto done;
        }
        PyObject *item = PyList_GET_ITEM(items, at);
        if (item == Py_None) {
            nulls++;
        } else if (PyBytes_CheckExact(item)) {
            total += PyBytes_GET_SIZE(item);
            if (total > INT32_MAX) {
                break; /* refused below; stop before the sum can overflow */
            }
        } else {
            PyErr_Format(PyExc_TypeError, "items must be bytes or None, not %.100s", Py_TYPE(item)->tp_name);
            goto done;
        }
    }
    if (total > INT32_MAX) {
        PyErr_SetString(PyExc_OverflowError, "more than 2 GiB of bytes for one binary column");
        goto done;
    }
    offsets = PyBytes_FromStringAndSize(NULL, 4 * (n + 1));
    data = PyBytes_FromStringAndSize(NULL, total);
    if (offsets == NULL || data == NULL) {
        goto done;
    }
    uint8_t *valid_bits = NULL;
    if (nulls) {
        validity = PyBytes_FromStringAndSize(NULL, (n + 7) / 8);
        if (validity == NULL) {
            goto done;
        }
        valid_bits = (uint8_t *)PyBytes_AS_STRING(validity);
        memset(valid_bits, 0, (size_t)((n + 7) / 8));
    }
    int32_t *ends = (int32_t *)PyBytes_AS_STRING(offsets);
    char *out = PyBytes_AS_STRING(data);
    int32_t position = 0;
    Py_ssize_t nulls_seen = 0;
    ends[0] = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        /* Allocating the buffers may have run a finalizer that changed the list: check again. */
        int64_t at = picked ? picked[i] : i;
        PyObject *item = at < PyList_GET_SIZE(items) ? PyList_GET_ITEM(items, at) : NULL;
        if (item == NULL || (item != Py_None && !PyBytes_CheckExact(item))
            || (item != Py_None && PyBytes_GET_SIZE(item) > total - position)
            || (item == Py_None && !valid_bits)) {
            PyErr_SetString(PyExc_RuntimeError, "pack_binary: the items changed while they were packed");
            goto done;
        }
        if (item != Py_None) {
            Py_ssize_t size = PyBytes_GET_SIZE(item);
            memcpy(out + position, PyBytes_AS_STRING(item), (size_t)size);
            position += (int32_t)size;
            if (valid_bits) {
                valid_bits[i >> 3] |= (uint8_t)(1u << (i & 7));
            }
        } else {
            nulls_seen++;
        }
        ends[i + 1] = position;
    }
    if (nulls_seen != nulls || position != total) {
        PyErr_SetString(PyExc_RuntimeError, "pack_binary: the items changed while they were packed");
        goto done;
    }
    result = Py_BuildValue("(OOOn)", offsets, data, validity ? validity : Py_None, nulls);
done:
    Py_XDECREF(offsets);
    Py_XDECREF(data);
    Py_XDECREF(validity);
    if (picked) {
        PyBuffer_Release(&order);
    }
    return result;
}

/* Whether ends[0..rows] ascend within a buffer of size bytes, checked at the rows used. */
static int row_in_bounds(const int32_t *ends, int64_t row, Py_ssize_t size) {
    return ends[row] >= 0 && ends[row + 1] >= ends[row] && ends[row + 1] <= size;
}

/* index_values(key_ends, key_data, value_ends, value_data, rows, partitions, positions, inline_limit)
 *   -> list of (key, head + inline value) */
static PyObject *index_values(PyObject *self, PyObject *args) {
    Py_buffer key_ends, key_data, value_ends, value_data, rows, partitions, positions;
    Py_ssize_t inline_limit;
    if (!PyArg_ParseTuple(args, "y*y*y*y*y*y*y*n", &key_ends, &key_data, &value_ends, &value_data, &rows,
                          &partitions, &positions, &inline_limit)) {
        return NULL;
    }
    PyObject *result = NULL;
    Py_ssize_t records = key_ends.len / 4 - 1;
    Py_ssize_t n = rows.len / 8;
    const int32_t *kend = (const int32_t *)key_ends.buf, *vend = (const int32_t *)value_ends.buf;
    const int64_t *row = (const int64_t *)rows.buf, *offset = (const int64_t *)positions.buf;
    const uint16_t *partition = (const uint16_t *)partitions.buf;
    const char *kdata = (const char *)key_data.buf, *vdata = (const char *)value_data.buf;
    if (records < 0 || key_ends.len % 4 || value_ends.len % 4 || rows.len % 8
        || value_ends.len / 4 - 1 != records || positions.len != 8 * n || partitions.len != 2 * n) {
        PyErr_SetString(PyExc_ValueError, "index_values: buffers of different lengths");
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (row[i] < 0 || row[i] >= records || !row_in_bounds(kend, row[i], key_data.len)
            || !row_in_bounds(vend, row[i], value_data.len)) {
            PyErr_SetString(PyExc_ValueError, "index_values: a row outside the columns");
            goto done;
        }
    }
    PyObject *list = PyList_New(n);
    if (list == NULL) {
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t r = row[i];
        Py_ssize_t value_size = vend[r + 1] - vend[r];
        int inline_value = value_size <= inline_limit;
        Py_ssize_t key_size = kend[r + 1] - kend[r];
        PyObject *key = PyBytes_FromStringAndSize(kdata + kend[r], key_size);
        PyObject *value = PyBytes_FromStringAndSize(NULL, HEAD_BYTES + (inline_value ? value_size : 0));
        PyObject *pair = (key && value) ? PyTuple_New(2) : NULL;
        if (pair == NULL) {
            Py_XDECREF(key);
            Py_XDECREF(value);
            Py_DECREF(list);
            goto done;
        }
        uint8_t *head = (uint8_t *)PyBytes_AS_STRING(value);
        uint16_t p = partition[i];
        uint64_t o = (uint64_t)offset[i];
        head[4] = (uint8_t)(p >> 8);
        head[5] = (uint8_t)p;
        for (int b = 0; b < 8; b++) {
            head[6 + b] = (uint8_t)(o >> (56 - 8 * b));
        }
        head[14] = (uint8_t)(inline_value ? FLAG_INLINE : 0);
        if (inline_value) {
            memcpy(head + HEAD_BYTES, vdata + vend[r], (size_t)value_size);
        }
        uint32_t crc = crc32c_extend(crc32c_extend(0, kdata + kend[r], (size_t)key_size), head + 4,
                                     (size_t)(HEAD_BYTES - 4 + (inline_value ? value_size : 0)));
        head[0] = (uint8_t)(crc >> 24);
        head[1] = (uint8_t)(crc >> 16);
        head[2] = (uint8_t)(crc >> 8);
        head[3] = (uint8_t)crc;
        PyTuple_SET_ITEM(pair, 0, key);
        PyTuple_SET_ITEM(pair, 1, value);
        PyList_SET_ITEM(list, i, pair);
    }
    result = list;
done:
    PyBuffer_Release(&key_ends);
    PyBuffer_Release(&key_data);
    PyBuffer_Release(&value_ends);
    PyBuffer_Release(&value_data);
    PyBuffer_Release(&rows);
    PyBuffer_Release(&partitions);
    PyBuffer_Release(&positions);
    return result;
}

/* Sorting keys for latest_rows: a row and the 8 bytes of its key after the prefix all keys share
 * (big-endian, zero-padded), which settle most comparisons without reading the key. */
typedef struct {
    uint64_t prefix;
    uint32_t row;
    uint32_t unused;
} Slot;

typedef struct {
    const int32_t *ends;
    const char *data;
} Keys;

/* The order of rows a and b by key (kvlog's key order). */
static int compare_keys(const Keys *keys, uint32_t a, uint32_t b) {
    return key_order(keys->data + keys->ends[a], (size_t)(keys->ends[a + 1] - keys->ends[a]),
                     keys->data + keys->ends[b], (size_t)(keys->ends[b + 1] - keys->ends[b]));
}

/* Stable merge sort of slots[0..n) by whole key (tmp: room for n slots). */
static void sort_by_key(const Keys *keys, Slot *slots, Slot *tmp, size_t n) {
    for (size_t width = 1; width < n; width *= 2) {
        for (size_t lo = 0; lo < n; lo += 2 * width) {
            size_t mid = lo + width < n ? lo + width : n, hi = lo + 2 * width < n ? lo + 2 * width : n;
            size_t i = lo, j = mid, k = lo;
            while (i < mid && j < hi) {
                tmp[k++] = compare_keys(keys, slots[j].row, slots[i].row) < 0 ? slots[j++] : slots[i++];
            }
            while (i < mid) {
                tmp[k++] = slots[i++];
            }
            while (j < hi) {
                tmp[k++] = slots[j++];
            }
        }
        memcpy(slots, tmp, n * sizeof(Slot));
    }
}

/* Sorts slots[0..n) by key, stable (tmp: room for n slots): LSD radix passes over the prefixes,
 * then a merge sort of each run of equal prefixes by whole key. */
static Slot *sort_slots(const Keys *keys, Slot *slots, Slot *tmp, size_t n) {
    size_t counts[8][256];
    memset(counts, 0, sizeof counts);
    for (size_t i = 0; i < n; i++) {
        for (int b = 0; b < 8; b++) {
            counts[b][(slots[i].prefix >> (8 * b)) & 0xff]++;
        }
    }
    for (int b = 0; b < 8; b++) {
        size_t *count = counts[b], total = 0;
        if (count[(slots[0].prefix >> (8 * b)) & 0xff] == n) {
            continue; /* one value at this byte: the pass would change nothing */
        }
        for (int v = 0; v < 256; v++) {
            size_t c = count[v];
            count[v] = total;
            total += c;
        }
        for (size_t i = 0; i < n; i++) {
            tmp[count[(slots[i].prefix >> (8 * b)) & 0xff]++] = slots[i];
        }
        Slot *swap = slots;
        slots = tmp;
        tmp = swap;
    }
    for (size_t lo = 0; lo < n;) {
        size_t hi = lo + 1;
        while (hi < n && slots[hi].prefix == slots[lo].prefix) {
            hi++;
        }
        if (hi - lo > 1) {
            sort_by_key(keys, slots + lo, tmp + lo, hi - lo);
        }
        lo = hi;
    }
    return slots;
}

/* latest_rows(key_ends, key_data) -> bytes of int64: the last row of each distinct key, in key order */
static PyObject *latest_rows(PyObject *self, PyObject *args) {
    Py_buffer key_ends, key_data;
    if (!PyArg_ParseTuple(args, "y*y*", &key_ends, &key_data)) {
        return NULL;
    }
    PyObject *result = NULL;
    Slot *slots = NULL, *tmp = NULL;
    Py_ssize_t n = key_ends.len / 4 - 1;
    Keys keys = {(const int32_t *)key_ends.buf, (const char *)key_data.buf};
    if (n < 0 || (uint64_t)n > UINT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "latest_rows: not the offsets of a binary column");
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!row_in_bounds(keys.ends, i, key_data.len)) {
            PyErr_SetString(PyExc_ValueError, "latest_rows: offsets outside the data");
            goto done;
        }
    }
    if (n == 0) {
        result = PyBytes_FromStringAndSize(NULL, 0);
        goto done;
    }
    slots = PyMem_RawMalloc((size_t)n * sizeof(Slot));
    tmp = PyMem_RawMalloc((size_t)n * sizeof(Slot));
    if (slots == NULL || tmp == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    size_t kept = 0;
    int64_t *out = NULL;
    Py_BEGIN_ALLOW_THREADS
    /* The prefix all keys share adds nothing to the order: the 8 bytes after it do. */
    const char *first = keys.data + keys.ends[0];
    size_t shared = (size_t)(keys.ends[1] - keys.ends[0]);
    for (Py_ssize_t i = 1; i < n && shared; i++) {
        const char *key = keys.data + keys.ends[i];
        size_t len = (size_t)(keys.ends[i + 1] - keys.ends[i]), m = 0, limit = len < shared ? len : shared;
        while (m < limit && key[m] == first[m]) {
            m++;
        }
        shared = m;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        const uint8_t *key = (const uint8_t *)keys.data + keys.ends[i] + shared;
        size_t len = (size_t)(keys.ends[i + 1] - keys.ends[i]) - shared;
        uint64_t prefix = 0;
        for (size_t b = 0; b < 8; b++) {
            prefix = (prefix << 8) | (b < len ? key[b] : 0);
        }
        slots[i].prefix = prefix;
        slots[i].row = (uint32_t)i;
        slots[i].unused = 0;
    }
    Slot *sorted = sort_slots(&keys, slots, tmp, (size_t)n);
    /* Equal keys are adjacent, in row order: keep the last of each. */
    out = (int64_t *)(sorted == slots ? tmp : slots); /* 8 of each slot's 16 bytes */
    for (Py_ssize_t i = 0; i < n; i++) {
        if (i + 1 < n && sorted[i].prefix == sorted[i + 1].prefix
            && compare_keys(&keys, sorted[i].row, sorted[i + 1].row) == 0) {
            continue;
        }
        out[kept++] = sorted[i].row;
    }
    Py_END_ALLOW_THREADS
    result = PyBytes_FromStringAndSize((const char *)out, (Py_ssize_t)(8 * kept));
done:
    PyMem_RawFree(slots);
    PyMem_RawFree(tmp);
    PyBuffer_Release(&key_ends);
    PyBuffer_Release(&key_data);
    return result;
}

static PyMethodDef methods[] = {
    {"pack_binary", pack_binary, METH_VARARGS, "The buffers of a binary column of bytes objects."},
    {"index_values", index_values, METH_VARARGS, "(key, index value) pairs of rows of two binary columns."},
    {"latest_rows", latest_rows, METH_VARARGS, "The last row of each distinct key of a binary column, in key order."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_columns", "Compiled column loops (see kvlog.format.columns).", -1, methods,
};

PyMODINIT_FUNC PyInit__columns(void) {
    const uint16_t probe = 1;
    if (*(const uint8_t *)&probe != 1) {
        PyErr_SetString(PyExc_ImportError, "kvlog's column loops need a little-endian host");
        return NULL;
    }
    crc32c_init();
    return PyModule_Create(&module);
}
