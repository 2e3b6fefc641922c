/* The nsqd reader hot path in C: channel deliveries -> NSQ message frames.
 *
 * A speedup of protocols.nsq.frames.py_message_frames, byte for byte (the Python
 * function stays the reference and the fallback; tests compare the two). Each frame is
 * nsq-protocol.md section 3 and 5: size u32 BE (everything after it), frame type u32 BE
 * (given by the caller: FRAME_TYPE_MESSAGE), timestamp i64 BE (ns), attempts u16 BE,
 * the 16-byte message id (the eventId in lowercase hex), body.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#include "_bytes.h"
#include <string.h>

static const char hexdigits[] = "0123456789abcdef";

/* One delivery's fields, converted in the first pass. */
typedef struct {
    long long ts;
    unsigned long attempts;
    unsigned long long eid;
    Py_buffer buf;
    Py_ssize_t b0, b1;
} item_t;

static PyObject *frames_message_frames(PyObject *self, PyObject *args) {
    PyObject *items;
    unsigned int frame_type;
    PyObject *result = NULL;
    if (!PyArg_ParseTuple(args, "O!I", &PyList_Type, &items, &frame_type))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(items);
    item_t *it = PyMem_Calloc(n ? n : 1, sizeof(item_t));
    if (it == NULL)
        return PyErr_NoMemory();
    Py_ssize_t got = 0; /* items whose buffer is held */
    Py_ssize_t total = 0;
    for (; got < n; got++) {
        PyObject *t = PyList_GET_ITEM(items, got);
        item_t *r = &it[got];
        PyObject *bufobj;
        if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) != 6) {
            PyErr_SetString(PyExc_TypeError,
                            "items must be (ts, attempts, event_id, buf, b0, b1) tuples");
            goto done;
        }
        r->ts = PyLong_AsLongLong(PyTuple_GET_ITEM(t, 0));
        r->attempts = PyLong_AsUnsignedLong(PyTuple_GET_ITEM(t, 1));
        r->eid = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(t, 2));
        r->b0 = PyLong_AsSsize_t(PyTuple_GET_ITEM(t, 4));
        r->b1 = PyLong_AsSsize_t(PyTuple_GET_ITEM(t, 5));
        if (PyErr_Occurred())
            goto done;
        if (r->attempts > 0xFFFF) {
            PyErr_SetString(PyExc_OverflowError, "attempts over 65535");
            goto done;
        }
        bufobj = PyTuple_GET_ITEM(t, 3);
        if (PyObject_GetBuffer(bufobj, &r->buf, PyBUF_SIMPLE) < 0)
            goto done;
        if (r->b0 < 0 || r->b1 < r->b0 || r->b1 > r->buf.len) {
            PyBuffer_Release(&r->buf);
            PyErr_SetString(PyExc_ValueError, "body span outside its buffer");
            goto done;
        }
        if (r->b1 - r->b0 > 0xFFFFFFFFLL - 30) {
            PyBuffer_Release(&r->buf);
            PyErr_SetString(PyExc_OverflowError, "body too large for a frame");
            goto done;
        }
        total += 34 + (r->b1 - r->b0);
    }
    result = PyBytes_FromStringAndSize(NULL, total);
    if (result == NULL)
        goto done;
    unsigned char *o = (unsigned char *)PyBytes_AS_STRING(result);
    for (Py_ssize_t i = 0; i < n; i++) {
        item_t *r = &it[i];
        Py_ssize_t blen = r->b1 - r->b0;
        uint64_t ts = (uint64_t)r->ts, eid = r->eid;
        o = put_be32(o, (uint32_t)(blen + 30));
        o = put_be32(o, frame_type);
        o = put_be32(o, (uint32_t)(ts >> 32));
        o = put_be32(o, (uint32_t)ts);
        *o++ = (unsigned char)(r->attempts >> 8);
        *o++ = (unsigned char)r->attempts;
        for (int k = 15; k >= 0; k--) {
            o[k] = hexdigits[eid & 0xF];
            eid >>= 4;
        }
        o += 16;
        memcpy(o, (const char *)r->buf.buf + r->b0, blen);
        o += blen;
    }
done:
    for (Py_ssize_t i = 0; i < got; i++)
        PyBuffer_Release(&it[i].buf);
    PyMem_Free(it);
    return result;
}

static PyMethodDef frames_methods[] = {
    {"message_frames", frames_message_frames, METH_VARARGS,
     "message_frames(items, frame_type) -> bytes: one message frame per "
     "(ts_ns, attempts, event_id, buf, body_start, body_end) item."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef frames_module = {
    PyModuleDef_HEAD_INIT, "protocols.nsq._frames",
    "NSQ message frames in C (see frames.py).", -1, frames_methods,
};

PyMODINIT_FUNC PyInit__frames(void) { return PyModule_Create(&frames_module); }
