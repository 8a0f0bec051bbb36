/* barlink's C ABI between two processes, the way a C/C++ server drives it:
 * throughput per message size with blocking barlink_send, with
 * barlink_post_send + barlink_poll (copying), and with
 * barlink_post_send_buffer (zero-copy from a registered buffer); and, in
 * each mode, the one-way latency of a message there and back, halved, both
 * sides sending as the mode does. A posted message's completion is taken
 * once the next one is posted, while that one is on its way (as a server
 * answering requests reaps its last answer's completion), so every round
 * trip still holds one post, one receive and one completion a side. The
 * child receives
 * in place (barlink_release_and_recv_message: each message given back as
 * the next is received, in one call, as the Rust link's recv_into hands
 * its last buffer back; no copy after the checked one) or, with --recv copy,
 * with barlink_recv into its own buffer; it checks the first and last
 * bytes of every message; or, with --recv posted, into its own pool, where
 * it keeps receives posted ahead (barlink_post_recv) and takes each with
 * barlink_wait_completion, oldest first, as a server lends its buffers.
 * Default config throughout (barlink_config_init);
 * --progress-thread sets BARLINK_CONFIG_PROGRESS_THREAD on both sides, so
 * each link has a thread of its own moving packets while the caller copies.
 *
 *   ffi_bench [--sizes 64,4096,65536,1048576,16777216] [--windows 5]
 *             [--bytes-per-window 67108864] [--lat-iters 500] [--json]
 *             [--modes c-send,c-post-send,c-post-send-buffer]
 *             [--recv in-place|copy|posted] [--progress-thread]
 *
 * scripts/ffi-bench.sh builds it and runs it beside `barlink bench --paths
 * barlink` (the Rust link) in the same run, for the ratios. One JSON object
 * per line with --json: path, size_bytes, gbps, lat_p50_us, progress_thread,
 * recv, and messages_lent and messages_copied (barlink_get_stats over the
 * mode's timed windows: whether a blocking send lent its bytes or copied
 * them, which says which Rust path it compares with).
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "barlink.h"

#define TIMEOUT_MS 60000
#define MAX_SIZES 32
#define IN_FLIGHT 64

enum mode { BLOCKING, POSTED, REGISTERED, MODES };
static const char *mode_names[MODES] = {"c-send", "c-post-send", "c-post-send-buffer"};

static size_t sizes[MAX_SIZES] = {64, 4096, 65536, 1048576, 16777216};
static int size_count = 5;
static int windows = 5;
static size_t bytes_per_window = 64u << 20;
static int lat_iters = 500;
static int json = 0;
/* The modes measured, in turn within each window. */
static enum mode modes[MODES] = {BLOCKING, POSTED, REGISTERED};
static int mode_count = MODES;
/* How both sides receive: in place, copied into their buffer, or into
 * receives posted ahead. */
enum recv_how { RECV_IN_PLACE, RECV_COPY, RECV_POSTED, RECV_HOWS };
static const char *recv_names[RECV_HOWS] = {"in-place", "copy", "posted"};
static enum recv_how recv_how = RECV_IN_PLACE;
/* Both sides' config: the defaults, or with a progress thread. */
static barlink_config config;
static int progress_thread = 0;

static void die(const char *what, barlink_status status) {
    fprintf(stderr, "ffi_bench: %s: %s (%s)\n", what, barlink_status_string(status),
            barlink_last_error());
    exit(1);
}

#define TRY(what, call)                         \
    do {                                        \
        barlink_status s_ = (call);             \
        if (s_ != BARLINK_OK) die((what), s_);  \
    } while (0)

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int compare(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *values, int n) {
    qsort(values, (size_t)n, sizeof *values, compare);
    return values[n / 2];
}

static size_t count_for(size_t size) {
    size_t n = bytes_per_window / size;
    return n < 16 ? 16 : n;
}

static void fill(unsigned char *buf, size_t len) {
    for (size_t i = 0; i < len; i++) buf[i] = (unsigned char)(i * 131 + 7);
}

/* The message received in place last, held until the next receive (or
 * release_held) gives it back, as the Rust bench's receiver hands its
 * last buffer back when it next receives (`recv_into`), before it waits:
 * in both benches the answering side gives back after it has answered.
 * barlink_release_and_recv_message gives it back and receives the next in
 * one call; a zeroed message (id 0) holds nothing. */
static barlink_message held;

static void release_held(barlink_link *link) {
    if (held.id != 0) {
        TRY("release_message", barlink_release_message(link, &held));
        memset(&held, 0, sizeof held);
    }
}

/* --recv posted: a pool of slots, each of one message's size, that take
 * the next messages in turn. A slot is posted again, while messages are
 * still to come, when the next receive begins: after its message was
 * checked and answered, as a server lends a buffer back once done with
 * it, so that no post lies between a message and its answer. The receives
 * posted run ahead of the messages arriving and none is left over. */
static unsigned char *pool;
static size_t pool_bytes;
static uint64_t slot_request[IN_FLIGHT];
static size_t slot_size, slot_count, slot_next, posts_left, outstanding;
static int slot_to_post = -1; /* a slot whose message was taken */

static void post_slot(barlink_link *link, size_t slot) {
    TRY("post_recv", barlink_post_recv(link, pool + slot * slot_size, slot_size, slot,
                                       &slot_request[slot]));
    posts_left--;
    outstanding++;
}

/* The pool of a process (after the fork: its pages are its own): 4 MiB,
 * or two of the largest messages if more, touched now, so that no first
 * write of a page falls in a timed window. Small enough to stay in cache
 * as the Rust link's reused buffers do: this measures the calls, not
 * memory. A pool of 32 MiB (32 slots at 1 MiB) ran at half the speed. */
static void make_pool(size_t max) {
    if (recv_how != RECV_POSTED) return;
    pool_bytes = max * 2 > (4u << 20) ? max * 2 : (4u << 20);
    pool = malloc(pool_bytes);
    if (!pool) die("allocating the posted receives' pool", BARLINK_OUT_OF_MEMORY);
    memset(pool, 0, pool_bytes);
}

/* Readies the receives of the next `count` messages of `size` bytes: as
 * many posted now as the pool has slots, the rest as slots come back. */
static void expect_messages(barlink_link *link, size_t size, size_t count) {
    if (recv_how != RECV_POSTED) return;
    if (outstanding != 0 || slot_to_post >= 0) die("posted receives left over", BARLINK_INTERNAL);
    slot_size = size;
    slot_count = pool_bytes / size;
    if (slot_count > IN_FLIGHT) slot_count = IN_FLIGHT;
    slot_next = 0;
    posts_left = count;
    for (size_t slot = 0; slot < slot_count && posts_left > 0; slot++) post_slot(link, slot);
}

/* Receives the next message: copied into `buf`; in a posted slot; or in
 * place, held until the next call. The last two copy its first and last
 * bytes into `buf`, where the checks read them. Returns its length. */
static size_t receive(barlink_link *link, unsigned char *buf, size_t max) {
    size_t len = 0;
    if (recv_how == RECV_POSTED) {
        size_t slot = slot_next;
        barlink_completion done;
        if (slot_to_post >= 0) post_slot(link, (size_t)slot_to_post);
        slot_to_post = -1;
        if (outstanding == 0) die("a receive with none posted", BARLINK_INTERNAL);
        TRY("wait_completion",
            barlink_wait_completion(link, slot_request[slot], TIMEOUT_MS, &done));
        outstanding--;
        slot_next = (slot + 1) % slot_count;
        len = done.bytes;
        if (len > max) die("a message longer than the largest size", BARLINK_BUFFER_TOO_SMALL);
        if (len > 0) {
            buf[0] = pool[slot * slot_size];
            buf[len - 1] = pool[slot * slot_size + len - 1];
        }
        if (posts_left > 0) slot_to_post = (int)slot;
        return len;
    }
    if (recv_how == RECV_COPY) {
        TRY("recv", barlink_recv(link, buf, max, &len, TIMEOUT_MS));
        return len;
    }
    TRY("release_and_recv_message", barlink_release_and_recv_message(link, &held, TIMEOUT_MS));
    len = held.len;
    if (len > max) die("a message longer than the largest size", BARLINK_BUFFER_TOO_SMALL);
    if (len > 0) {
        buf[0] = ((const unsigned char *)held.data)[0];
        buf[len - 1] = ((const unsigned char *)held.data)[len - 1];
    }
    return len;
}

/* Posts one send of `len` bytes in a non-blocking mode: copied from
 * `data`, or zero-copy from the start of `registered`. */
static barlink_status post_one(barlink_link *link, enum mode mode, const unsigned char *data,
                               barlink_buffer *registered, size_t len, uint64_t tag,
                               uint64_t *request) {
    return mode == POSTED ? barlink_post_send(link, data, len, tag, request)
                          : barlink_post_send_buffer(link, registered, 0, len, tag, request);
}

/* Sends one message of a latency round trip in `mode`. A posted send's
 * request id goes to `*request` (0 for a blocking send), for the caller
 * to take its completion once the answer (which acknowledges it) is in.
 * `registered` holds the bytes of a zero-copy send. */
static void send_turn(barlink_link *link, enum mode mode, const unsigned char *data,
                      barlink_buffer *registered, size_t len, uint64_t *request) {
    *request = 0;
    if (mode == BLOCKING) {
        TRY("send (latency)", barlink_send(link, data, len, TIMEOUT_MS));
        return;
    }
    /* Read at the first full queue: a post that goes at once reads no
     * clock, as the blocking send reads none. */
    double deadline = 0;
    for (;;) {
        barlink_status s = post_one(link, mode, data, registered, len, 0, request);
        if (s == BARLINK_OK) return;
        if (s != BARLINK_WOULD_BLOCK) die("post_send (latency)", s);
        if (deadline == 0) deadline = now() + TIMEOUT_MS / 1000.0;
        if (now() > deadline) die("post_send (latency): no room within the timeout", BARLINK_TIMEOUT);
        /* Progress only: the completions stay for the barlink_wait of
         * their own round trip. */
        TRY("progress (latency)", barlink_progress(link));
    }
}

/* The receiver: for every size, windows of each mode (count messages, then
 * a one-byte "got them"), then each mode's latency round trips, answered
 * the way the mode sends. */
static void child(const char *name, unsigned char *buf, size_t max) {
    barlink_link *link = NULL;
    make_pool(max);
    TRY("connect", barlink_connect(name, &config, TIMEOUT_MS, &link));
    /* Zero-copy answers come from memory of their own: `buf` takes each
     * message's checked bytes while the last answer may still be read. */
    unsigned char *answers = malloc(max);
    if (!answers) die("allocating the answers' buffer", BARLINK_OUT_OF_MEMORY);
    fill(answers, max);
    barlink_buffer *registered = NULL;
    TRY("register_buffer", barlink_register_buffer(answers, max, &registered));
    /* A posted answer, until the next message (which acknowledges it) is in. */
    uint64_t pending = 0;
    unsigned char expect[2];
    for (int s = 0; s < size_count; s++) {
        size_t size = sizes[s], count = count_for(size), len = 0;
        fill(buf, size);
        expect[0] = buf[0];
        expect[1] = buf[size - 1];
        for (int w = 0; w < windows * mode_count; w++) {
            expect_messages(link, size, count);
            for (size_t i = 0; i < count; i++) {
                len = receive(link, buf, max);
                if (len != size || buf[0] != expect[0] || buf[size - 1] != expect[1]) {
                    fprintf(stderr, "ffi_bench: message of %zu bytes arrived wrong\n", size);
                    exit(1);
                }
            }
            TRY("send ack", barlink_send(link, "k", 1, TIMEOUT_MS));
        }
        for (int k = 0; k < mode_count; k++) {
            expect_messages(link, size, (size_t)lat_iters);
            for (int i = 0; i < lat_iters; i++) {
                len = receive(link, buf, max);
                uint64_t answered = pending;
                send_turn(link, modes[k], modes[k] == REGISTERED ? answers : buf, registered, len,
                          &pending);
                if (answered != 0)
                    TRY("an answer's completion", barlink_wait(link, answered, TIMEOUT_MS));
            }
        }
    }
    release_held(link);
    TRY("flush", barlink_flush(link, TIMEOUT_MS));
    if (pending != 0) TRY("the last answer's completion", barlink_test(link, pending));
    /* The parent closes first; answering until then lets its close finish. */
    size_t len = 0;
    barlink_status s = barlink_recv(link, buf, max, &len, TIMEOUT_MS);
    if (s != BARLINK_CLOSED) die("waiting for the parent's close", s);
    barlink_close(link, 1000);
    barlink_deregister_buffer(registered);
    free(answers);
    free(pool);
}

/* The link's counters now. */
static barlink_stats stats_of(barlink_link *link) {
    barlink_stats stats;
    memset(&stats, 0, sizeof stats);
    stats.struct_size = sizeof stats;
    TRY("get_stats", barlink_get_stats(link, &stats));
    return stats;
}

/* Sends one window in `mode`; returns when the child confirmed it. */
static void window(barlink_link *link, enum mode mode, const unsigned char *data,
                   barlink_buffer *registered, size_t size, size_t count) {
    uint64_t request;
    size_t in_flight = 0, got, len;
    barlink_completion done[IN_FLIGHT];
    unsigned char ack[8];
    double deadline = now() + TIMEOUT_MS / 1000.0; /* nothing waits forever */
    for (size_t i = 0; i < count; i++) {
        if (mode == BLOCKING) {
            TRY("send", barlink_send(link, data, size, TIMEOUT_MS));
            continue;
        }
        for (;;) {
            barlink_status s = post_one(link, mode, data, registered, size, i, &request);
            if (s == BARLINK_OK && ++in_flight < IN_FLIGHT) break;
            if (s != BARLINK_OK && s != BARLINK_WOULD_BLOCK) die("post_send", s);
            if (now() > deadline) die("a window's posts (no completions within the timeout)", BARLINK_TIMEOUT);
            TRY("poll", barlink_poll(link, done, IN_FLIGHT, &got));
            for (size_t c = 0; c < got; c++)
                if (done[c].status != BARLINK_OK) die("a posted send", done[c].status);
            in_flight -= got;
            if (s == BARLINK_OK) break;
        }
    }
    TRY("recv ack", barlink_recv(link, ack, sizeof ack, &len, TIMEOUT_MS));
    while (in_flight > 0) {
        if (now() > deadline) die("a window's last completions", BARLINK_TIMEOUT);
        TRY("poll", barlink_poll(link, done, IN_FLIGHT, &got));
        in_flight -= got;
    }
}

static void parse(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json")) {
            json = 1;
        } else if (!strcmp(argv[i], "--progress-thread")) {
            progress_thread = 1;
        } else if (i + 1 < argc && !strcmp(argv[i], "--sizes")) {
            size_count = 0;
            for (char *p = strtok(argv[++i], ","); p && size_count < MAX_SIZES; p = strtok(NULL, ","))
                sizes[size_count++] = strtoull(p, NULL, 10);
        } else if (i + 1 < argc && !strcmp(argv[i], "--windows")) {
            windows = atoi(argv[++i]);
        } else if (i + 1 < argc && !strcmp(argv[i], "--bytes-per-window")) {
            bytes_per_window = strtoull(argv[++i], NULL, 10);
        } else if (i + 1 < argc && !strcmp(argv[i], "--lat-iters")) {
            lat_iters = atoi(argv[++i]);
        } else if (i + 1 < argc && !strcmp(argv[i], "--recv")) {
            const char *how = argv[++i];
            int r = 0;
            while (r < RECV_HOWS && strcmp(how, recv_names[r])) r++;
            if (r == RECV_HOWS) {
                fprintf(stderr, "ffi_bench: --recv takes in-place, copy or posted\n");
                exit(2);
            }
            recv_how = (enum recv_how)r;
        } else if (i + 1 < argc && !strcmp(argv[i], "--modes")) {
            mode_count = 0;
            for (char *p = strtok(argv[++i], ","); p; p = strtok(NULL, ",")) {
                int m = 0;
                while (m < MODES && strcmp(p, mode_names[m])) m++;
                if (m == MODES || mode_count == MODES) {
                    fprintf(stderr, "ffi_bench: --modes takes c-send, c-post-send, c-post-send-buffer\n");
                    exit(2);
                }
                modes[mode_count++] = (enum mode)m;
            }
        } else {
            fprintf(stderr, "usage: ffi_bench [--sizes N,N..] [--windows N] "
                            "[--bytes-per-window N] [--lat-iters N] [--json] [--modes M,M..]\n"
                            "                 [--recv in-place|copy|posted] [--progress-thread]\n");
            exit(2);
        }
    }
    for (int s = 0; s < size_count; s++)
        if (sizes[s] < 2) { fprintf(stderr, "ffi_bench: sizes must be at least 2\n"); exit(2); }
    if (windows < 1 || lat_iters < 1 || size_count < 1 || mode_count < 1) {
        fprintf(stderr, "ffi_bench: --windows, --lat-iters, --sizes and --modes need at least 1\n");
        exit(2);
    }
}

int main(int argc, char **argv) {
    parse(argc, argv);
    TRY("config_init", barlink_config_init(&config));
    if (progress_thread) config.flags |= BARLINK_CONFIG_PROGRESS_THREAD;
    size_t max = 0;
    for (int s = 0; s < size_count; s++) max = sizes[s] > max ? sizes[s] : max;
    unsigned char *data = malloc(max), *back = malloc(max);
    if (!data || !back) return 1;

    char name[64];
    snprintf(name, sizeof name, "ffi-bench-%d", (int)getpid());
    barlink_listener *listener = NULL;
    TRY("listen", barlink_listen(name, &config, &listener));
    pid_t pid = fork();
    if (pid == 0) {
        child(name, back, max);
        _exit(0);
    }
    barlink_link *link = NULL;
    make_pool(max);
    TRY("accept", barlink_accept(listener, TIMEOUT_MS, &link));
    TRY("listener_close", barlink_listener_close(listener));
    barlink_buffer *registered = NULL;
    TRY("register_buffer", barlink_register_buffer(data, max, &registered));
    if (!json) {
        printf("# ffi_bench: barlink's C ABI (%s), default config%s, two processes, receiving %s\n",
               barlink_version(), progress_thread ? " with a progress thread" : "",
               recv_how == RECV_IN_PLACE ? "in place"
               : recv_how == RECV_COPY   ? "by copy"
                                         : "into receives posted ahead");
        printf("# %10s  %-20s %9s %12s %6s\n", "size", "path", "GB/s", "lat p50 us", "lent");
    }
    double gbps[MODES][64], lat_p50[MODES];
    /* Of the messages of each mode's timed windows: lent, and copied. */
    uint64_t lent[MODES], copied[MODES];
    double *lat = malloc((size_t)lat_iters * sizeof *lat);
    if (!lat) die("allocating the latency samples", BARLINK_OUT_OF_MEMORY);
    for (int s = 0; s < size_count; s++) {
        size_t size = sizes[s], count = count_for(size), len;
        fill(data, size);
        memset(lent, 0, sizeof lent);
        memset(copied, 0, sizeof copied);
        for (int w = 0; w < windows; w++) {
            for (int k = 0; k < mode_count; k++) { /* the modes take turns */
                /* Untimed: a message counts as lent once acknowledged,
                 * so none of an earlier mode's (or of the latency pings')
                 * may still be on its way before a window, nor of the
                 * window's after it. */
                TRY("flush", barlink_flush(link, TIMEOUT_MS));
                barlink_stats before = stats_of(link);
                double t0 = now();
                window(link, modes[k], data, registered, size, count);
                gbps[modes[k]][w % 64] = (double)(size * count) / (now() - t0) / 1e9;
                TRY("flush", barlink_flush(link, TIMEOUT_MS));
                barlink_stats after = stats_of(link);
                lent[modes[k]] += after.messages_lent - before.messages_lent;
                copied[modes[k]] += after.messages_copied - before.messages_copied;
            }
        }
        for (int k = 0; k < mode_count; k++) {
            uint64_t request = 0, last = 0;
            expect_messages(link, size, (size_t)lat_iters);
            for (int i = 0; i < lat_iters; i++) {
                double t0 = now();
                send_turn(link, modes[k], data, registered, size, &request);
                /* The last ping's completion, which its answer brought,
                 * is taken while this one is on its way. */
                if (last != 0) TRY("a ping's completion", barlink_wait(link, last, TIMEOUT_MS));
                last = request;
                /* The answer is taken as the child takes every message (in
                 * place, copied, or posted ahead, as --recv says), as the
                 * Rust bench's parent takes its answers in the engine's
                 * buffers. */
                len = receive(link, back, max);
                if (len != size) die("an answer of another length", BARLINK_INTERNAL);
                lat[i] = (now() - t0) / 2 * 1e6;
            }
            if (last != 0) TRY("the last ping's completion", barlink_wait(link, last, TIMEOUT_MS));
            lat_p50[modes[k]] = median(lat, lat_iters);
        }
        /* The next size's windows take their acks with barlink_recv: give
         * the last answer back before them, untimed. */
        release_held(link);
        for (int k = 0; k < mode_count; k++) {
            int m = modes[k];
            double g = median(gbps[m], windows < 64 ? windows : 64);
            if (json)
                printf("{\"path\":\"%s\",\"size_bytes\":%zu,\"gbps\":%.3f,\"lat_p50_us\":%.3f,"
                       "\"progress_thread\":%s,\"recv\":\"%s\",\"messages_lent\":%llu,"
                       "\"messages_copied\":%llu}\n",
                       mode_names[m], size, g, lat_p50[m], progress_thread ? "true" : "false",
                       recv_names[recv_how], (unsigned long long)lent[m],
                       (unsigned long long)copied[m]);
            else if (lent[m] + copied[m] == 0) /* zero copy: neither */
                printf("  %10zu  %-20s %9.2f %12.2f %6s\n", size, mode_names[m], g, lat_p50[m], "-");
            else
                printf("  %10zu  %-20s %9.2f %12.2f %5.0f%%\n", size, mode_names[m], g, lat_p50[m],
                       100.0 * (double)lent[m] / (double)(lent[m] + copied[m]));
        }
        fflush(stdout);
    }
    release_held(link);
    TRY("flush", barlink_flush(link, TIMEOUT_MS));
    TRY("close", barlink_close(link, TIMEOUT_MS));
    int status = 0;
    waitpid(pid, &status, 0);
    barlink_deregister_buffer(registered);
    free(data);
    free(back);
    free(pool);
    free(lat);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        fprintf(stderr, "ffi_bench: the receiving process failed\n");
        return 1;
    }
    return 0;
}
