/*
 * A forward scan's entries in C, for kvlog/index/_runs.c (which includes this once, after
 * _index_entry.h and _key_order.h): ScanWalk walks the B-tree's cursor merged with an overlay
 * of the memtable's and the pending runs' entries (see kvlog.index.merged and the Python twins
 * in _runs_py.py).
 */
#ifndef KVLOG_SCAN_WALK_H
#define KVLOG_SCAN_WALK_H

/* ---- scan walks ---------------------------------------------------------------------------- */

/* ScanWalk(source, overlay, at, overlay_done, upper, resume, now_ms, held): an iterator of a
 * forward scan's (key, value) pairs, merging the B-tree's entries (source: an iterator of
 * (lmdb_key, index value) pairs from a cursor, or None) with the overlay (a sorted list of
 * (key, item) from the memtable and the pending runs, read from position at; item: the value,
 * None for a key hidden, anything else for Python to read), the overlay winning a key. It
 * stops (StopIteration, state set) at the end of the range (END), at what it cannot hand out
 * itself: a B-tree pair to decode in Python, damaged or with its value in a data file (TREE:
 * held), an overlay item that is not a value (OVERLAY: item), the overlay list consumed while
 * more may follow (REFILL), an error of the source (ERROR: error), the B-tree's first long key
 * (RESUME: resume, the bound to read on from); or when cleared (CLEARED). It never raises
 * while iterating, so its caller turns every failure into the store's own errors. */

enum { WALK_RUNNING, WALK_END, WALK_TREE, WALK_OVERLAY, WALK_REFILL, WALK_ERROR, WALK_RESUME, WALK_CLEARED };

typedef struct {
    PyObject_HEAD
    PyObject *source;   /* iterator, or NULL once exhausted */
    PyObject *overlay;  /* list */
    Py_ssize_t at;
    int overlay_done;
    PyObject *upper;    /* bytes or NULL */
    PyObject *resume;   /* bytes or NULL */
    long long now_ms;
    PyObject *held;     /* the B-tree pair pulled and not handed out, or NULL */
    PyObject *item;     /* WALK_OVERLAY: the overlay pair */
    PyObject *error;    /* WALK_ERROR: the exception */
    int state;
} ScanWalk;

static void walk_dealloc(ScanWalk *self) {
    Py_XDECREF(self->source);
    Py_XDECREF(self->overlay);
    Py_XDECREF(self->upper);
    Py_XDECREF(self->resume);
    Py_XDECREF(self->held);
    Py_XDECREF(self->item);
    Py_XDECREF(self->error);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int walk_init(ScanWalk *self, PyObject *args, PyObject *kwds) {
    PyObject *source, *overlay, *upper, *resume, *held;
    Py_ssize_t at;
    int overlay_done;
    long long now_ms;
    if (!PyArg_ParseTuple(args, "OO!npOOLO", &source, &PyList_Type, &overlay, &at, &overlay_done, &upper,
                          &resume, &now_ms, &held)) {
        return -1;
    }
    if ((upper != Py_None && !PyBytes_Check(upper)) || (resume != Py_None && !PyBytes_Check(resume))
        || (held != Py_None && (!PyTuple_Check(held) || PyTuple_GET_SIZE(held) != 2))
        || (source != Py_None && !PyIter_Check(source)) || at < 0) {
        PyErr_SetString(PyExc_TypeError, "ScanWalk() takes an iterator or None, a list, a position, a flag, "
                                         "bytes or None twice, a time and a pair or None");
        return -1;
    }
    Py_XSETREF(self->source, source == Py_None ? NULL : Py_NewRef(source));
    Py_XSETREF(self->overlay, Py_NewRef(overlay));
    Py_XSETREF(self->upper, upper == Py_None ? NULL : Py_NewRef(upper));
    Py_XSETREF(self->resume, resume == Py_None ? NULL : Py_NewRef(resume));
    Py_XSETREF(self->held, held == Py_None ? NULL : Py_NewRef(held));
    Py_CLEAR(self->item);
    Py_CLEAR(self->error);
    self->at = at;
    self->overlay_done = overlay_done;
    self->now_ms = now_ms;
    self->state = WALK_RUNNING;
    return 0;
}

static int bytes_order(PyObject *a, PyObject *b) {
    return key_order(PyBytes_AS_STRING(a), (size_t)PyBytes_GET_SIZE(a), PyBytes_AS_STRING(b),
                     (size_t)PyBytes_GET_SIZE(b));
}

/* Stop with the exception set as the walk's error. */
static PyObject *walk_fail(ScanWalk *self) {
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    if (value != NULL && tb != NULL) {
        PyException_SetTraceback(value, tb);
    }
    Py_XDECREF(type);
    Py_XDECREF(tb);
    Py_XSETREF(self->error, value != NULL ? value : Py_NewRef(Py_None));
    self->state = WALK_ERROR;
    return NULL;
}

static PyObject *walk_next(ScanWalk *self) {
    for (;;) {
        if (self->state != WALK_RUNNING) {
            return NULL;
        }
        if (self->held == NULL && self->source != NULL) {
            PyObject *pair = PyIter_Next(self->source);
            if (pair == NULL) {
                if (PyErr_Occurred()) {
                    return walk_fail(self);
                }
                Py_CLEAR(self->source);
            } else if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2 || !PyBytes_Check(PyTuple_GET_ITEM(pair, 0))
                       || !PyBytes_Check(PyTuple_GET_ITEM(pair, 1))) {
                Py_DECREF(pair);
                PyErr_SetString(PyExc_TypeError, "a scan's source yields (bytes, bytes) pairs");
                return walk_fail(self);
            } else {
                PyObject *key = PyTuple_GET_ITEM(pair, 0);
                if (self->upper != NULL && bytes_order(key, self->upper) >= 0) {
                    Py_DECREF(pair);
                    Py_CLEAR(self->source);
                } else if (PyBytes_GET_SIZE(key) > MAX_DIRECT_KEY) {
                    /* A long key's group: every real key of it is > its first bytes + b"\0". */
                    PyObject *bound = PyBytes_FromStringAndSize(NULL, MAX_DIRECT_KEY + 1);
                    if (bound == NULL) {
                        Py_DECREF(pair);
                        return walk_fail(self);
                    }
                    memcpy(PyBytes_AS_STRING(bound), PyBytes_AS_STRING(key), MAX_DIRECT_KEY);
                    Py_DECREF(pair); /* key was borrowed from it */
                    PyBytes_AS_STRING(bound)[MAX_DIRECT_KEY] = 0;
                    Py_XSETREF(self->resume, bound);
                    Py_XSETREF(self->upper, Py_NewRef(bound));
                    Py_CLEAR(self->source);
                } else {
                    self->held = pair;
                }
            }
        }
        Py_ssize_t count = PyList_GET_SIZE(self->overlay);
        PyObject *next = NULL; /* the overlay's next pair (borrowed) */
        int overlay_left = 0;
        if (self->at < count) {
            next = PyList_GET_ITEM(self->overlay, self->at);
            if (!PyTuple_Check(next) || PyTuple_GET_SIZE(next) != 2 || !PyBytes_Check(PyTuple_GET_ITEM(next, 0))) {
                PyErr_SetString(PyExc_TypeError, "a scan's overlay holds (bytes, item) pairs");
                return walk_fail(self);
            }
            if (self->upper != NULL && bytes_order(PyTuple_GET_ITEM(next, 0), self->upper) >= 0) {
                next = NULL; /* past the range: the overlay is done */
            } else {
                overlay_left = 1;
            }
        } else if (!self->overlay_done) {
            self->state = WALK_REFILL;
            return NULL;
        }
        if (self->held == NULL && !overlay_left) {
            self->state = self->resume != NULL ? WALK_RESUME : WALK_END;
            return NULL;
        }
        int order = self->held == NULL ? 1 : !overlay_left ? -1
                    : bytes_order(PyTuple_GET_ITEM(self->held, 0), PyTuple_GET_ITEM(next, 0));
        if (order < 0) {
            PyObject *key = PyTuple_GET_ITEM(self->held, 0), *value = PyTuple_GET_ITEM(self->held, 1);
            Entry e;
            if (entry_open(PyBytes_AS_STRING(key), (size_t)PyBytes_GET_SIZE(key),
                           (const uint8_t *)PyBytes_AS_STRING(value), (size_t)PyBytes_GET_SIZE(value), &e) < 0) {
                self->state = WALK_TREE; /* damaged: for Python to raise */
                return NULL;
            }
            if ((e.flags & FLAG_EXPIRES) && self->now_ms >= e.expires) {
                Py_CLEAR(self->held);
                continue;
            }
            if (e.inline_value == NULL) {
                self->state = WALK_TREE; /* its value is in a data file */
                return NULL;
            }
            PyObject *out = PyTuple_New(2);
            PyObject *inline_value = PyBytes_FromStringAndSize(e.inline_value, (Py_ssize_t)e.inline_len);
            if (out == NULL || inline_value == NULL) {
                Py_XDECREF(out);
                Py_XDECREF(inline_value);
                return walk_fail(self);
            }
            PyTuple_SET_ITEM(out, 0, Py_NewRef(key));
            PyTuple_SET_ITEM(out, 1, inline_value);
            Py_CLEAR(self->held);
            return out;
        }
        if (order == 0) {
            Py_CLEAR(self->held); /* the overlay's entry is newer */
        }
        self->at++;
        PyObject *item = PyTuple_GET_ITEM(next, 1);
        if (item == Py_None) {
            continue;
        }
        if (PyBytes_CheckExact(item)) {
            return Py_NewRef(next);
        }
        Py_XSETREF(self->item, Py_NewRef(next));
        self->state = WALK_OVERLAY;
        return NULL;
    }
}

static PyObject *walk_clear(ScanWalk *self, PyObject *unused) {
    self->state = WALK_CLEARED;
    Py_CLEAR(self->source);
    Py_RETURN_NONE;
}

static PyObject *field(PyObject *value) {
    return Py_NewRef(value != NULL ? value : Py_None);
}

static PyObject *walk_get_state(ScanWalk *self, void *closure) { return PyLong_FromLong(self->state); }
static PyObject *walk_get_at(ScanWalk *self, void *closure) { return PyLong_FromSsize_t(self->at); }
static PyObject *walk_get_source(ScanWalk *self, void *closure) { return field(self->source); }
static PyObject *walk_get_upper(ScanWalk *self, void *closure) { return field(self->upper); }
static PyObject *walk_get_resume(ScanWalk *self, void *closure) { return field(self->resume); }
static PyObject *walk_get_held(ScanWalk *self, void *closure) { return field(self->held); }
static PyObject *walk_get_item(ScanWalk *self, void *closure) { return field(self->item); }
static PyObject *walk_get_error(ScanWalk *self, void *closure) { return field(self->error); }

static PyGetSetDef walk_getset[] = {
    {"state", (getter)walk_get_state, NULL, "Why it stopped (0: it has not).", NULL},
    {"at", (getter)walk_get_at, NULL, "The overlay's next position.", NULL},
    {"source", (getter)walk_get_source, NULL, "The source, None once exhausted.", NULL},
    {"upper", (getter)walk_get_upper, NULL, "The range's upper bound (None: none).", NULL},
    {"resume", (getter)walk_get_resume, NULL, "The bound to read on from (a long key met).", NULL},
    {"held", (getter)walk_get_held, NULL, "The B-tree pair pulled and not handed out.", NULL},
    {"item", (getter)walk_get_item, NULL, "The overlay pair for Python to read.", NULL},
    {"error", (getter)walk_get_error, NULL, "The source's error.", NULL},
    {NULL},
};

static PyMethodDef walk_methods[] = {
    {"clear", (PyCFunction)walk_clear, METH_NOARGS, "Stop: the next step ends the iteration."},
    {NULL},
};

static PyTypeObject ScanWalkType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "kvlog.index._runs.ScanWalk",
    .tp_basicsize = sizeof(ScanWalk),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A forward scan's pairs: the B-tree's entries merged with an overlay.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)walk_init,
    .tp_dealloc = (destructor)walk_dealloc,
    .tp_iter = PyObject_SelfIter,
    .tp_iternext = (iternextfunc)walk_next,
    .tp_getset = walk_getset,
    .tp_methods = walk_methods,
};

#endif /* KVLOG_SCAN_WALK_H */
