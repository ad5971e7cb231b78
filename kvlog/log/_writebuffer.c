/*
 * The write buffer's hot path, compiled: one buffered put.
 *
 * kvlog.log.flusher owns the buffer and documents it. A WriteBuffer holds the three columns of
 * buffered records (Python lists of keys, values and timestamps), the count of buffered bytes
 * and the trigger past which a put needs the flusher's attention; put() appends one record and
 * sets it in the memtable's front dict under the memtable's lock, as the Python version did, in
 * about half its time. The flusher replaces the lists when it takes them.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

typedef struct {
    PyObject_HEAD
    PyObject *keys;
    PyObject *values;
    PyObject *stamps;
    PyObject *memtable; /* has a "front" dict attribute, replaced when a flush freezes it */
    PyObject *acquire;  /* the memtable lock's bound acquire and release */
    PyObject *release;
    PyObject *now_ns;   /* the clock: () -> int nanoseconds */
    PyObject *fatal;    /* None, or the exception every later put raises */
    Py_ssize_t buffered_bytes;
    Py_ssize_t trigger;
    Py_ssize_t overhead; /* bytes counted per record on top of its key and value */
} WriteBuffer;

static PyObject *front_name;

static int WriteBuffer_init(WriteBuffer *self, PyObject *args, PyObject *kwds) {
    static char *names[] = {"memtable", "lock", "now_ns", "overhead", NULL};
    PyObject *memtable, *lock, *now_ns;
    Py_ssize_t overhead;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOOn", names, &memtable, &lock, &now_ns, &overhead)) {
        return -1;
    }
    PyObject *acquire = PyObject_GetAttrString(lock, "acquire");
    PyObject *release = acquire ? PyObject_GetAttrString(lock, "release") : NULL;
    PyObject *keys = PyList_New(0), *values = PyList_New(0), *stamps = PyList_New(0);
    if (!acquire || !release || !keys || !values || !stamps) {
        Py_XDECREF(acquire);
        Py_XDECREF(release);
        Py_XDECREF(keys);
        Py_XDECREF(values);
        Py_XDECREF(stamps);
        return -1;
    }
    Py_XSETREF(self->acquire, acquire);
    Py_XSETREF(self->release, release);
    Py_XSETREF(self->keys, keys);
    Py_XSETREF(self->values, values);
    Py_XSETREF(self->stamps, stamps);
    Py_XSETREF(self->memtable, Py_NewRef(memtable));
    Py_XSETREF(self->now_ns, Py_NewRef(now_ns));
    Py_XSETREF(self->fatal, Py_NewRef(Py_None));
    self->buffered_bytes = 0;
    self->trigger = 0;
    self->overhead = overhead;
    return 0;
}

static int WriteBuffer_traverse(WriteBuffer *self, visitproc visit, void *arg) {
    Py_VISIT(self->keys);
    Py_VISIT(self->values);
    Py_VISIT(self->stamps);
    Py_VISIT(self->memtable);
    Py_VISIT(self->acquire);
    Py_VISIT(self->release);
    Py_VISIT(self->now_ns);
    Py_VISIT(self->fatal);
    return 0;
}

static int WriteBuffer_clear(WriteBuffer *self) {
    Py_CLEAR(self->keys);
    Py_CLEAR(self->values);
    Py_CLEAR(self->stamps);
    Py_CLEAR(self->memtable);
    Py_CLEAR(self->acquire);
    Py_CLEAR(self->release);
    Py_CLEAR(self->now_ns);
    Py_CLEAR(self->fatal);
    return 0;
}

static void WriteBuffer_dealloc(WriteBuffer *self) {
    PyObject_GC_UnTrack(self);
    WriteBuffer_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Remove the last item of the first `columns` columns (keys, values, stamps): a record taken
 * back. Python code run meanwhile (a property, a lock) may have replaced or deleted a column:
 * such a column is left alone, and the error being raised is kept. */
static void drop_last_record(WriteBuffer *self, int columns) {
    PyObject *lists[3] = {self->keys, self->values, self->stamps};
    PyObject *type, *exc, *tb;
    PyErr_Fetch(&type, &exc, &tb);
    for (int i = 0; i < columns; i++) {
        if (lists[i] != NULL && PyList_CheckExact(lists[i]) && PyList_GET_SIZE(lists[i]) > 0) {
            if (PyList_SetSlice(lists[i], PyList_GET_SIZE(lists[i]) - 1, PY_SSIZE_T_MAX, NULL) < 0) {
                PyErr_Clear();
            }
        }
    }
    PyErr_Restore(type, exc, tb);
}

/* Append key, value and stamp to the columns, or leave them as they were. */
static int append_record(WriteBuffer *self, PyObject *key, PyObject *value, PyObject *stamp) {
    PyObject *columns[3] = {self->keys, self->values, self->stamps};
    PyObject *items[3] = {key, value, stamp};
    for (int i = 0; i < 3; i++) {
        if (columns[i] == NULL || !PyList_CheckExact(columns[i])) {
            PyErr_SetString(PyExc_TypeError, "the write buffer's columns must be lists");
            return -1;
        }
    }
    for (int i = 0; i < 3; i++) {
        if (PyList_Append(columns[i], items[i]) < 0) {
            drop_last_record(self, i);
            return -1;
        }
    }
    return 0;
}

/* put(key, value) -> whether the buffered bytes reached the trigger */
static PyObject *WriteBuffer_put(WriteBuffer *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "put() takes a key and a value");
        return NULL;
    }
    if (self->now_ns == NULL || self->acquire == NULL || self->release == NULL || self->memtable == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "the write buffer was not initialised");
        return NULL;
    }
    PyObject *key = args[0], *value = args[1];
    if (!PyBytes_CheckExact(key) || !PyBytes_CheckExact(value)) {
        PyErr_SetString(PyExc_TypeError, "put() takes bytes (validated by the caller)");
        return NULL;
    }
    if (self->fatal != NULL && self->fatal != Py_None) {
        if (PyExceptionInstance_Check(self->fatal)) {
            PyErr_SetObject((PyObject *)Py_TYPE(self->fatal), self->fatal);
        } else {
            PyErr_SetString(PyExc_RuntimeError, "the write buffer is failed");
        }
        return NULL;
    }
    PyObject *stamp = PyObject_CallNoArgs(self->now_ns);
    if (stamp == NULL) {
        return NULL;
    }
    PyObject *held = PyObject_CallNoArgs(self->acquire);
    if (held == NULL) {
        Py_DECREF(stamp);
        return NULL;
    }
    Py_DECREF(held);
    int failed = append_record(self, key, value, stamp);
    Py_DECREF(stamp);
    if (!failed) {
        PyObject *front = PyObject_GetAttr(self->memtable, front_name);
        if (front == NULL || PyDict_SetItem(front, key, value) < 0) {
            failed = -1;
            drop_last_record(self, 3);  /* the record was appended: take it back */
        }
        Py_XDECREF(front);
    }
    if (!failed) {
        self->buffered_bytes += PyBytes_GET_SIZE(key) + PyBytes_GET_SIZE(value) + self->overhead;
    }
    /* Release even after an error, keeping the error raised. */
    PyObject *type, *exc, *tb;
    PyErr_Fetch(&type, &exc, &tb);
    PyObject *released = PyObject_CallNoArgs(self->release);
    if (released == NULL) {
        Py_XDECREF(type);
        Py_XDECREF(exc);
        Py_XDECREF(tb);
        return NULL;
    }
    Py_DECREF(released);
    PyErr_Restore(type, exc, tb);
    if (failed) {
        return NULL;
    }
    return PyBool_FromLong(self->buffered_bytes >= self->trigger);
}

static PyMethodDef WriteBuffer_methods[] = {
    {"put", (PyCFunction)(void (*)(void))WriteBuffer_put, METH_FASTCALL,
     "Buffer one put of a validated key and value; returns whether the trigger was reached."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef WriteBuffer_members[] = {
    {"keys", T_OBJECT_EX, offsetof(WriteBuffer, keys), 0, "Buffered keys, in write order."},
    {"values", T_OBJECT_EX, offsetof(WriteBuffer, values), 0, "Buffered values (None: a delete)."},
    {"stamps", T_OBJECT_EX, offsetof(WriteBuffer, stamps), 0, "Buffered timestamps in nanoseconds."},
    {"fatal", T_OBJECT_EX, offsetof(WriteBuffer, fatal), 0, "None, or the exception puts raise."},
    {"buffered_bytes", T_PYSSIZET, offsetof(WriteBuffer, buffered_bytes), 0, "Bytes counted as buffered."},
    {"trigger", T_PYSSIZET, offsetof(WriteBuffer, trigger), 0, "Buffered bytes at which put returns True."},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject WriteBufferType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "kvlog.log._writebuffer.WriteBuffer",
    .tp_doc = "Columns of buffered records and the compiled put (see kvlog.log.flusher).",
    .tp_basicsize = sizeof(WriteBuffer),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)WriteBuffer_init,
    .tp_dealloc = (destructor)WriteBuffer_dealloc,
    .tp_traverse = (traverseproc)WriteBuffer_traverse,
    .tp_clear = (inquiry)WriteBuffer_clear,
    .tp_methods = WriteBuffer_methods,
    .tp_members = WriteBuffer_members,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_writebuffer", "The write buffer's compiled put (see kvlog.log.flusher).", -1, NULL,
};

PyMODINIT_FUNC PyInit__writebuffer(void) {
    front_name = PyUnicode_InternFromString("front");
    if (front_name == NULL || PyType_Ready(&WriteBufferType) < 0) {
        return NULL;
    }
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) {
        return NULL;
    }
    if (PyModule_AddObjectRef(m, "WriteBuffer", (PyObject *)&WriteBufferType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
