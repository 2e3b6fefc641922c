/* The smss subscriber hot path in C: stored records -> the body of one pushed batch.
 *
 * A speedup of protocols.smss.views.py_encode_records, byte for byte (the Python
 * function stays the reference and the fallback; tests compare the two). The store's
 * record layout is not written here: views.py hands its field offsets to configure()
 * from mqserver.store.format at import, so that layout keeps one definition. Nor is the
 * head of the pushed record: configure() also gets the offsets of its fields, derived
 * from protocols.smss.wire.PUSHED_RECORD.
 *
 * The pushed record is smss's, little-endian:
 *   ts i64, eventId i64, queueId i64, queueOffset+1 i64, then the message record:
 *   S u32 (headers block + body), H u32 (header count), headers (u32 len, key, u32 len,
 *   value)..., body.
 * A record stored with SYSFLAG_SMSS_FRAMED already holds S, H, headers and body.
 * What stays fixed here is the width and byte order of each field of that head, which
 * configure() checks against the sizes it is given.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#include "_bytes.h"
#include <string.h>

/* Field offsets inside a stored record, and the framed flag (set by configure). */
static Py_ssize_t off_queue_id, off_queue_offset, off_sys_flag, off_store_ts,
    off_event_id, off_body_len, header_size;
static uint32_t framed_flag;
/* The pushed record's head (set by configure): where ts, eventId, queueId,
 * queueOffset+1 (i64 LE each), S and H (u32 LE each) go, the size of the part before
 * the message record (prefix_size) and of the whole head (head_size). */
static Py_ssize_t out_ts, out_event_id, out_queue_id, out_next_pos, out_size, out_count,
    prefix_size, head_size;
static int configured;

/* One record's parts, found in the first pass and used again in the second. */
typedef struct {
    const unsigned char *rec;   /* start of the stored record */
    const unsigned char *body;
    uint32_t body_len;
    const unsigned char *props; /* properties string, or NULL when empty */
    uint32_t props_len;
    int framed;
} parts_t;

/* Is [k, k+klen) one of the hidden keys (a tuple of bytes)? */
static int is_hidden(PyObject *hidden, const unsigned char *k, Py_ssize_t klen) {
    Py_ssize_t n = PyTuple_GET_SIZE(hidden);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *h = PyTuple_GET_ITEM(hidden, i);
        if (PyBytes_GET_SIZE(h) == klen && memcmp(PyBytes_AS_STRING(h), k, klen) == 0)
            return 1;
    }
    return 0;
}

/* Walk a properties string as format.decode_properties does: items end with 0x02,
 * empty items are skipped, the key ends at the first 0x01 (no 0x01: empty value).
 * Writes the smss headers block to out when out is not NULL; returns its size and the
 * header count in *count. */
static Py_ssize_t headers_block(const unsigned char *p, Py_ssize_t n, PyObject *hidden,
                                uint32_t *count, unsigned char *out) {
    Py_ssize_t size = 0;
    uint32_t c = 0;
    const unsigned char *end = p + n;
    while (p < end) {
        const unsigned char *item_end = memchr(p, 0x02, end - p);
        if (item_end == NULL)
            item_end = end;
        if (item_end > p) {
            const unsigned char *sep = memchr(p, 0x01, item_end - p);
            const unsigned char *k = p, *v;
            Py_ssize_t klen, vlen;
            if (sep == NULL) {
                klen = item_end - p;
                v = item_end;
                vlen = 0;
            } else {
                klen = sep - p;
                v = sep + 1;
                vlen = item_end - v;
            }
            if (!is_hidden(hidden, k, klen)) {
                if (out != NULL) {
                    out = put_le32(out, (uint32_t)klen);
                    memcpy(out, k, klen);
                    out += klen;
                    out = put_le32(out, (uint32_t)vlen);
                    memcpy(out, v, vlen);
                    out += vlen;
                }
                size += 8 + klen + vlen;
                c++;
            }
        }
        p = item_end + 1;
    }
    *count = c;
    return size;
}

/* Is [off, off+width) inside a head of size bytes? */
static int fits(Py_ssize_t off, Py_ssize_t width, Py_ssize_t size) {
    return off >= 0 && off <= size - width;
}

static PyObject *push_configure(PyObject *self, PyObject *args) {
    Py_ssize_t h_size, o_ts, o_eid, o_qid, o_pos, o_s, o_h, p_size;
    configured = 0;
    if (!PyArg_ParseTuple(args, "nnnnnnnI(nnnnnn)nn", &header_size, &off_queue_id,
                          &off_queue_offset, &off_sys_flag, &off_store_ts, &off_event_id,
                          &off_body_len, &framed_flag, &o_ts, &o_eid, &o_qid, &o_pos, &o_s,
                          &o_h, &p_size, &h_size))
        return NULL;
    if (!(fits(o_ts, 8, p_size) && fits(o_eid, 8, p_size) && fits(o_qid, 8, p_size) &&
          fits(o_pos, 8, p_size) && p_size <= h_size && fits(o_s, 4, h_size) &&
          fits(o_h, 4, h_size) && o_s >= p_size && o_h >= p_size)) {
        PyErr_SetString(PyExc_ValueError, "pushed record head fields outside the head");
        return NULL;
    }
    out_ts = o_ts;
    out_event_id = o_eid;
    out_queue_id = o_qid;
    out_next_pos = o_pos;
    out_size = o_s;
    out_count = o_h;
    prefix_size = p_size;
    head_size = h_size;
    configured = 1;
    Py_RETURN_NONE;
}

static PyObject *push_encode(PyObject *self, PyObject *args) {
    Py_buffer view;
    PyObject *locs, *hidden;
    PyObject *result = NULL;
    parts_t *parts = NULL;
    if (!configured) {
        PyErr_SetString(PyExc_RuntimeError, "configure() was not called");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "y*O!O!", &view, &PyList_Type, &locs, &PyTuple_Type, &hidden))
        return NULL;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(hidden); i++) {
        if (!PyBytes_Check(PyTuple_GET_ITEM(hidden, i))) {
            PyErr_SetString(PyExc_TypeError, "hidden keys must be bytes");
            goto done;
        }
    }
    const unsigned char *buf = view.buf;
    Py_ssize_t buf_len = view.len;
    Py_ssize_t n = PyList_GET_SIZE(locs);
    parts = PyMem_Malloc(sizeof(parts_t) * (n ? n : 1));
    if (parts == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    /* First pass: find each record's parts, check its bounds, and size the output. */
    Py_ssize_t total = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t pos = loc_pos(locs, i);
        if (pos == -1 && PyErr_Occurred())
            goto done;
        if (pos < 0 || pos > buf_len - header_size)
            goto corrupt;
        parts_t *r = &parts[i];
        r->rec = buf + pos;
        r->body_len = get_be32(r->rec + off_body_len);
        Py_ssize_t b0 = pos + header_size;
        /* body, topic length byte, topic, 2-byte properties length */
        if ((Py_ssize_t)r->body_len > buf_len - b0 - 1)
            goto corrupt;
        Py_ssize_t p = b0 + r->body_len;
        p += 1 + buf[p];
        if (p > buf_len - 2)
            goto corrupt;
        r->props_len = ((uint32_t)buf[p] << 8) | buf[p + 1];
        if ((Py_ssize_t)r->props_len > buf_len - p - 2)
            goto corrupt;
        r->body = buf + b0;
        r->props = r->props_len ? buf + p + 2 : NULL;
        r->framed = (get_be32(r->rec + off_sys_flag) & framed_flag) != 0;
        total += prefix_size + r->body_len;
        if (!r->framed) {
            uint32_t count;
            total += head_size - prefix_size;
            if (r->props != NULL)
                total += headers_block(r->props, r->props_len, hidden, &count, NULL);
        }
    }
    result = PyBytes_FromStringAndSize(NULL, total);
    if (result == NULL)
        goto done;
    /* Second pass: write. */
    unsigned char *o = (unsigned char *)PyBytes_AS_STRING(result);
    for (Py_ssize_t i = 0; i < n; i++) {
        parts_t *r = &parts[i];
        const unsigned char *rec = r->rec;
        put_le64(o + out_ts, get_be64(rec + off_store_ts));
        put_le64(o + out_event_id, get_be64(rec + off_event_id));
        put_le64(o + out_queue_id, (uint64_t)(int64_t)(int32_t)get_be32(rec + off_queue_id));
        put_le64(o + out_next_pos, get_be64(rec + off_queue_offset) + 1);
        if (r->framed) {
            o += prefix_size;
        } else {
            uint32_t count = 0;
            Py_ssize_t block = 0;
            if (r->props != NULL)
                block = headers_block(r->props, r->props_len, hidden, &count, o + head_size);
            put_le32(o + out_size, (uint32_t)(block + r->body_len));
            put_le32(o + out_count, count);
            o += head_size + block;
        }
        memcpy(o, r->body, r->body_len);
        o += r->body_len;
    }
    goto done;
corrupt:
    PyErr_SetString(PyExc_ValueError, "a stored record runs past the end of the buffer");
done:
    PyMem_Free(parts);
    PyBuffer_Release(&view);
    return result;
}

static PyMethodDef push_methods[] = {
    {"configure", push_configure, METH_VARARGS,
     "configure(header_size, off_queue_id, off_queue_offset, off_sys_flag, off_store_ts, "
     "off_event_id, off_body_len, framed_flag, (out_ts, out_event_id, out_queue_id, "
     "out_next_pos, out_size, out_count), prefix_size, head_size): the store's record "
     "layout, then the pushed record's head."},
    {"encode", push_encode, METH_VARARGS,
     "encode(buffer, locs, hidden) -> bytes: the pushed-batch body of the records at "
     "locs [(pos, size), ...] in buffer, leaving out properties named in hidden."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef push_module = {
    PyModuleDef_HEAD_INIT, "protocols.smss._push",
    "smss pushed-batch encoding in C (see views.py).", -1, push_methods,
};

PyMODINIT_FUNC PyInit__push(void) { return PyModule_Create(&push_module); }
