/*
 * Per-record loops between Python objects and Arrow binary columns, compiled.
 *
 * kvlog.format.columns wraps these functions and documents them. pack_binary turns a list of
 * bytes objects (None: null) into the three buffers of an Arrow binary column in one pass per
 * buffer; index_values turns rows of two Arrow binary columns into the (key, index value) pairs
 * that LMDB's putmulti takes. Both hold the GIL: they create or read Python objects.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

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
    ends[0] = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PyList_GET_ITEM(items, picked ? picked[i] : i);
        if (item != Py_None) {
            Py_ssize_t size = PyBytes_GET_SIZE(item);
            memcpy(out + position, PyBytes_AS_STRING(item), (size_t)size);
            position += (int32_t)size;
            if (valid_bits) {
                valid_bits[i >> 3] |= (uint8_t)(1u << (i & 7));
            }
        }
        ends[i + 1] = position;
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
    if (records < 0 || value_ends.len / 4 - 1 != records || positions.len / 8 != n
        || partitions.len / 2 != n) {
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
        PyObject *key = PyBytes_FromStringAndSize(kdata + kend[r], kend[r + 1] - kend[r]);
        PyObject *value = PyBytes_FromStringAndSize(NULL, 11 + (inline_value ? value_size : 0));
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
        head[0] = (uint8_t)(p >> 8);
        head[1] = (uint8_t)p;
        for (int b = 0; b < 8; b++) {
            head[2 + b] = (uint8_t)(o >> (56 - 8 * b));
        }
        head[10] = (uint8_t)(inline_value ? 1 : 0);
        if (inline_value) {
            memcpy(head + 11, vdata + vend[r], (size_t)value_size);
        }
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

static PyMethodDef methods[] = {
    {"pack_binary", pack_binary, METH_VARARGS, "The buffers of a binary column of bytes objects."},
    {"index_values", index_values, METH_VARARGS, "(key, index value) pairs of rows of two binary columns."},
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
    return PyModule_Create(&module);
}
