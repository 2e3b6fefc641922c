/* The read-path record check in C: is each record of a read sound (framing and body
 * CRC)? A speedup of format.first_damaged (format.py), which stays the reference and
 * the fallback; tests compare the two. Also the audit's step over a segment's records
 * (walk), a speedup of the loop in spark/audit/scan.py's walk, its reference, and its
 * CRCs of many spans at once (crc32s).
 *
 * Every read path (cursors, pulls, the replication feed) calls it once per read, over
 * the buffer the records came in, so a damaged record is never served. The CRC is
 * zlib's crc32 masked to 31 bits, as format.body_crc (RocketMQ's UtilAll.crc32).
 * No layout is written here: mqserver/store/native.py hands configure() the header size,
 * the offset and size of the fields read, the smallest record and the message magic,
 * from the construct schemas of format.py; configure() checks the sizes against the
 * widths read here.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <limits.h>
#include <string.h>
#include <zlib.h>

#include "_bytes.h"

/* The fields read, in the order configure() takes their (offset, size), and widths. */
enum { F_TOTAL, F_MAGIC, F_CRC, F_BODY_LEN, N_FIELDS };
static const Py_ssize_t field_width[N_FIELDS] = {4, 4, 4, 4};
static Py_ssize_t off[N_FIELDS], header_size, min_record_size;
static uint32_t message_magic, admin_magic;
static int configured;

/* configure(header_size, spans, min_record_size, message_magic, admin_magic): checked
 * whole before any of it is used (a failed call changes nothing). */
static PyObject *check_configure(PyObject *self, PyObject *args) {
    Py_ssize_t hsize, min_size, new_off[N_FIELDS];
    PyObject *spans;
    unsigned long magic, admin;
    if (!PyArg_ParseTuple(args, "nO!nkk", &hsize, &PyTuple_Type, &spans, &min_size, &magic,
                          &admin))
        return NULL;
    if (read_spans(spans, N_FIELDS, field_width, hsize, 0, new_off, "record header") < 0)
        return NULL;
    if (min_size < hsize) {
        PyErr_SetString(PyExc_ValueError, "the smallest record is smaller than its header");
        return NULL;
    }
    memcpy(off, new_off, sizeof off);
    header_size = hsize;
    min_record_size = min_size;
    message_magic = (uint32_t)magic;
    admin_magic = (uint32_t)admin;
    configured = 1;
    Py_RETURN_NONE;
}

/* 1 when the record of size bytes at pos (within len) is sound: its framing, and its
 * body CRC when crc is set. */
static int sound(const unsigned char *buf, Py_ssize_t len, Py_ssize_t pos, Py_ssize_t size,
                 int crc) {
    if (size < min_record_size || pos < 0 || pos > len - size)
        return 0;
    const unsigned char *p = buf + pos;
    if ((int32_t)get_be32(p + off[F_TOTAL]) != size || get_be32(p + off[F_MAGIC]) != message_magic)
        return 0;
    int32_t blen = (int32_t)get_be32(p + off[F_BODY_LEN]);
    if (blen < 0 || blen > size - min_record_size)
        return 0;
    if (!crc)
        return 1;
    uLong sum = crc32(0L, p + header_size, (uInt)blen);
    return (uint32_t)(sum & 0x7FFFFFFFu) == get_be32(p + off[F_CRC]);
}

static PyObject *check_first_damaged(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (!configured) {
        PyErr_SetString(PyExc_RuntimeError, "configure() was not called");
        return NULL;
    }
    if (nargs != 3 || !PyList_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "first_damaged(buf, locs: list, check_crc)");
        return NULL;
    }
    PyObject *locs = args[1];
    int crc = PyObject_IsTrue(args[2]);
    if (crc < 0)
        return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0)
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(locs), found = -1;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *loc = PyList_GET_ITEM(locs, i);
        if (!PyTuple_Check(loc) || PyTuple_GET_SIZE(loc) < 2) {
            PyErr_SetString(PyExc_TypeError, "locs must hold (pos, size) tuples");
            goto fail;
        }
        Py_ssize_t pos = PyLong_AsSsize_t(PyTuple_GET_ITEM(loc, 0));
        Py_ssize_t size = PyLong_AsSsize_t(PyTuple_GET_ITEM(loc, 1));
        if ((pos == -1 || size == -1) && PyErr_Occurred())
            goto fail;
        if (!sound((const unsigned char *)view.buf, view.len, pos, size, crc)) {
            found = i;
            break;
        }
    }
    PyBuffer_Release(&view);
    return PyLong_FromSsize_t(found);
fail:
    PyBuffer_Release(&view);
    return NULL;
}

/* walk(buf, pos, stop, limit) -> (positions, pos): step over the records of buf from
 * pos (a record boundary) while pos < stop. A record there has the message or admin
 * magic and a total size of at least the smallest record's that ends within limit
 * (the file's end, as a position in buf) and within buf. positions holds the
 * positions stepped over, native int64s in a bytes object; pos is where the walk
 * ended: at or after stop, at a record that runs past buf, or at bytes no record
 * starts with (the caller looks at what is there). */
static PyObject *check_walk(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (!configured) {
        PyErr_SetString(PyExc_RuntimeError, "configure() was not called");
        return NULL;
    }
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "walk(buf, pos, stop, limit)");
        return NULL;
    }
    Py_ssize_t pos = PyLong_AsSsize_t(args[1]);
    Py_ssize_t stop = PyLong_AsSsize_t(args[2]);
    Py_ssize_t limit = PyLong_AsSsize_t(args[3]);
    if (PyErr_Occurred())
        return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0)
        return NULL;
    const unsigned char *buf = (const unsigned char *)view.buf;
    Py_ssize_t len = view.len, n = 0, cap = 4096;
    Py_ssize_t head = (off[F_TOTAL] > off[F_MAGIC] ? off[F_TOTAL] : off[F_MAGIC]) + 4;
    if (limit > len)
        limit = len;
    int64_t *out = PyMem_Malloc(cap * sizeof(int64_t));
    if (out == NULL) {
        PyBuffer_Release(&view);
        return PyErr_NoMemory();
    }
    while (pos < stop && pos >= 0 && pos <= len - head) {
        const unsigned char *p = buf + pos;
        uint32_t magic = get_be32(p + off[F_MAGIC]);
        Py_ssize_t size = (int32_t)get_be32(p + off[F_TOTAL]);
        if ((magic != message_magic && magic != admin_magic) || size < min_record_size ||
            size > limit - pos)
            break;
        if (n == cap) {
            int64_t *more = PyMem_Realloc(out, 2 * cap * sizeof(int64_t));
            if (more == NULL) {
                PyMem_Free(out);
                PyBuffer_Release(&view);
                return PyErr_NoMemory();
            }
            out = more;
            cap *= 2;
        }
        out[n++] = pos;
        pos += size;
    }
    PyBuffer_Release(&view);
    PyObject *positions = PyBytes_FromStringAndSize((const char *)out, n * (Py_ssize_t)sizeof(int64_t));
    PyMem_Free(out);
    if (positions == NULL)
        return NULL;
    return Py_BuildValue("(Nn)", positions, pos);
}

/* crc32s(buf, starts, lengths) -> bytes: zlib's CRC-32 of buf[starts[i]:starts[i] +
 * lengths[i]] for each i, native uint32s. starts and lengths are buffers of native
 * int64s of one length (numpy arrays); a span outside buf raises ValueError. The
 * audit's body CRCs (spark/audit/columns.py _body_crcs, the reference). */
static PyObject *check_crc32s(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "crc32s(buf, starts, lengths)");
        return NULL;
    }
    Py_buffer view, st, ln;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0)
        return NULL;
    if (PyObject_GetBuffer(args[1], &st, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&view);
        return NULL;
    }
    if (PyObject_GetBuffer(args[2], &ln, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&st);
        PyBuffer_Release(&view);
        return NULL;
    }
    PyObject *out = NULL;
    if (st.len != ln.len || st.len % (Py_ssize_t)sizeof(int64_t)) {
        PyErr_SetString(PyExc_ValueError, "starts and lengths must be int64 arrays of one length");
        goto done;
    }
    Py_ssize_t n = st.len / (Py_ssize_t)sizeof(int64_t);
    out = PyBytes_FromStringAndSize(NULL, n * (Py_ssize_t)sizeof(uint32_t));
    if (out == NULL)
        goto done;
    uint32_t *crc = (uint32_t *)PyBytes_AS_STRING(out);
    const unsigned char *buf = (const unsigned char *)view.buf;
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t a, b;
        memcpy(&a, (const char *)st.buf + i * sizeof(int64_t), sizeof a);
        memcpy(&b, (const char *)ln.buf + i * sizeof(int64_t), sizeof b);
        if (a < 0 || b < 0 || a > view.len || b > view.len - a || b > UINT_MAX) {
            PyErr_Format(PyExc_ValueError, "span %zd (%lld, %lld) is outside the buffer",
                         i, (long long)a, (long long)b);
            Py_CLEAR(out);
            goto done;
        }
        crc[i] = (uint32_t)crc32(0L, buf + a, (uInt)b);
    }
done:
    PyBuffer_Release(&ln);
    PyBuffer_Release(&st);
    PyBuffer_Release(&view);
    return out;
}

static PyMethodDef check_methods[] = {
    {"configure", check_configure, METH_VARARGS,
     "configure(header_size, spans, min_record_size, message_magic, admin_magic): the "
     "layout, from format.py (see native.py)."},
    {"walk", (PyCFunction)(void (*)(void))check_walk, METH_FASTCALL,
     "walk(buf, pos, stop, limit) -> (positions: int64 bytes, pos): the records stepped "
     "over from pos (see spark/audit/scan.py)."},
    {"crc32s", (PyCFunction)(void (*)(void))check_crc32s, METH_FASTCALL,
     "crc32s(buf, starts, lengths) -> uint32 bytes: the CRC-32 of each span of buf."},
    {"first_damaged", (PyCFunction)(void (*)(void))check_first_damaged, METH_FASTCALL,
     "first_damaged(buf, locs, check_crc) -> index of the first damaged record of locs, "
     "or -1."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef check_module = {
    PyModuleDef_HEAD_INIT, "mqserver.store._check",
    "The read-path record check in C (see format.first_damaged).", -1, check_methods,
};

PyMODINIT_FUNC PyInit__check(void) { return PyModule_Create(&check_module); }
