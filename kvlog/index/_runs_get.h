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

/* *dict_out = obj's instance dict (a new reference), or NULL when it has none (its attributes
 * are slots); -1 on error. A get reads its objects' plain attributes there (attr_in), past the
 * generic lookup: they are never descriptors, and no one assigns their __dict__. */
static int dict_of(PyObject *obj, PyObject **dict_out) {
    *dict_out = NULL;
    PyObject *d = PyObject_GetAttrString(obj, "__dict__");
    if (d == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_AttributeError)) {
            return -1;
        }
        PyErr_Clear();
        return 0;
    }
    if (PyDict_CheckExact(d)) {
        *dict_out = d;
    } else {
        Py_DECREF(d);
    }
    return 0;
}

/* obj.name (a new reference), read in d (dict_of(obj), or NULL) when d holds it. */
static inline PyObject *attr_in(PyObject *obj, PyObject *d, PyObject *name) {
    if (d != NULL) {
        PyObject *value = PyDict_GetItemWithError(d, name);
        if (value != NULL) {
            return Py_NewRef(value);
        }
        if (PyErr_Occurred()) {
            return NULL;
        }
    }
    return PyObject_GetAttr(obj, name);
}

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
    PyObject *memtable, *clock, *index, *slow, *decoded, *snaps, *meta, *gate, *inside;
    PyObject *memtable_dict, *index_dict; /* their instance dicts (dict_of), or NULL */
    Py_buffer view;
    Py_ssize_t page;
} Getter;

static PyObject *s_front, *s_frozen, *s_complete, *s_epoch;

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
        PyObject *table = attr_in(g->memtable, g->memtable_dict, names[i]);
        if (table == NULL) {
            return -1;
        }
        int found = 0;
        if (PyDict_CheckExact(table)) {
            found = PyDict_GET_SIZE(table) > 0 ? PyDict_Contains(table, key) : 0;
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

/* What getter_pooled found. */
enum { POOLED_VALUE, POOLED_DECODE, POOLED_SLOW, POOLED_SLOW_ON_ERROR, POOLED_ERROR };

/* The lookup of key in a pooled transaction, inside the map's gate: POOLED_VALUE with *value
 * (None: no such key, or deleted; *raw set too, or None), POOLED_DECODE with *raw (a value not
 * inline), POOLED_SLOW (the slow path answers), POOLED_SLOW_ON_ERROR (an exception is set: the
 * slow path answers if it is an Exception) or POOLED_ERROR. Never calls out of the gate. */
static int getter_pooled(Getter *g, PyObject *key, PyObject **raw_out, PyObject **value_out) {
    /* Take a pooled transaction (the list's last): this call alone uses it until it goes back. */
    Py_ssize_t n = PyList_GET_SIZE(g->snaps);
    if (n == 0) {
        return POOLED_SLOW;
    }
    PyObject *epoch = PyObject_GetAttr(g->gate, s_epoch);
    if (epoch == NULL) {
        return POOLED_ERROR;
    }
    long long e = PyLong_AsLongLong(epoch);
    Py_DECREF(epoch);
    if (e == -1 && PyErr_Occurred()) {
        return POOLED_ERROR;
    }
    if (e & 1) {
        return POOLED_SLOW; /* a resize is under way */
    }
    PyObject *snap = Py_NewRef(PyList_GET_ITEM(g->snaps, n - 1));
    if (PyList_SetSlice(g->snaps, n - 1, n, NULL) < 0) {
        Py_DECREF(snap);
        return POOLED_ERROR;
    }
    if (!PyTuple_CheckExact(snap) || PyTuple_GET_SIZE(snap) != 4 || !PyList_CheckExact(PyTuple_GET_ITEM(snap, 2))
        || !PyLong_CheckExact(PyTuple_GET_ITEM(snap, 3))) {
        Py_DECREF(snap);
        return POOLED_SLOW;
    }
    long long id = PyLong_AsLongLong(PyTuple_GET_ITEM(snap, 0));
    if (id == -1 && PyErr_Occurred()) {
        Py_DECREF(snap);
        return POOLED_ERROR;
    }
    if (id != getter_newest(g)) {
        Py_DECREF(snap); /* a commit landed since it began: the slow path takes the newer one */
        return POOLED_SLOW;
    }
    long long tag = PyLong_AsLongLong(PyTuple_GET_ITEM(snap, 3));
    if (tag == -1 && PyErr_Occurred()) {
        Py_DECREF(snap);
        return POOLED_ERROR;
    }
    if (tag != e) {
        Py_DECREF(snap); /* its transaction and views died with a resize of the map */
        return POOLED_SLOW;
    }
    PyObject *runs = PyTuple_GET_ITEM(snap, 2), *raw = NULL;
    if (PyList_GET_SIZE(runs) > 0) {
        PyObject *pair = PyTuple_Pack(2, runs, key);
        if (pair == NULL) {
            Py_DECREF(snap);
            return POOLED_ERROR;
        }
        raw = find_first(NULL, pair);
        Py_DECREF(pair);
        if (raw == Py_None) {
            Py_CLEAR(raw);
        } else if (raw == NULL) {
            Py_DECREF(snap);
            return POOLED_SLOW_ON_ERROR; /* a damaged run: the slow path says so */
        }
    }
    if (raw == NULL) {
        raw = PyObject_CallOneArg(PyTuple_GET_ITEM(snap, 1), key);
        if (raw == NULL) {
            Py_DECREF(snap);
            return POOLED_SLOW_ON_ERROR; /* its transaction ended, or LMDB failed */
        }
    }
    if (raw == Py_None || (PyBytes_CheckExact(raw) && PyBytes_GET_SIZE(raw) == 0)) {
        int put = PyList_Append(g->snaps, snap); /* no such key, or deleted in a run */
        Py_DECREF(snap);
        if (put < 0) {
            Py_DECREF(raw);
            return POOLED_ERROR;
        }
        *raw_out = raw;
        *value_out = Py_NewRef(Py_None);
        return POOLED_VALUE;
    }
    PyObject *pair[2] = {key, raw};
    PyObject *value = inline_of(NULL, pair, 2);
    if (value == NULL) {
        Py_DECREF(raw);
        Py_DECREF(snap);
        return POOLED_SLOW_ON_ERROR; /* fails its checks: the slow path reads it again and raises */
    }
    int put = PyList_Append(g->snaps, snap);
    Py_DECREF(snap);
    if (put < 0) {
        Py_DECREF(value);
        Py_DECREF(raw);
        return POOLED_ERROR;
    }
    *raw_out = raw;
    if (value == Py_None) {
        Py_DECREF(value);
        return POOLED_DECODE;
    }
    *value_out = value;
    return POOLED_VALUE;
}

/* The lookup of key with freshness deadline fresh (NULL: none): what calling the Getter gives. */
static PyObject *getter_lookup(Getter *g, PyObject *key, PyObject *fresh) {
    if (!PyBytes_CheckExact(key) || PyBytes_GET_SIZE(key) > MAX_DIRECT_KEY || PyBytes_GET_SIZE(key) == 0
        || g->meta == NULL || g->inside == NULL || PyList_GET_SIZE(g->snaps) == 0) {
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
    PyObject *complete = attr_in(g->index, g->index_dict, s_complete);
    if (complete == NULL) {
        return NULL;
    }
    Py_DECREF(complete);
    if (complete != Py_True) {
        return getter_slow(g, key, fresh);
    }
    /* Enter the map's gate (kvlog.meta.map_gate): no resize while the pooled transaction and
     * its views are used; during a resize, the slow path (which waits for it). */
    if (PyList_Append(g->inside, Py_None) < 0) {
        return NULL;
    }
    PyObject *raw = NULL, *value = NULL;
    int outcome = getter_pooled(g, key, &raw, &value);
    Py_ssize_t inside = PyList_GET_SIZE(g->inside);
    if (PyList_SetSlice(g->inside, inside - 1, inside, NULL) < 0) { /* leave the gate */
        Py_XDECREF(raw);
        Py_XDECREF(value);
        return NULL;
    }
    switch (outcome) {
    case POOLED_VALUE:
        Py_DECREF(raw);
        return value;
    case POOLED_DECODE: {
        PyObject *pair[2] = {key, raw};
        value = PyObject_Vectorcall(g->decoded, pair, 2, NULL); /* reads a data file: outside */
        Py_DECREF(raw);
        return value;
    }
    case POOLED_ERROR:
        return NULL;
    default:
        if (outcome == POOLED_SLOW_ON_ERROR) {
            if (!PyErr_ExceptionMatches(PyExc_Exception)) {
                return NULL;
            }
            PyErr_Clear();
        }
        return getter_slow(g, key, fresh);
    }
}

static PyObject *getter_call(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (kwnames != NULL || nargs < 1 || nargs > 2) {
        PyErr_SetString(PyExc_TypeError, "lookup(key, fresh_until=inf)");
        return NULL;
    }
    return getter_lookup((Getter *)self, args[0], nargs == 2 ? args[1] : NULL);
}

static void getter_unwatch(Getter *g) {
    if (g->meta != NULL) {
        PyBuffer_Release(&g->view);
        Py_CLEAR(g->meta);
    }
}

/* watch(snaps, meta, page_size, gate): the pool to take transactions from, the meta pages to
 * check them against (meta None: none are watched, every get takes the slow path), and the gate
 * of the map's views (its epoch dates the runs' views). */
static PyObject *getter_watch(PyObject *self, PyObject *args) {
    Getter *g = (Getter *)self;
    PyObject *snaps, *meta, *gate;
    Py_ssize_t page;
    if (!PyArg_ParseTuple(args, "O!OnO", &PyList_Type, &snaps, &meta, &page, &gate)) {
        return NULL;
    }
    getter_unwatch(g);
    Py_INCREF(snaps);
    Py_XSETREF(g->snaps, snaps);
    PyObject *inside = PyObject_GetAttrString(gate, "inside");
    if (inside == NULL) {
        return NULL;
    }
    if (!PyList_CheckExact(inside)) {
        Py_DECREF(inside);
        PyErr_SetString(PyExc_TypeError, "the gate's inside must be a list");
        return NULL;
    }
    Py_XSETREF(g->inside, inside);
    Py_INCREF(gate);
    Py_XSETREF(g->gate, gate);
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
    if (g->snaps == NULL || dict_of(memtable, &g->memtable_dict) < 0 || dict_of(index, &g->index_dict) < 0) {
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
    Py_VISIT(g->memtable_dict);
    Py_VISIT(g->index_dict);
    Py_VISIT(g->slow);
    Py_VISIT(g->decoded);
    Py_VISIT(g->snaps);
    Py_VISIT(g->meta);
    Py_VISIT(g->gate);
    Py_VISIT(g->inside);
    return 0;
}

static int getter_clear(PyObject *self) {
    Getter *g = (Getter *)self;
    getter_unwatch(g);
    Py_CLEAR(g->memtable);
    Py_CLEAR(g->clock);
    Py_CLEAR(g->index);
    Py_CLEAR(g->memtable_dict);
    Py_CLEAR(g->index_dict);
    Py_CLEAR(g->slow);
    Py_CLEAR(g->decoded);
    Py_CLEAR(g->snaps);
    Py_CLEAR(g->gate);
    Py_CLEAR(g->inside);
    return 0;
}

static void getter_dealloc(PyObject *self) {
    PyObject_GC_UnTrack(self);
    getter_clear(self);
    Py_TYPE(self)->tp_free(self);
}

static PyMethodDef getter_methods[] = {
    {"watch", getter_watch, METH_VARARGS, "The pool of read transactions, the meta pages that date them, and the map's gate."},
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
    s_epoch = PyUnicode_InternFromString("epoch");
    if (s_front == NULL || s_frozen == NULL || s_complete == NULL || s_epoch == NULL || PyType_Ready(&GetterType) < 0) {
        return -1;
    }
    return PyModule_AddObjectRef(m, "Getter", (PyObject *)&GetterType);
}

#endif
