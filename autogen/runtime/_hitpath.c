/* The dispatcher's hit path in C: a repeated call served from its remembered binding.
 *
 * autogen.dispatch.make_call's Python function binds a call, launches it and, on the call's
 * second sighting, remembers it as an autogen.bound.BoundCall under its key (the current device
 * and stream, the keyword names and every argument's id). Served from Python, a remembered call
 * still spends a sizeable share of a bare CuPy launch in the interpreter (building the key, the
 * guards, the launch binding's argument conversions; docs/benchmarks.md, "Dispatcher host cost"). HitPath is that same function with the
 * hit served here: the key, one dictionary lookup, the guards, cuLaunchKernel. Everything else
 * (the first calls, a failed guard, a launch that fails) goes to the Python function, which stays
 * the one place that binds, remembers and reports errors.
 *
 * The key and the guards are those of autogen.bound, computed the same way, so a key built here
 * finds what the Python side stored: a tuple of the device, the stream's pointer, the keyword
 * names, then id() of every positional and keyword argument; each guard is a weak reference to
 * an array that must still be alive with the shape it had.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stddef.h>
#include <stdint.h>

/* cuLaunchKernel as cuda.h declares it; CUresult is an enum, CUfunction and CUstream pointers. */
typedef int (*LaunchKernel)(void *function, unsigned int grid_x, unsigned int grid_y, unsigned int grid_z,
                            unsigned int block_x, unsigned int block_y, unsigned int block_z,
                            unsigned int shared_bytes, void *stream, void **parameters, void **extra);

/* One launch as autogen.bound packs it (PACKED_LAUNCH there: "=Q3I3IIIQ", 48 bytes). */
typedef struct {
    uint64_t function;
    uint32_t grid[3];
    uint32_t block[3];
    uint32_t shared_bytes;
    uint32_t unused;
    uint64_t parameters; /* the address of the launch's void *[] */
} PackedLaunch;

_Static_assert(sizeof(PackedLaunch) == 48, "PackedLaunch must match autogen.bound.PACKED_LAUNCH");

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *fallback;       /* the Python function: binds, remembers, serves what is not served here */
    PyObject *calls;          /* key -> BoundCall, filled by the Python side */
    PyObject *sightings;      /* key -> Sighting, used by the Python side only */
    PyObject *dispatcher;     /* the dispatcher whose kernels the remembered calls launch */
    PyObject *globals;        /* autogen.dispatch's namespace, for its _default_dispatcher */
    PyObject *get_device;     /* cupy.cuda.runtime.getDevice */
    PyObject *current_stream; /* cupy.cuda.get_current_stream */
    LaunchKernel launch;      /* NULL until configure(): every call goes to the Python function */
    PyObject *dict;           /* __name__, __doc__ and family, as a function has them */
} HitPath;

static PyObject *str_ptr, *str_shape, *str_arrays, *str_packed, *str_result, *str_default_dispatcher;

/* The object a weak reference points to (a new reference), or NULL where it is dead. */
static PyObject *referent(PyObject *ref)
{
#if PY_VERSION_HEX >= 0x030D0000
    PyObject *object = NULL;
    if (PyWeakref_GetRef(ref, &object) < 0) {
        PyErr_Clear();
        return NULL;
    }
    return object;
#else
    PyObject *object = PyWeakref_GetObject(ref);
    if (object == NULL) {
        PyErr_Clear();
        return NULL;
    }
    if (object == Py_None)
        return NULL;
    Py_INCREF(object);
    return object;
#endif
}

/* autogen.bound's key: (device, stream pointer, *keyword names, *ids of the arguments). */
static PyObject *call_key(PyObject *device, PyObject *stream_ptr, PyObject *const *args, Py_ssize_t nargs,
                          PyObject *kwnames)
{
    Py_ssize_t keywords = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    PyObject *key = PyTuple_New(2 + keywords + nargs + keywords);
    if (key == NULL)
        return NULL;
    Py_INCREF(device);
    PyTuple_SET_ITEM(key, 0, device);
    Py_INCREF(stream_ptr);
    PyTuple_SET_ITEM(key, 1, stream_ptr);
    for (Py_ssize_t i = 0; i < keywords; i++) {
        PyObject *name = PyTuple_GET_ITEM(kwnames, i);
        Py_INCREF(name);
        PyTuple_SET_ITEM(key, 2 + i, name);
    }
    for (Py_ssize_t i = 0; i < nargs + keywords; i++) { /* the keyword values follow the positional ones */
        PyObject *id = PyLong_FromVoidPtr((void *)args[i]);
        if (id == NULL) {
            Py_DECREF(key);
            return NULL;
        }
        PyTuple_SET_ITEM(key, 2 + keywords + i, id);
    }
    return key;
}

/* The guards of a BoundCall: each array alive, with the shape it was bound with. 1, 0, or -1
 * with an exception set. */
static int guards_hold(PyObject *bound)
{
    PyObject *arrays = PyObject_GetAttr(bound, str_arrays);
    if (arrays == NULL)
        return -1;
    int holds = PyTuple_Check(arrays);
    for (Py_ssize_t i = 0; holds && i < PyTuple_GET_SIZE(arrays); i++) {
        PyObject *guard = PyTuple_GET_ITEM(arrays, i); /* (weak reference, shape) */
        PyObject *array = referent(PyTuple_GET_ITEM(guard, 0));
        if (array == NULL) {
            holds = 0;
            break;
        }
        PyObject *shape = PyObject_GetAttr(array, str_shape);
        Py_DECREF(array);
        if (shape == NULL) {
            holds = -1;
            break;
        }
        holds = PyObject_RichCompareBool(shape, PyTuple_GET_ITEM(guard, 1), Py_EQ);
        Py_DECREF(shape);
    }
    Py_DECREF(arrays);
    return holds;
}

/* Launch every kernel of `bound` on `stream`. 1 where all were launched; 0 where the first one
 * failed (nothing was launched: the Python function serves the call and reports why, or makes a
 * context current and launches, CUDA_ERROR_INVALID_CONTEXT); -1 with an exception set where a
 * later one failed. */
static int launch_all(HitPath *self, PyObject *bound, void *stream)
{
    PyObject *packed = PyObject_GetAttr(bound, str_packed);
    if (packed == NULL)
        return -1;
    if (!PyBytes_Check(packed) || PyBytes_GET_SIZE(packed) % sizeof(PackedLaunch) != 0) {
        Py_DECREF(packed);
        PyErr_SetString(PyExc_TypeError, "BoundCall.packed must be bytes of whole PACKED_LAUNCH records");
        return -1;
    }
    const PackedLaunch *launches = (const PackedLaunch *)PyBytes_AS_STRING(packed);
    Py_ssize_t count = PyBytes_GET_SIZE(packed) / (Py_ssize_t)sizeof(PackedLaunch);
    int launched = 1;
    for (Py_ssize_t i = 0; i < count; i++) {
        const PackedLaunch *l = &launches[i];
        int status = self->launch((void *)(uintptr_t)l->function, l->grid[0], l->grid[1], l->grid[2], l->block[0],
                                  l->block[1], l->block[2], l->shared_bytes, stream,
                                  (void **)(uintptr_t)l->parameters, NULL);
        if (status != 0) {
            if (i == 0) {
                launched = 0;
            } else {
                PyErr_Format(PyExc_RuntimeError, "cuLaunchKernel failed with CUDA error %d on launch %zd of %zd",
                             status, i + 1, count);
                launched = -1;
            }
            break;
        }
    }
    Py_DECREF(packed);
    return launched;
}

/* The call served from its remembered binding: a new reference to its result; NULL without an
 * exception where it was not (the Python function serves it); NULL with one on an error. */
static PyObject *serve(HitPath *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *result = NULL, *bound = NULL;
    PyObject *device = PyObject_CallNoArgs(self->get_device);
    if (device == NULL)
        return NULL;
    PyObject *stream = PyObject_CallNoArgs(self->current_stream);
    PyObject *stream_ptr = stream ? PyObject_GetAttr(stream, str_ptr) : NULL;
    Py_XDECREF(stream);
    PyObject *key = stream_ptr ? call_key(device, stream_ptr, args, nargs, kwnames) : NULL;
    Py_DECREF(device);
    if (key == NULL)
        goto done;
    bound = PyDict_GetItemWithError(self->calls, key);
    Py_DECREF(key);
    if (bound == NULL)
        goto done;
    Py_INCREF(bound); /* the guards run Python-level attribute lookups: keep it alive meanwhile */
    PyObject *current = PyDict_GetItemWithError(self->globals, str_default_dispatcher);
    if (current != self->dispatcher || guards_hold(bound) != 1)
        goto done;
    void *stream_handle = PyLong_AsVoidPtr(stream_ptr);
    if (stream_handle == NULL && PyErr_Occurred())
        goto done;
    if (launch_all(self, bound, stream_handle) != 1)
        goto done;
    PyObject *give_result = PyObject_GetAttr(bound, str_result);
    if (give_result != NULL) {
        result = PyObject_CallNoArgs(give_result);
        Py_DECREF(give_result);
    }
done:
    Py_XDECREF(bound);
    Py_XDECREF(stream_ptr);
    return result;
}

static PyObject *hitpath_vectorcall(PyObject *callable, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    HitPath *self = (HitPath *)callable;
    if (self->fallback == NULL || self->fallback == Py_None) {
        PyErr_SetString(PyExc_TypeError, "HitPath: no Python function to call (set .fallback)");
        return NULL;
    }
    if (self->launch != NULL) {
        PyObject *result = serve(self, args, PyVectorcall_NARGS(nargsf), kwnames);
        if (result != NULL || PyErr_Occurred())
            return result;
    }
    return PyObject_Vectorcall(self->fallback, args, nargsf, kwnames);
}

static PyObject *hitpath_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    if (PyTuple_GET_SIZE(args) != 0 || (kwargs != NULL && PyDict_GET_SIZE(kwargs) != 0)) {
        PyErr_SetString(PyExc_TypeError, "HitPath() takes no arguments");
        return NULL;
    }
    HitPath *self = (HitPath *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->vectorcall = hitpath_vectorcall;
    self->calls = PyDict_New();
    self->sightings = PyDict_New();
    Py_INCREF(Py_None);
    self->dispatcher = Py_None;
    Py_INCREF(Py_None);
    self->fallback = Py_None;
    if (self->calls == NULL || self->sightings == NULL) {
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

static PyObject *hitpath_configure(HitPath *self, PyObject *args)
{
    PyObject *get_device, *current_stream, *launch_address, *globals;
    if (!PyArg_ParseTuple(args, "OOOO!:configure", &get_device, &current_stream, &launch_address, &PyDict_Type,
                          &globals))
        return NULL;
    void *launch = PyLong_AsVoidPtr(launch_address);
    if (launch == NULL) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "configure: the address of cuLaunchKernel is NULL");
        return NULL;
    }
    Py_INCREF(get_device);
    Py_XSETREF(self->get_device, get_device);
    Py_INCREF(current_stream);
    Py_XSETREF(self->current_stream, current_stream);
    Py_INCREF(globals);
    Py_XSETREF(self->globals, globals);
    self->launch = (LaunchKernel)launch;
    Py_RETURN_NONE;
}

static int hitpath_traverse(HitPath *self, visitproc visit, void *arg)
{
    Py_VISIT(self->fallback);
    Py_VISIT(self->calls);
    Py_VISIT(self->sightings);
    Py_VISIT(self->dispatcher);
    Py_VISIT(self->globals);
    Py_VISIT(self->get_device);
    Py_VISIT(self->current_stream);
    Py_VISIT(self->dict);
    return 0;
}

static int hitpath_clear(HitPath *self)
{
    self->launch = NULL;
    Py_CLEAR(self->fallback);
    Py_CLEAR(self->calls);
    Py_CLEAR(self->sightings);
    Py_CLEAR(self->dispatcher);
    Py_CLEAR(self->globals);
    Py_CLEAR(self->get_device);
    Py_CLEAR(self->current_stream);
    Py_CLEAR(self->dict);
    return 0;
}

static void hitpath_dealloc(HitPath *self)
{
    PyObject_GC_UnTrack(self);
    hitpath_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef hitpath_methods[] = {
    {"configure", (PyCFunction)hitpath_configure, METH_VARARGS,
     "configure(get_device, current_stream, launch_address, globals): serve remembered calls from now on,\n"
     "launching with the cuLaunchKernel at launch_address; globals is autogen.dispatch's namespace."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef hitpath_members[] = {
    {"fallback", T_OBJECT, offsetof(HitPath, fallback), 0, "the Python function serving every other call"},
    {"calls", T_OBJECT, offsetof(HitPath, calls), READONLY, "key -> autogen.bound.BoundCall"},
    {"sightings", T_OBJECT, offsetof(HitPath, sightings), READONLY, "key -> autogen.bound.Sighting"},
    {"dispatcher", T_OBJECT, offsetof(HitPath, dispatcher), 0, "the dispatcher the remembered calls belong to"},
    {NULL, 0, 0, 0, NULL},
};

static PyObject *hitpath_configured(HitPath *self, void *closure)
{
    return PyBool_FromLong(self->launch != NULL);
}

static PyGetSetDef hitpath_getset[] = {
    {"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict, NULL, NULL},
    {"configured", (getter)hitpath_configured, NULL, "whether remembered calls are served here", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject HitPathType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "autogen._hitpath.HitPath",
    .tp_doc = "A family's dispatched call: remembered calls served in C, every other call by .fallback.",
    .tp_basicsize = sizeof(HitPath),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_new = hitpath_new,
    .tp_dealloc = (destructor)hitpath_dealloc,
    .tp_traverse = (traverseproc)hitpath_traverse,
    .tp_clear = (inquiry)hitpath_clear,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(HitPath, vectorcall),
    .tp_dictoffset = offsetof(HitPath, dict),
    .tp_methods = hitpath_methods,
    .tp_members = hitpath_members,
    .tp_getset = hitpath_getset,
};

static struct PyModuleDef hitpath_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "autogen._hitpath",
    .m_doc = "The dispatcher's hit path in C (see autogen.dispatch.make_call and autogen.bound).",
    .m_size = -1,
};

PyMODINIT_FUNC PyInit__hitpath(void)
{
    const char *names[] = {"ptr", "shape", "arrays", "packed", "result", "_default_dispatcher"};
    PyObject **strings[] = {&str_ptr, &str_shape, &str_arrays, &str_packed, &str_result, &str_default_dispatcher};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        *strings[i] = PyUnicode_InternFromString(names[i]);
        if (*strings[i] == NULL)
            return NULL;
    }
    if (PyType_Ready(&HitPathType) < 0)
        return NULL;
    PyObject *module = PyModule_Create(&hitpath_module);
    if (module == NULL)
        return NULL;
    Py_INCREF(&HitPathType);
    if (PyModule_AddObject(module, "HitPath", (PyObject *)&HitPathType) < 0) {
        Py_DECREF(&HitPathType);
        Py_DECREF(module);
        return NULL;
    }
    if (PyModule_AddIntConstant(module, "PACKED_LAUNCH_BYTES", (long)sizeof(PackedLaunch)) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
