/*
 * Included by _runs.c, after its index-value and run functions: the get fast path (see
 * kvlog.index.reads) -- lmdb_txnid reads the id of an LMDB file's newest commit from its meta
 * pages, and Getter answers the common case of KeyIndex.lookup in one call.
 */
#ifndef KVLOG_RUNS_GET_H
#define KVLOG_RUNS_GET_H

/* ---- LMDB's newest commit ------------------------------------------------------------------ */

/* lmdb_txnid(meta, page_size) -> the id of the newest commit of an LMDB data file whose first
 * two pages (its meta pages, page_size bytes each) meta maps: the larger of their transaction
 * ids. LMDB writes a meta page's id last, as one aligned 8-byte store. */
#define LMDB_TXNID_AT 144 /* page header 16, then magic, version, address, map size, 2 dbs, last page */

static PyObject *lmdb_txnid(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "lmdb_txnid(meta, page_size)");
        return NULL;
    }
    Py_ssize_t page = PyLong_AsSsize_t(args[1]);
    if (page == -1 && PyErr_Occurred()) {
        return NULL;
    }
    Py_buffer view;
    if (get_buffer(args[0], &view) < 0) {
        return NULL;
    }
    if (page < LMDB_TXNID_AT + 8 || page % 8 != 0 || view.len < page + LMDB_TXNID_AT + 8) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "not an LMDB file's meta pages");
        return NULL;
    }
    const volatile uint64_t *first = (const volatile uint64_t *)((const char *)view.buf + LMDB_TXNID_AT);
    const volatile uint64_t *second = (const volatile uint64_t *)((const char *)view.buf + page + LMDB_TXNID_AT);
    uint64_t a = *first, b = *second;
    PyBuffer_Release(&view);
    return PyLong_FromUnsignedLongLong(a > b ? a : b);
}

/* ---- the get fast path ------------------------------------------------------------------- */

/* Getter(memtable, monotonic_s, index, slow, decoded): KeyIndex.lookup's common case in one call
 * (see kvlog.index.reads): a bytes key of at most MAX_DIRECT_KEY bytes that the memtable does
 * not hold, before the freshness deadline, in a complete index, read with a pooled read
 * transaction whose snapshot is still the newest (watch(snaps, meta, page_size) names the pool
 * and the data file's meta pages). Every other case, and any error on the way, is slow(key,
 * fresh_until)'s: the Python path, which gives every answer and raises every error. A value
 * not inline in its entry is decoded(key, raw)'s. */
typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *memtable, *clock, *index, *slow, *decoded, *snaps, *meta;
    Py_buffer view;
    Py_ssize_t page;
} Getter;

static PyObject *s_front, *s_frozen, *s_complete;

static PyObject *getter_slow(Getter *g, PyObject *key, PyObject *fresh) {
    PyObject *args[2] = {key, fresh};
    return PyObject_Vectorcall(g->slow, args, fresh != NULL ? 2 : 1, NULL);
}

/* The newest commit's id from the watched meta pages, or -1 when none are watched. */
static long long getter_newest(const Getter *g) {
    if (g->meta == NULL) {
        return -1;
    }
    const char *base = (const char *)g->view.buf;
    uint64_t a = *(const volatile uint64_t *)(base + LMDB_TXNID_AT);
    uint64_t b = *(const volatile uint64_t *)(base + g->page + LMDB_TXNID_AT);
    return (long long)(a > b ? a : b);
}

/* 1 if the memtable holds key (in front or frozen), 0 if not, -1 on error. */
static int getter_in_memtable(Getter *g, PyObject *key) {
    PyObject *names[2] = {s_front, s_frozen};
    for (int i = 0; i < 2; i++) {
        PyObject *table = PyObject_GetAttr(g->memtable, names[i]);
        if (table == NULL) {
            return -1;
        }
        int found = 0;
        if (PyDict_CheckExact(table)) {
            found = PyDict_Contains(table, key);
        } else if (table != Py_None) {
            found = 1; /* not a dict: the slow path reads it */
        }
        Py_DECREF(table);
        if (found != 0) {
            return found;
        }
    }
    return 0;
}

static PyObject *getter_call(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    Getter *g = (Getter *)self;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (kwnames != NULL || nargs < 1 || nargs > 2) {
        PyErr_SetString(PyExc_TypeError, "lookup(key, fresh_until=inf)");
        return NULL;
    }
    PyObject *key = args[0], *fresh = nargs == 2 ? args[1] : NULL;
    if (!PyBytes_CheckExact(key) || PyBytes_GET_SIZE(key) > MAX_DIRECT_KEY || PyBytes_GET_SIZE(key) == 0
        || g->meta == NULL || PyList_GET_SIZE(g->snaps) == 0) {
        return getter_slow(g, key, fresh);
    }
    int held = getter_in_memtable(g, key);
    if (held != 0) {
        return held < 0 ? NULL : getter_slow(g, key, fresh);
    }
    if (fresh != NULL) {
        double until = PyFloat_AsDouble(fresh);
        if (until == -1.0 && PyErr_Occurred()) {
            return NULL;
        }
        PyObject *now = PyObject_CallNoArgs(g->clock);
        if (now == NULL) {
            return NULL;
        }
        double t = PyFloat_AsDouble(now);
        Py_DECREF(now);
        if (t == -1.0 && PyErr_Occurred()) {
            return NULL;
        }
        if (t >= until) {
            return getter_slow(g, key, fresh);
        }
    }
    PyObject *complete = PyObject_GetAttr(g->index, s_complete);
    if (complete == NULL) {
        return NULL;
    }
    Py_DECREF(complete);
    if (complete != Py_True) {
        return getter_slow(g, key, fresh);
    }
    /* Take a pooled transaction (the list's last): this call alone uses it until it goes back. */
    Py_ssize_t n = PyList_GET_SIZE(g->snaps);
    if (n == 0) {
        return getter_slow(g, key, fresh);
    }
    PyObject *snap = Py_NewRef(PyList_GET_ITEM(g->snaps, n - 1));
    if (PyList_SetSlice(g->snaps, n - 1, n, NULL) < 0) {
        Py_DECREF(snap);
        return NULL;
    }
    if (!PyTuple_CheckExact(snap) || PyTuple_GET_SIZE(snap) != 3 || !PyList_CheckExact(PyTuple_GET_ITEM(snap, 2))) {
        Py_DECREF(snap);
        return getter_slow(g, key, fresh);
    }
    long long id = PyLong_AsLongLong(PyTuple_GET_ITEM(snap, 0));
    if (id == -1 && PyErr_Occurred()) {
        Py_DECREF(snap);
        return NULL;
    }
    if (id != getter_newest(g)) {
        Py_DECREF(snap); /* a commit landed since it began: the slow path takes the newer one */
        return getter_slow(g, key, fresh);
    }
    PyObject *runs = PyTuple_GET_ITEM(snap, 2), *raw = NULL;
    if (PyList_GET_SIZE(runs) > 0) {
        PyObject *pair = PyTuple_Pack(2, runs, key);
        if (pair == NULL) {
            Py_DECREF(snap);
            return NULL;
        }
        raw = find_first(NULL, pair);
        Py_DECREF(pair);
        if (raw == Py_None) {
            Py_CLEAR(raw);
        } else if (raw == NULL) {
            goto slow; /* a damaged run: the slow path says so */
        }
    }
    if (raw == NULL) {
        raw = PyObject_CallOneArg(PyTuple_GET_ITEM(snap, 1), key);
        if (raw == NULL) {
            goto slow; /* its transaction ended (the map was resized), or LMDB failed */
        }
    }
    if (raw == Py_None || (PyBytes_CheckExact(raw) && PyBytes_GET_SIZE(raw) == 0)) {
        Py_DECREF(raw); /* no such key, or deleted in a run */
        int put = PyList_Append(g->snaps, snap);
        Py_DECREF(snap);
        return put < 0 ? NULL : Py_NewRef(Py_None);
    }
    PyObject *pair[2] = {key, raw};
    PyObject *value = inline_of(NULL, pair, 2);
    if (value == NULL) {
        Py_DECREF(raw);
        goto slow; /* fails its checks: the slow path reads it again and raises */
    }
    if (PyList_Append(g->snaps, snap) < 0) {
        Py_DECREF(value);
        Py_DECREF(raw);
        Py_DECREF(snap);
        return NULL;
    }
    Py_DECREF(snap);
    if (value == Py_None) {
        Py_DECREF(value);
        value = PyObject_Vectorcall(g->decoded, pair, 2, NULL);
    }
    Py_DECREF(raw);
    return value;
slow:
    Py_DECREF(snap);
    if (!PyErr_ExceptionMatches(PyExc_Exception)) {
        return NULL;
    }
    PyErr_Clear();
    return getter_slow(g, key, fresh);
}

static void getter_unwatch(Getter *g) {
    if (g->meta != NULL) {
        PyBuffer_Release(&g->view);
        Py_CLEAR(g->meta);
    }
}

/* watch(snaps, meta, page_size): the pool to take transactions from, and the meta pages to check
 * them against (meta None: none are watched, every get takes the slow path). */
static PyObject *getter_watch(PyObject *self, PyObject *args) {
    Getter *g = (Getter *)self;
    PyObject *snaps, *meta;
    Py_ssize_t page;
    if (!PyArg_ParseTuple(args, "O!On", &PyList_Type, &snaps, &meta, &page)) {
        return NULL;
    }
    getter_unwatch(g);
    Py_INCREF(snaps);
    Py_XSETREF(g->snaps, snaps);
    if (meta == Py_None) {
        Py_RETURN_NONE;
    }
    if (get_buffer(meta, &g->view) < 0) {
        return NULL;
    }
    if (page < LMDB_TXNID_AT + 8 || page % 8 != 0 || g->view.len < page + LMDB_TXNID_AT + 8) {
        PyBuffer_Release(&g->view);
        PyErr_SetString(PyExc_ValueError, "not an LMDB file's meta pages");
        return NULL;
    }
    g->meta = Py_NewRef(meta);
    g->page = page;
    Py_RETURN_NONE;
}

static PyObject *getter_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    PyObject *memtable, *clock, *index, *slow, *decoded;
    if (kwds != NULL && PyDict_GET_SIZE(kwds) > 0) {
        PyErr_SetString(PyExc_TypeError, "Getter() takes positional arguments");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "OOOOO", &memtable, &clock, &index, &slow, &decoded)) {
        return NULL;
    }
    Getter *g = (Getter *)type->tp_alloc(type, 0);
    if (g == NULL) {
        return NULL;
    }
    g->vectorcall = getter_call;
    g->memtable = Py_NewRef(memtable);
    g->clock = Py_NewRef(clock);
    g->index = Py_NewRef(index);
    g->slow = Py_NewRef(slow);
    g->decoded = Py_NewRef(decoded);
    g->snaps = PyList_New(0);
    if (g->snaps == NULL) {
        Py_DECREF(g);
        return NULL;
    }
    return (PyObject *)g;
}

static int getter_traverse(PyObject *self, visitproc visit, void *arg) {
    Getter *g = (Getter *)self;
    Py_VISIT(g->memtable);
    Py_VISIT(g->clock);
    Py_VISIT(g->index);
    Py_VISIT(g->slow);
    Py_VISIT(g->decoded);
    Py_VISIT(g->snaps);
    Py_VISIT(g->meta);
    return 0;
}

static int getter_clear(PyObject *self) {
    Getter *g = (Getter *)self;
    getter_unwatch(g);
    Py_CLEAR(g->memtable);
    Py_CLEAR(g->clock);
    Py_CLEAR(g->index);
    Py_CLEAR(g->slow);
    Py_CLEAR(g->decoded);
    Py_CLEAR(g->snaps);
    return 0;
}

static void getter_dealloc(PyObject *self) {
    PyObject_GC_UnTrack(self);
    getter_clear(self);
    Py_TYPE(self)->tp_free(self);
}

static PyMethodDef getter_methods[] = {
    {"watch", getter_watch, METH_VARARGS, "The pool of read transactions, and the meta pages that date them."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject GetterType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "kvlog.index._runs.Getter",
    .tp_doc = "KeyIndex.lookup's common case in one call (see kvlog.index.reads).",
    .tp_basicsize = sizeof(Getter),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_new = getter_new,
    .tp_dealloc = getter_dealloc,
    .tp_traverse = getter_traverse,
    .tp_clear = getter_clear,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(Getter, vectorcall),
    .tp_methods = getter_methods,
};

/* Adds Getter to module m; -1 on error. */
static int runs_get_init(PyObject *m) {
    s_front = PyUnicode_InternFromString("front");
    s_frozen = PyUnicode_InternFromString("frozen");
    s_complete = PyUnicode_InternFromString("_complete");
    if (s_front == NULL || s_frozen == NULL || s_complete == NULL || PyType_Ready(&GetterType) < 0) {
        return -1;
    }
    return PyModule_AddObjectRef(m, "Getter", (PyObject *)&GetterType);
}

#endif
