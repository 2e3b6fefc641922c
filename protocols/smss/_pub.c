/* The smss publish hot path in C: one read holding exactly one PUB -> its Pub event
 * (topic, trace and payload; and messages, [body], when the payload is one message
 * record without headers).
 *
 * The fast decode inside protocols.smss.codec.RequestDecoder.feed, a speedup of
 * codec.py_one_pub, which stays the reference and the fallback (tests compare the two
 * on generated input). The request header is not written down here: codec.py hands
 * configure() the offset and width of each field, derived from protocols.smss.wire at
 * import, and configure() checks the widths this code reads them with (all
 * little-endian).
 *
 * It only recognises: anything else (another command, a topic or payload over the
 * limits, a payload of 8 bytes or fewer, bytes before or after the request) returns
 * None, and feed decodes the read the general way, which applies every rule and answers
 * every error. So limits are checked here before anything is copied.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#include "_bytes.h"

/* Request header: size, then where code (u8), topic length (u16), payload length (u32)
 * and trace length (u8) are. */
static Py_ssize_t hdr_size, off_code, off_topic_len, off_payload_len, off_trace_len;
/* A PUB's payload must be longer than this (the record prefix, S and H), and where S
 * (u32) and H (u32) are in that prefix. */
static Py_ssize_t min_payload, off_s, off_h;
static unsigned int cmd_pub;
/* The event type (messages.Pub, a frozen dataclass with slots) and its field names. */
static PyTypeObject *pub_type;
static PyObject *s_topic, *s_trace, *s_payload, *s_messages;
static int configured;

static inline uint32_t get_le16(const unsigned char *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8);
}

static inline uint32_t get_le32(const unsigned char *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) |
           ((uint32_t)p[3] << 24);
}

/* configure(header_size, header_spans, prefix_size, prefix_spans, cmd_pub, event_type) */
static PyObject *pub_configure(PyObject *self, PyObject *args) {
    static const Py_ssize_t header_widths[] = {1, 2, 4, 1};
    static const Py_ssize_t prefix_widths[] = {4, 4};
    PyObject *header_spans, *prefix_spans, *etype;
    Py_ssize_t h_size, min_p, hdr[4], pre[2];
    configured = 0;
    if (!PyArg_ParseTuple(args, "nOnOIO!", &h_size, &header_spans, &min_p, &prefix_spans,
                          &cmd_pub, &PyType_Type, &etype))
        return NULL;
    if (read_spans(header_spans, 4, header_widths, h_size, 0, hdr, "request header") < 0 ||
        read_spans(prefix_spans, 2, prefix_widths, min_p, 1, pre, "message prefix") < 0)
        return NULL;
    off_s = pre[0];
    off_h = pre[1];
    hdr_size = h_size;
    off_code = hdr[0];
    off_topic_len = hdr[1];
    off_payload_len = hdr[2];
    off_trace_len = hdr[3];
    min_payload = min_p;
    Py_XSETREF(pub_type, (PyTypeObject *)Py_NewRef(etype));
    configured = 1;
    Py_RETURN_NONE;
}

/* one_pub(data, max_topic, max_payload) -> Pub(topic, trace, payload) or None */
static PyObject *pub_one_pub(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (!configured) {
        PyErr_SetString(PyExc_RuntimeError, "configure() was not called");
        return NULL;
    }
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "one_pub(data, max_topic, max_payload)");
        return NULL;
    }
    PyObject *data = args[0];
    Py_ssize_t max_topic = PyLong_AsSsize_t(args[1]);
    if (max_topic == -1 && PyErr_Occurred())
        return NULL;
    Py_ssize_t max_payload = PyLong_AsSsize_t(args[2]);
    if (max_payload == -1 && PyErr_Occurred())
        return NULL;
    if (!PyBytes_CheckExact(data))
        Py_RETURN_NONE;
    Py_ssize_t n = PyBytes_GET_SIZE(data);
    if (n <= hdr_size)
        Py_RETURN_NONE;
    const char *p = PyBytes_AS_STRING(data);
    const unsigned char *u = (const unsigned char *)p;
    Py_ssize_t topic_len = (Py_ssize_t)get_le16(u + off_topic_len);
    Py_ssize_t trace_len = u[off_trace_len];
    Py_ssize_t payload = (Py_ssize_t)get_le32(u + off_payload_len);
    Py_ssize_t body = hdr_size + topic_len + trace_len;
    if (u[off_code] != cmd_pub || topic_len > max_topic || payload <= min_payload ||
        payload > max_payload || body + payload != n)
        Py_RETURN_NONE;
    /* The event made as its dataclass __init__ makes it (object.__setattr__ of each
     * field: the class's own __setattr__ refuses, it is frozen), without the calls. */
    PyObject *out = pub_type->tp_alloc(pub_type, 0);
    if (out == NULL)
        return NULL;
    PyObject *part = PyBytes_FromStringAndSize(p + hdr_size, topic_len);
    if (part == NULL || PyObject_GenericSetAttr(out, s_topic, part) < 0)
        goto fail;
    Py_DECREF(part);
    part = PyBytes_FromStringAndSize(p + hdr_size + topic_len, trace_len);
    if (part == NULL || PyObject_GenericSetAttr(out, s_trace, part) < 0)
        goto fail;
    Py_DECREF(part);
    part = PyBytes_FromStringAndSize(p + body, payload);
    if (part == NULL || PyObject_GenericSetAttr(out, s_payload, part) < 0)
        goto fail;
    Py_DECREF(part);
    /* One record without headers filling the whole payload: its body, in a list, as
     * views.payload_to_messages makes it. S is a u32, so the sum cannot overflow. */
    uint32_t s = get_le32(u + body + off_s);
    if (get_le32(u + body + off_h) == 0 && (uint64_t)s + (uint64_t)min_payload == (uint64_t)payload) {
        PyObject *msg = PyBytes_FromStringAndSize(p + body + min_payload, payload - min_payload);
        if (msg == NULL)
            goto fail_out;
        part = PyList_New(1);
        if (part == NULL) {
            Py_DECREF(msg);
            goto fail_out;
        }
        PyList_SET_ITEM(part, 0, msg);
    } else {
        part = Py_NewRef(Py_None);
    }
    if (PyObject_GenericSetAttr(out, s_messages, part) < 0)
        goto fail;
    Py_DECREF(part);
    return out;
fail:
    Py_XDECREF(part);
fail_out:
    Py_DECREF(out);
    return NULL;
}

static PyMethodDef pub_methods[] = {
    {"configure", pub_configure, METH_VARARGS,
     "configure(header_size, ((off, size) of code, topic_len, payload_len, trace_len), "
     "prefix_size, ((off, size) of S, H), cmd_pub, event_type): the request header, the "
     "message record prefix (a PUB's payload must exceed it), and the event type (topic, "
     "trace, payload, messages)."},
    {"one_pub", (PyCFunction)(void (*)(void))pub_one_pub, METH_FASTCALL,
     "one_pub(data, max_topic, max_payload) -> the Pub event when data (bytes) is exactly "
     "one PUB within the limits, else None."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef pub_module = {
    PyModuleDef_HEAD_INIT, "protocols.smss._pub",
    "The fast decode of one whole smss PUB in C (see codec.py).", -1, pub_methods,
};

PyMODINIT_FUNC PyInit__pub(void) {
    if ((s_topic = PyUnicode_InternFromString("topic")) == NULL ||
        (s_trace = PyUnicode_InternFromString("trace")) == NULL ||
        (s_payload = PyUnicode_InternFromString("payload")) == NULL ||
        (s_messages = PyUnicode_InternFromString("messages")) == NULL)
        return NULL;
    return PyModule_Create(&pub_module);
}
