/* Java's String.hashCode in C: a speedup of format.java_string_hash_py (format.py),
 * which stays the reference and the fallback; tests compare the two.
 *
 * A RocketMQ SEND hashes its tag (the consume-queue entry's tag hash) and each of its
 * keys (the index), one multiply-add per UTF-16 code unit: in Python that loop is a
 * few hundred bytecodes per message. Java hashes UTF-16 units, so a character past the
 * BMP counts as its surrogate pair; a lone surrogate (Python strings may hold one) is
 * the single unit it is.
 *
 * Also, with their references in format.py: index_key_hash (the index's hash of
 * "topic#key") and tag_hash_of (a properties string's TAGS value found and hashed), so
 * a SEND's record packing and its index entry call no Python to hash.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "_javahash.h"

static PyObject *java_string_hash(PyObject *self, PyObject *arg) {
    if (!PyUnicode_Check(arg)) {
        PyErr_SetString(PyExc_TypeError, "java_string_hash() takes a str");
        return NULL;
    }
    /* unsigned: Java's int overflow, without C's undefined behaviour */
    return PyLong_FromLong((long)(int32_t)hash_units(0, arg));
}

/* index_key_hash(topic, key): format.index_key_hash, abs(hashCode of "topic#key"), 0
 * for Integer.MIN_VALUE. */
static PyObject *index_key_hash(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !PyUnicode_Check(args[0]) || !PyUnicode_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "index_key_hash() takes two str");
        return NULL;
    }
    int32_t h = (int32_t)hash_units(hash_units(0, args[0]) * 31u + (uint32_t)'#', args[1]);
    if (h == INT32_MIN)
        h = 0;
    return PyLong_FromLong(h < 0 ? -(long)h : (long)h);
}

/* The first index of byte c in d[from:n], or -1. */
static Py_ssize_t find_byte(const unsigned char *d, Py_ssize_t n, unsigned char c, Py_ssize_t from) {
    const unsigned char *at = from < n ? memchr(d + from, c, (size_t)(n - from)) : NULL;
    return at == NULL ? -1 : at - d;
}

/* The first index of the 4 bytes "TAGS" in d[from:n], or -1. */
static Py_ssize_t find_tags(const unsigned char *d, Py_ssize_t n, Py_ssize_t from) {
    for (Py_ssize_t i = from; i + 4 <= n; i++) {
        if (d[i] == 'T' && memcmp(d + i, "TAGS", 4) == 0)
            return i;
    }
    return -1;
}

/* tag_hash_of(properties): format.tag_hash_of (the reference), the hash of the TAGS
 * value of the first item whose key is TAGS, its bytes decoded with "replace"; 0 without
 * one. */
static PyObject *tag_hash_of(PyObject *self, PyObject *arg) {
    Py_buffer view;
    Py_ssize_t n, start, stop, end = -1, pos = 0;
    const unsigned char *d;
    PyObject *value;
    uint32_t h;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    d = view.buf;
    n = view.len;
    if (n >= 5 && memcmp(d, "TAGS\x01", 5) == 0) {  /* the first item: how clients write it */
        start = 5;
    } else {
        for (;;) {
            Py_ssize_t at = find_tags(d, n, pos);
            if (at < 0) {
                PyBuffer_Release(&view);
                return PyLong_FromLong(0);
            }
            end = at + 4;
            /* an item's key: at the start or after 0x02, ended by 0x01, 0x02 or the end */
            if ((at == 0 || d[at - 1] == 2) && (end == n || d[end] == 1 || d[end] == 2))
                break;
            pos = at + 1;
        }
        if (end == n || d[end] == 2) {  /* the key without a value: the hash of "" */
            PyBuffer_Release(&view);
            return PyLong_FromLong(0);
        }
        start = end + 1;
    }
    stop = find_byte(d, n, 2, start);
    if (stop < 0)
        stop = n;
    value = PyUnicode_DecodeUTF8((const char *)d + start, stop - start, "replace");
    PyBuffer_Release(&view);
    if (value == NULL)
        return NULL;
    h = hash_units(0, value);
    Py_DECREF(value);
    return PyLong_FromLong((long)(int32_t)h);
}

static PyMethodDef methods[] = {
    {"java_string_hash", java_string_hash, METH_O,
     "java_string_hash(s) -> Java's String.hashCode of s, a signed 32-bit int"},
    {"index_key_hash", (PyCFunction)(void (*)(void))index_key_hash, METH_FASTCALL,
     "index_key_hash(topic, key) -> the IndexFile KeyHash (format.index_key_hash)"},
    {"tag_hash_of", tag_hash_of, METH_O,
     "tag_hash_of(properties) -> the consume-queue tag hash (format.tag_hash_of)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_hash", "Java's String.hashCode (format.java_string_hash).", -1,
    methods,
};

PyMODINIT_FUNC PyInit__hash(void) { return PyModule_Create(&module); }
