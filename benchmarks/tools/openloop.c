/* Open-loop HTTP/1.1 load for bench_http.py: requests due at start + n/rate, each
 * timed from when it was due (wrk2's model: no coordinated omission).
 *
 *   cc -O2 -o openloop benchmarks/openloop.c      (bench_http.py builds it on first use)
 *   openloop PORT RATE SECONDS CONNECTIONS USERS SEED
 *
 * CONNECTIONS keep-alive connections to 127.0.0.1:PORT; request n asks for
 * GET /v1/users/{random 1..USERS}/home?limit=20. Due requests queue in order and go
 * out on the first idle connection, so a slow server makes later requests wait, and
 * that wait is in their latency; idle connections take turns, and one the server
 * closes is opened again (a request it held counts as lost). Prints one JSON line: requests, non-200 answers,
 * latency percentiles (ms), the achieved rate and the wall time. Python's asyncio
 * client costs ~190 us of a core per request here; this one a few, so on a 2-core
 * box it does not take the cores the server is measured on.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#define BUF (1 << 20)

typedef struct {
    int fd;
    long req;      /* the request in flight, -1 when idle */
    size_t have;   /* bytes of its answer read so far */
    char *buf;
} conn_t;

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double pct(double *v, long n, double q) {
    if (n == 0) return 0;
    long i = (long)(q * (n - 1) + 0.5);
    return v[i];
}

static uint64_t rng_state;
static uint64_t next_rand(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

static void die(const char *what) {
    perror(what);
    exit(2);
}

/* (Re)open connection i: keep-alive, no Nagle, watched for answers. */
static void open_conn(int ep, struct sockaddr_in *addr, conn_t *c, int i) {
    if (c->fd >= 0) close(c->fd); /* closing drops it from the epoll set */
    int fd = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    if (fd < 0 || connect(fd, (struct sockaddr *)addr, sizeof *addr) < 0) die("connect");
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    c->fd = fd, c->req = -1, c->have = 0;
    struct epoll_event ev = {.events = EPOLLIN, .data.u32 = (uint32_t)i};
    if (epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) < 0) die("epoll_ctl");
}

int main(int argc, char **argv) {
    if (argc != 7) {
        fprintf(stderr, "usage: openloop PORT RATE SECONDS CONNECTIONS USERS SEED\n");
        return 2;
    }
    int port = atoi(argv[1]), nconn = atoi(argv[4]);
    double rate = atof(argv[2]), seconds = atof(argv[3]);
    long users = atol(argv[5]);
    rng_state = 88172645463325252ULL ^ (uint64_t)atol(argv[6]);
    long total = (long)(rate * seconds);
    if (port <= 0 || rate <= 0 || seconds <= 0 || nconn <= 0 || users <= 0 || total <= 0) {
        fprintf(stderr, "openloop: every argument must be > 0\n");
        return 2;
    }
    double *due = malloc(sizeof(double) * total), *lat = malloc(sizeof(double) * total);
    long *queue = malloc(sizeof(long) * total);
    conn_t *conns = calloc(nconn, sizeof(conn_t));
    int ep = epoll_create1(0);
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons(port)};
    inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
    for (int i = 0; i < nconn; i++) {
        conns[i] = (conn_t){.fd = -1, .req = -1, .buf = malloc(BUF)};
        open_conn(ep, &addr, &conns[i], i);
    }
    int tfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK);
    struct epoll_event tev = {.events = EPOLLIN, .data.u32 = UINT32_MAX};
    epoll_ctl(ep, EPOLL_CTL_ADD, tfd, &tev);

    double start = now_s() + 0.05;
    for (long n = 0; n < total; n++) due[n] = start + n / rate;
    long released = 0, head = 0, tail = 0, done = 0, bad = 0, errors = 0, lost = 0;
    int idle = nconn, next_conn = 0;
    char req[160];
    double deadline = start + seconds + 30;
    struct epoll_event events[256];
    while (done + lost < total && now_s() < deadline) {
        double t = now_s();
        while (released < total && due[released] <= t) queue[tail++] = released++;
        /* Idle connections in turn, so none sits out the server's keep-alive timeout. */
        for (int j = 0; j < nconn && idle > 0 && head < tail; j++) {
            int i = next_conn;
            next_conn = (next_conn + 1) % nconn;
            if (conns[i].req >= 0) continue;
            long n = queue[head++];
            int len = snprintf(req, sizeof req,
                               "GET /v1/users/%ld/home?limit=20 HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
                               (long)(next_rand() % (uint64_t)users) + 1);
            if (send(conns[i].fd, req, len, MSG_NOSIGNAL) != len) {
                open_conn(ep, &addr, &conns[i], i); /* closed while idle: once more */
                if (send(conns[i].fd, req, len, MSG_NOSIGNAL) != len) die("send");
            }
            conns[i].req = n, conns[i].have = 0, idle--;
        }
        if (released < total) {
            double next = due[released];
            struct itimerspec its = {.it_value = {.tv_sec = (time_t)next,
                                                  .tv_nsec = (long)((next - (time_t)next) * 1e9)}};
            timerfd_settime(tfd, TFD_TIMER_ABSTIME, &its, NULL);
        }
        int k = epoll_wait(ep, events, 256, 1000);
        for (int e = 0; e < k; e++) {
            uint32_t i = events[e].data.u32;
            if (i == UINT32_MAX) {
                uint64_t x;
                if (read(tfd, &x, sizeof x) < 0 && errno != EAGAIN) die("timerfd");
                continue;
            }
            conn_t *c = &conns[i];
            ssize_t r = recv(c->fd, c->buf + c->have, BUF - c->have, 0);
            if (r <= 0) { /* closed: idle (a keep-alive timeout), or its answer is lost */
                if (c->req >= 0) lost++, idle++;
                open_conn(ep, &addr, c, (int)i);
                continue;
            }
            c->have += (size_t)r;
            char *end = memmem(c->buf, c->have, "\r\n\r\n", 4);
            if (end == NULL || c->req < 0) continue;
            long length = 0;
            char *cl = memmem(c->buf, end - c->buf, "content-length:", 15);
            if (cl != NULL) length = atol(cl + 15);
            size_t whole = (size_t)(end - c->buf) + 4 + (size_t)length;
            if (c->have < whole) continue;
            lat[done++] = (now_s() - due[c->req]) * 1000;
            bad += strncmp(c->buf, "HTTP/1.1 200", 12) != 0;
            c->req = -1, c->have = 0, idle++;
        }
        if (k < 0 && errno != EINTR) die("epoll_wait");
    }
    double wall = now_s() - start;
    errors = total - done - lost;
    qsort(lat, done, sizeof(double), cmp);
    printf("{\"requests\": %ld, \"non200\": %ld, \"unanswered\": %ld, \"lost\": %ld, "
           "\"p50_ms\": %.3f, "
           "\"p99_ms\": %.3f, \"p999_ms\": %.3f, \"max_ms\": %.3f, \"achieved_per_s\": %.1f, "
           "\"wall_s\": %.3f}\n",
           done, bad, errors, lost, pct(lat, done, .5), pct(lat, done, .99), pct(lat, done, .999),
           done ? lat[done - 1] : 0.0, done / (wall > seconds ? wall : seconds), wall);
    return 0;
}
