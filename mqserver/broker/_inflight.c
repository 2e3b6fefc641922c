/* The channel hot paths in C: handing out fresh records and finishing a run of FINs.
 *
 * Speedups of Channel._take_fresh_py and Channel._finish_py (channels.py), with the same
 * effects on the in-flight table, the floor and the done sets; the Python methods stay
 * the reference and the fallback, and tests compare the two. Neither the record layout
 * nor the in-flight entry layout is written here: channels.py hands both to configure()
 * at import (from mqserver.store.format and its own entry indexes).
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#include "_bytes.h"

#define ENTRY_LEN 9

/* Record field offsets and the body offset; in-flight entry indexes. */
static Py_ssize_t off_total, off_queue_id, off_queue_offset, off_physical, off_store_ts,
    off_event_id, off_body_len, body_offset;
static Py_ssize_t ix_eid, ix_qid, ix_qoff, ix_loff, ix_size, ix_attempts, ix_deadline,
    ix_owner, ix_started;
static int configured;

static PyObject *inflight_configure(PyObject *self, PyObject *args) {
    if (!PyArg_ParseTuple(args, "(nnnnnnnn)(nnnnnnnnn)", &off_total, &off_queue_id,
                          &off_queue_offset, &off_physical, &off_store_ts, &off_event_id,
                          &off_body_len, &body_offset, &ix_eid, &ix_qid, &ix_qoff, &ix_loff,
                          &ix_size, &ix_attempts, &ix_deadline, &ix_owner, &ix_started))
        return NULL;
    Py_ssize_t ix[] = {ix_eid, ix_qid, ix_qoff, ix_loff, ix_size, ix_attempts, ix_deadline,
                       ix_owner, ix_started};
    int seen = 0;
    for (int i = 0; i < ENTRY_LEN; i++) {
        if (ix[i] < 0 || ix[i] >= ENTRY_LEN || (seen & (1 << ix[i]))) {
            PyErr_SetString(PyExc_ValueError, "entry indexes must be a permutation of 0..8");
            return NULL;
        }
        seen |= 1 << ix[i];
    }
    configured = 1;
    Py_RETURN_NONE;
}

/* take(buf, locs, in_flight, deadline, owner, now, ms_ns, out) -> None
 *
 * For each record at locs [(pos, size), ...] in buf: put a new in-flight entry (first
 * attempt) under its eventId and append (ts_ns, 1, eventId, buf, body_start, body_end)
 * to out. */
static PyObject *inflight_take(PyObject *self, PyObject *args) {
    PyObject *bufobj, *locs, *in_flight, *deadline, *owner, *now, *out;
    long long ms_ns;
    Py_buffer view;
    if (!configured) {
        PyErr_SetString(PyExc_RuntimeError, "configure() was not called");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "OO!O!OOOLO!", &bufobj, &PyList_Type, &locs, &PyDict_Type,
                          &in_flight, &deadline, &owner, &now, &ms_ns, &PyList_Type, &out))
        return NULL;
    if (PyObject_GetBuffer(bufobj, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    const unsigned char *buf = view.buf;
    Py_ssize_t n = PyList_GET_SIZE(locs);
    PyObject *one = PyLong_FromLong(1);
    PyObject *result = NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t pos = loc_pos(locs, i);
        if (pos == -1 && PyErr_Occurred())
            goto done;
        if (pos < 0 || pos > view.len - body_offset)
            goto corrupt;
        const unsigned char *r = buf + pos;
        int64_t blen = (int32_t)get_be32(r + off_body_len);
        if (blen < 0 || blen > view.len - pos - body_offset)
            goto corrupt;
        int64_t eid_v = (int64_t)get_be64(r + off_event_id);
        PyObject *entry = PyList_New(ENTRY_LEN);
        PyObject *eid = PyLong_FromLongLong(eid_v);
        if (entry == NULL || eid == NULL) {
            Py_XDECREF(entry);
            Py_XDECREF(eid);
            goto done;
        }
        PyObject *qid = PyLong_FromLong((int32_t)get_be32(r + off_queue_id));
        PyObject *qoff = PyLong_FromLongLong((int64_t)get_be64(r + off_queue_offset));
        PyObject *loff = PyLong_FromLongLong((int64_t)get_be64(r + off_physical));
        PyObject *size = PyLong_FromLong((int32_t)get_be32(r + off_total));
        /* The list owns what is set in it, so one DECREF of the entry frees all. */
        Py_INCREF(eid);
        PyList_SET_ITEM(entry, ix_eid, eid);
        PyList_SET_ITEM(entry, ix_qid, qid);
        PyList_SET_ITEM(entry, ix_qoff, qoff);
        PyList_SET_ITEM(entry, ix_loff, loff);
        PyList_SET_ITEM(entry, ix_size, size);
        Py_INCREF(one);
        PyList_SET_ITEM(entry, ix_attempts, one);
        Py_INCREF(deadline);
        PyList_SET_ITEM(entry, ix_deadline, deadline);
        Py_INCREF(owner);
        PyList_SET_ITEM(entry, ix_owner, owner);
        Py_INCREF(now);
        PyList_SET_ITEM(entry, ix_started, now);
        if (qid == NULL || qoff == NULL || loff == NULL || size == NULL ||
            PyDict_SetItem(in_flight, eid, entry) < 0) {
            Py_DECREF(entry);
            Py_DECREF(eid);
            goto done;
        }
        Py_DECREF(entry);
        long long ts_ns, ts_ms = (int64_t)get_be64(r + off_store_ts);
        PyObject *ts;
        if (!__builtin_mul_overflow(ts_ms, ms_ns, &ts_ns)) {
            ts = PyLong_FromLongLong(ts_ns);
        } else {
            /* past the year 2262: Python ints do not overflow, so neither may we */
            PyObject *a = PyLong_FromLongLong(ts_ms), *b = PyLong_FromLongLong(ms_ns);
            ts = (a && b) ? PyNumber_Multiply(a, b) : NULL;
            Py_XDECREF(a);
            Py_XDECREF(b);
        }
        if (ts == NULL) {
            Py_DECREF(eid);
            goto done;
        }
        PyObject *item = Py_BuildValue("(NOOOnn)", ts, one, eid, bufobj, pos + body_offset,
                                       (Py_ssize_t)(pos + body_offset + blen));
        Py_DECREF(eid);
        if (item == NULL)
            goto done;
        int failed = PyList_Append(out, item);
        Py_DECREF(item);
        if (failed < 0)
            goto done;
    }
    result = Py_None;
    Py_INCREF(result);
    goto done;
corrupt:
    PyErr_SetString(PyExc_ValueError, "a stored record runs past the end of the buffer");
done:
    Py_XDECREF(one);
    PyBuffer_Release(&view);
    return result;
}

/* finish(eids, in_flight, owner, floor, done) -> count
 *
 * FIN eids in order, stopping at the first that is not in flight or not owner's; each
 * finished message leaves the in-flight table and moves its queue's floor (or joins the
 * done set above it), as Channel._finished does. */
static PyObject *inflight_finish(PyObject *self, PyObject *args) {
    PyObject *eids, *in_flight, *owner, *floor, *done;
    if (!configured) {
        PyErr_SetString(PyExc_RuntimeError, "configure() was not called");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "OO!OO!O!", &eids, &PyDict_Type, &in_flight, &owner,
                          &PyDict_Type, &floor, &PyDict_Type, &done))
        return NULL;
    PyObject *seq = PySequence_Fast(eids, "eids must be a sequence");
    if (seq == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq), count = 0;
    PyObject **items = PySequence_Fast_ITEMS(seq);
    int error = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *e = PyDict_GetItemWithError(in_flight, items[i]); /* borrowed */
        if (e == NULL) {
            error = PyErr_Occurred() != NULL;
            break;
        }
        if (!PyList_Check(e) || PyList_GET_SIZE(e) != ENTRY_LEN) {
            PyErr_SetString(PyExc_TypeError, "in-flight entries must be 9-item lists");
            error = 1;
            break;
        }
        if (PyList_GET_ITEM(e, ix_owner) != owner)
            break;
        Py_INCREF(e);
        if (PyDict_DelItem(in_flight, items[i]) < 0) {
            Py_DECREF(e);
            error = 1;
            break;
        }
        PyObject *qid = PyList_GET_ITEM(e, ix_qid);
        long long qoff = PyLong_AsLongLong(PyList_GET_ITEM(e, ix_qoff));
        PyObject *fobj = PyDict_GetItemWithError(floor, qid);
        PyObject *d = PyDict_GetItemWithError(done, qid);
        long long f = fobj == NULL ? -1 : PyLong_AsLongLong(fobj);
        if (fobj == NULL || d == NULL || !PySet_Check(d) || PyErr_Occurred()) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_KeyError, "queue without floor or done set");
            Py_DECREF(e);
            error = 1;
            break;
        }
        if (qoff == f) {
            f++;
            while (PySet_GET_SIZE(d) > 0) {
                PyObject *fo = PyLong_FromLongLong(f);
                int r = fo == NULL ? -1 : PySet_Discard(d, fo);
                Py_XDECREF(fo);
                if (r < 0) {
                    error = 1;
                    break;
                }
                if (r == 0)
                    break;
                f++;
            }
            PyObject *nf = error ? NULL : PyLong_FromLongLong(f);
            if (nf == NULL || PyDict_SetItem(floor, qid, nf) < 0) {
                Py_XDECREF(nf);
                Py_DECREF(e);
                error = 1;
                break;
            }
            Py_DECREF(nf);
        } else if (qoff > f) {
            if (PySet_Add(d, PyList_GET_ITEM(e, ix_qoff)) < 0) {
                Py_DECREF(e);
                error = 1;
                break;
            }
        }
        Py_DECREF(e);
        count++;
    }
    Py_DECREF(seq);
    if (error)
        return NULL;
    return PyLong_FromSsize_t(count);
}

static PyMethodDef inflight_methods[] = {
    {"configure", inflight_configure, METH_VARARGS,
     "configure((record offsets...), (entry indexes...)): see channels.py."},
    {"take", inflight_take, METH_VARARGS,
     "take(buf, locs, in_flight, deadline, owner, now, ms_ns, out): hand out fresh records."},
    {"finish", inflight_finish, METH_VARARGS,
     "finish(eids, in_flight, owner, floor, done) -> count: FIN a run of messages."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef inflight_module = {
    PyModuleDef_HEAD_INIT, "mqserver.broker._inflight",
    "Channel in-flight hot paths in C (see channels.py).", -1, inflight_methods,
};

PyMODINIT_FUNC PyInit__inflight(void) { return PyModule_Create(&inflight_module); }
