/* The publish hot path in C: messages -> commit-log records and consume-queue entries.
 *
 * A speedup of the record-packing loop of Writer._pack_py (writer.py), byte for
 * byte; the Python loop stays the reference and the fallback, and tests compare the two.
 * No layout is written here: mqserver/store/native.py hands configure() the offset and
 * size of every record header field and consume-queue entry field, derived from the
 * construct schemas of format.py, and configure() checks each size against the width
 * this code writes. A record is its header, the body, the topic tail (built by the
 * caller: length + topic) and the length-prefixed properties. The caller passes
 * zlib.crc32 and format.tag_hash_of, so the CRC and the Java tag hash are computed by
 * the same code as everywhere else. usual() is pack() for the usual publish of one message
 * into the open segment (Writer._pack_c chooses it), with its constants set once and the
 * PutResult made here.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#include "_bytes.h"
#include <string.h>

/* The record header fields, in the order configure() takes their (offset, size). */
enum { F_TOTAL, F_MAGIC, F_CRC, F_QUEUE_ID, F_FLAG, F_QUEUE_OFFSET, F_PHYSICAL, F_SYS_FLAG,
       F_BORN_TS, F_BORN_HOST, F_STORE_TS, F_STORE_HOST, F_RECONSUME, F_EVENT_ID, F_BODY_LEN,
       N_FIELDS };
/* The width each of them is written with: what configure() checks the sizes against. */
static const Py_ssize_t field_width[N_FIELDS] = {4, 4, 4, 4, 4, 8, 8, 4, 8, 8, 8, 8, 4, 8, 4};
/* The consume-queue entry fields: commit-log offset, record size, tag hash. */
enum { E_OFFSET, E_SIZE, E_TAG_HASH, N_ENTRY_FIELDS };
static const Py_ssize_t entry_width[N_ENTRY_FIELDS] = {8, 4, 8};
/* The properties length field is written as a big-endian u16. */
#define PROPS_LEN_WIDTH 2

static Py_ssize_t off[N_FIELDS], header_size, eoff[N_ENTRY_FIELDS], entry_size;
/* format.SYSFLAG_BATCH_MORE: another message record of the same write follows. */
static uint32_t batch_more;
static int configured;

static PyObject *s_body, *s_properties, *s_flag, *s_sys_flag, *s_reconsume_times,
    *s_born_ts, *s_born_host;

/* One message's fields, gathered in the first pass. */
typedef struct {
    PyObject *body, *props; /* new references */
    Py_buffer bv, pv;
    int have_bv, have_pv;
    long long flag, sys_flag, reconsume, born_ts;
    char born_host[8];
    long long tag_hash;
    uint32_t crc;
    Py_ssize_t size;
} msg_t;

static void release(msg_t *m) {
    if (m->have_bv)
        PyBuffer_Release(&m->bv);
    if (m->have_pv)
        PyBuffer_Release(&m->pv);
    Py_XDECREF(m->body);
    Py_XDECREF(m->props);
}

static int get_ll(PyObject *obj, PyObject *name, long long *out) {
    PyObject *v = PyObject_GetAttr(obj, name);
    if (v == NULL)
        return -1;
    *out = PyLong_AsLongLong(v);
    Py_DECREF(v);
    return (*out == -1 && PyErr_Occurred()) ? -1 : 0;
}

static int arg_ll(PyObject *obj, long long *out) {
    *out = PyLong_AsLongLong(obj);
    return (*out == -1 && PyErr_Occurred()) ? -1 : 0;
}

static int arg_n(PyObject *obj, Py_ssize_t *out) {
    *out = PyLong_AsSsize_t(obj);
    return (*out == -1 && PyErr_Occurred()) ? -1 : 0;
}

/* configure(header_size, header_spans, entry_size, entry_spans, props_len_size, batch_more)
 * The layout, checked whole before any of it is used (a failed call changes nothing). */
static PyObject *pack_configure(PyObject *self, PyObject *args) {
    Py_ssize_t hsize, esize, plen_size, new_off[N_FIELDS], new_eoff[N_ENTRY_FIELDS];
    PyObject *hspans, *espans;
    unsigned long bm;
    if (!PyArg_ParseTuple(args, "nOnOnk", &hsize, &hspans, &esize, &espans, &plen_size, &bm))
        return NULL;
    if (read_spans(hspans, N_FIELDS, field_width, hsize, 1, new_off, "record header") < 0 ||
        read_spans(espans, N_ENTRY_FIELDS, entry_width, esize, 1, new_eoff, "consume-queue entry") < 0)
        return NULL;
    if (plen_size != PROPS_LEN_WIDTH) {
        PyErr_Format(PyExc_ValueError, "properties length of %zd bytes, expected %d", plen_size,
                     PROPS_LEN_WIDTH);
        return NULL;
    }
    memcpy(off, new_off, sizeof off);
    memcpy(eoff, new_eoff, sizeof eoff);
    header_size = hsize;
    entry_size = esize;
    batch_more = (uint32_t)bm;
    configured = 1;
    Py_RETURN_NONE;
}

/* pack(messages, start, magic, queue_id, op, is_msg, qoff, pos, seg_left, blank_size,
 *      now, host, event_id, tail, max_size, crc32, tag_hash[, ends])
 *   -> (data, entries, offsets, queue_offsets, sizes, stop)
 *
 * Packs messages[start:] while each record plus a BLANK marker fits in seg_left. An item
 * of messages is a Message, or a bytes object: a message with only a body (no
 * properties, flags 0, born now on no host). queue_offsets count up from qoff for
 * messages and are qoff itself for admin records (is_msg false).
 * stop: 0 all packed; 1 the next message needs a new segment (the caller rolls and
 * calls again); 2 the next message's body is over max_size.
 * Every message record but the last of messages gets batch_more (another record of the
 * same write follows), unless ends (None, or bytes as long as messages) is nonzero at
 * its index: the messages are several writes, and a write ends there. */
static PyObject *pack_pack(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    Py_ssize_t start, seg_left, blank_size, max_size;
    long long magic_ll, queue_id_ll, op_ll, qoff, pos, now, event_id;
    if (!configured) {
        PyErr_SetString(PyExc_RuntimeError, "configure() was not called");
        return NULL;
    }
    if (nargs != 17 && nargs != 18) {
        PyErr_SetString(PyExc_TypeError, "pack() takes 17 or 18 arguments");
        return NULL;
    }
    const char *ends = NULL;
    if (nargs == 18 && args[17] != Py_None) {
        if (!PyBytes_Check(args[17]) || !PyList_Check(args[0]) ||
            PyBytes_GET_SIZE(args[17]) != PyList_GET_SIZE(args[0])) {
            PyErr_SetString(PyExc_TypeError, "pack(): ends must be None or bytes as long as messages");
            return NULL;
        }
        ends = PyBytes_AS_STRING(args[17]);
    }
    PyObject *messages = args[0], *host = args[11], *tail = args[13], *crc32 = args[15],
             *tag_hash = args[16];
    if (!PyList_Check(messages) || !PyBytes_Check(host) || !PyBytes_Check(tail)) {
        PyErr_SetString(PyExc_TypeError, "pack(): messages must be a list, host and tail bytes");
        return NULL;
    }
    if (arg_n(args[1], &start) < 0 || arg_ll(args[2], &magic_ll) < 0 ||
        arg_ll(args[3], &queue_id_ll) < 0 || arg_ll(args[4], &op_ll) < 0 ||
        arg_ll(args[6], &qoff) < 0 || arg_ll(args[7], &pos) < 0 ||
        arg_n(args[8], &seg_left) < 0 || arg_n(args[9], &blank_size) < 0 ||
        arg_ll(args[10], &now) < 0 || arg_ll(args[12], &event_id) < 0 ||
        arg_n(args[14], &max_size) < 0)
        return NULL;
    int is_msg = PyObject_IsTrue(args[5]);
    if (is_msg < 0)
        return NULL;
    uint32_t magic = (uint32_t)magic_ll;
    int queue_id = (int)queue_id_ll, op = (int)op_ll;
    if (PyBytes_GET_SIZE(host) != field_width[F_STORE_HOST]) {
        PyErr_SetString(PyExc_ValueError, "host must be 8 bytes");
        return NULL;
    }
    Py_ssize_t total_n = PyList_GET_SIZE(messages);
    if (start < 0 || start > total_n) {
        PyErr_SetString(PyExc_IndexError, "start out of range");
        return NULL;
    }
    Py_ssize_t n = total_n - start;
    Py_ssize_t tail_len = PyBytes_GET_SIZE(tail);
    msg_t *ms = PyMem_Calloc(n ? n : 1, sizeof(msg_t));
    if (ms == NULL)
        return PyErr_NoMemory();
    PyObject *result = NULL, *data = NULL, *entries = NULL, *offsets = NULL, *qoffsets = NULL,
             *sizes = NULL;
    int stop = 0;
    Py_ssize_t k = 0, data_len = 0;
    /* First pass: fields, sizes, CRCs and tag hashes, until a stop. */
    for (; k < n; k++) {
        PyObject *msg = PyList_GET_ITEM(messages, start + k);
        msg_t *m = &ms[k];
        int plain = PyBytes_CheckExact(msg); /* a body alone: every other field default */
        m->body = plain ? Py_NewRef(msg) : PyObject_GetAttr(msg, s_body);
        if (m->body == NULL || PyObject_GetBuffer(m->body, &m->bv, PyBUF_SIMPLE) < 0)
            goto fail;
        m->have_bv = 1;
        if (m->bv.len > max_size) {
            stop = 2;
            break;
        }
        if (plain) {
            m->size = header_size + m->bv.len + tail_len + PROPS_LEN_WIDTH;
            if (m->size + blank_size > seg_left) {
                stop = 1;
                break;
            }
            seg_left -= m->size;
            m->flag = is_msg ? 0 : op;
            memset(m->born_host, 0, 8);
            goto checksum;
        }
        m->props = PyObject_GetAttr(msg, s_properties);
        if (m->props == NULL || PyObject_GetBuffer(m->props, &m->pv, PyBUF_SIMPLE) < 0)
            goto fail;
        m->have_pv = 1;
        if (m->pv.len > 0xFFFF) {
            PyErr_SetString(PyExc_ValueError, "properties over 65535 bytes");
            goto fail;
        }
        m->size = header_size + m->bv.len + tail_len + PROPS_LEN_WIDTH + m->pv.len;
        if (m->size + blank_size > seg_left) {
            stop = 1;
            break;
        }
        seg_left -= m->size;
        if (get_ll(msg, s_sys_flag, &m->sys_flag) < 0 ||
            get_ll(msg, s_reconsume_times, &m->reconsume) < 0 ||
            get_ll(msg, s_born_ts, &m->born_ts) < 0)
            goto fail;
        if (is_msg) {
            if (get_ll(msg, s_flag, &m->flag) < 0)
                goto fail;
        } else {
            m->flag = op;
        }
        PyObject *bh = PyObject_GetAttr(msg, s_born_host);
        if (bh == NULL)
            goto fail;
        if (!PyBytes_Check(bh) || PyBytes_GET_SIZE(bh) != field_width[F_BORN_HOST]) {
            Py_DECREF(bh);
            PyErr_SetString(PyExc_ValueError, "born_host must be 8 bytes");
            goto fail;
        }
        memcpy(m->born_host, PyBytes_AS_STRING(bh), 8);
        Py_DECREF(bh);
    checksum:;
        PyObject *c = PyObject_CallOneArg(crc32, m->body);
        if (c == NULL)
            goto fail;
        m->crc = (uint32_t)(PyLong_AsUnsignedLongMask(c) & 0x7FFFFFFFu);
        Py_DECREF(c);
        m->tag_hash = 0;
        if (is_msg && m->have_pv && m->pv.len >= 5 && memmem(m->pv.buf, m->pv.len, "TAGS\x01", 5) != NULL) {
            PyObject *h = PyObject_CallOneArg(tag_hash, m->props);
            if (h == NULL)
                goto fail;
            m->tag_hash = PyLong_AsLongLong(h);
            Py_DECREF(h);
            if (m->tag_hash == -1 && PyErr_Occurred())
                goto fail;
        }
        data_len += m->size;
    }
    /* Second pass: write records and entries. */
    data = PyBytes_FromStringAndSize(NULL, data_len);
    entries = PyBytes_FromStringAndSize(NULL, is_msg ? k * entry_size : 0);
    offsets = PyList_New(k);
    qoffsets = PyList_New(k);
    sizes = PyList_New(k);
    if (data == NULL || entries == NULL || offsets == NULL || qoffsets == NULL || sizes == NULL)
        goto fail;
    unsigned char *o = (unsigned char *)PyBytes_AS_STRING(data);
    unsigned char *e = (unsigned char *)PyBytes_AS_STRING(entries);
    for (Py_ssize_t i = 0; i < k; i++) {
        msg_t *m = &ms[i];
        PyObject *off_obj = PyLong_FromLongLong(pos), *size_obj = PyLong_FromSsize_t(m->size),
                 *qoff_obj = PyLong_FromLongLong(qoff);
        if (off_obj == NULL || size_obj == NULL || qoff_obj == NULL) {
            Py_XDECREF(off_obj);
            Py_XDECREF(size_obj);
            Py_XDECREF(qoff_obj);
            goto fail;
        }
        PyList_SET_ITEM(offsets, i, off_obj);
        PyList_SET_ITEM(qoffsets, i, qoff_obj);
        PyList_SET_ITEM(sizes, i, size_obj);
        put_be32(o + off[F_TOTAL], (uint32_t)m->size);
        put_be32(o + off[F_MAGIC], magic);
        put_be32(o + off[F_CRC], m->crc);
        put_be32(o + off[F_QUEUE_ID], (uint32_t)queue_id);
        put_be32(o + off[F_FLAG], (uint32_t)m->flag);
        put_be64(o + off[F_QUEUE_OFFSET], (uint64_t)qoff);
        put_be64(o + off[F_PHYSICAL], (uint64_t)pos);
        uint32_t sys_flag = (uint32_t)m->sys_flag & ~batch_more;
        if (is_msg && start + i < total_n - 1 && !(ends && ends[start + i]))
            sys_flag |= batch_more;
        put_be32(o + off[F_SYS_FLAG], sys_flag);
        put_be64(o + off[F_BORN_TS], (uint64_t)(m->born_ts ? m->born_ts : now));
        memcpy(o + off[F_BORN_HOST], m->born_host, 8);
        put_be64(o + off[F_STORE_TS], (uint64_t)now);
        memcpy(o + off[F_STORE_HOST], PyBytes_AS_STRING(host), 8);
        put_be32(o + off[F_RECONSUME], (uint32_t)m->reconsume);
        put_be64(o + off[F_EVENT_ID], (uint64_t)event_id);
        put_be32(o + off[F_BODY_LEN], (uint32_t)m->bv.len);
        o += header_size;
        memcpy(o, m->bv.buf, m->bv.len);
        o += m->bv.len;
        memcpy(o, PyBytes_AS_STRING(tail), tail_len);
        o += tail_len;
        *o++ = (unsigned char)(m->pv.len >> 8);
        *o++ = (unsigned char)m->pv.len;
        if (m->pv.len) {
            memcpy(o, m->pv.buf, m->pv.len);
            o += m->pv.len;
        }
        if (is_msg) {
            put_be64(e + eoff[E_OFFSET], (uint64_t)pos);
            put_be32(e + eoff[E_SIZE], (uint32_t)m->size);
            put_be64(e + eoff[E_TAG_HASH], (uint64_t)m->tag_hash);
            e += entry_size;
            qoff++;
        }
        pos += m->size;
        event_id++;
    }
    result = Py_BuildValue("(NNNNNi)", data, entries, offsets, qoffsets, sizes, stop);
    data = entries = offsets = qoffsets = sizes = NULL; /* stolen by Py_BuildValue's N */
fail:
    Py_XDECREF(data);
    Py_XDECREF(entries);
    Py_XDECREF(offsets);
    Py_XDECREF(qoffsets);
    Py_XDECREF(sizes);
    for (Py_ssize_t i = 0; i < n; i++)
        release(&ms[i]);
    PyMem_Free(ms);
    return result;
}

/* The usual publish (Writer._pack_c): its constants, set by configure_usual(). */
static PyObject *u_magic, *u_zero, *u_blank_size, *u_crc32, *u_tag_hash, *u_empty;
static PyTypeObject *u_result_type;
static PyObject *s_event_id, *s_queue_id, *s_store_ts, *s_log_offsets, *s_queue_offsets,
    *s_sizes;

/* configure_usual(message_magic, blank_size, crc32, tag_hash, result_type) */
static PyObject *pack_configure_usual(PyObject *self, PyObject *args) {
    PyObject *magic, *blank, *crc32, *tag_hash, *rtype;
    if (!PyArg_ParseTuple(args, "O!O!OOO!", &PyLong_Type, &magic, &PyLong_Type, &blank, &crc32,
                          &tag_hash, &PyType_Type, &rtype))
        return NULL;
    if (u_empty == NULL && (u_empty = PyTuple_New(0)) == NULL)
        return NULL;
    if (u_zero == NULL && (u_zero = PyLong_FromLong(0)) == NULL)
        return NULL;
    Py_XSETREF(u_magic, Py_NewRef(magic));
    Py_XSETREF(u_blank_size, Py_NewRef(blank));
    Py_XSETREF(u_crc32, Py_NewRef(crc32));
    Py_XSETREF(u_tag_hash, Py_NewRef(tag_hash));
    Py_XSETREF(u_result_type, (PyTypeObject *)Py_NewRef(rtype));
    Py_RETURN_NONE;
}

/* usual(messages, queue_id, qoff, pos, room, now, host, event_id, tail, max_size)
 *   -> (record, entry, result) or None
 *
 * pack() of a write of one message record (flag op 0, a message: queue offset qoff) with
 * the constants of configure_usual(), when messages is a list of one and its record fits
 * in room (the bytes left in the open segment) with a BLANK marker after it, and its
 * body is within max_size; else None, having done nothing (the caller takes the general
 * path, which says what is wrong). result is a new instance of the result type (not
 * initialised by its __init__) with event_id, queue_id, store_ts (now), log_offsets,
 * queue_offsets and sizes set, as Writer._pack_c makes it from pack(). */
static PyObject *pack_usual(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 10) {
        PyErr_SetString(PyExc_TypeError, "usual() takes 10 arguments");
        return NULL;
    }
    if (u_result_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "configure_usual() was not called");
        return NULL;
    }
    PyObject *messages = args[0];
    if (!PyList_CheckExact(messages) || PyList_GET_SIZE(messages) != 1)
        Py_RETURN_NONE;
    PyObject *full[17] = {messages, u_zero, u_magic, args[1], u_zero, Py_True, args[2], args[3],
                          args[4], u_blank_size, args[5], args[6], args[7], args[8], args[9],
                          u_crc32, u_tag_hash};
    PyObject *packed = pack_pack(self, full, 17);
    if (packed == NULL)
        return NULL;
    /* (data, entries, offsets, queue_offsets, sizes, stop) */
    if (PyLong_AsLong(PyTuple_GET_ITEM(packed, 5)) != 0) {
        Py_DECREF(packed);
        Py_RETURN_NONE;
    }
    PyObject *result = u_result_type->tp_new(u_result_type, u_empty, NULL);
    if (result == NULL ||
        PyObject_SetAttr(result, s_event_id, args[7]) < 0 ||
        PyObject_SetAttr(result, s_queue_id, args[1]) < 0 ||
        PyObject_SetAttr(result, s_store_ts, args[5]) < 0 ||
        PyObject_SetAttr(result, s_log_offsets, PyTuple_GET_ITEM(packed, 2)) < 0 ||
        PyObject_SetAttr(result, s_queue_offsets, PyTuple_GET_ITEM(packed, 3)) < 0 ||
        PyObject_SetAttr(result, s_sizes, PyTuple_GET_ITEM(packed, 4)) < 0) {
        Py_XDECREF(result);
        Py_DECREF(packed);
        return NULL;
    }
    PyObject *out = PyTuple_Pack(3, PyTuple_GET_ITEM(packed, 0), PyTuple_GET_ITEM(packed, 1),
                                 result);
    Py_DECREF(result);
    Py_DECREF(packed);
    return out;
}

static PyMethodDef pack_methods[] = {
    {"configure", pack_configure, METH_VARARGS,
     "configure(header_size, header_spans, entry_size, entry_spans, props_len_size, "
     "batch_more): the layout, from format.py (see native.py)."},
    {"pack", (PyCFunction)(void (*)(void))pack_pack, METH_FASTCALL,
     "pack(messages, start, magic, queue_id, op, is_msg, qoff, pos, seg_left, blank_size, "
     "now, host, event_id, tail, max_size, crc32, tag_hash[, ends]) -> (data, entries, "
     "offsets, queue_offsets, sizes, stop): see _pack.c."},
    {"configure_usual", pack_configure_usual, METH_VARARGS,
     "configure_usual(message_magic, blank_size, crc32, tag_hash, result_type): the "
     "constants of usual() (see native.py)."},
    {"usual", (PyCFunction)(void (*)(void))pack_usual, METH_FASTCALL,
     "usual(messages, queue_id, qoff, pos, room, now, host, event_id, tail, max_size) -> "
     "(record, entry, result) or None: see _pack.c."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef pack_module = {
    PyModuleDef_HEAD_INIT, "mqserver.store._pack",
    "Commit-log record packing in C (see writer.py).", -1, pack_methods,
};

PyMODINIT_FUNC PyInit__pack(void) {
#define INTERN(var, text)                                   \
    if ((var = PyUnicode_InternFromString(text)) == NULL) \
        return NULL;
    INTERN(s_body, "body");
    INTERN(s_properties, "properties");
    INTERN(s_flag, "flag");
    INTERN(s_sys_flag, "sys_flag");
    INTERN(s_reconsume_times, "reconsume_times");
    INTERN(s_born_ts, "born_ts");
    INTERN(s_born_host, "born_host");
    INTERN(s_event_id, "event_id");
    INTERN(s_queue_id, "queue_id");
    INTERN(s_store_ts, "store_ts");
    INTERN(s_log_offsets, "log_offsets");
    INTERN(s_queue_offsets, "queue_offsets");
    INTERN(s_sizes, "sizes");
    return PyModule_Create(&pack_module);
}
