/* The JSON header of a remoting frame in C: a speedup of codec.py_decode_json_header
 * for the headers clients send (the Python function stays the reference and the
 * fallback; tests compare the two).
 *
 * json_header(header, default_language) reads a subset of JSON: one object whose values
 * are strings, integers of up to 18 digits, or (one level down, as extFields is) objects
 * of those; strings with any escape but a \u surrogate. It returns (code, language,
 * version, opaque, flag, remark, extFields) as the Python function builds them (the C++
 * client's numeric extFields values as strings), or None for anything else: another
 * value type, a surrogate, bad UTF-8, bad JSON, a header field of another type, or no
 * code. None means "ask the Python function", which then decodes or refuses the header;
 * nothing here raises on bad input. json_command(header, body) builds the command itself
 * (the class, its field names and the defaults come from configure(), called by
 * codec.py): an instance whose __dict__ is what the dataclass's __init__ would set.
 * json_frame(data, max_frame) does the same for a read that is exactly one whole frame
 * (framing.FrameDecoder.whole, the usual read of a client waiting for each answer).
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

typedef struct {
    const unsigned char *p, *end;
    unsigned char *scratch; /* room for the longest string unescaped: the header's size */
} Cur;

static void skip_ws(Cur *c) {
    while (c->p < c->end && (*c->p == ' ' || *c->p == '\t' || *c->p == '\n' || *c->p == '\r'))
        c->p++;
}

static int hexval(unsigned char ch) {
    if (ch >= '0' && ch <= '9')
        return ch - '0';
    if (ch >= 'a' && ch <= 'f')
        return ch - 'a' + 10;
    if (ch >= 'A' && ch <= 'F')
        return ch - 'A' + 10;
    return -1;
}

/* The string at c->p (a '"'): a new str, or NULL (outside the subset, or an error set). */
static PyObject *parse_string(Cur *c) {
    const unsigned char *p = c->p + 1, *end = c->end, *start = p;
    unsigned char *o;
    while (p < end && *p != '"' && *p != '\\')
        p++;
    if (p >= end)
        return NULL;
    if (*p == '"') {
        c->p = p + 1;
        return PyUnicode_DecodeUTF8((const char *)start, p - start, NULL);
    }
    o = c->scratch;
    memcpy(o, start, p - start);
    o += p - start;
    while (p < end) {
        unsigned char ch = *p;
        if (ch == '"') {
            c->p = p + 1;
            return PyUnicode_DecodeUTF8((const char *)c->scratch, o - c->scratch, NULL);
        }
        if (ch != '\\') {
            *o++ = ch;
            p++;
            continue;
        }
        if (end - p < 2)
            return NULL;
        ch = p[1];
        p += 2;
        switch (ch) {
        case '"': *o++ = '"'; break;
        case '\\': *o++ = '\\'; break;
        case '/': *o++ = '/'; break;
        case 'b': *o++ = '\b'; break;
        case 'f': *o++ = '\f'; break;
        case 'n': *o++ = '\n'; break;
        case 'r': *o++ = '\r'; break;
        case 't': *o++ = '\t'; break;
        case 'u': {
            unsigned v = 0;
            int i;
            if (end - p < 4)
                return NULL;
            for (i = 0; i < 4; i++) {
                int h = hexval(p[i]);
                if (h < 0)
                    return NULL;
                v = v * 16 + (unsigned)h;
            }
            p += 4;
            if (v >= 0xD800 && v <= 0xDFFF)
                return NULL; /* pairs and lone surrogates: the Python path */
            if (v < 0x80) {
                *o++ = (unsigned char)v;
            } else if (v < 0x800) {
                *o++ = (unsigned char)(0xC0 | (v >> 6));
                *o++ = (unsigned char)(0x80 | (v & 0x3F));
            } else {
                *o++ = (unsigned char)(0xE0 | (v >> 12));
                *o++ = (unsigned char)(0x80 | ((v >> 6) & 0x3F));
                *o++ = (unsigned char)(0x80 | (v & 0x3F));
            }
            break;
        }
        default:
            return NULL;
        }
    }
    return NULL;
}

/* The integer at c->p: a new int, or NULL (a fraction, an exponent, a leading zero,
 * more than 18 digits: the Python path). */
static PyObject *parse_int(Cur *c) {
    const unsigned char *p = c->p, *end = c->end, *digits;
    long long v = 0;
    int neg = 0;
    if (*p == '-') {
        neg = 1;
        p++;
    }
    digits = p;
    while (p < end && *p >= '0' && *p <= '9') {
        v = v * 10 + (*p - '0');
        p++;
        if (p - digits > 18)
            return NULL;
    }
    if (p == digits || (*digits == '0' && p - digits > 1))
        return NULL;
    if (p < end && (*p == '.' || *p == 'e' || *p == 'E'))
        return NULL;
    c->p = p;
    return PyLong_FromLongLong(neg ? -v : v);
}

/* The object at c->p (a '{'): a new dict, or NULL. Objects only at depth 0; at depth 1
 * values are strings and integers. */
static PyObject *parse_object(Cur *c, int depth) {
    PyObject *d = PyDict_New(), *key = NULL, *value = NULL;
    if (d == NULL)
        return NULL;
    c->p++;
    skip_ws(c);
    if (c->p < c->end && *c->p == '}') {
        c->p++;
        return d;
    }
    for (;;) {
        skip_ws(c);
        if (c->p >= c->end || *c->p != '"' || (key = parse_string(c)) == NULL)
            goto fail;
        skip_ws(c);
        if (c->p >= c->end || *c->p != ':')
            goto fail;
        c->p++;
        skip_ws(c);
        if (c->p >= c->end)
            goto fail;
        if (*c->p == '"')
            value = parse_string(c);
        else if (*c->p == '-' || (*c->p >= '0' && *c->p <= '9'))
            value = parse_int(c);
        else if (*c->p == '{' && depth == 0)
            value = parse_object(c, 1);
        if (value == NULL || PyDict_SetItem(d, key, value) < 0)
            goto fail;
        Py_CLEAR(key);
        Py_CLEAR(value);
        skip_ws(c);
        if (c->p >= c->end)
            goto fail;
        if (*c->p == '}') {
            c->p++;
            return d;
        }
        if (*c->p != ',')
            goto fail;
        c->p++;
    }
fail:
    Py_XDECREF(key);
    Py_XDECREF(value);
    Py_DECREF(d);
    return NULL;
}

/* An int field of the header (default 0 when missing): a new reference, or NULL when it
 * is not an int. */
static PyObject *int_field(PyObject *obj, const char *name) {
    PyObject *v = PyDict_GetItemString(obj, name);
    if (v == NULL)
        return PyLong_FromLong(0);
    if (!PyLong_CheckExact(v))
        return NULL;
    Py_INCREF(v);
    return v;
}

/* extFields with every int value made a string, in place: 0, or -1. */
static int ext_strings(PyObject *ext) {
    PyObject *key, *value;
    Py_ssize_t pos = 0;
    while (PyDict_Next(ext, &pos, &key, &value)) {
        if (PyLong_CheckExact(value)) {
            PyObject *text = PyObject_Str(value);
            /* replacing the value of a key that is there does not resize the dict */
            if (text == NULL || PyDict_SetItem(ext, key, text) < 0) {
                Py_XDECREF(text);
                return -1;
            }
            Py_DECREF(text);
        } else if (!PyUnicode_CheckExact(value)) {
            return -1;
        }
    }
    return 0;
}

static PyObject *header_fields(PyObject *obj, PyObject *default_language) {
    PyObject *code, *version = NULL, *opaque = NULL, *flag = NULL, *language, *remark, *ext;
    PyObject *result = NULL;
    code = PyDict_GetItemString(obj, "code");
    if (code == NULL || !PyLong_CheckExact(code))
        return NULL;
    if ((version = int_field(obj, "version")) == NULL || (opaque = int_field(obj, "opaque")) == NULL
        || (flag = int_field(obj, "flag")) == NULL)
        goto done;
    language = PyDict_GetItemString(obj, "language");
    if (language == NULL || (PyUnicode_CheckExact(language) && PyUnicode_GET_LENGTH(language) == 0))
        language = default_language;
    else if (!PyUnicode_CheckExact(language))
        goto done;
    remark = PyDict_GetItemString(obj, "remark");
    if (remark == NULL)
        remark = Py_None;
    else if (!PyUnicode_CheckExact(remark))
        goto done;
    ext = PyDict_GetItemString(obj, "extFields");
    if (ext == NULL) {
        if ((ext = PyDict_New()) == NULL)
            goto done;
    } else if (!PyDict_CheckExact(ext) || ext_strings(ext) < 0) {
        goto done;
    } else {
        Py_INCREF(ext);
    }
    result = PyTuple_Pack(7, code, language, version, opaque, flag, remark, ext);
    Py_DECREF(ext);
done:
    Py_XDECREF(version);
    Py_XDECREF(opaque);
    Py_XDECREF(flag);
    return result;
}

/* The fields of the header in buf[0:len] as a tuple, or NULL (no exception: the Python
 * path). */
static PyObject *read_header_at(const unsigned char *buf, Py_ssize_t len,
                                PyObject *default_language) {
    Cur c;
    PyObject *obj = NULL, *result = NULL;
    c.p = buf;
    c.end = c.p + len;
    c.scratch = PyMem_Malloc(len ? (size_t)len : 1);
    if (c.scratch == NULL)
        return NULL; /* the Python path, which has its own memory to find */
    skip_ws(&c);
    if (c.p < c.end && *c.p == '{' && (obj = parse_object(&c, 0)) != NULL) {
        skip_ws(&c);
        if (c.p == c.end)
            result = header_fields(obj, default_language);
    }
    Py_XDECREF(obj);
    PyMem_Free(c.scratch);
    if (result == NULL)
        PyErr_Clear(); /* whatever it was, the Python path says it again */
    return result;
}

/* The header's fields as a tuple, or NULL (no exception: the Python path). */
static PyObject *read_header(PyObject *header, PyObject *default_language) {
    Py_buffer view;
    PyObject *result;
    if (PyObject_GetBuffer(header, &view, PyBUF_SIMPLE) < 0) {
        PyErr_Clear(); /* not bytes: the Python path says what it is */
        return NULL;
    }
    result = read_header_at(view.buf, view.len, default_language);
    PyBuffer_Release(&view);
    return result;
}

static PyObject *json_header(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    PyObject *result;
    if (nargs != 2 || !PyUnicode_CheckExact(args[1])) {
        PyErr_SetString(PyExc_TypeError, "json_header(header, default_language: str)");
        return NULL;
    }
    result = read_header(args[0], args[1]);
    if (result == NULL)
        Py_RETURN_NONE;
    return result;
}

/* configure(command_class, field_names, json_type, default_language, type_shift,
 * header_mask): what json_command builds, and how json_frame reads a frame's second word
 * (wire.py's SERIALIZE_TYPE_SHIFT and MAX_HEADER_LENGTH). field_names: the class's fields
 * in order, the 7 of the header then body and serialize_type. */
static PyObject *command_class, *field_names, *json_type, *default_lang;
static unsigned int type_shift, header_mask;

static PyObject *configure(PyObject *self, PyObject *args) {
    PyObject *cls, *names, *jtype, *lang;
    if (!PyArg_ParseTuple(args, "O!O!O!UII", &PyType_Type, &cls, &PyTuple_Type, &names,
                          &PyLong_Type, &jtype, &lang, &type_shift, &header_mask))
        return NULL;
    if (PyTuple_GET_SIZE(names) != 9) {
        PyErr_SetString(PyExc_ValueError, "a command has 9 fields");
        return NULL;
    }
    if (type_shift == 0 || type_shift > 31) {
        PyErr_SetString(PyExc_ValueError, "type_shift is 1..31");
        return NULL;
    }
    Py_INCREF(cls);
    Py_INCREF(names);
    Py_INCREF(jtype);
    Py_INCREF(lang);
    Py_XSETREF(command_class, cls);
    Py_XSETREF(field_names, names);
    Py_XSETREF(json_type, jtype);
    Py_XSETREF(default_lang, lang);
    Py_RETURN_NONE;
}

/* The command of the header's C{fields} (a reference taken) and C{body} (a reference
 * taken; NULL: an error is set), of serialize type C{stype}: an instance of the
 * configured class whose __dict__ holds its fields, as its __init__ would set them. */
static PyObject *make_command(PyObject *fields, PyObject *body, PyObject *stype) {
    PyObject *dict = NULL, *cmd = NULL, *empty;
    Py_ssize_t i;
    if (body == NULL || (dict = PyDict_New()) == NULL)
        goto done;
    for (i = 0; i < 7; i++) {
        if (PyDict_SetItem(dict, PyTuple_GET_ITEM(field_names, i), PyTuple_GET_ITEM(fields, i)) < 0)
            goto done;
    }
    if (PyDict_SetItem(dict, PyTuple_GET_ITEM(field_names, 7), body) < 0
        || PyDict_SetItem(dict, PyTuple_GET_ITEM(field_names, 8), stype) < 0)
        goto done;
    if ((empty = PyTuple_New(0)) == NULL)
        goto done;
    cmd = PyBaseObject_Type.tp_new((PyTypeObject *)command_class, empty, NULL);
    Py_DECREF(empty);
    if (cmd != NULL && PyObject_GenericSetDict(cmd, dict, NULL) < 0)
        Py_CLEAR(cmd);
done:
    Py_DECREF(fields);
    Py_XDECREF(body);
    Py_XDECREF(dict);
    return cmd;
}

static int configured(void) {
    if (command_class == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "_header.configure() was not called");
        return 0;
    }
    return 1;
}

/* json_command(header, body): the command, or None. */
static PyObject *json_command(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    PyObject *fields, *body;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "json_command(header, body)");
        return NULL;
    }
    if (!configured())
        return NULL;
    if ((fields = read_header(args[0], default_lang)) == NULL)
        Py_RETURN_NONE;
    body = PyBytes_CheckExact(args[1]) ? (Py_INCREF(args[1]), args[1]) : PyBytes_FromObject(args[1]);
    return make_command(fields, body, json_type);
}

static unsigned int be32(const unsigned char *p) {
    return ((unsigned int)p[0] << 24) | ((unsigned int)p[1] << 16) | ((unsigned int)p[2] << 8) | p[3];
}

/* json_frame(data, max_frame): the command of data (bytes) when it is exactly one whole
 * frame (length prefix included) of at most max_frame bytes with a JSON header within it,
 * read as json_command reads a header; None for anything else (the Python path). */
static PyObject *json_frame(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    const unsigned char *p;
    Py_ssize_t n, max_frame, header_len;
    unsigned int word;
    PyObject *fields;
    if (nargs != 2 || !PyLong_CheckExact(args[1])) {
        PyErr_SetString(PyExc_TypeError, "json_frame(data, max_frame: int)");
        return NULL;
    }
    if (!configured())
        return NULL;
    if (!PyBytes_CheckExact(args[0]))
        Py_RETURN_NONE;
    if ((max_frame = PyLong_AsSsize_t(args[1])) == -1 && PyErr_Occurred())
        return NULL;
    p = (const unsigned char *)PyBytes_AS_STRING(args[0]);
    n = PyBytes_GET_SIZE(args[0]);
    if (n < 8 || n > max_frame || (Py_ssize_t)be32(p) + 4 != n)
        Py_RETURN_NONE;
    word = be32(p + 4);
    header_len = (Py_ssize_t)(word & header_mask);
    if (word >> type_shift || header_len > n - 8)
        Py_RETURN_NONE;
    if ((fields = read_header_at(p + 8, header_len, default_lang)) == NULL)
        Py_RETURN_NONE;
    return make_command(fields, PyBytes_FromStringAndSize((const char *)p + 8 + header_len,
                                                          n - 8 - header_len), json_type);
}

/* -- the ROCKETMQ binary header (codec.py_decode_binary_header) -- */

static PyObject *binary_type, *language_names, *other_language;

static PyObject *configure_binary(PyObject *self, PyObject *args) {
    PyObject *btype, *names, *other;
    if (!PyArg_ParseTuple(args, "O!O!U", &PyLong_Type, &btype, &PyTuple_Type, &names, &other))
        return NULL;
    Py_INCREF(btype);
    Py_INCREF(names);
    Py_INCREF(other);
    Py_XSETREF(binary_type, btype);
    Py_XSETREF(language_names, names);
    Py_XSETREF(other_language, other);
    Py_RETURN_NONE;
}

static int be16s(const unsigned char *p) { return (int)(short)(((unsigned)p[0] << 8) | p[1]); }

static Py_ssize_t be32s(const unsigned char *p) { return (Py_ssize_t)(int)be32(p); }

/* The fields (code, language, version, opaque, flag, remark, extFields) of the binary
 * header in p[0:end] as a tuple, or NULL (no exception: the Python path, which says what
 * is wrong). Layout (wire.ROCKETMQ_HEADER): i16 code, u8 language, i16 version, i32
 * opaque, i32 flag, i32 remark length + remark, i32 extFields length + extFields, each
 * an i16 key length + key and an i32 value length + value, all UTF-8. */
static PyObject *binary_fields(const unsigned char *p, Py_ssize_t end) {
    Py_ssize_t pos = 17, remark_len, ext_len, key_len, value_len;
    unsigned int lang = p[2];
    PyObject *remark = NULL, *ext = NULL, *key = NULL, *value = NULL, *language, *result;
    if (end < 17 + 4)
        return NULL;
    remark_len = be32s(p + 13);
    if (remark_len < 0 || pos + remark_len + 4 > end)
        return NULL;
    if (remark_len == 0) {
        Py_INCREF(Py_None);
        remark = Py_None;
    } else if ((remark = PyUnicode_DecodeUTF8((const char *)p + pos, remark_len, NULL)) == NULL) {
        goto fail;
    }
    pos += remark_len;
    ext_len = be32s(p + pos);
    pos += 4;
    if (ext_len < 0 || pos + ext_len != end || (ext = PyDict_New()) == NULL)
        goto fail;
    while (pos < end) {
        if (pos + 2 > end)
            goto fail;
        key_len = be16s(p + pos);
        pos += 2;
        if (key_len < 0 || pos + key_len + 4 > end
            || (key = PyUnicode_DecodeUTF8((const char *)p + pos, key_len, NULL)) == NULL)
            goto fail;
        pos += key_len;
        value_len = be32s(p + pos);
        pos += 4;
        if (value_len < 0 || pos + value_len > end
            || (value = PyUnicode_DecodeUTF8((const char *)p + pos, value_len, NULL)) == NULL
            || PyDict_SetItem(ext, key, value) < 0)
            goto fail;
        pos += value_len;
        Py_CLEAR(key);
        Py_CLEAR(value);
    }
    language = (Py_ssize_t)lang < PyTuple_GET_SIZE(language_names)
                   ? PyTuple_GET_ITEM(language_names, lang) : other_language;
    result = Py_BuildValue("(iOiiiNN)", be16s(p), language, be16s(p + 3), (int)be32(p + 5),
                           (int)be32(p + 9), remark, ext);
    if (result != NULL)
        return result;
    remark = ext = NULL; /* Py_BuildValue took them, also when it failed */
fail:
    Py_XDECREF(remark);
    Py_XDECREF(ext);
    Py_XDECREF(key);
    Py_XDECREF(value);
    PyErr_Clear(); /* whatever it was, the Python path says it again */
    return NULL;
}

/* binary_command(header, body): the command of a binary header, or None. */
static PyObject *binary_command(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    Py_buffer view;
    PyObject *fields, *body;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "binary_command(header, body)");
        return NULL;
    }
    if (!configured())
        return NULL;
    if (binary_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "_header.configure_binary() was not called");
        return NULL;
    }
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) {
        PyErr_Clear(); /* not bytes: the Python path says what it is */
        Py_RETURN_NONE;
    }
    fields = binary_fields(view.buf, view.len);
    PyBuffer_Release(&view);
    if (fields == NULL)
        Py_RETURN_NONE;
    body = PyBytes_CheckExact(args[1]) ? (Py_INCREF(args[1]), args[1]) : PyBytes_FromObject(args[1]);
    return make_command(fields, body, binary_type);
}

static PyMethodDef methods[] = {
    {"json_header", (PyCFunction)(void (*)(void))json_header, METH_FASTCALL,
     "json_header(header, default_language) -> (code, language, version, opaque, flag, "
     "remark, extFields) or None: see codec.py_decode_json_header."},
    {"json_command", (PyCFunction)(void (*)(void))json_command, METH_FASTCALL,
     "json_command(header, body) -> the command json_header's fields make, or None."},
    {"json_frame", (PyCFunction)(void (*)(void))json_frame, METH_FASTCALL,
     "json_frame(data, max_frame) -> the command of data when it is one whole frame with a "
     "JSON header json_command reads, or None."},
    {"binary_command", (PyCFunction)(void (*)(void))binary_command, METH_FASTCALL,
     "binary_command(header, body) -> the command of a ROCKETMQ binary header, or None: "
     "see codec.py_decode_binary_header."},
    {"configure_binary", configure_binary, METH_VARARGS,
     "configure_binary(rocketmq_type, language_names, other_language)"},
    {"configure", configure, METH_VARARGS,
     "configure(command_class, field_names, json_type, default_language, type_shift, "
     "header_mask)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_header", "The JSON and binary headers of a remoting frame in C.", -1, methods,
};

PyMODINIT_FUNC PyInit__header(void) { return PyModule_Create(&module); }
