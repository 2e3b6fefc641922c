/* The smss publish hot path in C: one read holding one PUB of one message record
 * without headers (what the smss SDKs send) -> its topic and the message body.
 *
 * A speedup of protocols.smss.codec.py_bare_pub, which stays the reference and the
 * fallback (tests compare the two on generated input). The request header and the
 * message record prefix are not written down here: codec.py hands configure() the
 * offset and width of each field, derived from protocols.smss.wire at import, and
 * configure() checks the widths this code reads them with (all little-endian).
 *
 * It only recognises: anything else (another command, a topic or payload over the
 * limits, a payload of 8 bytes or fewer, bytes before or after the request, headers,
 * several records) returns None, and the caller decodes the read the general way,
 * which applies every rule and answers every error. So limits are checked here before
 * anything is copied, and what this returns is exactly what the general path stores.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#include "_bytes.h"

/* Request header: size, then where code (u8), topic length (u16), payload length (u32)
 * and trace length (u8) are; message record prefix: size, S (u32) and H (u32). */
static Py_ssize_t hdr_size, off_code, off_topic_len, off_payload_len, off_trace_len;
static Py_ssize_t prefix_size, off_s, off_h;
static unsigned int cmd_pub;
static int configured;

static inline uint32_t get_le16(const unsigned char *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8);
}

static inline uint32_t get_le32(const unsigned char *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) |
           ((uint32_t)p[3] << 24);
}

static PyObject *pub_configure(PyObject *self, PyObject *args) {
    static const Py_ssize_t header_widths[] = {1, 2, 4, 1};
    static const Py_ssize_t prefix_widths[] = {4, 4};
    PyObject *header_spans, *prefix_spans;
    Py_ssize_t h_size, p_size, hdr[4], pre[2];
    configured = 0;
    if (!PyArg_ParseTuple(args, "nOnOI", &h_size, &header_spans, &p_size, &prefix_spans,
                          &cmd_pub))
        return NULL;
    if (read_spans(header_spans, 4, header_widths, h_size, 0, hdr, "request header") < 0 ||
        read_spans(prefix_spans, 2, prefix_widths, p_size, 1, pre, "message prefix") < 0)
        return NULL;
    hdr_size = h_size;
    off_code = hdr[0];
    off_topic_len = hdr[1];
    off_payload_len = hdr[2];
    off_trace_len = hdr[3];
    prefix_size = p_size;
    off_s = pre[0];
    off_h = pre[1];
    configured = 1;
    Py_RETURN_NONE;
}

/* bare_pub(data, max_topic, max_payload) -> (topic, body) or None */
static PyObject *pub_bare_pub(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (!configured) {
        PyErr_SetString(PyExc_RuntimeError, "configure() was not called");
        return NULL;
    }
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "bare_pub(data, max_topic, max_payload)");
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
    const unsigned char *p = (const unsigned char *)PyBytes_AS_STRING(data);
    Py_ssize_t topic_len = (Py_ssize_t)get_le16(p + off_topic_len);
    Py_ssize_t trace_len = p[off_trace_len];
    Py_ssize_t payload = (Py_ssize_t)get_le32(p + off_payload_len);
    Py_ssize_t body = hdr_size + topic_len + trace_len;
    if (p[off_code] != cmd_pub || topic_len > max_topic || payload <= prefix_size ||
        payload > max_payload || body + payload != n)
        Py_RETURN_NONE;
    /* One record without headers filling the whole payload; S is a u32, so the sum
     * cannot overflow a Py_ssize_t on 64-bit builds, nor wrap on 32-bit ones where
     * payload <= n. */
    uint32_t s = get_le32(p + body + off_s);
    if (get_le32(p + body + off_h) != 0 || (uint64_t)s + (uint64_t)prefix_size != (uint64_t)payload)
        Py_RETURN_NONE;
    PyObject *topic = PyBytes_FromStringAndSize((const char *)p + hdr_size, topic_len);
    if (topic == NULL)
        return NULL;
    PyObject *msg = PyBytes_FromStringAndSize((const char *)p + body + prefix_size,
                                              payload - prefix_size);
    if (msg == NULL) {
        Py_DECREF(topic);
        return NULL;
    }
    PyObject *out = PyTuple_New(2);
    if (out == NULL) {
        Py_DECREF(topic);
        Py_DECREF(msg);
        return NULL;
    }
    PyTuple_SET_ITEM(out, 0, topic);
    PyTuple_SET_ITEM(out, 1, msg);
    return out;
}

static PyMethodDef pub_methods[] = {
    {"configure", pub_configure, METH_VARARGS,
     "configure(header_size, ((off, size) of code, topic_len, payload_len, trace_len), "
     "prefix_size, ((off, size) of S, H), cmd_pub): the request header and the message "
     "record prefix."},
    {"bare_pub", (PyCFunction)(void (*)(void))pub_bare_pub, METH_FASTCALL,
     "bare_pub(data, max_topic, max_payload) -> (topic, body) when data (bytes) is "
     "exactly one PUB of one message record without headers within the limits, else "
     "None."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef pub_module = {
    PyModuleDef_HEAD_INIT, "protocols.smss._pub",
    "The smss PUB fast path in C (see codec.py).", -1, pub_methods,
};

PyMODINIT_FUNC PyInit__pub(void) { return PyModule_Create(&pub_module); }
