/* The request loop of one FUSE worker in C: the native twin of Session._serve_python.
 *
 * Why: a worker of the Python loop holds the GIL from the moment its device read returns until it
 * blocks in the next one (parse, dispatch, reply, bookkeeping). On a FUSE connection requests come
 * in pairs and bursts (an OPEN and the RELEASE of the close before it, a READ and the kernel's
 * read-ahead), so a second worker woken by the kernel waits for that GIL, and every hand-over of the
 * GIL between two threads is a futex wake and a context switch. Here the GIL is held only while a
 * Python handler runs: the device read, the header's parse, the dispatch and the reply's writev run
 * without it. Measured on a 2-core VM (tmpfs source, a trivial handler): open + close of one file
 * took 42-44 us against 76-78 us with the Python loop and the same handlers.
 *
 * What it does is exactly what the Python loop does per request (see fastfs.daemon.kernel.session):
 * read one request into the worker's buffer, count its opcode, fill the worker's Request, publish
 * worker.current for the watchdog, call handler(request, body), and answer: bytes, a list of
 * buffers (sent by one writev, never joined), None (success), the NO_REPLY object, or an error
 * (an OSError's errno; any other exception EIO, reported to on_exception). Then request.after is
 * called. The loop ends when the worker is abandoned (returns 0), when the device read says the
 * connection is gone (returns its errno, or -1 when it read 0 bytes), or when a BaseException that
 * is no Exception escapes a handler (raised again, as the Python loop lets it).
 *
 * No policy lives here: no opcode is answered without its Python handler.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdint.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

/* struct fuse_in_header and struct fuse_out_header (include/uapi/linux/fuse.h) */
struct in_header {
    uint32_t len;
    uint32_t opcode;
    uint64_t unique;
    uint64_t nodeid;
    uint32_t uid;
    uint32_t gid;
    uint32_t pid;
    uint16_t total_extlen;
    uint16_t padding;
};

struct out_header {
    uint32_t len;
    int32_t error;
    uint64_t unique;
};

/* Opcodes below this are looked up in a table filled once per loop; others in the handlers dict. */
#define TABLE_SIZE 64
/* Buffers of one reply written as they are, at most (as MAX_REPLY_PARTS in session.py): a reply of
 * more, which only a read of many small blocks makes, is joined into one first (the kernel takes at
 * most IOV_MAX, 1024, buffers per writev). */
#define MAX_PARTS 64

/* -- reader places (the native twin of Session._take_reader_place and _leave_reader_place) ---------
 *
 * At most `spare` workers wait in the device read at once; the others park, each on a semaphore of
 * its own (on its stack, linked into the parked list). A worker that takes the last reader's place
 * (every reader now busy) wakes the worker that parked last first and counts it as a reader, so a
 * request that blocks on a slow source never keeps the next one waiting. The kernel hands a request
 * to the reader that has waited longest: with every worker reading, a serial stream of requests went
 * each to the coldest thread (measured: 16 workers took turns, and the daemon's CPU per open + close
 * was about twice what two warm workers spend). No Python object is touched under `lock`, and no
 * wait happens with the GIL held. */
struct parked {
    sem_t wake;
    struct parked *next;
};

typedef struct {
    PyObject_HEAD
    pthread_mutex_t lock;
    int spare;               /* readers at most (immutable) */
    int readers;             /* workers in, or entering, the device read (lock) */
    int ending;              /* the connection is gone: parked workers leave, none reads again (lock) */
    struct parked *parked;   /* the parked workers, the one parked last first (lock) */
} Readers;

/* Wait for a reader's place: 0 when taken, 1 when the connection is gone. *me* is the calling
 * worker's own parking place (made once per loop, so no semaphore is destroyed while a late post
 * may still touch it). */
static int take_place(Readers *r, struct parked *me)
{
    pthread_mutex_lock(&r->lock);
    if (r->ending) {
        pthread_mutex_unlock(&r->lock);
        return 1;
    }
    if (r->readers < r->spare) {
        r->readers++;
        pthread_mutex_unlock(&r->lock);
        return 0;
    }
    me->next = r->parked;
    r->parked = me;
    pthread_mutex_unlock(&r->lock);
    Py_BEGIN_ALLOW_THREADS
    while (sem_wait(&me->wake) < 0 && errno == EINTR)
        ;
    Py_END_ALLOW_THREADS
    pthread_mutex_lock(&r->lock); /* (whoever woke us unlinked us first) */
    int ending = r->ending;
    pthread_mutex_unlock(&r->lock);
    return ending;
}

/* The calling worker got a request: when it was the last reader, the worker parked last takes a
 * reader's place (counted for it here) and is woken. */
static void leave_place(Readers *r)
{
    struct parked *woken = NULL;
    pthread_mutex_lock(&r->lock);
    r->readers--;
    if (r->readers == 0 && r->parked != NULL && !r->ending) {
        woken = r->parked;
        r->parked = woken->next;
        r->readers++;
    }
    pthread_mutex_unlock(&r->lock);
    if (woken != NULL)
        sem_post(&woken->wake);
}

/* The connection is gone: no worker reads again, the parked ones leave. */
static void end_places(Readers *r)
{
    pthread_mutex_lock(&r->lock);
    r->ending = 1;
    struct parked *p = r->parked;
    r->parked = NULL;
    while (p != NULL) {
        struct parked *next = p->next; /* (read before the post: the waker's stack frame goes after it) */
        sem_post(&p->wake);
        p = next;
    }
    pthread_mutex_unlock(&r->lock);
}

static PyObject *Readers_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    int spare;
    static char *kwlist[] = {"spare", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "i", kwlist, &spare))
        return NULL;
    if (spare < 1) {
        PyErr_SetString(PyExc_ValueError, "spare must be at least 1");
        return NULL;
    }
    Readers *self = (Readers *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    pthread_mutex_init(&self->lock, NULL);
    self->spare = spare;
    self->readers = 0;
    self->ending = 0;
    self->parked = NULL;
    return (PyObject *)self;
}

static void Readers_dealloc(Readers *self)
{
    pthread_mutex_destroy(&self->lock);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Readers_end(Readers *self, PyObject *unused)
{
    end_places(self);
    Py_RETURN_NONE;
}

static PyObject *Readers_counts(Readers *self, PyObject *unused)
{
    pthread_mutex_lock(&self->lock);
    int readers = self->readers, parked = 0, ending = self->ending;
    for (struct parked *p = self->parked; p != NULL; p = p->next)
        parked++;
    pthread_mutex_unlock(&self->lock);
    return Py_BuildValue("(iii)", readers, parked, ending);
}

static PyMethodDef Readers_methods[] = {
    {"end", (PyCFunction)Readers_end, METH_NOARGS, "The connection is gone: no worker reads again, the parked leave."},
    {"counts", (PyCFunction)Readers_counts, METH_NOARGS, "(readers, parked, ending): for tests."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject ReadersType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "fastfs.daemon.kernel._loop.Readers",
    .tp_doc = PyDoc_STR("Readers(spare): the reader places of one session's workers (see the C file)."),
    .tp_basicsize = sizeof(Readers),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = Readers_new,
    .tp_dealloc = (destructor)Readers_dealloc,
    .tp_methods = Readers_methods,
};

static PyObject *s_unique, *s_opcode, *s_nodeid, *s_uid, *s_gid, *s_pid, *s_after, *s_current, *s_abandoned,
    *s_counts, *s_errno;

static double monotonic_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts); /* the clock of Python's time.monotonic */
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Write the header (and the buffers of *parts*) without the GIL; returns 0 or the errno of the write. */
static int write_reply(int fd, uint64_t unique, int32_t error, Py_buffer *parts, int nparts)
{
    struct iovec iov[MAX_PARTS + 1];
    struct out_header header;
    size_t total = sizeof header;
    for (int i = 0; i < nparts; i++) {
        iov[i + 1].iov_base = parts[i].buf;
        iov[i + 1].iov_len = (size_t)parts[i].len;
        total += (size_t)parts[i].len;
    }
    header.len = (uint32_t)total;
    header.error = error;
    header.unique = unique;
    iov[0].iov_base = &header;
    iov[0].iov_len = sizeof header;
    ssize_t written;
    Py_BEGIN_ALLOW_THREADS
    written = writev(fd, iov, nparts + 1);
    Py_END_ALLOW_THREADS
    return written < 0 ? errno : 0;
}

/* Call callback(*args) and drop its result; an exception there is printed (it must not end the loop). */
static void notify(PyObject *callback, PyObject *const *args, size_t nargs)
{
    PyObject *result = PyObject_Vectorcall(callback, args, nargs, NULL);
    if (result == NULL)
        PyErr_WriteUnraisable(callback);
    Py_XDECREF(result);
}

static void reply_failed(PyObject *on_reply_error, int code)
{
    PyObject *arg = PyLong_FromLong(code);
    if (arg == NULL) {
        PyErr_WriteUnraisable(on_reply_error);
        return;
    }
    notify(on_reply_error, &arg, 1);
    Py_DECREF(arg);
}

/* The pending exception, normalized and cleared (PyErr_GetRaisedException before Python 3.12). */
static PyObject *take_exception(void)
{
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
    PyErr_NormalizeException(&type, &value, &traceback);
    if (value != NULL && traceback != NULL)
        PyException_SetTraceback(value, traceback);
    Py_XDECREF(type);
    Py_XDECREF(traceback);
    if (value == NULL) {
        Py_INCREF(Py_None);
        value = Py_None;
    }
    return value;
}

/* The pending exception (not an OSError) goes to on_exception(opcode, exc); the request gets EIO. */
static void report_exception(PyObject *on_exception, PyObject *opcode)
{
    PyObject *exc = take_exception();
    PyObject *args[2] = {opcode, exc};
    notify(on_exception, args, 2);
    Py_DECREF(exc);
}

/* The errno of the pending OSError (cleared), EIO when it has none. */
static int take_oserror(void)
{
    PyObject *exc = take_exception();
    int code = EIO;
    PyObject *value = PyObject_GetAttr(exc, s_errno);
    if (value != NULL && PyLong_Check(value)) {
        long n = PyLong_AsLong(value);
        if (n > 0 && n < INT_MAX)
            code = (int)n;
    }
    PyErr_Clear();
    Py_XDECREF(value);
    Py_DECREF(exc);
    return code;
}

static int set_int(PyObject *obj, PyObject *name, unsigned long long value)
{
    PyObject *v = PyLong_FromUnsignedLongLong(value);
    if (v == NULL)
        return -1;
    int r = PyObject_SetAttr(obj, name, v);
    Py_DECREF(v);
    return r;
}

static int count_opcode(PyObject *counts, PyObject *opcode)
{
    PyObject *old = PyDict_GetItemWithError(counts, opcode); /* borrowed */
    if (old == NULL && PyErr_Occurred())
        return -1;
    long n = old == NULL ? 0 : PyLong_AsLong(old);
    PyObject *v = PyLong_FromLong(n + 1);
    if (v == NULL)
        return -1;
    int r = PyDict_SetItem(counts, opcode, v);
    Py_DECREF(v);
    return r;
}

/* Send *reply* (the handler's answer, not an error): 0, or -1 with a Python exception set when the
 * reply is not made of buffers (the caller answers EIO then). */
static int send_answer(int fd, uint64_t unique, PyObject *reply, PyObject *no_reply, PyObject *on_reply_error)
{
    Py_buffer parts[MAX_PARTS];
    int nparts = 0;
    int code;
    if (reply == no_reply)
        return 0;
    if (reply == Py_None) {
        code = write_reply(fd, unique, 0, NULL, 0);
    } else if (PyList_CheckExact(reply) && PyList_GET_SIZE(reply) > MAX_PARTS) {
        PyObject *empty = PyBytes_FromStringAndSize(NULL, 0);
        PyObject *joined = empty == NULL ? NULL : PyObject_CallMethod(empty, "join", "O", reply);
        Py_XDECREF(empty);
        if (joined == NULL)
            return -1;
        Py_buffer whole = {.buf = PyBytes_AS_STRING(joined), .len = PyBytes_GET_SIZE(joined)};
        code = write_reply(fd, unique, 0, &whole, 1);
        Py_DECREF(joined);
    } else if (PyList_CheckExact(reply)) {
        Py_ssize_t n = PyList_GET_SIZE(reply);
        for (Py_ssize_t i = 0; i < n; i++) {
            if (PyObject_GetBuffer(PyList_GET_ITEM(reply, i), &parts[nparts], PyBUF_SIMPLE) < 0) {
                for (int j = 0; j < nparts; j++)
                    PyBuffer_Release(&parts[j]);
                return -1;
            }
            nparts++;
        }
        code = write_reply(fd, unique, 0, parts, nparts);
    } else {
        if (PyObject_GetBuffer(reply, &parts[0], PyBUF_SIMPLE) < 0)
            return -1;
        nparts = 1;
        code = write_reply(fd, unique, 0, parts, nparts);
    }
    for (int j = 0; j < nparts; j++)
        PyBuffer_Release(&parts[j]);
    if (code)
        reply_failed(on_reply_error, code);
    return 0;
}

PyDoc_STRVAR(serve_doc,
    "serve(fd, buffer, handlers, request, worker, no_reply, no_reply_ops, on_exception, on_reply_error, readers)"
    " -> int\n\n"
    "Serve requests read from fd until the worker is abandoned (0), the device read ends the connection\n"
    "(its errno, or -1 for end of file) or a BaseException escapes a handler (raised).");

static PyObject *serve(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 10) {
        PyErr_SetString(PyExc_TypeError, "serve() takes 10 arguments");
        return NULL;
    }
    if (!PyObject_TypeCheck(args[9], &ReadersType)) {
        PyErr_SetString(PyExc_TypeError, "readers must be a Readers");
        return NULL;
    }
    Readers *places = (Readers *)args[9];
    struct parked me; /* this worker's parking place, for the whole loop */
    long fd_value = PyLong_AsLong(args[0]);
    if (fd_value == -1 && PyErr_Occurred())
        return NULL;
    if (fd_value < 0 || fd_value > INT_MAX) {
        PyErr_SetString(PyExc_ValueError, "bad file descriptor");
        return NULL;
    }
    int fd = (int)fd_value;
    PyObject *handlers = args[2], *request = args[3], *worker = args[4], *no_reply = args[5],
             *no_reply_ops = args[6], *on_exception = args[7], *on_reply_error = args[8];
    if (!PyDict_Check(handlers)) {
        PyErr_SetString(PyExc_TypeError, "handlers must be a dict");
        return NULL;
    }
    Py_buffer buffer;
    if (PyObject_GetBuffer(args[1], &buffer, PyBUF_WRITABLE) < 0)
        return NULL;
    PyObject *counts = PyObject_GetAttr(worker, s_counts);
    if (counts == NULL || !PyDict_Check(counts)) {
        if (counts != NULL)
            PyErr_SetString(PyExc_TypeError, "worker.counts must be a dict");
        Py_XDECREF(counts);
        PyBuffer_Release(&buffer);
        return NULL;
    }
    sem_init(&me.wake, 0, 0);
    me.next = NULL;
    PyObject *table[TABLE_SIZE];
    for (int op = 0; op < TABLE_SIZE; op++) {
        PyObject *key = PyLong_FromLong(op);
        table[op] = key == NULL ? NULL : PyDict_GetItemWithError(handlers, key); /* borrowed: handlers is held */
        Py_XDECREF(key);
        if (PyErr_Occurred())
            goto fail;
    }

    long result = 0;
    char *buf = buffer.buf;
    for (;;) {
        int abandoned = 0;
        PyObject *flag = PyObject_GetAttr(worker, s_abandoned);
        if (flag == NULL)
            goto fail;
        abandoned = PyObject_IsTrue(flag);
        Py_DECREF(flag);
        if (abandoned < 0)
            goto fail;
        if (abandoned)
            break;

        if (take_place(places, &me))
            break; /* the connection is gone */
        ssize_t n;
        int read_errno = 0;
        Py_BEGIN_ALLOW_THREADS
        n = read(fd, buf, (size_t)buffer.len);
        if (n < 0)
            read_errno = errno;
        Py_END_ALLOW_THREADS
        if (n < 0) {
            if (read_errno == EINTR || read_errno == EAGAIN || read_errno == ENOENT) {
                leave_place(places);
                continue;
            }
            end_places(places);
            result = read_errno; /* ENODEV: unmounted or aborted */
            break;
        }
        leave_place(places);
        if (n < (ssize_t)sizeof(struct in_header)) {
            if (n == 0) { /* end of the connection (only a socket peer says so this way) */
                end_places(places);
                result = -1;
                break;
            }
            continue;
        }
        const struct in_header *h = (const struct in_header *)buf;
        size_t length = h->len <= (uint32_t)n && h->len >= sizeof *h ? h->len : (size_t)n;
        uint64_t unique = h->unique;
        uint32_t op = h->opcode;
        PyObject *opcode = PyLong_FromUnsignedLong(op);
        if (opcode == NULL)
            goto fail;
        if (count_opcode(counts, opcode) < 0) {
            Py_DECREF(opcode);
            goto fail;
        }
        PyObject *handler = op < TABLE_SIZE ? table[op] : PyDict_GetItemWithError(handlers, opcode);
        if (handler == NULL) {
            if (PyErr_Occurred()) {
                Py_DECREF(opcode);
                goto fail;
            }
            int silent = PySet_Contains(no_reply_ops, opcode);
            if (silent < 0) {
                Py_DECREF(opcode);
                goto fail;
            }
            if (!silent) {
                int code = write_reply(fd, unique, -ENOSYS, NULL, 0);
                if (code)
                    reply_failed(on_reply_error, code);
            }
            Py_DECREF(opcode);
            continue;
        }
        if (set_int(request, s_unique, unique) < 0 || PyObject_SetAttr(request, s_opcode, opcode) < 0 ||
            set_int(request, s_nodeid, h->nodeid) < 0 || set_int(request, s_uid, h->uid) < 0 ||
            set_int(request, s_gid, h->gid) < 0 || set_int(request, s_pid, h->pid) < 0 ||
            PyObject_SetAttr(request, s_after, Py_None) < 0) {
            Py_DECREF(opcode);
            goto fail;
        }
        PyObject *current = Py_BuildValue("(KOdOI)", (unsigned long long)unique, opcode, monotonic_seconds(),
                                          Py_False, h->pid);
        if (current == NULL || PyObject_SetAttr(worker, s_current, current) < 0) {
            Py_XDECREF(current);
            Py_DECREF(opcode);
            goto fail;
        }
        Py_DECREF(current);
        PyObject *body = PyMemoryView_FromMemory(buf + sizeof *h, (Py_ssize_t)(length - sizeof *h), PyBUF_READ);
        if (body == NULL) {
            Py_DECREF(opcode);
            goto fail;
        }
        PyObject *call_args[2] = {request, body};
        PyObject *reply = PyObject_Vectorcall(handler, call_args, 2, NULL);
        Py_DECREF(body);
        int error = 0;
        if (reply == NULL) {
            if (PyErr_ExceptionMatches(PyExc_OSError)) {
                error = take_oserror();
            } else if (PyErr_ExceptionMatches(PyExc_Exception)) {
                error = EIO; /* a bug must cost one request, not the daemon */
                report_exception(on_exception, opcode);
            } else { /* KeyboardInterrupt, SystemExit: as the Python loop, the worker ends with it */
                PyObject *escaping = take_exception(); /* (kept while current is cleared) */
                PyObject_SetAttr(worker, s_current, Py_None);
                PyErr_Clear();
                PyErr_SetObject((PyObject *)Py_TYPE(escaping), escaping);
                Py_DECREF(escaping);
                Py_DECREF(opcode);
                goto fail;
            }
        }
        if (PyObject_SetAttr(worker, s_current, Py_None) < 0) {
            Py_XDECREF(reply);
            Py_DECREF(opcode);
            goto fail;
        }
        flag = PyObject_GetAttr(worker, s_abandoned);
        abandoned = flag == NULL ? -1 : PyObject_IsTrue(flag);
        Py_XDECREF(flag);
        if (abandoned < 0) {
            Py_XDECREF(reply);
            Py_DECREF(opcode);
            goto fail;
        }
        if (!abandoned) { /* (abandoned: the watchdog answered this request already) */
            if (error) {
                int code = write_reply(fd, unique, -error, NULL, 0);
                if (code)
                    reply_failed(on_reply_error, code);
            } else if (PyBytes_CheckExact(reply)) { /* the common answer, one payload */
                Py_buffer part = {.buf = PyBytes_AS_STRING(reply), .len = PyBytes_GET_SIZE(reply)};
                int code = write_reply(fd, unique, 0, &part, 1);
                if (code)
                    reply_failed(on_reply_error, code);
            } else if (send_answer(fd, unique, reply, no_reply, on_reply_error) < 0) {
                report_exception(on_exception, opcode);
                int code = write_reply(fd, unique, -EIO, NULL, 0);
                if (code)
                    reply_failed(on_reply_error, code);
            }
        }
        Py_XDECREF(reply);
        PyObject *after = PyObject_GetAttr(request, s_after);
        if (after == NULL) {
            Py_DECREF(opcode);
            goto fail;
        }
        if (after != Py_None) {
            PyObject *done = PyObject_CallNoArgs(after);
            if (done == NULL)
                report_exception(on_exception, opcode);
            Py_XDECREF(done);
        }
        Py_DECREF(after);
        Py_DECREF(opcode);
        if (abandoned)
            break;
    }
    sem_destroy(&me.wake); /* (not parked: nobody posts to it any more) */
    Py_DECREF(counts);
    PyBuffer_Release(&buffer);
    return PyLong_FromLong(result);

fail:
    sem_destroy(&me.wake);
    Py_DECREF(counts);
    PyBuffer_Release(&buffer);
    return NULL;
}

static PyMethodDef methods[] = {
    {"serve", (PyCFunction)(void (*)(void))serve, METH_FASTCALL, serve_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    "_loop",
    "The native request loop of a FUSE worker (see fastfs.daemon.kernel.session).",
    -1,
    methods,
    NULL,
    NULL,
    NULL,
    NULL,
};

PyMODINIT_FUNC PyInit__loop(void)
{
    struct {
        PyObject **slot;
        const char *name;
    } names[] = {
        {&s_unique, "unique"}, {&s_opcode, "opcode"},   {&s_nodeid, "nodeid"}, {&s_uid, "uid"},
        {&s_gid, "gid"},       {&s_pid, "pid"},         {&s_after, "after"},   {&s_current, "current"},
        {&s_abandoned, "abandoned"}, {&s_counts, "counts"}, {&s_errno, "errno"},
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        *names[i].slot = PyUnicode_InternFromString(names[i].name);
        if (*names[i].slot == NULL)
            return NULL;
    }
    if (PyType_Ready(&ReadersType) < 0)
        return NULL;
    PyObject *module = PyModule_Create(&module_def);
    if (module == NULL)
        return NULL;
    Py_INCREF(&ReadersType);
    if (PyModule_AddObject(module, "Readers", (PyObject *)&ReadersType) < 0) {
        Py_DECREF(&ReadersType);
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
