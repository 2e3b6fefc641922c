/* The smss replication stream's plain writes in C, on both sides.
 *
 * The leader (frames()): plain stored records -> REPLICA frames, a speedup of
 * protocols.smss.replica.ReplicaFeed's Python path (LogReader.read, then
 * binlog.record_to_block per record), byte for byte for the records it takes. It takes
 * only the records nearly every write of a busy master is: a message record of one
 * message (no SYSFLAG_BATCH_MORE, no other SysFlag bit), queue 0, flag 0, no reconsume,
 * no born host, no properties, an ASCII topic, a sound frame naming its own offset. Such
 * a record's binlog block is
 *
 *   cmdLen u32 LE, "storeTs\tPUB\teventId\tbornTs\ttopic\tpayloadLen\n",
 *   S u32 LE (= body length), H u32 LE (= 0), body, "\n"
 *
 * behind the REPLICA frame header (status, pad, block length). frames() stops at the
 * first record it does not take (or at the end of the buffer, or at a record that runs
 * past it) and says how far it went; the caller's Python path goes on from there.
 *
 * The follower (run()): REPLICA frames of plain PUB writes (messages without headers,
 * an ASCII topic, the fields written as the leader writes them) -> one run of writes of
 * one topic and store time with consecutive eventIds, what protocols.smss.follower's
 * Python path (ResponseDecoder, binlog.parse_block, binlog.messages_of, _PubRun) makes
 * of them. Anything else, or anything it is unsure of (a number Python's int() reads
 * and this does not, a frame not all here), ends the run and is left to that path,
 * which also gives the errors.
 *
 * The store's record layout is not written here: binlog.py hands configure() the field
 * offsets from mqserver.store.format, and the frame header's template and the offset
 * of its length from protocols.smss.wire. What stays fixed here is each field's width
 * and byte order (the store's header big-endian, the smss parts little-endian), which
 * configure() checks against the spans it is given.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "_bytes.h"

static Py_ssize_t header_size, off_magic, off_queue_id, off_flag, off_phys, off_sys_flag,
    off_born_ts, off_born_host, host_size, off_store_ts, off_reconsume, off_event_id,
    off_body_len, frame_len_at;
static uint32_t message_magic;
static int64_t cmd_pub;
static unsigned char frame_head[64];
static Py_ssize_t frame_size;
static int configured;

/* configure(): the widths of the fields it is given (in its argument order) are checked
 * against what this file reads (-1: any, the born host), and each lies in the header. */
static PyObject *feed_configure(PyObject *self, PyObject *args) {
    Py_buffer head;
    Py_ssize_t spans[11][2];
    static const Py_ssize_t width[11] = {4, 4, 4, 8, 4, 8, -1, 8, 4, 8, 4};
    unsigned long magic;
    long long pub;
    configured = 0;
    if (!PyArg_ParseTuple(args, "n(nn)(nn)(nn)(nn)(nn)(nn)(nn)(nn)(nn)(nn)(nn)kLy*n",
                          &header_size, &spans[0][0], &spans[0][1], &spans[1][0],
                          &spans[1][1], &spans[2][0], &spans[2][1], &spans[3][0],
                          &spans[3][1], &spans[4][0], &spans[4][1], &spans[5][0],
                          &spans[5][1], &spans[6][0], &spans[6][1], &spans[7][0],
                          &spans[7][1], &spans[8][0], &spans[8][1], &spans[9][0],
                          &spans[9][1], &spans[10][0], &spans[10][1], &magic, &pub, &head,
                          &frame_len_at))
        return NULL;
    for (int i = 0; i < 11; i++) {
        Py_ssize_t off = spans[i][0], w = spans[i][1];
        if ((width[i] >= 0 && w != width[i]) || w <= 0 || off < 0 || off + w > header_size) {
            PyBuffer_Release(&head);
            PyErr_Format(PyExc_ValueError, "record field %d: span (%zd, %zd) unexpected", i,
                         off, w);
            return NULL;
        }
    }
    if (head.len > (Py_ssize_t)sizeof(frame_head) || frame_len_at < 0 ||
        frame_len_at + 4 > head.len) {
        PyBuffer_Release(&head);
        PyErr_SetString(PyExc_ValueError, "frame header template unexpected");
        return NULL;
    }
    off_magic = spans[0][0];
    off_queue_id = spans[1][0];
    off_flag = spans[2][0];
    off_phys = spans[3][0];
    off_sys_flag = spans[4][0];
    off_born_ts = spans[5][0];
    off_born_host = spans[6][0];
    host_size = spans[6][1];
    off_store_ts = spans[7][0];
    off_reconsume = spans[8][0];
    off_event_id = spans[9][0];
    off_body_len = spans[10][0];
    message_magic = (uint32_t)magic;
    cmd_pub = pub;
    memcpy(frame_head, head.buf, head.len);
    frame_size = head.len;
    PyBuffer_Release(&head);
    configured = 1;
    Py_RETURN_NONE;
}

/* Decimal digits of v, as Python's %d writes them, into o; returns the position after. */
static unsigned char *put_dec(unsigned char *o, int64_t v) {
    char tmp[24];
    int n = 0;
    uint64_t u = v < 0 ? (uint64_t)0 - (uint64_t)v : (uint64_t)v;
    do {
        tmp[n++] = (char)('0' + u % 10);
        u /= 10;
    } while (u);
    if (v < 0)
        *o++ = '-';
    while (n)
        *o++ = (unsigned char)tmp[--n];
    return o;
}

static Py_ssize_t dec_len(int64_t v) {
    unsigned char tmp[24];
    return put_dec(tmp, v) - tmp;
}

/* The size of the frame of the plain record at rec (size bytes, at log offset phys), or
 * 0 when it is not one this path takes. */
static Py_ssize_t plain_frame_size(const unsigned char *rec, Py_ssize_t size, int64_t phys) {
    if (size < header_size + 3 || get_be32(rec + off_magic) != message_magic)
        return 0;
    if ((int64_t)get_be64(rec + off_phys) != phys)
        return 0;
    if (get_be32(rec + off_sys_flag) || get_be32(rec + off_queue_id) ||
        get_be32(rec + off_flag) || get_be32(rec + off_reconsume))
        return 0;
    for (Py_ssize_t i = 0; i < host_size; i++)
        if (rec[off_born_host + i])
            return 0;
    int32_t body_len = (int32_t)get_be32(rec + off_body_len);
    if (body_len < 0 || body_len > size - header_size - 3)
        return 0;
    const unsigned char *t = rec + header_size + body_len;
    Py_ssize_t tlen = t[0];
    /* topic length (1), topic, properties length (2) = 0: the whole record */
    if (header_size + body_len + 1 + tlen + 2 != size || t[1 + tlen] || t[2 + tlen])
        return 0;
    for (Py_ssize_t i = 0; i < tlen; i++)
        if (t[1 + i] & 0x80)
            return 0; /* UTF-8 beyond ASCII: the Python path decodes it */
    Py_ssize_t payload = 8 + (Py_ssize_t)body_len + 1;
    Py_ssize_t line = dec_len((int64_t)get_be64(rec + off_store_ts)) + 1 + dec_len(cmd_pub) +
                      1 + dec_len((int64_t)get_be64(rec + off_event_id)) + 1 +
                      dec_len((int64_t)get_be64(rec + off_born_ts)) + 1 + tlen + 1 +
                      dec_len(payload) + 1;
    return frame_size + 4 + line + payload;
}

static unsigned char *put_frame(unsigned char *o, const unsigned char *rec, Py_ssize_t fsize) {
    int32_t body_len = (int32_t)get_be32(rec + off_body_len);
    const unsigned char *t = rec + header_size + body_len;
    Py_ssize_t tlen = t[0];
    Py_ssize_t payload = 8 + (Py_ssize_t)body_len + 1;
    memcpy(o, frame_head, frame_size);
    put_le32(o + frame_len_at, (uint32_t)(fsize - frame_size));
    o += frame_size;
    unsigned char *len_at = o;
    o += 4;
    unsigned char *line = o;
    o = put_dec(o, (int64_t)get_be64(rec + off_store_ts));
    *o++ = '\t';
    o = put_dec(o, cmd_pub);
    *o++ = '\t';
    o = put_dec(o, (int64_t)get_be64(rec + off_event_id));
    *o++ = '\t';
    o = put_dec(o, (int64_t)get_be64(rec + off_born_ts));
    *o++ = '\t';
    memcpy(o, t + 1, tlen);
    o += tlen;
    *o++ = '\t';
    o = put_dec(o, payload);
    *o++ = '\n';
    put_le32(len_at, (uint32_t)(o - line));
    o = put_le32(o, (uint32_t)body_len);
    o = put_le32(o, 0);
    memcpy(o, rec + header_size, body_len);
    o += body_len;
    *o++ = '\n';
    return o;
}

static PyObject *feed_frames(PyObject *self, PyObject *args) {
    Py_buffer view;
    long long base;
    if (!configured) {
        PyErr_SetString(PyExc_RuntimeError, "configure() was not called");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "y*L", &view, &base))
        return NULL;
    const unsigned char *buf = view.buf;
    Py_ssize_t end = view.len, pos = 0, out = 0, count = 0;
    int64_t last = 0;
    /* first pass: how far the plain records go, and the size of their frames */
    while (end - pos >= header_size) {
        Py_ssize_t size = (int32_t)get_be32(buf + pos);
        if (size <= 0 || size > end - pos)
            break;
        Py_ssize_t f = plain_frame_size(buf + pos, size, base + pos);
        if (!f)
            break;
        out += f;
        count++;
        last = (int64_t)get_be64(buf + pos + off_event_id);
        pos += size;
    }
    if (!count) {
        PyBuffer_Release(&view);
        Py_RETURN_NONE;
    }
    PyObject *data = PyBytes_FromStringAndSize(NULL, out);
    if (data == NULL) {
        PyBuffer_Release(&view);
        return NULL;
    }
    unsigned char *o = (unsigned char *)PyBytes_AS_STRING(data);
    Py_ssize_t p = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        Py_ssize_t size = (int32_t)get_be32(buf + p);
        unsigned char *next = put_frame(o, buf + p, plain_frame_size(buf + p, size, base + p));
        o = next;
        p += size;
    }
    PyBuffer_Release(&view);
    return Py_BuildValue("(NnnL)", data, pos, count, (long long)last);
}

/* -- the follower's side: the REPLICA frames of plain writes -> runs to apply ------- */

static inline uint32_t get_le32(const unsigned char *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) |
           ((uint32_t)p[3] << 24);
}

/* Parse [-]digits (1 to 18 of them) at *p, ending at the byte stop; 0 when the field
 * is anything else (Python's int() takes more forms: the Python path has those). */
static int get_dec(const unsigned char **p, const unsigned char *end, unsigned char stop,
                   int64_t *out) {
    const unsigned char *q = *p;
    int neg = 0, n = 0;
    int64_t v = 0;
    if (q < end && *q == '-') {
        neg = 1;
        q++;
    }
    while (q < end && *q >= '0' && *q <= '9' && n < 19) {
        v = v * 10 + (*q - '0');
        q++;
        n++;
    }
    if (n == 0 || n > 18 || q >= end || *q != stop)
        return 0;
    *out = neg ? -v : v;
    *p = q + 1;
    return 1;
}

/* One plain PUB write in the frame at buf[pos:end]: fills the fields, returns the
 * frame's size, or 0 when the frame is incomplete or not such a write. */
typedef struct {
    int64_t write_time, event_id, born_ts;
    const unsigned char *topic, *payload;
    Py_ssize_t topic_len, payload_len, count;
} plain_write_t;

static Py_ssize_t plain_write(const unsigned char *buf, Py_ssize_t pos, Py_ssize_t end,
                              Py_ssize_t max_len, plain_write_t *w) {
    if (end - pos < frame_size)
        return 0;
    const unsigned char *f = buf + pos;
    if (memcmp(f, frame_head, frame_len_at) != 0) /* status OK (and the pad) */
        return 0;
    uint32_t len = get_le32(f + frame_len_at);
    if (len < 4 || len > (uint64_t)max_len || (Py_ssize_t)len > end - pos - frame_size)
        return 0; /* an empty block, a length over the limit, or not all here */
    const unsigned char *b = f + frame_size, *bend = b + len;
    uint32_t cmd_len = get_le32(b);
    if (cmd_len < 2 || cmd_len > len - 4)
        return 0;
    const unsigned char *p = b + 4, *line_end = b + 4 + cmd_len; /* after its newline */
    int64_t cmd, plen;
    if (!get_dec(&p, line_end, '\t', &w->write_time) || !get_dec(&p, line_end, '\t', &cmd) ||
        cmd != cmd_pub || !get_dec(&p, line_end, '\t', &w->event_id) ||
        !get_dec(&p, line_end, '\t', &w->born_ts))
        return 0;
    w->topic = p;
    while (p < line_end && *p != '\t') {
        if (*p & 0x80 || *p == '\n')
            return 0; /* beyond ASCII (the Python path decodes it), or a short line */
        p++;
    }
    if (p >= line_end)
        return 0;
    w->topic_len = p - w->topic;
    p++;
    if (!get_dec(&p, line_end, '\n', &plen) || p != line_end)
        return 0;
    /* the payload: message records (S, H = 0, the body), then a newline, filling the
     * block exactly; walked as payload.record_spans walks it */
    if (plen < 10 || line_end + plen != bend || bend[-1] != '\n')
        return 0;
    const unsigned char *r = line_end;
    Py_ssize_t total = (Py_ssize_t)plen - 1, at = 0;
    w->count = 0;
    while (at < total) {
        uint32_t size = get_le32(r + at), headers = get_le32(r + at + 4);
        Py_ssize_t stop = at + 8 + (Py_ssize_t)size;
        if (size == 0 || stop > total || (total - stop > 0 && total - stop <= 8))
            return 0; /* a payload the Python path refuses */
        if (headers != 0)
            return 0; /* headers: the Python path */
        w->count++;
        at = stop;
    }
    w->payload = r;
    w->payload_len = total;
    return frame_size + len;
}

static PyObject *feed_run(PyObject *self, PyObject *args) {
    Py_buffer view;
    Py_ssize_t pos, max_len;
    if (!configured) {
        PyErr_SetString(PyExc_RuntimeError, "configure() was not called");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "y*nn", &view, &pos, &max_len))
        return NULL;
    const unsigned char *buf = view.buf;
    Py_ssize_t end = view.len, n = 0, at = pos;
    plain_write_t first, w;
    PyObject *items = NULL, *ends = NULL, *result = NULL;
    if (pos < 0 || pos > end) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "position outside the buffer");
        return NULL;
    }
    Py_ssize_t size = plain_write(buf, at, end, max_len, &first);
    if (!size) {
        PyBuffer_Release(&view);
        Py_RETURN_NONE;
    }
    items = PyList_New(0);
    ends = PyByteArray_FromStringAndSize(NULL, 0);
    if (items == NULL || ends == NULL)
        goto done;
    w = first;
    for (;;) {
        Py_ssize_t p = 0;
        for (Py_ssize_t i = 0; i < w.count; i++) {
            uint32_t blen = get_le32(w.payload + p);
            PyObject *item = Py_BuildValue("(Ly#)", (long long)w.born_ts,
                                           (const char *)w.payload + p + 8, (Py_ssize_t)blen);
            if (item == NULL || PyList_Append(items, item) < 0) {
                Py_XDECREF(item);
                goto done;
            }
            Py_DECREF(item);
            p += 8 + (Py_ssize_t)blen;
            /* each write keeps its end: the last message of each is marked */
            char end_mark = i == w.count - 1;
            if (PyByteArray_Resize(ends, n + 1) < 0)
                goto done;
            PyByteArray_AS_STRING(ends)[n] = end_mark;
            n++;
        }
        at += size;
        /* the next write continues the run: the next eventId, same time and topic */
        size = plain_write(buf, at, end, max_len, &w);
        if (!size || w.event_id != first.event_id + n || w.write_time != first.write_time ||
            w.topic_len != first.topic_len || memcmp(w.topic, first.topic, w.topic_len) != 0)
            break;
    }
    result = Py_BuildValue("(ns#LLOO)", at, (const char *)first.topic, first.topic_len,
                           (long long)first.write_time, (long long)first.event_id, items, ends);
done:
    Py_XDECREF(items);
    Py_XDECREF(ends);
    PyBuffer_Release(&view);
    return result;
}

static PyMethodDef feed_methods[] = {
    {"configure", feed_configure, METH_VARARGS,
     "configure(header_size, magic, queue_id, flag, physical_offset, sys_flag, born_ts, "
     "born_host, store_ts, reconsume_times, event_id, body_length, message_magic, cmd_pub, "
     "frame_header, frame_length_offset): the record's (offset, width) spans, the "
     "message magic, PUB's command number, the frame header's template and where its "
     "length goes."},
    {"frames", feed_frames, METH_VARARGS,
     "frames(buffer, offset) -> (data, length, count, last_event_id) or None: the REPLICA "
     "frames of the plain records at the start of buffer (at commit-log offset offset), "
     "how many bytes and records they took, and the last record's eventId; None when "
     "the first record is not plain."},
    {"run", feed_run, METH_VARARGS,
     "run(buffer, pos, max_length) -> (end, topic, write_time, first_event_id, "
     "[(born_ts, body), ...], ends) or None: the REPLICA frames from pos on that carry "
     "plain PUB writes (messages without headers) of one topic and store time with "
     "consecutive eventIds, where they end, and a bytearray marking the last message of "
     "each write; None when the frame at pos is not one (or not all here, or longer "
     "than max_length)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef feed_module = {
    PyModuleDef_HEAD_INIT, "protocols.smss._feed",
    "The smss replication stream's plain writes in C (see binlog.py).", -1, feed_methods,
};

PyMODINIT_FUNC PyInit__feed(void) { return PyModule_Create(&feed_module); }
