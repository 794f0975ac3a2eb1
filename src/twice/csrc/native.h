/* The registration functions of twice._native's own families, one per file in this folder: each
   adds its file's entry points to the module (PyInit__native in _native.c calls them). */

#ifndef TWICE_NATIVE_H
#define TWICE_NATIVE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* Each returns 0, or -1 with an exception set. */
int bind_fetch(PyObject *module);   /* fetch.c: the data loader's seeded per-sample fetch */
int bind_hashing(PyObject *module); /* hashing.c: digests and norms of many buffers */
int bind_records(PyObject *module); /* records.c: trace lines validated, compared, read */

#endif
