/* Helpers shared by the C speedups (mqserver/speedups.py): read a big-endian field, or
 * write one (big- or little-endian) and return the position after it; read a record's
 * position from a list of (pos, size) locations; read the field spans configure() is
 * handed. Include after <Python.h>. */

#ifndef MQSERVER_BYTES_H
#define MQSERVER_BYTES_H

#include <stdint.h>

static inline uint32_t get_be32(const unsigned char *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

static inline uint64_t get_be64(const unsigned char *p) {
    return ((uint64_t)get_be32(p) << 32) | get_be32(p + 4);
}

static inline unsigned char *put_be32(unsigned char *o, uint32_t v) {
    o[0] = (unsigned char)(v >> 24);
    o[1] = (unsigned char)(v >> 16);
    o[2] = (unsigned char)(v >> 8);
    o[3] = (unsigned char)v;
    return o + 4;
}

static inline unsigned char *put_be64(unsigned char *o, uint64_t v) {
    put_be32(o, (uint32_t)(v >> 32));
    return put_be32(o + 4, (uint32_t)v);
}

static inline unsigned char *put_le32(unsigned char *o, uint32_t v) {
    o[0] = (unsigned char)v;
    o[1] = (unsigned char)(v >> 8);
    o[2] = (unsigned char)(v >> 16);
    o[3] = (unsigned char)(v >> 24);
    return o + 4;
}

static inline unsigned char *put_le64(unsigned char *o, uint64_t v) {
    put_le32(o, (uint32_t)v);
    return put_le32(o + 4, (uint32_t)(v >> 32));
}

/* The position of locs[i], a (pos, size) tuple: -1 with TypeError set when the item is
 * not such a tuple, -1 with the conversion's error set when pos is not an int (callers
 * check PyErr_Occurred(); a negative pos without an error is theirs to refuse). */
static inline Py_ssize_t loc_pos(PyObject *locs, Py_ssize_t i) {
    PyObject *loc = PyList_GET_ITEM(locs, i);
    if (!PyTuple_Check(loc) || PyTuple_GET_SIZE(loc) < 1) {
        PyErr_SetString(PyExc_TypeError, "locs must hold (pos, size) tuples");
        return -1;
    }
    return PyLong_AsSsize_t(PyTuple_GET_ITEM(loc, 0));
}

/* A layout handed to a speedup's configure(): read n (offset, size) pairs from the tuple
 * spans into out, checking each size against width[] and that each lies within
 * [0, total); with cover, also that together they cover [0, total) exactly once (a
 * layout the speedup writes whole). -1 with an exception set when they do not. */
#define MAX_LAYOUT 1024
static inline int read_spans(PyObject *spans, Py_ssize_t n, const Py_ssize_t *width,
                             Py_ssize_t total, int cover, Py_ssize_t *out, const char *what) {
    char covered[MAX_LAYOUT] = {0};
    Py_ssize_t sum = 0;
    if (total <= 0 || total > MAX_LAYOUT) {
        PyErr_Format(PyExc_ValueError, "%s: size %zd out of range", what, total);
        return -1;
    }
    if (!PyTuple_Check(spans) || PyTuple_GET_SIZE(spans) != n) {
        PyErr_Format(PyExc_TypeError, "%s: a tuple of %zd (offset, size) pairs", what, n);
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t o, size;
        if (!PyArg_ParseTuple(PyTuple_GET_ITEM(spans, i), "nn", &o, &size))
            return -1;
        if (size != width[i] || o < 0 || o > total - size) {
            PyErr_Format(PyExc_ValueError, "%s: field %zd at %zd of %zd bytes, expected %zd bytes "
                         "within %zd", what, i, o, size, width[i], total);
            return -1;
        }
        for (Py_ssize_t b = o; cover && b < o + size; b++) {
            if (covered[b]++) {
                PyErr_Format(PyExc_ValueError, "%s: fields overlap at byte %zd", what, b);
                return -1;
            }
        }
        sum += size;
        out[i] = o;
    }
    if (cover && sum != total) {
        PyErr_Format(PyExc_ValueError, "%s: fields cover %zd of %zd bytes", what, sum, total);
        return -1;
    }
    return 0;
}

#endif
