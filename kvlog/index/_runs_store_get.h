/*
 * Included by _runs.c, after _runs_get.h: StoreGet, a store's whole get in one call when the key
 * is a valid bytes key of an open store (see kvlog.index.reads), with no Python frame.
 */
#ifndef KVLOG_RUNS_STORE_GET_H
#define KVLOG_RUNS_STORE_GET_H

/* StoreGet(owner, lookup, fallback, found, key_limit): called as get(key, default=None), the
 * common case of a store's get -- key a bytes object of 1 to key_limit bytes, owner._closed
 * False -- answered as lookup(key, owner._refresh_at) gives: its bytes, default for None, and
 * found(key, answer, default) for any other answer (stale, or a value in a data file). Every
 * other call, keywords included, is fallback(*args, **kwargs)'s: the Python get, which gives
 * every answer and raises every error. A Getter as lookup is called without a Python call. */
typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *owner, *lookup, *fallback, *found;
    PyObject *owner_dict; /* its instance dict (dict_of), or NULL */
    Py_ssize_t key_limit;
} StoreGet;

static PyObject *s_closed, *s_refresh_at;

static PyObject *store_get_call(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    StoreGet *sg = (StoreGet *)self;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (kwnames != NULL || nargs < 1 || nargs > 2) {
        return PyObject_Vectorcall(sg->fallback, args, nargsf, kwnames);
    }
    PyObject *key = args[0];
    if (!PyBytes_CheckExact(key) || PyBytes_GET_SIZE(key) == 0 || PyBytes_GET_SIZE(key) > sg->key_limit) {
        return PyObject_Vectorcall(sg->fallback, args, nargsf, NULL);
    }
    PyObject *closed = attr_in(sg->owner, sg->owner_dict, s_closed);
    if (closed == NULL) {
        return NULL;
    }
    Py_DECREF(closed);
    if (closed != Py_False) {
        return PyObject_Vectorcall(sg->fallback, args, nargsf, NULL); /* it raises StoreClosedError */
    }
    PyObject *fresh = attr_in(sg->owner, sg->owner_dict, s_refresh_at);
    if (fresh == NULL) {
        return NULL;
    }
    PyObject *answer;
    if (Py_IS_TYPE(sg->lookup, &GetterType)) {
        answer = getter_lookup((Getter *)sg->lookup, key, fresh);
    } else {
        PyObject *pair[2] = {key, fresh};
        answer = PyObject_Vectorcall(sg->lookup, pair, 2, NULL);
    }
    Py_DECREF(fresh);
    if (answer == NULL || PyBytes_CheckExact(answer)) {
        return answer;
    }
    PyObject *otherwise = nargs == 2 ? args[1] : Py_None;
    if (answer == Py_None) {
        Py_DECREF(answer);
        return Py_NewRef(otherwise);
    }
    PyObject *three[3] = {key, answer, otherwise};
    PyObject *value = PyObject_Vectorcall(sg->found, three, 3, NULL);
    Py_DECREF(answer);
    return value;
}

static PyObject *store_get_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    PyObject *owner, *lookup, *fallback, *found;
    Py_ssize_t key_limit;
    if (kwds != NULL && PyDict_GET_SIZE(kwds) > 0) {
        PyErr_SetString(PyExc_TypeError, "StoreGet() takes positional arguments");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "OOOOn", &owner, &lookup, &fallback, &found, &key_limit)) {
        return NULL;
    }
    if (key_limit < 1) {
        PyErr_SetString(PyExc_ValueError, "StoreGet() needs a positive key_limit");
        return NULL;
    }
    StoreGet *sg = (StoreGet *)type->tp_alloc(type, 0);
    if (sg == NULL) {
        return NULL;
    }
    sg->vectorcall = store_get_call;
    sg->owner = Py_NewRef(owner);
    sg->lookup = Py_NewRef(lookup);
    sg->fallback = Py_NewRef(fallback);
    sg->found = Py_NewRef(found);
    sg->key_limit = key_limit;
    if (dict_of(owner, &sg->owner_dict) < 0) {
        Py_DECREF(sg);
        return NULL;
    }
    return (PyObject *)sg;
}

static int store_get_traverse(PyObject *self, visitproc visit, void *arg) {
    StoreGet *sg = (StoreGet *)self;
    Py_VISIT(sg->owner);
    Py_VISIT(sg->lookup);
    Py_VISIT(sg->fallback);
    Py_VISIT(sg->found);
    Py_VISIT(sg->owner_dict);
    return 0;
}

static int store_get_clear(PyObject *self) {
    StoreGet *sg = (StoreGet *)self;
    Py_CLEAR(sg->owner);
    Py_CLEAR(sg->lookup);
    Py_CLEAR(sg->fallback);
    Py_CLEAR(sg->found);
    Py_CLEAR(sg->owner_dict);
    return 0;
}

static void store_get_dealloc(PyObject *self) {
    PyObject_GC_UnTrack(self);
    store_get_clear(self);
    Py_TYPE(self)->tp_free(self);
}

/* What introspection reads of a bound method (help, inspect.signature): the
 * store's own get's name, qualified name and docstring, the get itself as __wrapped__ (its
 * signature is the store get's), and the store as __self__. */
static PyObject *store_get_of_fallback(PyObject *self, void *name) {
    StoreGet *sg = (StoreGet *)self;
    if (sg->fallback == NULL) {
        PyErr_SetString(PyExc_AttributeError, (const char *)name);
        return NULL;
    }
    return PyObject_GetAttrString(sg->fallback, (const char *)name);
}

static PyObject *store_get_wrapped(PyObject *self, void *closure) {
    (void)closure;
    StoreGet *sg = (StoreGet *)self;
    if (sg->fallback == NULL) {
        PyErr_SetString(PyExc_AttributeError, "__wrapped__");
        return NULL;
    }
    return Py_NewRef(sg->fallback);
}

static PyObject *store_get_owner(PyObject *self, void *closure) {
    (void)closure;
    StoreGet *sg = (StoreGet *)self;
    if (sg->owner == NULL) {
        PyErr_SetString(PyExc_AttributeError, "__self__");
        return NULL;
    }
    return Py_NewRef(sg->owner);
}

static PyGetSetDef store_get_getset[] = {
    {"__name__", store_get_of_fallback, NULL, "The store get's name.", "__name__"},
    {"__qualname__", store_get_of_fallback, NULL, "The store get's qualified name.", "__qualname__"},
    {"__doc__", store_get_of_fallback, NULL, "The store get's docstring.", "__doc__"},
    {"__wrapped__", store_get_wrapped, NULL, "The store's own get, which answers every other call.", NULL},
    {"__self__", store_get_owner, NULL, "The store.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject StoreGetType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "kvlog.index._runs.StoreGet",
    .tp_basicsize = sizeof(StoreGet),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_new = store_get_new,
    .tp_dealloc = store_get_dealloc,
    .tp_traverse = store_get_traverse,
    .tp_clear = store_get_clear,
    .tp_getset = store_get_getset,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(StoreGet, vectorcall),
};

/* Adds StoreGet to module m; -1 on error. */
static int runs_store_get_init(PyObject *m) {
    s_closed = PyUnicode_InternFromString("_closed");
    s_refresh_at = PyUnicode_InternFromString("_refresh_at");
    if (s_closed == NULL || s_refresh_at == NULL || PyType_Ready(&StoreGetType) < 0) {
        return -1;
    }
    return PyModule_AddObjectRef(m, "StoreGet", (PyObject *)&StoreGetType);
}

#endif
