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
 * A worker takes the GIL once per request: a parked worker woken to take a reader's place goes into the
 * device read without it, and a short answer (at most REPLY_COPY_MAX bytes, None or an error) with no
 * request.after is copied, written without the GIL, and the worker reads its next request before it
 * takes the GIL again (ANSWER_NOGIL). Each time it took it back only to let go of it again, it waited
 * for the handler of the request that had come meanwhile. Measured on a 2-core VM (tmpfs source, first
 * pass over 10,000 files of 3 KiB, medians of 5 runs alternated with the loop before): the daemon's
 * futex calls 32,972 against 50,377 and its context switches 58,607 against 65,652 on the served route
 * (4 requests a file), 21,412 against 35,380 and 42,070 against 47,366 on the default route (3).
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
 * No policy lives here: no opcode is answered without its Python handler, with one exception the
 * engine grants per handle, the direct reads below; a RELEASE may be answered before its handler
 * runs (late releases, Later, below), but its handler still runs. An opcode with no handler is
 * answered ENOSYS, as the Python loop answers it, but without taking the GIL (bare_answer: Python's
 * open() sends an IOCTL for every file); those requests are counted in Readers.answered.
 *
 * Spinning (Readers spin_us, fuse.spin_us). While requests come one at a time (no other worker serving
 * one) and close together, and after a request it answered quickly (SPIN_QUICK_NS), the worker
 * reading the device keeps reading its own descriptor non-blocking for up to spin_us before it falls
 * back to the blocking read (read_request). A worker
 * asleep in the device read is woken by the kernel, on a VM the wake-up of an idle CPU, and that was on
 * the path of every request of a reader waiting for each answer. Measured on a 2-core VM, tmpfs
 * source, one reader opening and reading 10,000 files of 3 KiB with Python's open(): 161-178 us a file
 * with 30 us against 202-219 without; over loopback sshfs the 16-thread and DataLoader rows did not
 * get slower (busy workers: no spin).
 *
 * Direct reads (Direct). A READ of a handle the engine has handed over (Direct.add: its own
 * descriptor, the version's size, the windows where a read would join one of the file's streams) is
 * answered here by pread into a buffer of the loop's, without calling the handler: the engine
 * decided (fastfs.fsio.readpath, direct_offer) that reads of this handle go exactly to the source
 * anyway and no stream of the file prefetches. The handler's work per such read is what the engine
 * would only count, so the loop counts it (a tally per handle: reads, bytes, pread latencies by the
 * engine's buckets, request sizes) and keeps the last DIRECT_RING reads it served, for the engine to
 * take later and feed to its policy as if it had seen them (Direct.take, before the handler serves
 * the next read of the handle). Any read the loop does not serve (one inside a window or next to
 * a read it served, where a stream may be starting; one too large; one that reaches past the version's
 * size as handed over, so the engine answers at the end of a file that may have grown; a pread error) makes the handle inactive: the handler serves it and every later one until the engine
 * hands the handle over again. The request is published in worker.current as any other, so the
 * watchdog bounds a pread that hangs; the adapter then takes the handle back (Direct.abandon), and
 * the engine counts the reads of it running here as stuck reads of the file (its later reads fail
 * fast) until each returns (on_unstuck(fh), called by the worker whose pread returned).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdint.h>
#include <string.h>
#include <sys/uio.h>
#include <stdlib.h>
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
/* Answers up to this size are copied and written without the GIL (ANSWER_NOGIL): every metadata
 * answer (an entry is 144 bytes, attributes 120, an open 32) and a page of a listing. */
#define REPLY_COPY_MAX 4096
/* In the request loop, holding the GIL and no Python object: write the answer without the GIL and go on
 * to the next request without taking it back (`released`; a failed write takes it to report). */
#define ANSWER_NOGIL(error_, parts_, nparts_)                                                        \
    {                                                                                                \
        released = PyEval_SaveThread();                                                              \
        int code_ = write_reply_nogil(fd, unique, (error_), (parts_), (nparts_));                    \
        if (code_) {                                                                                 \
            PyEval_RestoreThread(released);                                                          \
            released = NULL;                                                                         \
            reply_failed(on_reply_error, code_);                                                     \
        }                                                                                            \
        continue;                                                                                    \
    }

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
    int busy; /* the worker is counted in Readers.busy: it got a request and has not come back to read */
};

typedef struct {
    PyObject_HEAD
    pthread_mutex_t lock;
    int spare;               /* readers at most (immutable) */
    int readers;             /* workers in, or entering, the device read (lock) */
    int ending;              /* the connection is gone: parked workers leave, none reads again (lock) */
    struct parked *parked;   /* the parked workers, the one parked last first (lock) */
    unsigned long long bare[TABLE_SIZE]; /* requests answered ENOSYS without the GIL, by opcode (lock) */
    int busy;                /* workers between a request read and their next read (lock; read racily) */
    uint64_t spin_ns;        /* how long a reader polls before it sleeps, 0: never (immutable) */
    int spinner;             /* a reader is polling (atomic) */
    uint64_t last_request;   /* monotonic ns of the last request read (atomic, relaxed) */
    unsigned long long spun; /* requests a spinning reader read (atomic, relaxed) */
    unsigned long long forgets; /* FORGET and BATCH_FORGET requests read, counted before the GIL (atomic) */
} Readers;

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Requests came this close together for a reader to poll for the next one. */
#define SPIN_DENSE_NS 1000000u
/* A worker spins only after a request it answered this quickly: one that waited on the source longer
 * (a random read over sshfs, 200 us) gains little from a quicker wake-up, and the spin took CPU the
 * source's own client needed (2,000 random 4 KiB reads over loopback sshfs: 0.83-0.86x direct with a
 * spin after every request, 0.88-0.92x without). */
#define SPIN_QUICK_NS 100000u

/* One device read, without the GIL. With spin_ns, while requests come close together, one reader at
 * a time (the spinner) reads its descriptor non-blocking for up to spin_ns before it falls back to a
 * blocking read: a reader asleep in the device read is woken by the kernel, on a VM a wake-up of an
 * idle CPU, on the latency path of every request. *nonblock* tracks the O_NONBLOCK flag of this
 * worker's own descriptor (a clone of the connection's), switched only when the worker becomes or
 * stops being the spinner; the other readers wait in the blocking read, where the kernel wakes one. */
static ssize_t read_request(Readers *r, int fd, char *buf, size_t len, int *nonblock, int may_spin,
                            uint64_t *got_at)
{
    if (may_spin) {
        uint64_t now = now_ns();
        int idle = 0;
        /* only while requests come one at a time (no other worker is serving one) and close together:
         * a parallel load keeps the CPUs busy with its own requests, and a poll would take CPU from them;
         * and only after a request this worker answered quickly (*got_at: when it came; SPIN_QUICK_NS) */
        if (__atomic_load_n(&r->busy, __ATOMIC_RELAXED) == 0 && now - *got_at < SPIN_QUICK_NS &&
            now - __atomic_load_n(&r->last_request, __ATOMIC_RELAXED) < SPIN_DENSE_NS &&
            __atomic_compare_exchange_n(&r->spinner, &idle, 1, 0, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED)) {
            if (!*nonblock && fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK) == 0)
                *nonblock = 1;
            uint64_t deadline = now + r->spin_ns;
            ssize_t n = -1;
            int err = EAGAIN;
            while (*nonblock) {
                n = read(fd, buf, len);
                err = errno;
                if (n >= 0 || err != EAGAIN || now_ns() >= deadline)
                    break;
            }
            __atomic_store_n(&r->spinner, 0, __ATOMIC_RELEASE);
            if (n >= 0 || err != EAGAIN) {
                if (n >= 0) {
                    *got_at = now_ns();
                    __atomic_store_n(&r->last_request, *got_at, __ATOMIC_RELAXED);
                    __atomic_add_fetch(&r->spun, 1, __ATOMIC_RELAXED);
                }
                errno = err;
                return n;
            }
        }
        if (*nonblock && fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK) == 0)
            *nonblock = 0;
    }
    ssize_t n = read(fd, buf, len);
    if (n >= 0 && may_spin) {
        *got_at = now_ns();
        __atomic_store_n(&r->last_request, *got_at, __ATOMIC_RELAXED);
    }
    return n;
}

/* The worker came back to read (or leaves its loop): no longer counted in Readers.busy (lock held). */
static void not_busy(Readers *r, struct parked *me)
{
    if (me->busy) {
        r->busy--;
        me->busy = 0;
    }
}

/* Wait for a reader's place: 0 when taken, 1 when the connection is gone. *me* is the calling
 * worker's own parking place (made once per loop, so no semaphore is destroyed while a late post
 * may still touch it). */
static int take_place(Readers *r, struct parked *me)
{
    /* Called without the GIL: a parked worker woken to read goes straight into the device read, and
     * takes the GIL only once a request came (waking to take it here made it wait for the handler of
     * the request that woke it, the GIL passed back and forth twice per request). */
    pthread_mutex_lock(&r->lock);
    not_busy(r, me);
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
    while (sem_wait(&me->wake) < 0 && errno == EINTR)
        ;
    pthread_mutex_lock(&r->lock); /* (whoever woke us unlinked us first) */
    int ending = r->ending;
    pthread_mutex_unlock(&r->lock);
    return ending;
}

/* The calling worker got a request: when it was the last reader, the worker parked last takes a
 * reader's place (counted for it here) and is woken. *bare*: the request's opcode when the loop
 * answers it ENOSYS without the GIL (counted here, in the same locked step), else -1. */
static void leave_place(Readers *r, struct parked *me, int bare)
{
    struct parked *woken = NULL;
    pthread_mutex_lock(&r->lock);
    if (bare >= 0)
        r->bare[bare]++;
    r->busy++;
    me->busy = 1;
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

/* A worker leaving its loop is no longer counted busy (an abandoned one left its request to others). */
static void leave_busy(Readers *r, struct parked *me)
{
    pthread_mutex_lock(&r->lock);
    not_busy(r, me);
    pthread_mutex_unlock(&r->lock);
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
    int spare, spin_us = 0;
    static char *kwlist[] = {"spare", "spin_us", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "i|i", kwlist, &spare, &spin_us))
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
    memset(self->bare, 0, sizeof self->bare);
    self->spin_ns = spin_us > 0 ? (uint64_t)spin_us * 1000u : 0;
    self->spinner = 0;
    self->last_request = 0;
    self->busy = 0;
    self->spun = 0;
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

static PyObject *Readers_answered(Readers *self, PyObject *unused)
{
    unsigned long long bare[TABLE_SIZE];
    pthread_mutex_lock(&self->lock);
    memcpy(bare, self->bare, sizeof bare);
    pthread_mutex_unlock(&self->lock);
    PyObject *result = PyDict_New();
    for (int op = 0; result != NULL && op < TABLE_SIZE; op++) {
        if (!bare[op])
            continue;
        PyObject *key = PyLong_FromLong(op), *value = PyLong_FromUnsignedLongLong(bare[op]);
        if (key == NULL || value == NULL || PyDict_SetItem(result, key, value) < 0)
            Py_CLEAR(result);
        Py_XDECREF(key);
        Py_XDECREF(value);
    }
    return result;
}

static PyObject *Readers_spun(Readers *self, PyObject *unused)
{
    return PyLong_FromUnsignedLongLong(__atomic_load_n(&self->spun, __ATOMIC_RELAXED));
}

/* FORGET and BATCH_FORGET requests read so far. Counted by the reading thread right after its read,
 * before it takes the GIL for the handler: a request the kernel queued after a FORGET (an OPEN of a
 * node whose inode the FORGET's eviction took, pages and all) finds the FORGET counted here even when
 * its handler runs first on another thread, so the adapter can tell one is still being handled. */
static PyObject *Readers_forgets(Readers *self, PyObject *unused)
{
    return PyLong_FromUnsignedLongLong(__atomic_load_n(&self->forgets, __ATOMIC_SEQ_CST));
}

static PyMethodDef Readers_methods[] = {
    {"forgets", (PyCFunction)Readers_forgets, METH_NOARGS, "FORGET and BATCH_FORGET requests read so far."},
    {"end", (PyCFunction)Readers_end, METH_NOARGS, "The connection is gone: no worker reads again, the parked leave."},
    {"counts", (PyCFunction)Readers_counts, METH_NOARGS, "(readers, parked, ending): for tests."},
    {"spun", (PyCFunction)Readers_spun, METH_NOARGS, "Requests read by a spinning reader (spin_us)."},
    {"answered", (PyCFunction)Readers_answered, METH_NOARGS,
     "{opcode: requests}: the requests of no handler the loops answered ENOSYS without the GIL."},
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


/* -- late releases (Later) ------------------------------------------------------------------------
 *
 * The kernel sends RELEASE after close() has returned and never waits for its reply, yet a worker
 * serving it holds the GIL while the reader's next OPEN arrives: the OPEN's worker then waits for the
 * GIL, a futex wake and a context switch on the latency path. With a Later, the loop answers a
 * RELEASE at once and keeps the request (header and body, LATER_RECORD bytes at most); a Python
 * thread of the session runs the RELEASE handler on them later, in batches (Later.wait, Later.take).
 * The handler still sees every RELEASE, only later: no policy lives here. A full queue (`cap`
 * records) or a closed one takes no more: the loop then calls the handler as before. `lock` is never
 * held across I/O or a Python call. */
#define OP_RELEASE 18
/* FUSE_FORGET and FUSE_BATCH_FORGET (counted as they are read: Readers_forgets). */
#define OP_FORGET 2
#define OP_BATCH_FORGET 42
/* Bytes of one kept request: the header (40) and struct fuse_release_in (24). */
#define LATER_RECORD 64

typedef struct {
    PyObject_HEAD
    pthread_mutex_t lock;
    pthread_cond_t cond;     /* signalled when a record comes or the queue closes */
    char *records;           /* count records of LATER_RECORD bytes (lock) */
    Py_ssize_t count;        /* (lock) */
    Py_ssize_t cap;          /* records at most (immutable) */
    int closed;              /* no record is taken any more (lock) */
} Later;

/* Keep the request *req* (*length* bytes): 1, or 0 when the queue is full, closed or it does not fit. */
static int later_push(Later *l, const char *req, size_t length)
{
    if (length > LATER_RECORD)
        return 0;
    pthread_mutex_lock(&l->lock);
    if (l->closed || l->count >= l->cap) {
        pthread_mutex_unlock(&l->lock);
        return 0;
    }
    char *record = l->records + l->count * LATER_RECORD;
    memcpy(record, req, length);
    memset(record + length, 0, LATER_RECORD - length);
    if (l->count++ == 0)
        pthread_cond_signal(&l->cond);
    pthread_mutex_unlock(&l->lock);
    return 1;
}

static PyObject *Later_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    Py_ssize_t cap;
    static char *kwlist[] = {"cap", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "n", kwlist, &cap))
        return NULL;
    if (cap < 1 || cap > PY_SSIZE_T_MAX / LATER_RECORD) {
        PyErr_SetString(PyExc_ValueError, "cap out of range");
        return NULL;
    }
    char *records = malloc((size_t)cap * LATER_RECORD);
    if (records == NULL)
        return PyErr_NoMemory();
    Later *self = (Later *)type->tp_alloc(type, 0);
    if (self == NULL) {
        free(records);
        return NULL;
    }
    pthread_mutex_init(&self->lock, NULL);
    pthread_cond_init(&self->cond, NULL);
    self->records = records;
    self->count = 0;
    self->cap = cap;
    self->closed = 0;
    return (PyObject *)self;
}

static void Later_dealloc(Later *self)
{
    pthread_cond_destroy(&self->cond);
    pthread_mutex_destroy(&self->lock);
    free(self->records);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* wait(timeout): block (without the GIL) until a record is kept or the queue closes, at most
 * *timeout* seconds (None: no bound). True when records wait; False when none does (closed, or the
 * time ran out). */
static PyObject *Later_wait(Later *self, PyObject *arg)
{
    double timeout = -1.0;
    if (arg != Py_None) {
        timeout = PyFloat_AsDouble(arg);
        if (timeout == -1.0 && PyErr_Occurred())
            return NULL;
        if (timeout < 0)
            timeout = 0;
    }
    struct timespec deadline;
    if (timeout >= 0) {
        clock_gettime(CLOCK_REALTIME, &deadline);
        double whole = (double)(time_t)timeout;
        deadline.tv_sec += (time_t)timeout;
        deadline.tv_nsec += (long)((timeout - whole) * 1e9);
        if (deadline.tv_nsec >= 1000000000L) {
            deadline.tv_sec++;
            deadline.tv_nsec -= 1000000000L;
        }
    }
    Py_ssize_t count;
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&self->lock);
    while (self->count == 0 && !self->closed) {
        if (timeout < 0)
            pthread_cond_wait(&self->cond, &self->lock);
        else if (pthread_cond_timedwait(&self->cond, &self->lock, &deadline) == ETIMEDOUT)
            break;
    }
    count = self->count;
    pthread_mutex_unlock(&self->lock);
    Py_END_ALLOW_THREADS
    return PyBool_FromLong(count > 0);
}

/* take(): the kept requests, oldest first, as bytes (the queue is empty after). */
static PyObject *Later_take(Later *self, PyObject *unused)
{
    pthread_mutex_lock(&self->lock);
    Py_ssize_t count = self->count;
    char *copy = count ? malloc((size_t)count * LATER_RECORD) : NULL;
    if (copy != NULL) {
        memcpy(copy, self->records, (size_t)count * LATER_RECORD);
        self->count = 0;
    }
    pthread_mutex_unlock(&self->lock);
    if (count && copy == NULL)
        return PyErr_NoMemory(); /* (the records stay: a later take gets them) */
    PyObject *list = PyList_New(count);
    for (Py_ssize_t i = 0; list != NULL && i < count; i++) {
        const char *record = copy + i * LATER_RECORD;
        uint32_t length;
        memcpy(&length, record, sizeof length); /* in_header.len */
        PyObject *item = PyBytes_FromStringAndSize(record, length <= LATER_RECORD ? length : LATER_RECORD);
        if (item == NULL)
            Py_CLEAR(list);
        else
            PyList_SET_ITEM(list, i, item);
    }
    free(copy);
    return list;
}

/* close(): take no more records and wake the waiters (the kept ones stay for take). */
static PyObject *Later_close(Later *self, PyObject *unused)
{
    pthread_mutex_lock(&self->lock);
    self->closed = 1;
    pthread_cond_broadcast(&self->cond);
    pthread_mutex_unlock(&self->lock);
    Py_RETURN_NONE;
}

static PyObject *Later_keep(Later *self, PyObject *arg)
{
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    int kept = later_push(self, view.buf, (size_t)view.len);
    PyBuffer_Release(&view);
    return PyBool_FromLong(kept);
}

static Py_ssize_t Later_len(Later *self)
{
    pthread_mutex_lock(&self->lock);
    Py_ssize_t count = self->count;
    pthread_mutex_unlock(&self->lock);
    return count;
}

static PyMethodDef Later_methods[] = {
    {"wait", (PyCFunction)Later_wait, METH_O, "wait(timeout): True when kept requests wait (None: no bound)."},
    {"take", (PyCFunction)Later_take, METH_NOARGS, "take(): the kept requests (bytes), oldest first."},
    {"close", (PyCFunction)Later_close, METH_NOARGS, "close(): keep no more requests; wake the waiters."},
    {"keep", (PyCFunction)Later_keep, METH_O, "keep(request): keep it as the loop does (for tests); True if kept."},
    {NULL, NULL, 0, NULL},
};

static PySequenceMethods Later_as_sequence = {.sq_length = (lenfunc)Later_len};

static PyTypeObject LaterType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "fastfs.daemon.kernel._loop.Later",
    .tp_doc = PyDoc_STR("Later(cap): RELEASE requests answered by the loop, for their handler to run later."),
    .tp_basicsize = sizeof(Later),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = Later_new,
    .tp_dealloc = (destructor)Later_dealloc,
    .tp_methods = Later_methods,
    .tp_as_sequence = &Later_as_sequence,
};

/* -- direct reads (see the comment at the top) ----------------------------------------------------
 *
 * Entries live in a chained hash table under `lock`, which is never held across a pread, a dup or
 * a close. An entry removed while a worker preads with it (in_use) is unlinked and marked dead;
 * that worker closes its descriptor and frees it. */

/* Reads kept per handle for the engine's policy: as many as a file's streams (policy.MAX_STREAMS),
 * so replaying them rebuilds the streams a policy seeing every read would hold. */
#define DIRECT_RING 8
/* Windows per handle: one per stream of the file (policy.MAX_STREAMS). */
#define DIRECT_WINDOWS 8
/* Latency bounds at most (the engine's stats.LATENCY_BUCKETS has 14). */
#define DIRECT_BOUNDS 32
/* Request sizes are tallied by (size - 1).bit_length(), as the engine's stats slot them. */
#define SIZE_BITS 33
#define DIRECT_BUCKETS 1024
/* struct fuse_read_in: fh, offset, size (then read_flags, lock_owner, flags, padding) */
#define READ_IN_SIZE 40
#define OP_READ 15

struct direct_entry {
    struct direct_entry *next;
    uint64_t fh;
    int fd;                 /* a dup of the engine's descriptor, this entry's own */
    int active;             /* reads may be served here (lock) */
    int in_use;             /* preads running with fd (lock) */
    int dead;               /* removed while in use: the last user closes and frees (lock) */
    int stuck;              /* of in_use, reads the engine counts as stuck (Direct.abandon), (lock) */
    uint64_t size;          /* the version's size when handed over: reads reaching past it go to the handler */
    int nwindows;
    uint64_t lo[DIRECT_WINDOWS], hi[DIRECT_WINDOWS];
    /* served since the last take (lock) */
    uint64_t reads, bytes, lat_ns;
    uint64_t lat_counts[DIRECT_BOUNDS + 1];
    uint64_t size_counts[SIZE_BITS];
    int ring_n, ring_next;
    uint64_t ring_off[DIRECT_RING];
    uint32_t ring_len[DIRECT_RING];
};

typedef struct {
    PyObject_HEAD
    pthread_mutex_t lock;
    uint32_t max_read;      /* reads of this size or more go to the handler (immutable) */
    uint64_t reorder, page, max_slack; /* the policy's slack: min(max_slack, reorder * max(size, page)) */
    int nbounds;
    uint64_t bounds_ns[DIRECT_BOUNDS];
    PyObject *on_unstuck;   /* on_unstuck(fh): a read counted stuck returned (immutable; may be None) */
    long entries;           /* (lock) */
    struct direct_entry *buckets[DIRECT_BUCKETS];
} Direct;

static struct direct_entry **direct_slot(Direct *d, uint64_t fh)
{
    struct direct_entry **p = &d->buckets[fh % DIRECT_BUCKETS];
    while (*p != NULL && (*p)->fh != fh)
        p = &(*p)->next;
    return p;
}

static uint64_t direct_slack(Direct *d, uint64_t size)
{
    uint64_t s = d->reorder * (size > d->page ? size : d->page);
    return s > d->max_slack ? d->max_slack : s;
}

/* Would a read at *off* join a stream: inside a window the engine gave, or next to a read served here
 * since (the policy's own test, StreamPolicy._match)? */
static int direct_near(Direct *d, struct direct_entry *e, uint64_t off)
{
    for (int i = 0; i < e->nwindows; i++)
        if (off >= e->lo[i] && off <= e->hi[i])
            return 1;
    for (int i = 0; i < e->ring_n; i++) {
        uint64_t end = e->ring_off[i] + e->ring_len[i];
        uint64_t dist = off > end ? off - end : end - off;
        if (dist <= direct_slack(d, e->ring_len[i]))
            return 1;
    }
    return 0;
}

static void direct_free(struct direct_entry *e)
{
    if (e->fd >= 0)
        close(e->fd);
    free(e);
}

/* direct_free from a method called with the GIL: the close is I/O (on a FUSE source every close of a
 * file is a FLUSH round trip to its daemon; a network file's last close may wait on its server), and
 * holding the GIL across it stalled every other handler of the mount meanwhile. */
static void direct_free_unlocked(struct direct_entry *e)
{
    Py_BEGIN_ALLOW_THREADS
    direct_free(e);
    Py_END_ALLOW_THREADS
}

/* Serve one READ without the GIL: the bytes read into *buf* (*n*), 1; or 0 when the handler must
 * serve it (the handle is inactive from then on, if it is handed over at all). *unstuck* is set when
 * the read was one the engine counted stuck: the caller tells on_unstuck (with the GIL). */
static int direct_read(Direct *d, uint64_t fh, uint64_t off, uint32_t size, char *buf, size_t *n, int *unstuck)
{
    *unstuck = 0;
    pthread_mutex_lock(&d->lock);
    struct direct_entry *e = *direct_slot(d, fh);
    if (e == NULL || !e->active) {
        pthread_mutex_unlock(&d->lock);
        return 0;
    }
    if (size >= d->max_read || size == 0 || off + size > e->size || direct_near(d, e, off)) {
        e->active = 0;
        pthread_mutex_unlock(&d->lock);
        return 0;
    }
    e->in_use++;
    int fd = e->fd;
    pthread_mutex_unlock(&d->lock);

    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    size_t total = 0;
    int failed = 0;
    while (total < size) {
        ssize_t r = pread(fd, buf + total, size - total, (off_t)(off + total));
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            failed = 1;
            break;
        }
        if (r == 0)
            break; /* the end of the file moved (as the handler's loop: a short answer) */
        total += (size_t)r;
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    uint64_t ns = (uint64_t)(t1.tv_sec - t0.tv_sec) * 1000000000u + (uint64_t)t1.tv_nsec - (uint64_t)t0.tv_nsec;

    pthread_mutex_lock(&d->lock);
    e->in_use--;
    if (e->stuck > 0) {
        e->stuck--;
        *unstuck = 1;
    }
    int gone = e->dead && e->in_use == 0;
    if (failed) {
        e->active = 0; /* the handler reads it again and reports the error */
    } else if (!e->dead) {
        e->reads++;
        e->bytes += total;
        e->lat_ns += ns;
        int b = 0;
        while (b < d->nbounds && d->bounds_ns[b] < ns)
            b++;
        e->lat_counts[b]++;
        int bits = 0;
        for (uint64_t v = total > 0 ? total - 1 : 0; v; v >>= 1)
            bits++;
        e->size_counts[bits < SIZE_BITS ? bits : SIZE_BITS - 1]++;
        e->ring_off[e->ring_next] = off;
        e->ring_len[e->ring_next] = size;
        e->ring_next = (e->ring_next + 1) % DIRECT_RING;
        if (e->ring_n < DIRECT_RING)
            e->ring_n++;
    }
    pthread_mutex_unlock(&d->lock);
    if (gone)
        direct_free(e);
    *n = total;
    return !failed;
}

/* *obj* as a fast sequence of at most *max* items (a new reference), or NULL with an exception set. */
static PyObject *bounded_sequence(PyObject *obj, Py_ssize_t max, const char *what)
{
    PyObject *seq = PySequence_Fast(obj, what);
    if (seq != NULL && PySequence_Fast_GET_SIZE(seq) > max) {
        Py_DECREF(seq);
        PyErr_Format(PyExc_ValueError, "%s: at most %zd items", what, max);
        return NULL;
    }
    return seq;
}

static PyObject *Direct_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    unsigned int max_read;
    unsigned long long reorder, page, max_slack;
    PyObject *bounds;
    PyObject *on_unstuck = Py_None;
    static char *kwlist[] = {"max_read", "reorder", "page", "max_slack", "latency_bounds", "on_unstuck", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "IKKKO|O", kwlist, &max_read, &reorder, &page, &max_slack, &bounds,
                                     &on_unstuck))
        return NULL;
    PyObject *seq = bounded_sequence(bounds, DIRECT_BOUNDS, "latency_bounds must be a sequence");
    if (seq == NULL)
        return NULL;
    Py_ssize_t nb = PySequence_Fast_GET_SIZE(seq);
    Direct *self = (Direct *)type->tp_alloc(type, 0); /* (zeroed: no entries) */
    if (self == NULL) {
        Py_DECREF(seq);
        return NULL;
    }
    pthread_mutex_init(&self->lock, NULL); /* (first: the dealloc of a failed construction destroys it) */
    Py_INCREF(on_unstuck);
    self->on_unstuck = on_unstuck;
    for (Py_ssize_t i = 0; i < nb; i++) {
        double s = PyFloat_AsDouble(PySequence_Fast_GET_ITEM(seq, i));
        if (s == -1.0 && PyErr_Occurred()) {
            Py_DECREF(seq);
            Py_DECREF(self);
            return NULL;
        }
        self->bounds_ns[i] = (uint64_t)(s * 1e9);
    }
    Py_DECREF(seq);
    self->nbounds = (int)nb;
    self->max_read = max_read;
    self->reorder = reorder;
    self->page = page;
    self->max_slack = max_slack;
    return (PyObject *)self;
}

static void Direct_dealloc(Direct *self)
{
    for (int i = 0; i < DIRECT_BUCKETS; i++) {
        struct direct_entry *e = self->buckets[i];
        while (e != NULL) {
            struct direct_entry *next = e->next;
            direct_free_unlocked(e); /* (no loop runs with this table any more: it holds a reference) */
            e = next;
        }
    }
    pthread_mutex_destroy(&self->lock);
    Py_XDECREF(self->on_unstuck);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* A read the engine counted stuck returned: tell it (GIL held). */
static void direct_unstuck(Direct *d, uint64_t fh)
{
    if (d->on_unstuck == Py_None)
        return;
    PyObject *arg = PyLong_FromUnsignedLongLong(fh);
    if (arg == NULL) {
        PyErr_WriteUnraisable(d->on_unstuck);
        return;
    }
    PyObject *result = PyObject_CallOneArg(d->on_unstuck, arg);
    if (result == NULL)
        PyErr_WriteUnraisable(d->on_unstuck);
    Py_XDECREF(result);
    Py_DECREF(arg);
}

/* What a handle served since the last take: reads, bytes, nanoseconds of pread, latency and size
 * counts, and (for a take) its ring, oldest first. */
struct tally_buf {
    uint64_t reads, bytes, lat_ns, lat[DIRECT_BOUNDS + 1], sizes[SIZE_BITS], roff[DIRECT_RING];
    uint32_t rlen[DIRECT_RING];
    int rn;
};

/* Move *e*'s tally (and its ring when *ring*) into *t* (lock held; nothing but C here). */
static void tally_take(struct direct_entry *e, int ring, struct tally_buf *t)
{
    t->reads = e->reads;
    t->bytes = e->bytes;
    t->lat_ns = e->lat_ns;
    memcpy(t->lat, e->lat_counts, sizeof e->lat_counts);
    memcpy(t->sizes, e->size_counts, sizeof e->size_counts);
    e->reads = e->bytes = e->lat_ns = 0;
    memset(e->lat_counts, 0, sizeof e->lat_counts);
    memset(e->size_counts, 0, sizeof e->size_counts);
    t->rn = 0;
    if (ring) {
        int n = e->ring_n, first = (e->ring_next - n + DIRECT_RING) % DIRECT_RING;
        for (int i = 0; i < n; i++) {
            t->roff[i] = e->ring_off[(first + i) % DIRECT_RING];
            t->rlen[i] = e->ring_len[(first + i) % DIRECT_RING];
        }
        t->rn = n;
        e->ring_n = e->ring_next = 0;
    }
}

/* (reads, bytes, seconds, latency counts, {size bits: count}, ((offset, length), ...)) */
static PyObject *tally_tuple(Direct *d, const struct tally_buf *t)
{
    PyObject *lats = PyTuple_New(d->nbounds + 1);
    PyObject *szs = PyDict_New();
    PyObject *ring = PyTuple_New(t->rn);
    if (lats == NULL || szs == NULL || ring == NULL)
        goto fail;
    for (int i = 0; i <= d->nbounds; i++) {
        PyObject *v = PyLong_FromUnsignedLongLong(t->lat[i]);
        if (v == NULL)
            goto fail;
        PyTuple_SET_ITEM(lats, i, v);
    }
    for (int i = 0; i < SIZE_BITS; i++) {
        if (!t->sizes[i])
            continue;
        PyObject *k = PyLong_FromLong(i), *v = PyLong_FromUnsignedLongLong(t->sizes[i]);
        int r = k == NULL || v == NULL ? -1 : PyDict_SetItem(szs, k, v);
        Py_XDECREF(k);
        Py_XDECREF(v);
        if (r < 0)
            goto fail;
    }
    for (int i = 0; i < t->rn; i++) {
        PyObject *pair = Py_BuildValue("(KI)", (unsigned long long)t->roff[i], (unsigned int)t->rlen[i]);
        if (pair == NULL)
            goto fail;
        PyTuple_SET_ITEM(ring, i, pair);
    }
    return Py_BuildValue("(KKdNNN)", (unsigned long long)t->reads, (unsigned long long)t->bytes,
                         (double)t->lat_ns * 1e-9, lats, szs, ring);
fail:
    Py_XDECREF(lats);
    Py_XDECREF(szs);
    Py_XDECREF(ring);
    return NULL;
}

static PyObject *Direct_add(Direct *self, PyObject *args)
{
    unsigned long long fh, size;
    int fd;
    PyObject *windows;
    if (!PyArg_ParseTuple(args, "KiKO", &fh, &fd, &size, &windows))
        return NULL;
    PyObject *seq = bounded_sequence(windows, DIRECT_WINDOWS, "windows must be a sequence of (low, high)");
    if (seq == NULL)
        return NULL;
    Py_ssize_t nw = PySequence_Fast_GET_SIZE(seq);
    uint64_t lo[DIRECT_WINDOWS], hi[DIRECT_WINDOWS];
    for (Py_ssize_t i = 0; i < nw; i++) {
        unsigned long long l, h;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, i), "KK", &l, &h)) {
            Py_DECREF(seq);
            return NULL;
        }
        lo[i] = l;
        hi[i] = h;
    }
    Py_DECREF(seq);
    pthread_mutex_lock(&self->lock);
    struct direct_entry *e = *direct_slot(self, fh);
    if (e != NULL) { /* handed over again: new windows (the same version's descriptor) */
        e->nwindows = (int)nw;
        memcpy(e->lo, lo, sizeof lo[0] * (size_t)nw);
        memcpy(e->hi, hi, sizeof hi[0] * (size_t)nw);
        e->active = 1;
        pthread_mutex_unlock(&self->lock);
        Py_RETURN_NONE;
    }
    pthread_mutex_unlock(&self->lock);
    struct direct_entry *fresh = calloc(1, sizeof *fresh);
    if (fresh == NULL)
        return PyErr_NoMemory();
    fresh->fd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (fresh->fd < 0) {
        free(fresh);
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    fresh->fh = fh;
    fresh->size = size;
    fresh->nwindows = (int)nw;
    memcpy(fresh->lo, lo, sizeof lo[0] * (size_t)nw);
    memcpy(fresh->hi, hi, sizeof hi[0] * (size_t)nw);
    fresh->active = 1;
    pthread_mutex_lock(&self->lock);
    struct direct_entry **slot = direct_slot(self, fh);
    if (*slot != NULL) { /* another thread added it meanwhile */
        pthread_mutex_unlock(&self->lock);
        direct_free_unlocked(fresh);
        Py_RETURN_NONE;
    }
    *slot = fresh;
    self->entries++;
    pthread_mutex_unlock(&self->lock);
    Py_RETURN_NONE;
}

/* take(fh) / remove(fh): the handle's tally and ring since the last take (None when it has none).
 * abandon(fh): remove(fh), and count the handle's reads running now as stuck; (count, tally). */
static PyObject *direct_take_common(Direct *self, PyObject *arg, int remove, int abandon)
{
    unsigned long long fh = PyLong_AsUnsignedLongLong(arg);
    if (fh == (unsigned long long)-1 && PyErr_Occurred())
        return NULL;
    struct tally_buf t;
    struct direct_entry *freed = NULL;
    int stuck = 0;
    pthread_mutex_lock(&self->lock);
    struct direct_entry **slot = direct_slot(self, fh);
    struct direct_entry *e = *slot;
    if (e == NULL) {
        pthread_mutex_unlock(&self->lock);
        if (abandon)
            return Py_BuildValue("(iO)", 0, Py_None);
        Py_RETURN_NONE;
    }
    tally_take(e, 1, &t);
    if (abandon) {
        stuck = e->in_use - e->stuck;
        e->stuck = e->in_use;
    }
    if (remove) {
        *slot = e->next;
        self->entries--;
        if (e->in_use)
            e->dead = 1;
        else
            freed = e;
    }
    pthread_mutex_unlock(&self->lock);
    if (freed != NULL)
        direct_free_unlocked(freed);
    PyObject *tally;
    if (!t.reads && !t.rn) {
        Py_INCREF(Py_None);
        tally = Py_None;
    } else if ((tally = tally_tuple(self, &t)) == NULL) {
        return NULL;
    }
    return abandon ? Py_BuildValue("(iN)", stuck, tally) : tally;
}

static PyObject *Direct_take(Direct *self, PyObject *arg) { return direct_take_common(self, arg, 0, 0); }
static PyObject *Direct_remove(Direct *self, PyObject *arg) { return direct_take_common(self, arg, 1, 0); }
static PyObject *Direct_abandon(Direct *self, PyObject *arg) { return direct_take_common(self, arg, 1, 1); }

/* drain(): [(fh, tally)] of every handle that served reads since its last take; rings stay. */
static PyObject *Direct_drain(Direct *self, PyObject *unused)
{
    PyObject *out = PyList_New(0);
    if (out == NULL)
        return NULL;
    for (int b = 0; b < DIRECT_BUCKETS; b++) {
        for (;;) { /* one entry per lock hold: the Python objects are made without it */
            struct tally_buf t;
            uint64_t fh = 0;
            int found = 0;
            pthread_mutex_lock(&self->lock);
            for (struct direct_entry *e = self->buckets[b]; e != NULL; e = e->next) {
                if (e->reads) {
                    fh = e->fh;
                    tally_take(e, 0, &t);
                    found = 1;
                    break;
                }
            }
            pthread_mutex_unlock(&self->lock);
            if (!found)
                break;
            PyObject *tally = tally_tuple(self, &t);
            PyObject *item = tally == NULL ? NULL : Py_BuildValue("(KN)", (unsigned long long)fh, tally);
            if (item == NULL || PyList_Append(out, item) < 0) {
                Py_XDECREF(item);
                Py_DECREF(out);
                return NULL;
            }
            Py_DECREF(item);
        }
    }
    return out;
}

/* state(fh): (active, windows) of a handed-over handle, None otherwise; and len(): handles. For tests. */
static PyObject *Direct_state(Direct *self, PyObject *arg)
{
    unsigned long long fh = PyLong_AsUnsignedLongLong(arg);
    if (fh == (unsigned long long)-1 && PyErr_Occurred())
        return NULL;
    pthread_mutex_lock(&self->lock);
    struct direct_entry *e = *direct_slot(self, fh);
    int active = e != NULL && e->active, nw = e != NULL ? e->nwindows : 0, present = e != NULL;
    uint64_t lo[DIRECT_WINDOWS], hi[DIRECT_WINDOWS];
    for (int i = 0; i < nw; i++) {
        lo[i] = e->lo[i];
        hi[i] = e->hi[i];
    }
    pthread_mutex_unlock(&self->lock);
    if (!present)
        Py_RETURN_NONE;
    PyObject *ws = PyTuple_New(nw);
    if (ws == NULL)
        return NULL;
    for (int i = 0; i < nw; i++) {
        PyObject *w = Py_BuildValue("(KK)", (unsigned long long)lo[i], (unsigned long long)hi[i]);
        if (w == NULL) {
            Py_DECREF(ws);
            return NULL;
        }
        PyTuple_SET_ITEM(ws, i, w);
    }
    return Py_BuildValue("(ON)", active ? Py_True : Py_False, ws);
}

static Py_ssize_t Direct_len(Direct *self)
{
    pthread_mutex_lock(&self->lock);
    long n = self->entries;
    pthread_mutex_unlock(&self->lock);
    return (Py_ssize_t)n;
}

/* read(fh, offset, size) -> bytes or None: what the loop does with a READ of fh (tests). */
static PyObject *Direct_read(Direct *self, PyObject *args)
{
    unsigned long long fh, off;
    unsigned int size;
    if (!PyArg_ParseTuple(args, "KKI", &fh, &off, &size))
        return NULL;
    char *buf = malloc(size ? size : 1);
    if (buf == NULL)
        return PyErr_NoMemory();
    size_t n = 0;
    int served, unstuck;
    Py_BEGIN_ALLOW_THREADS
    served = direct_read(self, fh, off, size, buf, &n, &unstuck);
    Py_END_ALLOW_THREADS
    if (unstuck)
        direct_unstuck(self, fh);
    PyObject *out = served ? PyBytes_FromStringAndSize(buf, (Py_ssize_t)n) : (Py_INCREF(Py_None), Py_None);
    free(buf);
    return out;
}

static PyMethodDef Direct_methods[] = {
    {"add", (PyCFunction)Direct_add, METH_VARARGS,
     "add(fh, fd, size, windows): hand reads of fh over (fd is duplicated; again: new windows, active)."},
    {"take", (PyCFunction)Direct_take, METH_O, "take(fh): the tally and ring since the last take, or None."},
    {"remove", (PyCFunction)Direct_remove, METH_O, "remove(fh): take, and forget the handle."},
    {"abandon", (PyCFunction)Direct_abandon, METH_O,
     "abandon(fh): remove, counting its reads running now as stuck: (count, tally or None)."},
    {"drain", (PyCFunction)Direct_drain, METH_NOARGS, "drain(): [(fh, tally)] of handles that served reads."},
    {"state", (PyCFunction)Direct_state, METH_O, "state(fh): (active, windows), or None."},
    {"read", (PyCFunction)Direct_read, METH_VARARGS, "read(fh, offset, size): the loop's answer (bytes) or None."},
    {NULL, NULL, 0, NULL},
};

static PySequenceMethods Direct_as_sequence = {.sq_length = (lenfunc)Direct_len};

static PyTypeObject DirectType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "fastfs.daemon.kernel._loop.Direct",
    .tp_doc = PyDoc_STR("Direct(max_read, reorder, page, max_slack, latency_bounds, on_unstuck=None): handles "
                        "whose reads the loop serves itself (see the C file)."),
    .tp_basicsize = sizeof(Direct),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = Direct_new,
    .tp_dealloc = (destructor)Direct_dealloc,
    .tp_methods = Direct_methods,
    .tp_as_sequence = &Direct_as_sequence,
};

static PyObject *s_unique, *s_opcode, *s_nodeid, *s_uid, *s_gid, *s_pid, *s_after, *s_current, *s_abandoned,
    *s_counts, *s_errno, *s_owns_fd;

static double monotonic_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts); /* the clock of Python's time.monotonic */
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Write one reply: a header and *nparts* buffers by one writev; 0 or the errno. Without the GIL (the
 * caller holds no Python object it needs across the call, or has released the GIL around it). */
static int write_reply_nogil(int fd, uint64_t unique, int32_t error, Py_buffer *parts, int nparts)
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
    ssize_t written = writev(fd, iov, nparts + 1);
    return written < 0 ? errno : 0;
}

/* write_reply_nogil with the GIL released around it (the caller holds it, and the buffers' objects). */
static int write_reply(int fd, uint64_t unique, int32_t error, Py_buffer *parts, int nparts)
{
    int code;
    Py_BEGIN_ALLOW_THREADS
    code = write_reply_nogil(fd, unique, error, parts, nparts);
    Py_END_ALLOW_THREADS
    return code;
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
    "serve(fd, buffer, handlers, request, worker, no_reply, no_reply_ops, on_exception, on_reply_error, readers,"
    " direct) -> int\n\n"
    "Serve requests read from fd until the worker is abandoned (0), the device read ends the connection\n"
    "(its errno, or -1 for end of file) or a BaseException escapes a handler (raised).");

/* Without the GIL, a request just read: whether it is one the loop answers ENOSYS itself (*bare*: no
 * handler, and an answer is due), its reader's place left and the request counted in one locked step.
 * The Python loop answers the same ENOSYS; here no GIL is taken for it. Python's open() asks every
 * file it opens whether it is a terminal (an ioctl, TCGETS), which the kernel sends to the daemon
 * (it keeps no answer of FUSE_IOCTL): taking the GIL for that answer made a hot open() + close() of
 * one file cost twice an os.open() + close() (95 against 46 us, tmpfs source, 2-core VM). */
static int bare_answer(Readers *places, struct parked *me, const char *bare, const char *buf)
{
    uint32_t op = ((const struct in_header *)buf)->opcode;
    if (op >= TABLE_SIZE || !bare[op])
        return 0;
    leave_place(places, me, (int)op);
    return 1;
}

static PyObject *serve(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 12) {
        PyErr_SetString(PyExc_TypeError, "serve() takes 12 arguments");
        return NULL;
    }
    if (!PyObject_TypeCheck(args[9], &ReadersType)) {
        PyErr_SetString(PyExc_TypeError, "readers must be a Readers");
        return NULL;
    }
    if (args[10] != Py_None && !PyObject_TypeCheck(args[10], &DirectType)) {
        PyErr_SetString(PyExc_TypeError, "direct must be a Direct or None");
        return NULL;
    }
    if (args[11] != Py_None && !PyObject_TypeCheck(args[11], &LaterType)) {
        PyErr_SetString(PyExc_TypeError, "later must be a Later or None");
        return NULL;
    }
    Later *later = args[11] == Py_None ? NULL : (Later *)args[11];
    Readers *places = (Readers *)args[9];
    Direct *direct = args[10] == Py_None ? NULL : (Direct *)args[10];
    char *rbuf = NULL; /* the answers of direct reads (max_read bytes) */
    if (direct != NULL && (rbuf = malloc(direct->max_read)) == NULL)
        return PyErr_NoMemory();
    struct parked me; /* this worker's parking place, for the whole loop */
    long fd_value = PyLong_AsLong(args[0]);
    if (fd_value == -1 && PyErr_Occurred()) {
        free(rbuf);
        return NULL;
    }
    if (fd_value < 0 || fd_value > INT_MAX) {
        PyErr_SetString(PyExc_ValueError, "bad file descriptor");
        free(rbuf);
        return NULL;
    }
    int fd = (int)fd_value;
    PyObject *handlers = args[2], *request = args[3], *worker = args[4], *no_reply = args[5],
             *no_reply_ops = args[6], *on_exception = args[7], *on_reply_error = args[8];
    if (!PyDict_Check(handlers)) {
        PyErr_SetString(PyExc_TypeError, "handlers must be a dict");
        free(rbuf);
        return NULL;
    }
    Py_buffer buffer;
    if (PyObject_GetBuffer(args[1], &buffer, PyBUF_WRITABLE) < 0) {
        free(rbuf);
        return NULL;
    }
    PyObject *counts = PyObject_GetAttr(worker, s_counts);
    if (counts == NULL || !PyDict_Check(counts)) {
        if (counts != NULL)
            PyErr_SetString(PyExc_TypeError, "worker.counts must be a dict");
        Py_XDECREF(counts);
        PyBuffer_Release(&buffer);
        free(rbuf);
        return NULL;
    }
    sem_init(&me.wake, 0, 0);
    me.next = NULL;
    me.busy = 0;
    PyObject *table[TABLE_SIZE];
    for (int op = 0; op < TABLE_SIZE; op++) {
        PyObject *key = PyLong_FromLong(op);
        table[op] = key == NULL ? NULL : PyDict_GetItemWithError(handlers, key); /* borrowed: handlers is held */
        Py_XDECREF(key);
        if (PyErr_Occurred())
            goto fail;
    }
    /* Opcodes of no handler that want an answer: ENOSYS, written without the GIL (see bare_answer). */
    char bare[TABLE_SIZE];
    for (int op = 0; op < TABLE_SIZE; op++) {
        int silent = 0;
        if (table[op] == NULL) {
            PyObject *key = PyLong_FromLong(op);
            silent = key == NULL ? -1 : PySequence_Contains(no_reply_ops, key);
            Py_XDECREF(key);
            if (silent < 0)
                goto fail;
        }
        bare[op] = table[op] == NULL && !silent;
    }

    long result = 0;
    int nonblock = 0; /* this worker's descriptor is non-blocking (it was the spinner last: read_request) */
    uint64_t got_at = 0; /* when this worker's last request came (monotonic ns; with spin only) */
    /* A worker spins only on a descriptor of its own (a clone): the flag it switches is the descriptor's. */
    PyObject *owns = PyObject_GetAttr(worker, s_owns_fd);
    int may_spin = owns == NULL ? -1 : PyObject_IsTrue(owns);
    Py_XDECREF(owns);
    if (may_spin < 0)
        goto fail;
    may_spin = may_spin && places->spin_ns > 0;
    char *buf = buffer.buf;
    char small[REPLY_COPY_MAX]; /* a short answer, copied so its object goes before the GIL does */
    /* Not NULL: the last request's answer was written without the GIL, which this worker then does not
     * take again until its next request came (see ANSWER_NOGIL). Every path that leaves the loop
     * or touches a Python object holds the GIL. */
    PyThreadState *released = NULL;
    for (;;) {
        int abandoned = 0;
        PyObject *flag;
        if (released == NULL) { /* (after an answer written without the GIL: checked just before it) */
            flag = PyObject_GetAttr(worker, s_abandoned);
            if (flag == NULL)
                goto fail;
            abandoned = PyObject_IsTrue(flag);
            Py_DECREF(flag);
            if (abandoned < 0)
                goto fail;
            if (abandoned)
                break;
            released = PyEval_SaveThread();
        }

        ssize_t n = 0;
        int read_errno = 0;
        int gone = take_place(places, &me);
        if (!gone) {
            n = read_request(places, fd, buf, (size_t)buffer.len, &nonblock, may_spin, &got_at);
            if (n < 0)
                read_errno = errno;
        }
        if (n >= (ssize_t)sizeof(struct in_header)) {
            uint32_t read_op = ((const struct in_header *)buf)->opcode;
            if (read_op == OP_FORGET || read_op == OP_BATCH_FORGET) /* (see Readers_forgets) */
                __atomic_add_fetch(&places->forgets, 1, __ATOMIC_SEQ_CST);
        }
        if (n >= (ssize_t)sizeof(struct in_header) && bare_answer(places, &me, bare, buf)) {
            int code = write_reply_nogil(fd, ((const struct in_header *)buf)->unique, -ENOSYS, NULL, 0);
            if (code) {
                PyEval_RestoreThread(released);
                released = NULL;
                reply_failed(on_reply_error, code);
            }
            continue;
        }
        PyEval_RestoreThread(released);
        released = NULL;
        if (gone)
            break; /* the connection is gone */
        if (n < 0) {
            if (read_errno == EINTR || read_errno == EAGAIN || read_errno == ENOENT) {
                leave_place(places, &me, -1);
                continue;
            }
            end_places(places);
            result = read_errno; /* ENODEV: unmounted or aborted */
            break;
        }
        leave_place(places, &me, -1);
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
        if (op == OP_RELEASE && later != NULL && later_push(later, buf, length)) {
            Py_DECREF(opcode); /* (kept before the answer: whoever takes the queue after it sees it) */
            ANSWER_NOGIL(0, NULL, 0);
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
        if (op == OP_READ && direct != NULL && length - sizeof *h >= READ_IN_SIZE) {
            const char *in = buf + sizeof *h;
            uint64_t rfh, roff;
            uint32_t rsize;
            memcpy(&rfh, in, 8);
            memcpy(&roff, in + 8, 8);
            memcpy(&rsize, in + 16, 4);
            size_t got = 0;
            int served, unstuck;
            Py_BEGIN_ALLOW_THREADS
            served = direct_read(direct, rfh, roff, rsize, rbuf, &got, &unstuck);
            Py_END_ALLOW_THREADS
            if (unstuck)
                direct_unstuck(direct, rfh);
            if (served) {
                Py_DECREF(opcode);
                if (PyObject_SetAttr(worker, s_current, Py_None) < 0)
                    goto fail;
                flag = PyObject_GetAttr(worker, s_abandoned);
                abandoned = flag == NULL ? -1 : PyObject_IsTrue(flag);
                Py_XDECREF(flag);
                if (abandoned < 0)
                    goto fail;
                if (abandoned)
                    break; /* the watchdog answered it already */
                Py_buffer part = {.buf = rbuf, .len = (Py_ssize_t)got}; /* (the loop's own buffer) */
                ANSWER_NOGIL(0, &part, 1);
            }
        }
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
        PyObject *after = PyObject_GetAttr(request, s_after);
        if (after == NULL) {
            Py_XDECREF(reply);
            Py_DECREF(opcode);
            goto fail;
        }
        /* A short answer and nothing to run after it (every answer but a READ's views): written
         * without the GIL, and the worker goes on to its next read without taking it back. */
        if (!abandoned && after == Py_None &&
            (error || reply == Py_None || (PyBytes_CheckExact(reply) && PyBytes_GET_SIZE(reply) <= REPLY_COPY_MAX))) {
            Py_buffer part = {.buf = small, .len = 0};
            if (!error && reply != Py_None) {
                part.len = PyBytes_GET_SIZE(reply);
                memcpy(small, PyBytes_AS_STRING(reply), (size_t)part.len);
            }
            Py_XDECREF(reply);
            Py_DECREF(after);
            Py_DECREF(opcode);
            ANSWER_NOGIL(error ? -error : 0, &part, part.len ? 1 : 0);
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
    leave_busy(places, &me);
    sem_destroy(&me.wake); /* (not parked: nobody posts to it any more) */
    Py_DECREF(counts);
    PyBuffer_Release(&buffer);
    free(rbuf);
    return PyLong_FromLong(result);

fail:
    leave_busy(places, &me);
    sem_destroy(&me.wake);
    Py_DECREF(counts);
    PyBuffer_Release(&buffer);
    free(rbuf);
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
        {&s_abandoned, "abandoned"}, {&s_counts, "counts"}, {&s_errno, "errno"}, {&s_owns_fd, "owns_fd"},
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        *names[i].slot = PyUnicode_InternFromString(names[i].name);
        if (*names[i].slot == NULL)
            return NULL;
    }
    struct {
        PyTypeObject *type;
        const char *name;
    } types[] = {{&ReadersType, "Readers"}, {&DirectType, "Direct"}, {&LaterType, "Later"}};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
        if (PyType_Ready(types[i].type) < 0)
            return NULL;
    PyObject *module = PyModule_Create(&module_def);
    if (module == NULL)
        return NULL;
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        Py_INCREF(types[i].type);
        if (PyModule_AddObject(module, types[i].name, (PyObject *)types[i].type) < 0) {
            Py_DECREF(types[i].type);
            Py_DECREF(module);
            return NULL;
        }
    }
    if (PyModule_AddIntConstant(module, "LATER_RECORD", LATER_RECORD) < 0 ||
        PyModule_AddIntConstant(module, "DIRECT_RING", DIRECT_RING) < 0 ||
        PyModule_AddIntConstant(module, "DIRECT_WINDOWS", DIRECT_WINDOWS) < 0 ||
        PyModule_AddIntConstant(module, "SIZE_BITS", SIZE_BITS) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
