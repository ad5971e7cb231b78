/*
 * The overlay of a forward scan in C, for kvlog/index/_runs.c (which includes this once, after
 * the index runs' Run, span_of and lower_bound): RunMerge merges the memtable's writes and the
 * pending runs, newest first, a chunk at a time (see kvlog.index.merged and the Python twin in
 * _run_merge_py.py).
 *
 * A chunk's call reads every run in place (its caller holds the map's gate, see
 * kvlog.meta.map_gate): the first one finds each run's first entry in the range by binary
 * search, then the sources are merged key by key, so a short scan reads about as many entries
 * of the runs as it hands out, each run's next key compared and nothing sorted. Only positions
 * are kept between calls, never a pointer into a run.
 */
#ifndef KVLOG_RUN_MERGE_H
#define KVLOG_RUN_MERGE_H

/* RunMerge(front, runs, lower, upper, now_ms): front a sorted list of (key, memtable entry),
 * runs a list of index runs newest first (read in place), lower and upper bytes or None. */
typedef struct {
    PyObject_HEAD
    PyObject *front;       /* list */
    Py_ssize_t front_at;
    PyObject *runs;        /* tuple */
    PyObject *lower;       /* bytes or NULL */
    PyObject *upper;       /* bytes or NULL */
    long long now_ms;
    Py_ssize_t count;      /* runs */
    uint32_t *pos;         /* each run's next entry, once sought */
    uint32_t *end;         /* each run's first entry past the range */
    Py_buffer *views;      /* a call's buffers of the runs, count of them */
    Run *open;             /* a call's opened runs */
    int sought;
} RunMerge;

static void run_merge_dealloc(RunMerge *self) {
    Py_XDECREF(self->front);
    Py_XDECREF(self->runs);
    Py_XDECREF(self->lower);
    Py_XDECREF(self->upper);
    PyMem_Free(self->pos);
    PyMem_Free(self->end);
    PyMem_Free(self->views);
    PyMem_Free(self->open);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int run_merge_init(RunMerge *self, PyObject *args, PyObject *kwds) {
    PyObject *front, *runs, *lower, *upper;
    long long now_ms;
    if (!PyArg_ParseTuple(args, "O!O!OOL", &PyList_Type, &front, &PyList_Type, &runs, &lower, &upper, &now_ms)) {
        return -1;
    }
    if ((lower != Py_None && !PyBytes_Check(lower)) || (upper != Py_None && !PyBytes_Check(upper))) {
        PyErr_SetString(PyExc_TypeError, "RunMerge() takes two lists, bytes or None twice and a time");
        return -1;
    }
    PyObject *held = PyList_AsTuple(runs);
    if (held == NULL) {
        return -1;
    }
    Py_ssize_t count = PyTuple_GET_SIZE(held);
    size_t n = count > 0 ? (size_t)count : 1;
    uint32_t *pos = PyMem_Calloc(n, sizeof(uint32_t)), *end = PyMem_Calloc(n, sizeof(uint32_t));
    Py_buffer *views = PyMem_Calloc(n, sizeof(Py_buffer));
    Run *open = PyMem_Calloc(n, sizeof(Run));
    if (pos == NULL || end == NULL || views == NULL || open == NULL) {
        PyMem_Free(pos);
        PyMem_Free(end);
        PyMem_Free(views);
        PyMem_Free(open);
        Py_DECREF(held);
        PyErr_NoMemory();
        return -1;
    }
    PyMem_Free(self->pos);
    PyMem_Free(self->end);
    PyMem_Free(self->views);
    PyMem_Free(self->open);
    self->pos = pos;
    self->end = end;
    self->views = views;
    self->open = open;
    self->count = count;
    Py_XSETREF(self->runs, held);
    Py_XSETREF(self->front, Py_NewRef(front));
    Py_XSETREF(self->lower, lower == Py_None ? NULL : Py_NewRef(lower));
    Py_XSETREF(self->upper, upper == Py_None ? NULL : Py_NewRef(upper));
    self->front_at = 0;
    self->now_ms = now_ms;
    self->sought = 0;
    return 0;
}

/* Entry i of an open run checked as run_entry does, without copying: its key, and its value
 * taken apart into *e (*deletion set for a deletion); -1 (ValueError) if it is damaged. */
static int merge_entry(const Run *run, uint32_t i, const char **key, size_t *klen, Entry *e, int *deletion) {
    uint32_t ks, ke, vs, ve;
    if (span_of(run->key_end, i, run->key_bytes, &ks, &ke) < 0
        || span_of(run->value_end, i, run->value_bytes, &vs, &ve) < 0) {
        return -1;
    }
    *key = run->keys + ks;
    *klen = ke - ks;
    const uint8_t *value = (const uint8_t *)run->values + vs;
    if (*klen == 0 || *klen > MAX_DIRECT_KEY) {
        PyErr_SetString(PyExc_ValueError, BAD_RUN);
        return -1;
    }
    *deletion = ve - vs == DELETION_BYTES;
    if (*deletion) {
        if (crc32c_extend(0, *key, *klen) != load_be32(value)) {
            PyErr_SetString(PyExc_ValueError, BAD_ENTRY);
            return -1;
        }
        return 0;
    }
    if (entry_open(*key, *klen, value, ve - vs, e) < 0 || (e->flags & FLAG_LONG)) {
        PyErr_SetString(PyExc_ValueError, BAD_ENTRY);
        return -1;
    }
    return 0;
}

/* The scan's item of a checked run entry: None (a deletion, or expired at now_ms), the inline
 * value, or (partition, offset, expiry or None) of a value in a data file. */
static PyObject *merge_item(const Entry *e, int deletion, long long now_ms) {
    if (deletion || ((e->flags & FLAG_EXPIRES) && now_ms >= e->expires)) {
        return Py_NewRef(Py_None);
    }
    if (e->inline_value != NULL) {
        return PyBytes_FromStringAndSize(e->inline_value, (Py_ssize_t)e->inline_len);
    }
    if (e->flags & FLAG_EXPIRES) {
        return Py_BuildValue("(HKL)", e->partition, (unsigned long long)e->offset, (long long)e->expires);
    }
    return Py_BuildValue("(HKO)", e->partition, (unsigned long long)e->offset, Py_None);
}

/* Run r's key at its position into *key and *klen; -1 (ValueError) if damaged. */
static int merge_head(const RunMerge *self, Py_ssize_t r, const char **key, size_t *klen) {
    uint32_t s, e;
    if (span_of(self->open[r].key_end, self->pos[r], self->open[r].key_bytes, &s, &e) < 0) {
        return -1;
    }
    *key = self->open[r].keys + s;
    *klen = e - s;
    return 0;
}

/* Move run r past the key it holds (key, checked), its next key checked to be greater. */
static int merge_step(RunMerge *self, Py_ssize_t r, const char *key, size_t klen, const char **next,
                      size_t *next_len) {
    self->pos[r]++;
    if (self->pos[r] >= self->end[r]) {
        return 0;
    }
    if (merge_head(self, r, next, next_len) < 0) {
        return -1;
    }
    if (key_order(key, klen, *next, *next_len) >= 0) {
        PyErr_SetString(PyExc_ValueError, BAD_RUN);
        return -1;
    }
    return 0;
}

/* Open the runs still to read (all of them, and find their range, on the first call). */
static int merge_open(RunMerge *self, Py_ssize_t *opened) {
    for (Py_ssize_t r = 0; r < self->count; r++) {
        if (self->sought && self->pos[r] >= self->end[r]) {
            self->views[r].obj = NULL;
            continue;
        }
        self->views[r].obj = NULL;
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(self->runs, r), &self->views[r], PyBUF_SIMPLE) < 0) {
            return -1;
        }
        *opened = r + 1;
        if (run_open(&self->views[r], &self->open[r]) < 0) {
            return -1;
        }
    }
    if (!self->sought) {
        for (Py_ssize_t r = 0; r < self->count; r++) {
            uint32_t first = 0, stop = self->open[r].count;
            if ((self->lower != NULL && lower_bound(&self->open[r], PyBytes_AS_STRING(self->lower),
                                                    (size_t)PyBytes_GET_SIZE(self->lower), &first) < 0)
                || (self->upper != NULL && lower_bound(&self->open[r], PyBytes_AS_STRING(self->upper),
                                                       (size_t)PyBytes_GET_SIZE(self->upper), &stop) < 0)) {
                return -1;
            }
            self->pos[r] = first;
            self->end[r] = stop < first ? first : stop;
        }
        self->sought = 1;
    }
    return 0;
}

/* The next of the merge's keys into out, at most size of them; -1 with an error set. */
static int merge_fill(RunMerge *self, PyObject *out, Py_ssize_t size, const char **heads, size_t *lens) {
    for (Py_ssize_t r = 0; r < self->count; r++) {
        if (self->pos[r] < self->end[r] && merge_head(self, r, &heads[r], &lens[r]) < 0) {
            return -1;
        }
    }
    Py_ssize_t front_len = PyList_GET_SIZE(self->front);
    while (PyList_GET_SIZE(out) < size) {
        PyObject *pair = NULL; /* the front's next pair (borrowed) */
        const char *least = NULL;
        size_t least_len = 0;
        Py_ssize_t from = -1; /* the newest source holding the least key: -1 the front */
        if (self->front_at < front_len) {
            pair = PyList_GET_ITEM(self->front, self->front_at);
            if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2 || !PyBytes_Check(PyTuple_GET_ITEM(pair, 0))) {
                PyErr_SetString(PyExc_TypeError, "RunMerge()'s front holds (bytes, entry) pairs");
                return -1;
            }
            least = PyBytes_AS_STRING(PyTuple_GET_ITEM(pair, 0));
            least_len = (size_t)PyBytes_GET_SIZE(PyTuple_GET_ITEM(pair, 0));
        }
        for (Py_ssize_t r = 0; r < self->count; r++) {
            if (self->pos[r] < self->end[r]
                && (least == NULL || key_order(heads[r], lens[r], least, least_len) < 0)) {
                least = heads[r];
                least_len = lens[r];
                from = r;
            }
        }
        if (least == NULL) {
            return 0;
        }
        PyObject *entry = NULL;
        if (from < 0) {
            entry = Py_NewRef(pair);
            self->front_at++;
        }
        /* Every run holding the least key moves past it: the newest one's entry is the item,
         * the older ones' are checked and hidden by it. */
        for (Py_ssize_t r = from < 0 ? 0 : from; r < self->count; r++) {
            if (self->pos[r] >= self->end[r] || key_order(heads[r], lens[r], least, least_len) != 0) {
                continue;
            }
            const char *key;
            size_t klen;
            Entry e;
            int deletion;
            if (merge_entry(&self->open[r], self->pos[r], &key, &klen, &e, &deletion) < 0) {
                Py_XDECREF(entry);
                return -1;
            }
            if (entry == NULL) {
                PyObject *item = merge_item(&e, deletion, self->now_ms);
                PyObject *k = item == NULL ? NULL : PyBytes_FromStringAndSize(key, (Py_ssize_t)klen);
                entry = k == NULL ? NULL : PyTuple_New(2);
                if (entry == NULL) {
                    Py_XDECREF(item);
                    Py_XDECREF(k);
                    return -1;
                }
                PyTuple_SET_ITEM(entry, 0, k);
                PyTuple_SET_ITEM(entry, 1, item);
            }
            if (merge_step(self, r, key, klen, &heads[r], &lens[r]) < 0) {
                Py_DECREF(entry);
                return -1;
            }
        }
        int failed = PyList_Append(out, entry);
        Py_DECREF(entry);
        if (failed < 0) {
            return -1;
        }
    }
    return 0;
}

/* chunk(size) -> (pairs, done): the merge's next keys, at most size of them, in order, each
 * once as (key, item): the front's entry as given, else the newest run's as the scan's item
 * (None for a deletion or an entry expired at now_ms, the inline value, or (partition, offset,
 * expiry or None)); done when every source is read. Damage raises ValueError. */
static PyObject *run_merge_chunk(RunMerge *self, PyObject *arg) {
    Py_ssize_t size = PyLong_AsSsize_t(arg);
    if (size == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (size < 1 || self->front == NULL) {
        PyErr_SetString(PyExc_ValueError, "RunMerge.chunk() takes a size of at least 1");
        return NULL;
    }
    PyObject *out = PyList_New(0);
    if (out == NULL) {
        return NULL;
    }
    size_t n = self->count > 0 ? (size_t)self->count : 1;
    const char **heads = PyMem_Malloc(n * sizeof(const char *));
    size_t *lens = PyMem_Malloc(n * sizeof(size_t));
    Py_ssize_t opened = 0;
    int failed = heads == NULL || lens == NULL;
    if (failed) {
        PyErr_NoMemory();
    } else {
        failed = merge_open(self, &opened) < 0 || merge_fill(self, out, size, heads, lens) < 0;
    }
    for (Py_ssize_t r = 0; r < opened; r++) {
        if (self->views[r].obj != NULL) {
            PyBuffer_Release(&self->views[r]);
        }
    }
    PyMem_Free(heads);
    PyMem_Free(lens);
    if (failed) {
        Py_DECREF(out);
        return NULL;
    }
    int done = self->front_at >= PyList_GET_SIZE(self->front);
    for (Py_ssize_t r = 0; done && r < self->count; r++) {
        done = self->pos[r] >= self->end[r];
    }
    return Py_BuildValue("(NO)", out, done ? Py_True : Py_False);
}

static PyMethodDef run_merge_methods[] = {
    {"chunk", (PyCFunction)run_merge_chunk, METH_O, "The merge's next keys, at most size of them, and whether it is done."},
    {NULL},
};

static PyTypeObject RunMergeType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "kvlog.index._runs.RunMerge",
    .tp_basicsize = sizeof(RunMerge),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A forward scan's overlay: the memtable's writes and the pending runs merged, newest first.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)run_merge_init,
    .tp_dealloc = (destructor)run_merge_dealloc,
    .tp_methods = run_merge_methods,
};

#endif /* KVLOG_RUN_MERGE_H */
