/* Helpers shared by the C speedups (mqserver/speedups.py): read a big-endian field, or
 * write one (big- or little-endian) and return the position after it; read a record's
 * position from a list of (pos, size) locations. Include after <Python.h>. */

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

#endif
