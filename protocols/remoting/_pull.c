/* The RocketMQ PULL body in C: the stored records a pull serves, copied one after
 * another into one bytes object, each with its STOREHOST set to the broker's address.
 *
 * A speedup of protocols.remoting.pulling.py_records_body, byte for byte (the Python
 * function stays the reference and the fallback; tests compare the two). A pull of 32
 * messages spent about half its time in that loop.
 *
 * No layout is written here: pulling.py hands configure() the record header's size and
 * the offset and size of its STOREHOST field, from the construct schema of
 * mqserver/store/format.py. Every location is checked against the buffer and the header
 * before anything is copied: a bad one raises ValueError and nothing is built.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

static Py_ssize_t header_size, host_off, host_size;
static int configured;

/* configure(header_size, host_offset, host_size): checked whole before it is used. */
static PyObject *pull_configure(PyObject *self, PyObject *args) {
    Py_ssize_t hsize, hoff, hlen;
    if (!PyArg_ParseTuple(args, "nnn", &hsize, &hoff, &hlen))
        return NULL;
    if (hsize <= 0 || hlen <= 0 || hoff < 0 || hoff > hsize - hlen) {
        PyErr_SetString(PyExc_ValueError, "STOREHOST lies outside the record header");
        return NULL;
    }
    header_size = hsize;
    host_off = hoff;
    host_size = hlen;
    configured = 1;
    Py_RETURN_NONE;
}

/* locs[i] as (pos, size), checked to lie within len and to hold a header: 0 or -1 with
 * an exception set. */
static int read_loc(PyObject *locs, Py_ssize_t i, Py_ssize_t len, Py_ssize_t *pos,
                    Py_ssize_t *size) {
    PyObject *loc = PyList_GET_ITEM(locs, i);
    if (!PyTuple_Check(loc) || PyTuple_GET_SIZE(loc) != 2) {
        PyErr_SetString(PyExc_TypeError, "locs must hold (pos, size) tuples");
        return -1;
    }
    *pos = PyLong_AsSsize_t(PyTuple_GET_ITEM(loc, 0));
    *size = PyLong_AsSsize_t(PyTuple_GET_ITEM(loc, 1));
    if ((*pos == -1 || *size == -1) && PyErr_Occurred())
        return -1;
    if (*size < header_size || *pos < 0 || *pos > len - *size) {
        PyErr_Format(PyExc_ValueError, "record (%zd, %zd) outside the %zd-byte buffer or "
                     "shorter than its header", *pos, *size, len);
        return -1;
    }
    return 0;
}

static PyObject *pull_records_body(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (!configured) {
        PyErr_SetString(PyExc_RuntimeError, "configure() was not called");
        return NULL;
    }
    if (nargs != 3 || !PyList_Check(args[1]) || !PyBytes_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "records_body(buf, locs: list, store_host: bytes)");
        return NULL;
    }
    PyObject *locs = args[1];
    if (PyBytes_GET_SIZE(args[2]) != host_size) {
        PyErr_Format(PyExc_ValueError, "store_host must be %zd bytes", host_size);
        return NULL;
    }
    const char *host = PyBytes_AS_STRING(args[2]);
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0)
        return NULL;
    PyObject *out = NULL;
    Py_ssize_t n = PyList_GET_SIZE(locs), total = 0, pos, size;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (read_loc(locs, i, view.len, &pos, &size) < 0)
            goto done;
        if (size > PY_SSIZE_T_MAX - total) {
            PyErr_NoMemory();
            goto done;
        }
        total += size;
    }
    out = PyBytes_FromStringAndSize(NULL, total);
    if (out == NULL)
        goto done;
    char *o = PyBytes_AS_STRING(out);
    const char *buf = (const char *)view.buf;
    /* locs cannot change in between: no Python code runs here (the list is only read) */
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *loc = PyList_GET_ITEM(locs, i);
        pos = PyLong_AsSsize_t(PyTuple_GET_ITEM(loc, 0));
        size = PyLong_AsSsize_t(PyTuple_GET_ITEM(loc, 1));
        memcpy(o, buf + pos, (size_t)size);
        memcpy(o + host_off, host, (size_t)host_size);
        o += size;
    }
done:
    PyBuffer_Release(&view);
    return out;
}

static PyMethodDef pull_methods[] = {
    {"configure", pull_configure, METH_VARARGS,
     "configure(header_size, host_offset, host_size): the record layout, from format.py "
     "(see pulling.py)."},
    {"records_body", (PyCFunction)(void (*)(void))pull_records_body, METH_FASTCALL,
     "records_body(buf, locs, store_host) -> the records at locs, STOREHOST set (see "
     "pulling.py_records_body)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef pull_module = {
    PyModuleDef_HEAD_INIT, "protocols.remoting._pull",
    "The RocketMQ PULL body in C (see pulling.py_records_body).", -1, pull_methods,
};

PyMODINIT_FUNC PyInit__pull(void) { return PyModule_Create(&pull_module); }
