/* The buffer description every portable kernel takes (portable.h's buffer_t): one converter for
   PyArg's "O&" that validates (address, elements, dtype code), and the size checks each entry
   point makes before it touches a buffer. */

#include "portable.h"

static const char *const KIND_NAMES[] = {"float32", "float64"};

static int convert(PyObject *arg, buffer_t *b, int optional) {
    if (arg == Py_None && optional) {
        b->data = NULL, b->count = 0, b->kind = -1;
        return 1;
    }
    if (!PyTuple_Check(arg) || PyTuple_GET_SIZE(arg) != 3) {
        PyErr_Format(PyExc_TypeError,
                     "a buffer is a tuple (address, elements, dtype code)%s, not %.100s",
                     optional ? " or None" : "", Py_TYPE(arg)->tp_name);
        return 0;
    }
    const unsigned long long address = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(arg, 0));
    const Py_ssize_t count = PyLong_AsSsize_t(PyTuple_GET_ITEM(arg, 1));
    const long kind = PyLong_AsLong(PyTuple_GET_ITEM(arg, 2));
    if (PyErr_Occurred()) return 0;
    if (count < 0 || (count > 0 && address == 0) || (kind != KIND_F32 && kind != KIND_F64)) {
        PyErr_Format(PyExc_ValueError,
                     "a buffer of %zd elements at address %zu of dtype code %ld: the elements are "
                     "at least 0, at an address not 0, the code 0 (float32) or 1 (float64)",
                     count, (size_t)address, kind);
        return 0;
    }
    b->data = (char *)(uintptr_t)address, b->count = count, b->kind = (int)kind;
    return 1;
}

int buffer(PyObject *arg, void *out) { return convert(arg, (buffer_t *)out, 0); }

int optional_buffer(PyObject *arg, void *out) { return convert(arg, (buffer_t *)out, 1); }

int buffer_holds(const char *kernel, const char *name, const buffer_t *b, Py_ssize_t count,
                 int kind) {
    if (b->kind < 0) return 1;
    if (kind != ANY_KIND && b->kind != kind) {
        PyErr_Format(PyExc_ValueError, "%s: %s is %s, not %s", kernel, name, KIND_NAMES[b->kind],
                     KIND_NAMES[kind]);
        return 0;
    }
    if (b->count < count) {
        PyErr_Format(PyExc_ValueError, "%s: %s holds %zd elements, the call reads or writes %zd",
                     kernel, name, b->count, count);
        return 0;
    }
    return 1;
}

int size_ok(const char *kernel, const char *name, Py_ssize_t value) {
    if (value >= 0) return 1;
    PyErr_Format(PyExc_ValueError, "%s: %s is %zd, below 0", kernel, name, value);
    return 0;
}
