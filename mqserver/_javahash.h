/* Java's String.hashCode over a Python str, shared by the C speedups that hash as
 * RocketMQ does (mqserver/store/_hash.c, mqserver/store/_index.c); the reference is
 * format.java_string_hash_py. Include after <Python.h>. */

#ifndef MQSERVER_JAVAHASH_H
#define MQSERVER_JAVAHASH_H

#include <stdint.h>

/* h continued over the UTF-16 units of the str u. Java hashes UTF-16 units, so a
 * character past the BMP counts as its surrogate pair; a lone surrogate (Python strings
 * may hold one) is the single unit it is. Unsigned: Java's int overflow, without C's
 * undefined behaviour. */
static inline uint32_t hash_units(uint32_t h, PyObject *u) {
    Py_ssize_t n = PyUnicode_GET_LENGTH(u);
    int kind = PyUnicode_KIND(u);
    const void *data = PyUnicode_DATA(u);
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
    return h;
}

#endif
