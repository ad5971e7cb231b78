/*
 * The structural check of kvlog's LMDB cache file (see kvlog.index.entry.check_cache_file and
 * kvlog.meta.env.check_lmdb_file, which wrap it): check_lmdb walks every B-tree page of an
 * LMDB data file once and checks every value of kvlog's key index, index runs and sealed
 * databases whole. It runs when a cache that was not closed cleanly is opened, before LMDB
 * itself reads it: LMDB trusts its pages and may crash on garbage, and a damaged key would
 * hide its entry from lookups.
 *
 * Nothing here trusts its input: every offset read from an LMDB page, an index value or an
 * index run is checked against the file before it is followed, and the first damage found is
 * returned as a string. The walk makes no Python calls and runs without the GIL.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "../_key_order.h"
#include "_index_entry.h"

/* LMDB 0.9's on-disk layout (lmdb's mdb.c), 64-bit little-endian: pages of psize bytes, each
 * with a 16-byte header (pgno u64, pad u16, flags u16, lower u16 and upper u16, or the number
 * of pages u32 of an overflow page); two meta pages first; B-trees of branch and leaf pages
 * whose nodes are (lo u16, hi u16, flags u16, ksize u16, key, data). */
#define MDB_MAGIC 0xBEEFC0DEu
#define MDB_DATA_VERSION 1
#define P_BRANCH 0x01
#define P_LEAF 0x02
#define P_OVERFLOW 0x04
#define P_META 0x08
#define F_BIGDATA 0x01
#define F_SUBDATA 0x02
#define F_DUPDATA 0x04
#define MDB_DUPSORT 0x04
#define MDB_PERSISTENT_FLAGS 0x7e
#define PAGEHDRSZ 16
#define NODESIZE 8
#define DB_BYTES 48
#define MAX_DEPTH 32
#define NO_PAGE (~(uint64_t)0)

/* What the values of a database are: LMDB's own data, kvlog's index entries, index runs, or
 * sealed values (a big-endian CRC32C of the key and the rest, then the rest), all checked
 * whole: a damaged key would move an entry where no lookup finds it. */
enum { KIND_PLAIN, KIND_FREE, KIND_INDEX, KIND_RUNS, KIND_SEALED };
#define MAX_SEALED 16

typedef struct {
    const uint8_t *map;
    uint64_t psize;
    uint64_t pages; /* the last used page + 1 */
    uint8_t *seen;  /* a bit per page: reached once already */
    const char *why;
    const char *index_name; /* the named databases of kind KIND_INDEX and KIND_RUNS */
    size_t index_name_len;
    const char *runs_name;
    size_t runs_name_len;
    Py_ssize_t sealed_count;
    const char *sealed_name[MAX_SEALED];
    size_t sealed_len[MAX_SEALED];
} Walk;

static inline uint16_t u16_at(const uint8_t *p) {
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}

static inline uint64_t u64_at(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

static int fail(Walk *w, const char *why) {
    w->why = why;
    return -1;
}

/* Whether run (n bytes) is a whole index run: tables in bounds, keys strictly increasing,
 * every entry passing its checksum. No Python calls: it runs without the GIL. */
static int run_whole(const uint8_t *run, uint64_t n) {
    if (n < 8 || load_u32(run) != RUN_MAGIC) {
        return 0;
    }
    uint64_t count = load_u32(run + 4), tables = 8 + 8 * count;
    if (tables > n) {
        return 0;
    }
    const char *key_end = (const char *)run + 8, *value_end = key_end + 4 * count;
    uint64_t key_bytes = count ? load_u32(key_end + 4 * (count - 1)) : 0;
    uint64_t value_bytes = count ? load_u32(value_end + 4 * (count - 1)) : 0;
    if (tables + key_bytes + value_bytes != n) {
        return 0;
    }
    const char *keys = (const char *)run + tables, *values = keys + key_bytes;
    uint32_t ks = 0, vs = 0, previous = 0, previous_len = 0;
    for (uint64_t i = 0; i < count; i++) {
        uint32_t ke = load_u32(key_end + 4 * i), ve = load_u32(value_end + 4 * i);
        if (ke < ks || ke > key_bytes || ve < vs || ve > value_bytes) {
            return 0;
        }
        uint32_t klen = ke - ks, vlen = ve - vs;
        if (klen == 0 || klen > MAX_DIRECT_KEY
            || (i && key_order(keys + previous, previous_len, keys + ks, klen) >= 0)) {
            return 0;
        }
        const uint8_t *value = (const uint8_t *)values + vs;
        if (vlen == DELETION_BYTES) {
            if (crc32c_extend(0, keys + ks, klen) != load_be32(value)) {
                return 0;
            }
        } else {
            Entry e;
            if (entry_open(keys + ks, klen, value, vlen, &e) < 0 || (e.flags & FLAG_LONG)) {
                return 0;
            }
        }
        previous = ks;
        previous_len = klen;
        ks = ke;
        vs = ve;
    }
    return 1;
}

/* Claim pages [pgno, pgno + count) for one use: in range, and not reached before. */
static int claim(Walk *w, uint64_t pgno, uint64_t count) {
    if (pgno < 2 || count == 0 || pgno >= w->pages || count > w->pages - pgno) {
        return fail(w, "a page number outside the file");
    }
    for (uint64_t p = pgno; p < pgno + count; p++) {
        if (w->seen[p >> 3] & (1u << (p & 7))) {
            return fail(w, "a page reached twice");
        }
        w->seen[p >> 3] |= (uint8_t)(1u << (p & 7));
    }
    return 0;
}

static int walk_db(Walk *w, const uint8_t *db, int kind, int depth_left);

/* The data of a leaf node (inline or on overflow pages, claimed) into *data, *size. */
static int node_data(Walk *w, const uint8_t *page, uint32_t at, const uint8_t **data, uint64_t *size) {
    const uint8_t *node = page + at;
    uint64_t dsize = (uint64_t)u16_at(node) | ((uint64_t)u16_at(node + 2) << 16);
    uint16_t ksize = u16_at(node + 6);
    uint64_t start = (uint64_t)at + NODESIZE + ksize;
    if (u16_at(node + 4) & F_BIGDATA) {
        if (start + 8 > w->psize) {
            return fail(w, "a node outside its page");
        }
        uint64_t pgno = u64_at(page + start);
        uint64_t count = (PAGEHDRSZ - 1 + dsize) / w->psize + 1;
        if (pgno < 2 || pgno >= w->pages) {
            return fail(w, "an overflow page outside the file");
        }
        const uint8_t *first = w->map + pgno * w->psize;
        uint32_t held;
        memcpy(&held, first + 12, 4);
        if (u64_at(first) != pgno || u16_at(first + 10) != P_OVERFLOW || held < count) {
            return fail(w, "a damaged overflow page");
        }
        if (claim(w, pgno, held) < 0) {
            return -1;
        }
        *data = first + PAGEHDRSZ;
    } else {
        if (start + dsize > w->psize) {
            return fail(w, "a node outside its page");
        }
        *data = page + start;
    }
    *size = dsize;
    return 0;
}

/* The kind of the named database called key (a node of the main database). */
static int kind_of(const Walk *w, const uint8_t *key, size_t n) {
    if (n == w->index_name_len && memcmp(key, w->index_name, n) == 0) {
        return KIND_INDEX;
    }
    if (n == w->runs_name_len && memcmp(key, w->runs_name, n) == 0) {
        return KIND_RUNS;
    }
    for (Py_ssize_t i = 0; i < w->sealed_count; i++) {
        if (n == w->sealed_len[i] && memcmp(key, w->sealed_name[i], n) == 0) {
            return KIND_SEALED;
        }
    }
    return KIND_PLAIN;
}

/* Check the subtree at pgno, at level (1: the root) of a tree of depth levels. */
static int walk_page(Walk *w, uint64_t pgno, int level, int depth, uint16_t db_flags, int kind,
                     int depth_left) {
    if (claim(w, pgno, 1) < 0) {
        return -1;
    }
    const uint8_t *page = w->map + pgno * w->psize;
    uint16_t flags = u16_at(page + 10), lower = u16_at(page + 12), upper = u16_at(page + 14);
    int leaf = level == depth, ordered = db_flags == 0 && kind != KIND_FREE; /* memcmp order */
    if (u64_at(page) != pgno || flags != (leaf ? P_LEAF : P_BRANCH)) {
        return fail(w, "a page of the wrong number or kind");
    }
    if (lower < PAGEHDRSZ + 2 || (lower - PAGEHDRSZ) % 2 || lower > upper || upper > w->psize) {
        return fail(w, "a page's free space out of bounds");
    }
    uint32_t keys = (uint32_t)(lower - PAGEHDRSZ) / 2;
    const uint8_t *previous = NULL;
    uint16_t previous_size = 0;
    for (uint32_t i = 0; i < keys; i++) {
        uint32_t at = u16_at(page + PAGEHDRSZ + 2 * i);
        if (at < upper || at + NODESIZE > w->psize) {
            return fail(w, "a node outside its page");
        }
        const uint8_t *node = page + at;
        uint16_t node_flags = u16_at(node + 4), ksize = u16_at(node + 6);
        if (at + NODESIZE + (uint64_t)ksize > w->psize) {
            return fail(w, "a key outside its page");
        }
        const uint8_t *key = node + NODESIZE;
        if (ordered && (leaf ? i > 0 : i > 1)) { /* a branch's first key is empty */
            if (key_order((const char *)previous, previous_size, (const char *)key, ksize) >= 0) {
                return fail(w, "keys out of order");
            }
        }
        previous = key;
        previous_size = ksize;
        if (!leaf) {
            uint64_t child = (uint64_t)u16_at(node) | ((uint64_t)u16_at(node + 2) << 16)
                             | ((uint64_t)node_flags << 32);
            if (walk_page(w, child, level + 1, depth, db_flags, kind, depth_left) < 0) {
                return -1;
            }
            continue;
        }
        if (node_flags & ~(F_BIGDATA | F_SUBDATA | F_DUPDATA)) {
            return fail(w, "a node of unknown kind");
        }
        const uint8_t *data;
        uint64_t size;
        if (node_data(w, page, at, &data, &size) < 0) {
            return -1;
        }
        if (node_flags & F_DUPDATA) {
            if (!(db_flags & MDB_DUPSORT) || (node_flags & F_BIGDATA) || kind != KIND_PLAIN) {
                return fail(w, "duplicates in a database without them");
            }
            if ((node_flags & F_SUBDATA) && (size != DB_BYTES || walk_db(w, data, KIND_PLAIN, depth_left - 1) < 0)) {
                return w->why ? -1 : fail(w, "a damaged database record");
            }
            continue; /* a sub-page of duplicates lies within the node, checked above */
        }
        if (node_flags & F_SUBDATA) {
            if (size != DB_BYTES || (node_flags & F_BIGDATA) || kind != KIND_PLAIN
                || walk_db(w, data, kind_of(w, key, ksize), depth_left - 1) < 0) {
                return w->why ? -1 : fail(w, "a damaged database record");
            }
        } else if (kind == KIND_FREE) { /* a list of free pages: count, then the page numbers */
            if (size < 8 || size % 8 || u64_at(data) != size / 8 - 1) {
                return fail(w, "a damaged free-page list");
            }
            for (uint64_t j = 1; j < size / 8; j++) {
                uint64_t free_page = u64_at(data + 8 * j);
                if (free_page < 2 || free_page >= w->pages) {
                    return fail(w, "a free page outside the file");
                }
            }
        } else if (kind == KIND_INDEX) {
            Entry e;
            if (entry_open((const char *)key, ksize, data, (size_t)size, &e) < 0) {
                return fail(w, "a key index entry that fails its checksum");
            }
        } else if (kind == KIND_RUNS) {
            if (!run_whole(data, size)) {
                return fail(w, "a damaged index run");
            }
        } else if (kind == KIND_SEALED) {
            if (size < 4 || crc32c_extend(crc32c_extend(0, key, ksize), data + 4, (size_t)size - 4)
                                 != load_be32(data)) {
                return fail(w, "a metadata value that fails its checksum");
            }
        }
    }
    return 0;
}

/* Check the database whose record (MDB_db, 48 bytes) is at db. */
static int walk_db(Walk *w, const uint8_t *db, int kind, int depth_left) {
    uint16_t flags = u16_at(db + 4), depth = u16_at(db + 6);
    uint64_t root = u64_at(db + 40);
    if (depth_left <= 0) {
        return fail(w, "databases nested too deep");
    }
    if (kind != KIND_FREE && (flags & ~MDB_PERSISTENT_FLAGS)) { /* the free one's holds the env's */
        return fail(w, "a database of unknown flags");
    }
    if (root == NO_PAGE) {
        return depth == 0 ? 0 : fail(w, "an empty database with a depth");
    }
    if (depth < 1 || depth > MAX_DEPTH) {
        return fail(w, "a database of impossible depth");
    }
    return walk_page(w, root, 1, depth, kind == KIND_FREE ? 0 : flags, kind, depth_left);
}

/* check_lmdb(data, index_name, runs_name, sealed_names) -> None if the LMDB data file is whole
 * (its B-trees' structure, and every value of the named key index, index runs and sealed
 * databases), else the first damage found */
static PyObject *check_lmdb(PyObject *self, PyObject *args) {
    Py_buffer buf, index_name, runs_name;
    PyObject *sealed;
    if (!PyArg_ParseTuple(args, "y*y*y*O!", &buf, &index_name, &runs_name, &PyTuple_Type, &sealed)) {
        return NULL;
    }
    const uint8_t *map = (const uint8_t *)buf.buf;
    uint64_t len = (uint64_t)buf.len;
    Walk w = {map, 0, 0, NULL, NULL, index_name.buf, (size_t)index_name.len, runs_name.buf,
              (size_t)runs_name.len, 0, {NULL}, {0}};
    const uint8_t *metas[2];
    if (PyTuple_GET_SIZE(sealed) > MAX_SEALED) {
        PyErr_SetString(PyExc_ValueError, "check_lmdb: at most 16 sealed databases");
        goto error;
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(sealed); i++) {
        PyObject *name = PyTuple_GET_ITEM(sealed, i); /* the tuple keeps it alive */
        if (!PyBytes_Check(name)) {
            PyErr_SetString(PyExc_TypeError, "check_lmdb: sealed database names are bytes");
            goto error;
        }
        w.sealed_name[i] = PyBytes_AS_STRING(name);
        w.sealed_len[i] = (size_t)PyBytes_GET_SIZE(name);
        w.sealed_count = i + 1;
    }
    if (len < PAGEHDRSZ + 136) {
        w.why = "too short for a meta page";
        goto out;
    }
    w.psize = (uint64_t)u16_at(map + PAGEHDRSZ + 24) | ((uint64_t)u16_at(map + PAGEHDRSZ + 26) << 16);
    if (w.psize < 256 || w.psize > 65536 || (w.psize & (w.psize - 1)) || len < 2 * w.psize) {
        w.why = "an impossible page size";
        goto out;
    }
    for (int m = 0; m < 2; m++) {
        const uint8_t *page = map + m * w.psize;
        uint32_t magic, version;
        memcpy(&magic, page + PAGEHDRSZ, 4);
        memcpy(&version, page + PAGEHDRSZ + 4, 4);
        if (!(u16_at(page + 10) & P_META) || magic != MDB_MAGIC || version != MDB_DATA_VERSION) {
            w.why = "a damaged meta page";
            goto out;
        }
        metas[m] = page + PAGEHDRSZ;
    }
    /* LMDB reads the meta page of the newer transaction: magic, version, address, map size,
     * the free and main databases' records, the last page, the transaction id. */
    const uint8_t *meta = u64_at(metas[0] + 128) < u64_at(metas[1] + 128) ? metas[1] : metas[0];
    uint64_t last = u64_at(meta + 120);
    if (last < 1 || last >= len / w.psize) {
        w.why = "a last page outside the file";
        goto out;
    }
    w.pages = last + 1;
    w.seen = PyMem_RawCalloc((size_t)(w.pages / 8 + 1), 1);
    if (w.seen == NULL) {
        PyErr_NoMemory();
        goto error;
    }
    Py_BEGIN_ALLOW_THREADS
    if (walk_db(&w, meta + 24, KIND_FREE, 3) == 0) {
        walk_db(&w, meta + 24 + DB_BYTES, KIND_PLAIN, 3); /* the main database: records of named ones */
    }
    Py_END_ALLOW_THREADS
    PyMem_RawFree(w.seen);
out:
    PyBuffer_Release(&buf);
    PyBuffer_Release(&index_name);
    PyBuffer_Release(&runs_name);
    if (w.why == NULL) {
        Py_RETURN_NONE;
    }
    return PyUnicode_FromString(w.why);
error:
    PyBuffer_Release(&buf);
    PyBuffer_Release(&index_name);
    PyBuffer_Release(&runs_name);
    return NULL;
}

static PyMethodDef methods[] = {
    {"check_lmdb", check_lmdb, METH_VARARGS,
     "None if an LMDB data file and kvlog's key index in it are whole, else what is not."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_cache_check",
    "The structural check of kvlog's LMDB cache file (see kvlog.index.entry.check_cache_file).", -1, methods,
};

PyMODINIT_FUNC PyInit__cache_check(void) {
    const uint16_t probe = 1;
    if (*(const uint8_t *)&probe != 1) {
        PyErr_SetString(PyExc_ImportError, "kvlog's cache check needs a little-endian host");
        return NULL;
    }
    crc32c_init();
    return PyModule_Create(&module);
}
