"""A TCP delay line: a loopback proxy that holds every byte for a fixed time in each direction.

Real network clients on loopback answer in microseconds; to show where fastfs hides latency for
the same client, a network source can be started with a delay between client and server. The
obvious tool, ``tc qdisc ... netem delay`` on a veth pair into a network namespace, needs
``CONFIG_NET_SCH_NETEM``, which this project's kernel does not have (nor ``sch_fq`` for an EDT
BPF delay), and netem on ``lo`` would slow down every other user of loopback. So the delay is a
small C proxy (compiled on first use with ``cc``, like the emulator's dirops shim): it accepts on a
free loopback port, connects each client to the server's port, and forwards every chunk it reads
once ``delay`` has passed since it arrived, in both directions. Chunks are pipelined (throughput is
not cut, up to :data:`MAX_QUEUED_BYTES` in flight per direction), so the model is a link with a
fixed one-way delay: a request/response round trip costs ``2 x delay`` more.

Its counters (connections, bytes client->server and server->client) live in a small file the proxy
maps and updates in place; :meth:`DelayLine.counters` reads it (eight-byte aligned stores, so a
reader never sees a torn value on x86-64).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import struct
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass

# Where the proxy binary is built (keyed by a hash of its source).
BUILD_DIR = os.path.join(tempfile.gettempdir(), "fastfs_bench_delayline")
# Seconds allowed for compiling it.
BUILD_TIMEOUT = 60.0
# Bytes held per direction of one connection before the proxy stops reading from its sender
# (bounds memory; 32 MiB in flight sustains 6.7 GB/s at 5 ms, far above loopback clients).
MAX_QUEUED_BYTES = 32 << 20
# Seconds to wait for the proxy to report its port, and to exit after SIGTERM.
START_TIMEOUT = 10.0
STOP_TIMEOUT = 5.0
# Counters in the stats file, in order (uint64 each).
COUNTER_NAMES = ("connections", "bytes_up", "bytes_down", "active")

SOURCE = r"""
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define CHUNK 65536
#define MAX_CONN 256

struct chunk { struct chunk *next; uint64_t due; size_t len, off; char data[]; };
struct dir { int from, to; struct chunk *head, *tail; size_t queued; int eof, shut, blocked; };
struct conn { int used, a, b; struct dir up, down; uint32_t ev_a, ev_b; };

static struct conn conns[MAX_CONN];
static volatile uint64_t *stats; /* connections, bytes_up, bytes_down, active */
static uint64_t delay_us, max_queued;
static int ep, stop;

static uint64_t now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

static void nonblock(int fd) { fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK); }

static void drop_dir(struct dir *d) {
    while (d->head) { struct chunk *c = d->head; d->head = c->next; free(c); }
    d->tail = NULL; d->queued = 0;
}

static void close_conn(struct conn *c) {
    epoll_ctl(ep, EPOLL_CTL_DEL, c->a, NULL);
    epoll_ctl(ep, EPOLL_CTL_DEL, c->b, NULL);
    close(c->a); close(c->b);
    drop_dir(&c->up); drop_dir(&c->down);
    c->used = 0;
    stats[3]--;
}

/* read what is there into delayed chunks; -1 on error */
static int fill(struct dir *d, uint64_t now) {
    while (!d->eof && d->queued < max_queued) {
        struct chunk *c = malloc(sizeof *c + CHUNK);
        if (!c) return -1;
        ssize_t n = read(d->from, c->data, CHUNK);
        if (n < 0) { free(c); return (errno == EAGAIN || errno == EINTR) ? 0 : -1; }
        if (n == 0) { free(c); d->eof = 1; return 0; }
        c->next = NULL; c->due = now + delay_us; c->len = (size_t)n; c->off = 0;
        if (d->tail) d->tail->next = c; else d->head = c;
        d->tail = c; d->queued += (size_t)n;
    }
    return 0;
}

/* write every due chunk; -1 on error */
static int flush(struct dir *d, uint64_t now, volatile uint64_t *counter) {
    d->blocked = 0;
    while (d->head && d->head->due <= now) {
        struct chunk *c = d->head;
        ssize_t n = write(d->to, c->data + c->off, c->len - c->off);
        if (n < 0) {
            if (errno == EAGAIN || errno == EINTR) { d->blocked = 1; return 0; }
            return -1;
        }
        *counter += (uint64_t)n; c->off += (size_t)n; d->queued -= (size_t)n;
        if (c->off == c->len) { d->head = c->next; if (!d->head) d->tail = NULL; free(c); }
    }
    if (d->eof && !d->head && !d->shut) { shutdown(d->to, SHUT_WR); d->shut = 1; }
    return 0;
}

static void want(int fd, uint32_t *cur, uint32_t ev, uint32_t tag) {
    if (*cur == ev) return;
    struct epoll_event e = { .events = ev, .data.u32 = tag };
    epoll_ctl(ep, EPOLL_CTL_MOD, fd, &e);
    *cur = ev;
}

static void on_term(int sig) { (void)sig; stop = 1; }

int main(int argc, char **argv) {
    if (argc != 6) {
        fprintf(stderr, "usage: delayline LISTEN_PORT TARGET_PORT DELAY_US MAX_QUEUED STATS_FILE\n");
        return 2;
    }
    int lport = atoi(argv[1]), tport = atoi(argv[2]);
    delay_us = strtoull(argv[3], NULL, 10); max_queued = strtoull(argv[4], NULL, 10);
    int sf = open(argv[5], O_RDWR | O_CREAT | O_TRUNC, 0644);
    if (sf < 0 || ftruncate(sf, 4096) < 0) { perror("stats file"); return 1; }
    stats = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, sf, 0);
    if (stats == MAP_FAILED) { perror("mmap"); return 1; }
    signal(SIGTERM, on_term); signal(SIGINT, on_term); signal(SIGPIPE, SIG_IGN);
    int ls = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in addr = { .sin_family = AF_INET, .sin_port = htons(lport),
                                .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    socklen_t alen = sizeof addr;
    if (bind(ls, (struct sockaddr *)&addr, sizeof addr) < 0 || listen(ls, 64) < 0
        || getsockname(ls, (struct sockaddr *)&addr, &alen) < 0) { perror("listen"); return 1; }
    nonblock(ls);
    ep = epoll_create1(0);
    struct epoll_event le = { .events = EPOLLIN, .data.u32 = 0xffffffffu };
    epoll_ctl(ep, EPOLL_CTL_ADD, ls, &le);
    printf("%d\n", ntohs(addr.sin_port)); fflush(stdout);
    while (!stop) {
        uint64_t now = now_us();
        long timeout = -1;
        for (int i = 0; i < MAX_CONN; i++) {
            struct conn *c = &conns[i];
            if (!c->used) continue;
            if (flush(&c->up, now, &stats[1]) < 0 || flush(&c->down, now, &stats[2]) < 0
                || (c->up.shut && c->down.shut)) { close_conn(c); continue; }
            struct dir *ds[2] = { &c->up, &c->down };
            for (int k = 0; k < 2; k++)
                if (ds[k]->head && !ds[k]->blocked) {
                    long t = ds[k]->head->due > now ? (long)((ds[k]->head->due - now + 999) / 1000) : 0;
                    if (timeout < 0 || t < timeout) timeout = t;
                }
            /* a: reads up (unless full or at eof), writes down when blocked; b the other way round */
            uint32_t ea = ((!c->up.eof && c->up.queued < max_queued) ? EPOLLIN : 0)
                          | (c->down.blocked ? EPOLLOUT : 0);
            uint32_t eb = ((!c->down.eof && c->down.queued < max_queued) ? EPOLLIN : 0)
                          | (c->up.blocked ? EPOLLOUT : 0);
            want(c->a, &c->ev_a, ea, (uint32_t)i << 1);
            want(c->b, &c->ev_b, eb, ((uint32_t)i << 1) | 1u);
        }
        struct epoll_event evs[64];
        int n = epoll_wait(ep, evs, 64, (int)timeout);
        now = now_us();
        for (int j = 0; j < n; j++) {
            uint32_t tag = evs[j].data.u32;
            if (tag == 0xffffffffu) {
                int cs = accept(ls, NULL, NULL);
                if (cs < 0) continue;
                int slot = -1;
                for (int i = 0; i < MAX_CONN; i++) if (!conns[i].used) { slot = i; break; }
                int ts = socket(AF_INET, SOCK_STREAM, 0);
                struct sockaddr_in ta = { .sin_family = AF_INET, .sin_port = htons(tport),
                                          .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
                if (slot < 0 || connect(ts, (struct sockaddr *)&ta, sizeof ta) < 0) { close(cs); close(ts); continue; }
                setsockopt(cs, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
                setsockopt(ts, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
                nonblock(cs); nonblock(ts);
                struct conn *c = &conns[slot];
                memset(c, 0, sizeof *c);
                c->used = 1; c->a = cs; c->b = ts;
                c->up.from = cs; c->up.to = ts; c->down.from = ts; c->down.to = cs;
                c->ev_a = c->ev_b = EPOLLIN;
                struct epoll_event ea = { .events = EPOLLIN, .data.u32 = (uint32_t)slot << 1 };
                struct epoll_event eb = { .events = EPOLLIN, .data.u32 = ((uint32_t)slot << 1) | 1u };
                epoll_ctl(ep, EPOLL_CTL_ADD, cs, &ea);
                epoll_ctl(ep, EPOLL_CTL_ADD, ts, &eb);
                stats[0]++; stats[3]++;
                continue;
            }
            struct conn *c = &conns[tag >> 1];
            if (!c->used) continue;
            struct dir *d = (tag & 1u) ? &c->down : &c->up; /* the direction this fd sends into */
            if (evs[j].events & EPOLLERR) { close_conn(c); continue; }
            if ((evs[j].events & (EPOLLIN | EPOLLHUP)) && fill(d, now) < 0) { close_conn(c); continue; }
            if (evs[j].events & EPOLLHUP) { /* both halves closed: nothing more to read or deliver here */
                struct dir *into = (tag & 1u) ? &c->up : &c->down;
                int fd = (tag & 1u) ? c->b : c->a;
                while (!d->eof && fill(d, now) == 0 && d->queued < max_queued) {}
                drop_dir(into); into->eof = into->shut = 1;
                epoll_ctl(ep, EPOLL_CTL_DEL, fd, NULL);
            }
        }
    }
    for (int i = 0; i < MAX_CONN; i++) if (conns[i].used) close_conn(&conns[i]);
    return 0;
}
"""


def build() -> str:
    """Path of the compiled proxy, building it on first use; raises RuntimeError without a C compiler."""
    digest = hashlib.sha256(SOURCE.encode()).hexdigest()[:16]
    binary = os.path.join(BUILD_DIR, f"delayline_{digest}")
    if os.path.exists(binary):
        return binary
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise RuntimeError("a source delay needs a C compiler (cc) to build the delay line")
    os.makedirs(BUILD_DIR, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=BUILD_DIR) as tmp:
        c_path = os.path.join(tmp, "delayline.c")
        with open(c_path, "w") as f:
            f.write(SOURCE)
        out = os.path.join(tmp, "delayline")
        res = subprocess.run([cc, "-O2", "-o", out, c_path], capture_output=True, text=True, timeout=BUILD_TIMEOUT)
        if res.returncode != 0:
            raise RuntimeError(f"cannot build the delay line: {res.stderr.strip()[-500:]}")
        os.replace(out, binary)
    return binary


@dataclass
class DelayLine:
    """A running delay line (from :func:`delay_line`): clients connect to ``port``."""

    port: int
    target_port: int
    delay_ms: float
    stats_path: str
    proc: subprocess.Popen

    def counters(self) -> dict[str, float]:
        """Connections accepted and bytes forwarded each way so far (``bytes_down``: server to client)."""
        with open(self.stats_path, "rb") as f:
            raw = f.read(8 * len(COUNTER_NAMES))
        if len(raw) < 8 * len(COUNTER_NAMES):
            return dict.fromkeys(COUNTER_NAMES, 0.0)
        return {k: float(v) for k, v in zip(COUNTER_NAMES, struct.unpack(f"<{len(COUNTER_NAMES)}Q", raw), strict=True)}


@contextlib.contextmanager
def delay_line(target_port: int, delay_ms: float, work_dir: str) -> Iterator[DelayLine]:
    """A delay line to ``127.0.0.1:target_port`` holding each byte *delay_ms* one way; always stopped."""
    binary = build()
    stats_path = os.path.join(work_dir, f"delayline-{target_port}.stats")
    log_path = os.path.join(work_dir, f"delayline-{target_port}.log")
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            [binary, "0", str(target_port), str(int(delay_ms * 1000)), str(MAX_QUEUED_BYTES), stats_path],
            stdout=subprocess.PIPE,
            stderr=log,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()  # the proxy prints its port once listening (or exits)
        if not line.isdigit():
            with open(log_path, errors="replace") as f:
                raise RuntimeError(f"delay line did not start: {f.read()[-500:]}")
        yield DelayLine(int(line), target_port, delay_ms, stats_path, proc)
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=STOP_TIMEOUT)
        if proc.stdout is not None:
            proc.stdout.close()
