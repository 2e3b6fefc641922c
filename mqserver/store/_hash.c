/* Java's String.hashCode in C: a speedup of format.java_string_hash_py (format.py),
 * which stays the reference and the fallback; tests compare the two.
 *
 * A RocketMQ SEND hashes its tag (the consume-queue entry's tag hash) and each of its
 * keys (the index), one multiply-add per UTF-16 code unit: in Python that loop is a
 * few hundred bytecodes per message. Java hashes UTF-16 units, so a character past the
 * BMP counts as its surrogate pair; a lone surrogate (Python strings may hold one) is
 * the single unit it is.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

static PyObject *java_string_hash(PyObject *self, PyObject *arg) {
    if (!PyUnicode_Check(arg)) {
        PyErr_SetString(PyExc_TypeError, "java_string_hash() takes a str");
        return NULL;
    }
    Py_ssize_t n = PyUnicode_GET_LENGTH(arg);
    int kind = PyUnicode_KIND(arg);
    const void *data = PyUnicode_DATA(arg);
    uint32_t h = 0;  /* unsigned: Java's int overflow, without C's undefined behaviour */
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_UCS4 c = PyUnicode_READ(kind, data, i);
        if (c >= 0x10000) {
            c -= 0x10000;
            h = h * 31u + (uint32_t)(0xD800 + (c >> 10));
            h = h * 31u + (uint32_t)(0xDC00 + (c & 0x3FF));
        } else {
            h = h * 31u + (uint32_t)c;
        }
    }
    return PyLong_FromLong((long)(int32_t)h);
}

static PyMethodDef methods[] = {
    {"java_string_hash", java_string_hash, METH_O,
     "java_string_hash(s) -> Java's String.hashCode of s, a signed 32-bit int"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_hash", "Java's String.hashCode (format.java_string_hash).", -1,
    methods,
};

PyMODINIT_FUNC PyInit__hash(void) { return PyModule_Create(&module); }
