/* The read-path record check in C: is each record of a read sound (framing and body
 * CRC)? A speedup of format.first_damaged (format.py), which stays the reference and
 * the fallback; tests compare the two.
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
#include <string.h>
#include <zlib.h>

#include "_bytes.h"

/* The fields read, in the order configure() takes their (offset, size), and widths. */
enum { F_TOTAL, F_MAGIC, F_CRC, F_BODY_LEN, N_FIELDS };
static const Py_ssize_t field_width[N_FIELDS] = {4, 4, 4, 4};
static Py_ssize_t off[N_FIELDS], header_size, min_record_size;
static uint32_t message_magic;
static int configured;

/* configure(header_size, spans, min_record_size, message_magic): checked whole before
 * any of it is used (a failed call changes nothing). */
static PyObject *check_configure(PyObject *self, PyObject *args) {
    Py_ssize_t hsize, min_size, new_off[N_FIELDS];
    PyObject *spans;
    unsigned long magic;
    if (!PyArg_ParseTuple(args, "nO!nk", &hsize, &PyTuple_Type, &spans, &min_size, &magic))
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

static PyMethodDef check_methods[] = {
    {"configure", check_configure, METH_VARARGS,
     "configure(header_size, spans, min_record_size, message_magic): the layout, from "
     "format.py (see native.py)."},
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
