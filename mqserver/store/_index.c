/* The key index's usual put in C: a speedup of index.put_uniq_py (index.py), which stays
 * the reference and the fallback; tests compare the two byte for byte.
 *
 * Every RocketMQ SEND carries the client's UNIQ_KEY, and the store's dispatch indexes it
 * (seed 000 §1.5: RocketMQ's IndexFile). In Python that is a find in the properties, a
 * decode, the hash, and the entry, slot and header packed into the mapped file: about
 * 250 bytecodes of the SEND's 1,750. Here it is one call.
 *
 * No layout is written here: mqserver/store/native.py hands configure() the sizes and
 * the (offset, size) of the header, slot and entry fields from the construct schemas of
 * format.py; configure() checks them against the widths used here. The file's own
 * header is the whole state: its slot count, entry count and the rest are read from the
 * mapped file on every put, so the Python and the C puts may alternate.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "_bytes.h"
#include "_javahash.h"

/* The header, slot and entry fields, in the order configure() takes their spans. */
enum { H_BEGIN_TS, H_END_TS, H_BEGIN_OFF, H_END_OFF, H_SLOTS, H_COUNT, N_HEADER };
static const Py_ssize_t header_width[N_HEADER] = {8, 8, 8, 8, 4, 4};
enum { E_HASH, E_OFFSET, E_DIFF, E_PREV, N_ENTRY };
static const Py_ssize_t entry_width[N_ENTRY] = {4, 8, 4, 4};
static const Py_ssize_t slot_width[1] = {4};

static Py_ssize_t hoff[N_HEADER], eoff[N_ENTRY], soff[1];
static Py_ssize_t header_size, slot_size, entry_size;
static int configured;

/* What put_uniq() returns (index.py names them). */
enum { PUT_NONE = 0, PUT_DONE = 1, PUT_FULL = 2, PUT_ELSEWHERE = 3 };

/* configure(header_size, header_spans, slot_size, slot_spans, entry_size, entry_spans):
 * checked whole before any of it is used (a failed call changes nothing). */
static PyObject *index_configure(PyObject *self, PyObject *args) {
    Py_ssize_t hs, ss, es, h[N_HEADER], s[1], e[N_ENTRY];
    PyObject *hspans, *sspans, *espans;
    if (!PyArg_ParseTuple(args, "nO!nO!nO!", &hs, &PyTuple_Type, &hspans, &ss, &PyTuple_Type,
                          &sspans, &es, &PyTuple_Type, &espans))
        return NULL;
    if (read_spans(hspans, N_HEADER, header_width, hs, 1, h, "index header") < 0
            || read_spans(sspans, 1, slot_width, ss, 1, s, "index slot") < 0
            || read_spans(espans, N_ENTRY, entry_width, es, 1, e, "index entry") < 0)
        return NULL;
    memcpy(hoff, h, sizeof hoff);
    memcpy(soff, s, sizeof soff);
    memcpy(eoff, e, sizeof eoff);
    header_size = hs;
    slot_size = ss;
    entry_size = es;
    configured = 1;
    Py_RETURN_NONE;
}

/* The UNIQ_KEY value in props[0:n] as index.put_uniq_py finds it: the first "UNIQ_KEY\x01"
 * decides; it must start the properties or follow 0x02, and its value runs to the next
 * 0x02 or the end. 0 with *key, *klen set; -1 when there is none. */
static int find_uniq(const unsigned char *d, Py_ssize_t n, Py_ssize_t *key, Py_ssize_t *klen) {
    static const char tag[] = "UNIQ_KEY\x01";
    const Py_ssize_t tlen = sizeof tag - 1;
    Py_ssize_t at = -1;
    for (Py_ssize_t i = 0; i + tlen <= n; i++) {
        const unsigned char *p = memchr(d + i, 'U', (size_t)(n - tlen - i + 1));
        if (p == NULL)
            break;
        i = p - d;
        if (memcmp(p, tag, (size_t)tlen) == 0) {
            at = i;
            break;
        }
    }
    if (at < 0 || (at > 0 && d[at - 1] != 2))
        return -1;
    Py_ssize_t start = at + tlen;
    const unsigned char *end = start < n ? memchr(d + start, 2, (size_t)(n - start)) : NULL;
    *key = start;
    *klen = (end == NULL ? n : end - d) - start;
    return 0;
}

/* 1 when props holds "KEYS\x01" anywhere (the general path then reads every key). */
static int has_keys(const unsigned char *d, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i + 5 <= n; i++) {
        const unsigned char *p = memchr(d + i, 'K', (size_t)(n - 5 - i + 1));
        if (p == NULL)
            return 0;
        i = p - d;
        if (memcmp(p, "KEYS\x01", 5) == 0)
            return 1;
    }
    return 0;
}

/* put_uniq(map, topic, properties, offset, store_ts) -> PUT_*: index.put_uniq_py. */
static PyObject *index_put_uniq(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    Py_buffer m, p;
    long long offset, ts;
    int result = PUT_NONE;
    if (!configured) {
        PyErr_SetString(PyExc_RuntimeError, "configure() was not called");
        return NULL;
    }
    if (nargs != 5 || !PyUnicode_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "put_uniq(map, topic: str, properties, offset, store_ts)");
        return NULL;
    }
    offset = PyLong_AsLongLong(args[3]);
    if (offset == -1 && PyErr_Occurred())
        return NULL;
    ts = PyLong_AsLongLong(args[4]);
    if (ts == -1 && PyErr_Occurred())
        return NULL;
    if (PyObject_GetBuffer(args[2], &p, PyBUF_SIMPLE) < 0)
        return NULL;
    if (PyObject_GetBuffer(args[0], &m, PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(&p);
        return NULL;
    }
    unsigned char *b = m.buf;
    const unsigned char *d = p.buf;
    Py_ssize_t key, klen;
    if (m.len < header_size) {
        PyErr_SetString(PyExc_ValueError, "an index file smaller than its header");
        goto fail;
    }
    int64_t end_off = (int64_t)get_be64(b + hoff[H_END_OFF]);
    if (offset <= end_off)
        goto done;  /* indexed already (a replay) */
    if (has_keys(d, p.len)) {
        result = PUT_ELSEWHERE;
        goto done;
    }
    if (find_uniq(d, p.len, &key, &klen) < 0 || klen == 0)
        goto done;
    for (Py_ssize_t i = 0; i < klen; i++) {
        if (d[key + i] >= 0x80) {  /* decoded with "replace" in Python */
            result = PUT_ELSEWHERE;
            goto done;
        }
    }
    int64_t slots = (int32_t)get_be32(b + hoff[H_SLOTS]);
    int64_t n = (int32_t)get_be32(b + hoff[H_COUNT]);
    Py_ssize_t entries_at = header_size + (Py_ssize_t)slots * slot_size;
    if (slots <= 0 || n < 1 || entries_at > m.len) {
        PyErr_SetString(PyExc_ValueError, "a damaged index file header");
        goto fail;
    }
    if (n > (m.len - entries_at) / entry_size) {
        result = PUT_FULL;
        goto done;
    }
    int64_t begin_ts = n == 1 ? ts : (int64_t)get_be64(b + hoff[H_BEGIN_TS]);
    int64_t diff = (ts - begin_ts) / 1000;
    if (diff > INT32_MAX) {  /* Python's packing refuses it, as it should */
        result = PUT_ELSEWHERE;
        goto done;
    }
    uint32_t h = hash_units(0, args[1]) * 31u + (uint32_t)'#';
    for (Py_ssize_t i = 0; i < klen; i++)
        h = h * 31u + d[key + i];
    int32_t kh = (int32_t)h;
    kh = kh == INT32_MIN ? 0 : (kh < 0 ? -kh : kh);
    unsigned char *slot = b + header_size + (Py_ssize_t)(kh % slots) * slot_size + soff[0];
    uint32_t prev = get_be32(slot);
    unsigned char *e = b + entries_at + (Py_ssize_t)(n - 1) * entry_size;
    put_be32(e + eoff[E_HASH], (uint32_t)kh);
    put_be64(e + eoff[E_OFFSET], (uint64_t)offset);
    put_be32(e + eoff[E_DIFF], diff > 0 ? (uint32_t)diff : 0u);
    put_be32(e + eoff[E_PREV], prev);
    put_be32(slot, (uint32_t)n);
    if (n == 1) {
        put_be64(b + hoff[H_BEGIN_TS], (uint64_t)ts);
        put_be64(b + hoff[H_BEGIN_OFF], (uint64_t)offset);
    }
    put_be64(b + hoff[H_END_TS], (uint64_t)ts);
    put_be64(b + hoff[H_END_OFF], (uint64_t)offset);
    put_be32(b + hoff[H_COUNT], (uint32_t)(n + 1));
    result = PUT_DONE;
done:
    PyBuffer_Release(&m);
    PyBuffer_Release(&p);
    return PyLong_FromLong(result);
fail:
    PyBuffer_Release(&m);
    PyBuffer_Release(&p);
    return NULL;
}

static PyMethodDef methods[] = {
    {"configure", index_configure, METH_VARARGS,
     "configure(header_size, header_spans, slot_size, slot_spans, entry_size, entry_spans): "
     "the index file's layout (index.py)."},
    {"put_uniq", (PyCFunction)(void (*)(void))index_put_uniq, METH_FASTCALL,
     "put_uniq(map, topic, properties, offset, store_ts) -> 0 nothing to index, 1 put, "
     "2 the file is full, 3 for the Python path (index.put_uniq_py)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_index", "The key index's usual put (index.put_uniq_py).", -1,
    methods,
};

PyMODINIT_FUNC PyInit__index(void) { return PyModule_Create(&module); }
