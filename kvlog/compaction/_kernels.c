/*
 * The offset map's per-record loops: fingerprints, insertion, lookup, the scan of mapped values.
 *
 * kvlog.compaction.kernels wraps these functions and documents them; kvlog.compaction.offset_map
 * owns the table and documents the hash and the layout. Every function takes whole buffers
 * (one call per Arrow batch), checks their sizes, and releases the GIL while it loops.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

static inline uint64_t fmix64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xFF51AFD7ED558CCDULL;
    x ^= x >> 33;
    x *= 0xC4CEB9FE1A85EC53ULL;
    x ^= x >> 33;
    return x;
}

/* The little-endian 32-bit word at data[position], zero past stop. */
static inline uint64_t word_at(const uint8_t *data, int64_t position, int64_t stop) {
    uint64_t word = 0;
    for (int i = 0; i < 4; i++) {
        if (position + i < stop) {
            word |= (uint64_t)data[position + i] << (8 * i);
        }
    }
    return word;
}

static inline int64_t home_slot(uint64_t hi, uint64_t slots) {
    return (int64_t)(((hi >> 32) * slots) >> 32);
}

/* The row holding fingerprint (h, tag), or else the first empty row of its probe sequence
 * (*empty set), or -1 when every row holds another fingerprint. */
static inline int64_t find_row(const uint64_t *rows, Py_ssize_t slots, uint64_t h, uint64_t tag, int *empty) {
    int64_t position = home_slot(h, (uint64_t)slots);
    for (Py_ssize_t probe = 0; probe < slots; probe++) {
        const uint64_t *row = rows + 2 * position;
        if (row[0] == 0 && row[1] == 0) {
            *empty = 1;
            return position;
        }
        if (row[0] == h && (row[1] >> 32) == tag) {
            *empty = 0;
            return position;
        }
        if (++position == slots) {
            position = 0;
        }
    }
    return -1;
}

static int too_small(const char *what) {
    PyErr_Format(PyExc_ValueError, "%s is too small", what);
    return -1;
}

/* nh_fingerprints(data, ends, material, first_mix, second_mix, hi_out, lo_out) */
static PyObject *nh_fingerprints(PyObject *self, PyObject *args) {
    Py_buffer data, ends, material, hi_out, lo_out;
    unsigned long long first_mix, second_mix;
    if (!PyArg_ParseTuple(args, "y*y*y*KKw*w*", &data, &ends, &material, &first_mix, &second_mix,
                          &hi_out, &lo_out)) {
        return NULL;
    }
    PyObject *result = NULL;
    Py_ssize_t n = ends.len / 8 - 1;
    const int64_t *end = (const int64_t *)ends.buf;
    const uint8_t *bytes = (const uint8_t *)data.buf;
    const uint32_t *key = (const uint32_t *)material.buf;
    Py_ssize_t key_words = material.len / 4;
    uint64_t *hi = (uint64_t *)hi_out.buf;
    uint32_t *lo = (uint32_t *)lo_out.buf;
    int failed = 0;
    if (n < 0 || hi_out.len / 8 < n || lo_out.len / 4 < n) {
        failed = too_small("an output or the offsets");
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {  /* offsets must ascend within the data */
        if (end[i] < 0 || end[i + 1] < end[i] || end[i + 1] > data.len) {
            PyErr_SetString(PyExc_ValueError, "key offsets outside the key data");
            failed = -1;
            goto done;
        }
        if (2 * ((end[i + 1] - end[i] + 7) / 8) + 4 > key_words) {
            failed = too_small("the key material");
            goto done;
        }
    }
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t start = end[i], stop = end[i + 1];
        uint64_t s0 = 0, s1 = 0, s2 = 0;
        Py_ssize_t w = 0;
        for (int64_t chunk = start; chunk < stop; chunk += 8, w += 2) {
            uint64_t w0, w1;
            if (chunk + 8 <= stop) {
                uint32_t pair[2];
                memcpy(pair, bytes + chunk, 8);  /* the host is little-endian (checked at import) */
                w0 = pair[0];
                w1 = pair[1];
            } else {
                w0 = word_at(bytes, chunk, stop);
                w1 = word_at(bytes, chunk + 4, stop);
            }
            s0 += (uint64_t)(uint32_t)(w0 + key[w]) * (uint64_t)(uint32_t)(w1 + key[w + 1]);
            s1 += (uint64_t)(uint32_t)(w0 + key[w + 2]) * (uint64_t)(uint32_t)(w1 + key[w + 3]);
            s2 += (uint64_t)(uint32_t)(w0 + key[w + 4]) * (uint64_t)(uint32_t)(w1 + key[w + 5]);
        }
        uint64_t length = (uint64_t)(stop - start);
        s1 ^= fmix64(length ^ first_mix);
        s2 ^= fmix64(length ^ second_mix);
        s0 += fmix64(s1);
        hi[i] = fmix64(s0);
        lo[i] = (uint32_t)(fmix64(s2) >> 32);
    }
    Py_END_ALLOW_THREADS
done:
    if (!failed) {
        result = Py_NewRef(Py_None);
    }
    PyBuffer_Release(&data);
    PyBuffer_Release(&ends);
    PyBuffer_Release(&material);
    PyBuffer_Release(&hi_out);
    PyBuffer_Release(&lo_out);
    return result;
}

/* insert_rows(table, slots, hi, lo, relative, size, capacity) -> (mapped, size) */
static PyObject *insert_rows(PyObject *self, PyObject *args) {
    Py_buffer table, his, los, relatives;
    Py_ssize_t slots, size, capacity;
    if (!PyArg_ParseTuple(args, "w*ny*y*y*nn", &table, &slots, &his, &los, &relatives, &size, &capacity)) {
        return NULL;
    }
    PyObject *result = NULL;
    Py_ssize_t n = his.len / 8, mapped = 0;
    if (slots < 1 || table.len / 16 < slots || los.len / 4 < n || relatives.len / 8 < n) {
        too_small("the table or an input");
        goto done;
    }
    uint64_t *rows = (uint64_t *)table.buf;
    const uint64_t *hi = (const uint64_t *)his.buf;
    const uint32_t *lo = (const uint32_t *)los.buf;
    const int64_t *relative = (const int64_t *)relatives.buf;
    Py_BEGIN_ALLOW_THREADS
    for (; mapped < n; mapped++) {
        uint64_t h = hi[mapped];
        uint64_t value = ((uint64_t)lo[mapped] << 32) | (uint64_t)relative[mapped];
        int empty = 0;
        int64_t position = find_row(rows, slots, h, value >> 32, &empty);
        if (position < 0 || (empty && size >= capacity)) {
            break;  /* a new key, and the table is at capacity (or full) */
        }
        uint64_t *row = rows + 2 * position;
        if (empty) {
            row[0] = h;
            row[1] = value;
            size++;
        } else if (value > row[1]) {
            row[1] = value;
        }
    }
    Py_END_ALLOW_THREADS
    result = Py_BuildValue("nn", mapped, size);
done:
    PyBuffer_Release(&table);
    PyBuffer_Release(&his);
    PyBuffer_Release(&los);
    PyBuffer_Release(&relatives);
    return result;
}

/* lookup_rows(table, slots, hi, lo, out) */
static PyObject *lookup_rows(PyObject *self, PyObject *args) {
    Py_buffer table, his, los, outs;
    Py_ssize_t slots;
    if (!PyArg_ParseTuple(args, "y*ny*y*w*", &table, &slots, &his, &los, &outs)) {
        return NULL;
    }
    PyObject *result = NULL;
    Py_ssize_t n = his.len / 8;
    if (slots < 1 || table.len / 16 < slots || los.len / 4 < n || outs.len / 8 < n) {
        too_small("the table or an input");
        goto done;
    }
    const uint64_t *rows = (const uint64_t *)table.buf;
    const uint64_t *hi = (const uint64_t *)his.buf;
    const uint32_t *lo = (const uint32_t *)los.buf;
    int64_t *out = (int64_t *)outs.buf;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) {
        int empty = 0;
        int64_t position = find_row(rows, slots, hi[i], lo[i], &empty);
        out[i] = (position < 0 || empty) ? -1 : (int64_t)(rows[2 * position + 1] & 0xFFFFFFFFULL);
    }
    Py_END_ALLOW_THREADS
    result = Py_NewRef(Py_None);
done:
    PyBuffer_Release(&table);
    PyBuffer_Release(&his);
    PyBuffer_Release(&los);
    PyBuffer_Release(&outs);
    return result;
}

/* mapped_values(table, out) -> count */
static PyObject *mapped_values(PyObject *self, PyObject *args) {
    Py_buffer table, outs;
    if (!PyArg_ParseTuple(args, "y*w*", &table, &outs)) {
        return NULL;
    }
    PyObject *result = NULL;
    Py_ssize_t slots = table.len / 16, count = 0;
    if (outs.len / 4 < slots) {
        too_small("the output");
        goto done;
    }
    const uint64_t *rows = (const uint64_t *)table.buf;
    uint32_t *out = (uint32_t *)outs.buf;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t slot = 0; slot < slots; slot++) {
        if (rows[2 * slot] != 0 || rows[2 * slot + 1] != 0) {
            out[count++] = (uint32_t)(rows[2 * slot + 1] & 0xFFFFFFFFULL);
        }
    }
    Py_END_ALLOW_THREADS
    result = PyLong_FromSsize_t(count);
done:
    PyBuffer_Release(&table);
    PyBuffer_Release(&outs);
    return result;
}

static PyMethodDef methods[] = {
    {"nh_fingerprints", nh_fingerprints, METH_VARARGS, "Fingerprints of the keys of an Arrow binary array's buffers."},
    {"insert_rows", insert_rows, METH_VARARGS, "Insert records into the table; returns (mapped, size)."},
    {"lookup_rows", lookup_rows, METH_VARARGS, "The relative offset mapped for each fingerprint, -1 where absent."},
    {"mapped_values", mapped_values, METH_VARARGS, "The low 32 bits of every occupied row's value."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_kernels", "The offset map's compiled loops (see kvlog.compaction.kernels).", -1, methods,
};

PyMODINIT_FUNC PyInit__kernels(void) {
    const uint16_t probe = 1;
    if (*(const uint8_t *)&probe != 1) {
        PyErr_SetString(PyExc_ImportError, "kvlog's compaction kernels need a little-endian host");
        return NULL;
    }
    return PyModule_Create(&module);
}
