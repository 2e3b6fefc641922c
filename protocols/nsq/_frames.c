/* The nsqd reader hot path in C: channel deliveries -> NSQ message frames.
 *
 * A speedup of protocols.nsq.frames.py_message_frames, byte for byte (the Python
 * function stays the reference and the fallback; tests compare the two). Each frame is
 * nsq-protocol.md section 3 and 5: size u32 BE (everything after it), frame type u32 BE
 * (given by the caller: FRAME_TYPE_MESSAGE), timestamp i64 BE (ns), attempts u16 BE,
 * the 16-byte message id (the eventId in lowercase hex), body.
 *
 * Where each field goes is not written here: frames.py hands configure() the offsets
 * derived from protocols.nsq.wire.MESSAGE_FRAME at import. The width and byte order of
 * each field stay fixed here; configure() checks the offsets fit them.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#include "_bytes.h"
#include <string.h>

static const char hexdigits[] = "0123456789abcdef";

/* The head of a message frame (set by configure): offsets of the type, timestamp,
 * attempts and id fields, and its size. The size prefix is at offset 0. */
static Py_ssize_t out_type, out_ts, out_attempts, out_id, head_size;
static int configured;

/* Is [off, off+width) inside the head? */
static int fits(Py_ssize_t off, Py_ssize_t width, Py_ssize_t size) {
    return off >= 4 && off <= size - width;
}

static PyObject *frames_configure(PyObject *self, PyObject *args) {
    Py_ssize_t o_size, o_type, o_ts, o_att, o_id, h_size;
    configured = 0;
    if (!PyArg_ParseTuple(args, "(nnnnn)n", &o_size, &o_type, &o_ts, &o_att, &o_id, &h_size))
        return NULL;
    if (o_size != 0 || !(fits(o_type, 4, h_size) && fits(o_ts, 8, h_size) &&
                         fits(o_att, 2, h_size) && fits(o_id, 16, h_size))) {
        PyErr_SetString(PyExc_ValueError, "message frame head fields outside the head");
        return NULL;
    }
    out_type = o_type;
    out_ts = o_ts;
    out_attempts = o_att;
    out_id = o_id;
    head_size = h_size;
    configured = 1;
    Py_RETURN_NONE;
}

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
    if (!configured) {
        PyErr_SetString(PyExc_RuntimeError, "configure() was not called");
        return NULL;
    }
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
        if (r->b1 - r->b0 > 0xFFFFFFFFLL - (head_size - 4)) {
            PyBuffer_Release(&r->buf);
            PyErr_SetString(PyExc_OverflowError, "body too large for a frame");
            goto done;
        }
        total += head_size + (r->b1 - r->b0);
    }
    result = PyBytes_FromStringAndSize(NULL, total);
    if (result == NULL)
        goto done;
    unsigned char *o = (unsigned char *)PyBytes_AS_STRING(result);
    for (Py_ssize_t i = 0; i < n; i++) {
        item_t *r = &it[i];
        Py_ssize_t blen = r->b1 - r->b0;
        uint64_t ts = (uint64_t)r->ts, eid = r->eid;
        unsigned char *id = o + out_id;
        put_be32(o, (uint32_t)(blen + head_size - 4));
        put_be32(o + out_type, frame_type);
        put_be32(o + out_ts, (uint32_t)(ts >> 32));
        put_be32(o + out_ts + 4, (uint32_t)ts);
        o[out_attempts] = (unsigned char)(r->attempts >> 8);
        o[out_attempts + 1] = (unsigned char)r->attempts;
        for (int k = 15; k >= 0; k--) {
            id[k] = hexdigits[eid & 0xF];
            eid >>= 4;
        }
        o += head_size;
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
    {"configure", frames_configure, METH_VARARGS,
     "configure((off_size, off_frame_type, off_timestamp, off_attempts, off_id), head_size): "
     "the layout of a message frame's head."},
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
