/*
 * Misuse of the barlink C ABI from C: NULL, forged, closed and wrong-kind
 * handles, double close, use after close, buffers too small, bad arguments.
 * Every case must return the documented status with a message, never crash.
 * scripts/ffi-test.sh builds this with gcc (also under ASan+UBSan) and runs
 * it; it forks a peer process that connects and echoes.
 *
 * Prints one line per check and "misuse: N passed, M failed"; exits 1 on a
 * failure.
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "barlink.h"

static int passed, failed;

/* Checks a status, and that a failure left a message (and success none). */
static void check(const char *what, barlink_status got, barlink_status want) {
    const char *message = barlink_last_error();
    int ok = got == want && message != NULL &&
             (want == BARLINK_OK ? message[0] == '\0' : message[0] != '\0');
    if (ok) {
        passed++;
        printf("ok   %-58s %s\n", what, want == BARLINK_OK ? "" : message);
    } else {
        failed++;
        printf("FAIL %-58s got %d (%s), want %d; message: %s\n", what, (int)got,
               barlink_status_string((int)got), (int)want, message ? message : "(NULL)");
    }
}

static void check_true(const char *what, int condition) {
    if (condition) {
        passed++;
        printf("ok   %s\n", what);
    } else {
        failed++;
        printf("FAIL %s\n", what);
    }
}

/* The peer: connects, sends one 1000-byte message, then echoes every message
 * until the link ends. */
static int peer(const char *name) {
    barlink_link *link = NULL;
    barlink_status s = barlink_connect(name, NULL, 10000, &link);
    if (s != BARLINK_OK) {
        fprintf(stderr, "peer: connect: %s\n", barlink_last_error());
        return 1;
    }
    char message[1000];
    for (int i = 0; i < 1000; i++) message[i] = (char)(i * 7);
    if (barlink_send(link, message, sizeof message, 5000) != BARLINK_OK) {
        fprintf(stderr, "peer: send: %s\n", barlink_last_error());
        return 1;
    }
    char buf[4096];
    for (;;) {
        size_t len = 0;
        s = barlink_recv(link, buf, sizeof buf, &len, 10000);
        if (s == BARLINK_CLOSED) break;
        if (s != BARLINK_OK) {
            fprintf(stderr, "peer: recv: %s\n", barlink_last_error());
            barlink_close(link, 0);
            return 1;
        }
        if (barlink_send(link, buf, len, 5000) != BARLINK_OK) {
            fprintf(stderr, "peer: send: %s\n", barlink_last_error());
            return 1;
        }
    }
    barlink_close(link, 1000);
    return 0;
}

/* A free TCP port on loopback (bound and released: the listener takes it). */
static int free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in addr;
    memset(&addr, 0, sizeof addr);
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t size = sizeof addr;
    if (fd < 0 || bind(fd, (struct sockaddr *)&addr, sizeof addr) != 0 ||
        getsockname(fd, (struct sockaddr *)&addr, &size) != 0)
        return -1;
    close(fd);
    return ntohs(addr.sin_port);
}

/* A TCP peer that exits while this side sends to it. Its socket closes
 * cleanly (nothing unread), so a write after the kernel's reset is EPIPE:
 * that must be an error the link reports (BARLINK_PEER_LOST once the peer
 * timeout passes), never SIGPIPE, which this program leaves at its default
 * as a server embedding the library may. */
static void tcp_peer_gone(const barlink_config *config) {
    char name[64];
    int port = free_port();
    check_true("a free TCP port (for a peer that exits)", port > 0);
    snprintf(name, sizeof name, "tcp://127.0.0.1:%d", port);
    barlink_config quick = *config;
    quick.peer_timeout_ms = 500;
    barlink_listener *listener = NULL;
    setenv("BARLINK_PSK", "6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b", 1);
    barlink_status listening = barlink_listen(name, &quick, &listener);
    check("listen(tcp://, for a peer that exits)", listening, BARLINK_OK);
    if (listening != BARLINK_OK) return;
    pid_t peer = fork();
    if (peer == 0) {
        barlink_link *mine = NULL;
        char byte = 0;
        size_t got = 0;
        if (barlink_connect(name, &quick, 10000, &mine) != BARLINK_OK) _exit(1);
        if (barlink_recv(mine, &byte, 1, &got, 10000) != BARLINK_OK) _exit(2);
        /* The answer carries the acknowledgement; then nothing is left
         * unread here, so the kernel ends the connection with a FIN. */
        if (barlink_send(mine, "k", 1, 10000) != BARLINK_OK) _exit(3);
        _exit(0); /* no close: the kernel closes the socket */
    }
    unsetenv("BARLINK_PSK");
    barlink_link *link = NULL;
    check("accept a TCP peer that will exit", barlink_accept(listener, 10000, &link), BARLINK_OK);
    check("send it one byte", barlink_send(link, "x", 1, 5000), BARLINK_OK);
    char answer = 0;
    size_t got = 0;
    check("its answer", barlink_recv(link, &answer, 1, &got, 5000), BARLINK_OK);
    int status = 0;
    waitpid(peer, &status, 0);
    check_true("the TCP peer took its byte and exited 0",
               WIFEXITED(status) && WEXITSTATUS(status) == 0);
    signal(SIGPIPE, SIG_DFL);
    size_t size = (size_t)1 << 20;
    char *block = calloc(1, size);
    barlink_status result = BARLINK_OK;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int i = 0; i < 256 && result == BARLINK_OK; i++)
        result = barlink_send(link, block, size, 5000);
    if (result == BARLINK_OK) result = barlink_flush(link, 5000);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    free(block);
    check("sending 1 MiB messages to a TCP peer that exited (no SIGPIPE)", result,
          BARLINK_PEER_LOST);
    check_true("reported within 5 s (peer timeout 500 ms)", t1.tv_sec - t0.tv_sec < 5);
    char spare[64];
    barlink_buffer *buffer = NULL;
    check("register_buffer (beside a lost link)", barlink_register_buffer(spare, sizeof spare, &buffer),
          BARLINK_OK);
    check("link_register_buffer(link whose peer was lost)",
          barlink_link_register_buffer(link, buffer), BARLINK_PEER_LOST);
    check("deregister_buffer (beside a lost link)", barlink_deregister_buffer(buffer), BARLINK_OK);
    check("close the link to the exited peer", barlink_close(link, 1000), BARLINK_OK);
    check("listener_close (tcp, peer exited)", barlink_listener_close(listener), BARLINK_OK);
}

/* Peers by address: a listener on tcp://127.0.0.1:PORT serves two peers in
 * turn, each link says its path, and what is wrong with an address or with
 * the setup's keys is a clear status. */
static void tcp_peers(const barlink_config *config) {
    char name[64], path[512];
    size_t len = 0;
    barlink_listener *listener = NULL;
    int port = free_port();
    check_true("a free TCP port", port > 0);
    snprintf(name, sizeof name, "tcp://127.0.0.1:%d", port);
    unsetenv("BARLINK_PSK");
    check("listen(tcp://) without a key", barlink_listen(name, config, &listener),
          BARLINK_INVALID_ARGUMENT);
    check_true("the refusal says how to configure a key",
               strstr(barlink_last_error(), "BARLINK_PSK_FILE") != NULL);
    setenv("BARLINK_PSK", "6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b", 1);
    check("listen(tcp://127.0.0.1:PORT)", barlink_listen(name, config, &listener), BARLINK_OK);
    check("listener_path", barlink_listener_path(listener, path, sizeof path, &len), BARLINK_OK);
    check_true("the listener's path is tcp, with its reason",
               strncmp(path, "tcp: ", 5) == 0 && strstr(path, "pre-shared key") != NULL);
    for (int round = 0; round < 2; round++) {
        pid_t client = fork();
        if (client == 0) {
            barlink_link *mine = NULL;
            char message[70000];
            memset(message, 'a' + round, sizeof message);
            if (barlink_connect(name, config, 10000, &mine) != BARLINK_OK) _exit(1);
            if (barlink_send(mine, message, sizeof message, 10000) != BARLINK_OK) _exit(2);
            size_t got = 0;
            if (barlink_recv(mine, message, sizeof message, &got, 10000) != BARLINK_OK) _exit(3);
            char mine_path[512];
            if (barlink_link_path(mine, mine_path, sizeof mine_path, &got) != BARLINK_OK ||
                strncmp(mine_path, "tcp: ", 5) != 0)
                _exit(4);
            barlink_close(mine, 5000);
            _exit(0);
        }
        barlink_link *link = NULL;
        check("accept a peer over TCP", barlink_accept(listener, 10000, &link), BARLINK_OK);
        char *message = malloc(70000);
        check("recv 70000 bytes over TCP", barlink_recv(link, message, 70000, &len, 10000),
              BARLINK_OK);
        check_true("the message arrived whole", len == 70000 && message[0] == 'a' + round &&
                                                     message[69999] == 'a' + round);
        free(message);
        check("reply", barlink_send(link, "ok", 2, 5000), BARLINK_OK);
        check("link_path(capacity 4)", barlink_link_path(link, path, 4, &len),
              BARLINK_BUFFER_TOO_SMALL);
        check_true("link_path says the size it needs", len > 4);
        check("link_path", barlink_link_path(link, path, sizeof path, &len), BARLINK_OK);
        check_true("the accepted link's path is tcp", strncmp(path, "tcp: ", 5) == 0 &&
                                                          strlen(path) + 1 == len);
        check("flush", barlink_flush(link, 10000), BARLINK_OK);
        int status = 0;
        waitpid(client, &status, 0);
        check_true("the TCP peer got its reply, its path said tcp, and it exited 0",
                   WIFEXITED(status) && WEXITSTATUS(status) == 0);
        barlink_close(link, 1000);
    }
    /* Long blocking sends over TCP: the link reads the sender's bytes in
     * place until the peer acknowledges them, or copies them before the
     * call returns; either way the sender overwrites its buffer at once
     * and every byte arrives as it was sent. (The TCP medium keeps each
     * packet it sends until its socket takes it, so a missing copy would
     * not show here: ffi/tests/abi.rs checks that over shared memory.) */
    enum { LONG = 2 << 20, LONG_SENDS = 3 };
    pid_t client = fork();
    if (client == 0) {
        barlink_link *mine = NULL;
        unsigned char *message = malloc(LONG);
        if (!message || barlink_connect(name, config, 10000, &mine) != BARLINK_OK) _exit(1);
        for (int k = 0; k < LONG_SENDS; k++) {
            for (size_t i = 0; i < LONG; i++) message[i] = (unsigned char)(i * 7 + k * 13);
            if (barlink_send(mine, message, LONG, 10000) != BARLINK_OK) _exit(2);
            memset(message, 0xee, LONG);
        }
        size_t got = 0;
        if (barlink_recv(mine, message, LONG, &got, 10000) != BARLINK_OK) _exit(3);
        free(message);
        barlink_close(mine, 5000);
        _exit(0);
    }
    barlink_link *link = NULL;
    check("accept a peer sending long messages over TCP", barlink_accept(listener, 10000, &link),
          BARLINK_OK);
    unsigned char *long_message = malloc(LONG);
    size_t wrong = 0;
    for (int k = 0; k < LONG_SENDS; k++) {
        check("recv a long message over TCP",
              barlink_recv(link, long_message, LONG, &len, 10000), BARLINK_OK);
        for (size_t i = 0; i < LONG; i++)
            wrong += long_message[i] != (unsigned char)(i * 7 + k * 13);
    }
    free(long_message);
    check_true("long blocking sends arrived as sent, the sender's later writes unseen",
               len == LONG && wrong == 0);
    check("reply to the long sends", barlink_send(link, "ok", 2, 5000), BARLINK_OK);
    check("flush", barlink_flush(link, 10000), BARLINK_OK);
    int status = 0;
    waitpid(client, &status, 0);
    check_true("the long sender exited 0", WIFEXITED(status) && WEXITSTATUS(status) == 0);
    barlink_close(link, 1000);
    check("listen(the same port again)", barlink_listen(name, config, &(barlink_listener *){NULL}),
          BARLINK_NAME_IN_USE);
    check("listener_close (tcp)", barlink_listener_close(listener), BARLINK_OK);
    check("connect(tcp://host without a port)",
          barlink_connect("tcp://127.0.0.1", config, 1000, &(barlink_link *){NULL}),
          BARLINK_SETUP_FAILED);
    if (access("/sys/class/infiniband", F_OK) != 0) {
        check("connect(rdma://) on a host without RDMA",
              barlink_connect("rdma://127.0.0.1:18515", config, 1000, &(barlink_link *){NULL}),
              BARLINK_NOT_AVAILABLE);
        check_true("the refusal says RDMA is missing", strstr(barlink_last_error(), "RDMA") != NULL);
    }
    unsetenv("BARLINK_PSK");
}

/* BARLINK_CONFIG_PROGRESS_THREAD: a sender posts 16 MiB (four rings' worth)
 * and computes for 3 s without calling barlink; its link's own thread must
 * move the message, so the receiver has it well before the sender's next
 * call. Without the flag only the first ring's worth would go out. */
static void progress_thread(const barlink_config *base) {
    enum { BIG = 16 << 20 };
    char name[64];
    snprintf(name, sizeof name, "misuse-c-progress-%d", (int)getpid());
    barlink_config config = *base;
    config.flags |= BARLINK_CONFIG_PROGRESS_THREAD;
    barlink_listener *listener = NULL;
    check("listen (progress thread)", barlink_listen(name, &config, &listener), BARLINK_OK);
    pid_t sender = fork();
    if (sender == 0) {
        barlink_link *mine = NULL;
        if (barlink_connect(name, &config, 10000, &mine) != BARLINK_OK) _exit(1);
        char *message = malloc(BIG);
        memset(message, 0x5a, BIG);
        uint64_t request = 0;
        if (barlink_post_send(mine, message, BIG, 0, &request) != BARLINK_OK) _exit(2);
        sleep(3); /* computing: no barlink call */
        if (barlink_wait(mine, request, 10000) != BARLINK_OK) _exit(3);
        barlink_close(mine, 5000);
        free(message);
        _exit(0);
    }
    barlink_link *link = NULL;
    check("accept (progress thread)", barlink_accept(listener, 10000, &link), BARLINK_OK);
    char *got = malloc(BIG);
    size_t len = 0;
    check("recv 16 MiB while the sender computes (2.5 s)",
          barlink_recv(link, got, BIG, &len, 2500), BARLINK_OK);
    check_true("16 MiB arrived whole", len == BIG && got[0] == 0x5a && got[BIG - 1] == 0x5a);
    free(got);
    int status = 0;
    waitpid(sender, &status, 0);
    check_true("the sender's wait saw the message acknowledged",
               WIFEXITED(status) && WEXITSTATUS(status) == 0);
    check("close (progress thread)", barlink_close(link, 5000), BARLINK_OK);
    check("listener_close (progress thread)", barlink_listener_close(listener), BARLINK_OK);
    barlink_config bad = *base;
    bad.flags = 0x80;
    check("an unknown flag is still refused", barlink_listen(name, &bad, &listener),
          BARLINK_INVALID_ARGUMENT);
}

int main(void) {
    char name[64];
    snprintf(name, sizeof name, "misuse-c-%d", (int)getpid());
    pid_t child = fork();
    if (child < 0) {
        perror("fork");
        return 2;
    }
    if (child == 0) _exit(peer(name));

    /* Versions and strings. */
    check_true("barlink_version is not empty", barlink_version()[0] != '\0');
    check_true("ABI major matches the header",
               (barlink_abi_version() >> 16) == BARLINK_ABI_VERSION_MAJOR);
    check_true("status_string names unknown codes",
               strstr(barlink_status_string(12345), "UNKNOWN") != NULL &&
                   strstr(barlink_status_string(-1), "UNKNOWN") != NULL);
    check_true("status_string names BARLINK_TIMEOUT",
               strstr(barlink_status_string(BARLINK_TIMEOUT), "TIMEOUT") != NULL);

    /* NULL handles everywhere. */
    char small[16];
    size_t len = 0;
    uint64_t request = 0;
    barlink_stats stats;
    memset(&stats, 0, sizeof stats);
    stats.struct_size = sizeof stats;
    barlink_completion completions[4];
    size_t count = 0;
    check("close(NULL)", barlink_close(NULL, 0), BARLINK_INVALID_HANDLE);
    check("send(NULL link)", barlink_send(NULL, "x", 1, 0), BARLINK_INVALID_HANDLE);
    check("recv(NULL link)", barlink_recv(NULL, small, sizeof small, &len, 0),
          BARLINK_INVALID_HANDLE);
    check("post_send(NULL link)", barlink_post_send(NULL, "x", 1, 0, &request),
          BARLINK_INVALID_HANDLE);
    check("post_recv(NULL link)", barlink_post_recv(NULL, small, sizeof small, 0, &request),
          BARLINK_INVALID_HANDLE);
    check("poll(NULL link)", barlink_poll(NULL, completions, 4, &count), BARLINK_INVALID_HANDLE);
    check("test(NULL link)", barlink_test(NULL, 1), BARLINK_INVALID_HANDLE);
    check("wait(NULL link)", barlink_wait(NULL, 1, 0), BARLINK_INVALID_HANDLE);
    check("cancel(NULL link)", barlink_cancel(NULL, 1), BARLINK_INVALID_HANDLE);
    check("flush(NULL link)", barlink_flush(NULL, 0), BARLINK_INVALID_HANDLE);
    check("progress(NULL link)", barlink_progress(NULL), BARLINK_INVALID_HANDLE);
    check("get_stats(NULL link)", barlink_get_stats(NULL, &stats), BARLINK_INVALID_HANDLE);
    check("accept(NULL listener)", barlink_accept(NULL, 0, &(barlink_link *){NULL}),
          BARLINK_INVALID_HANDLE);
    check("listener_close(NULL)", barlink_listener_close(NULL), BARLINK_INVALID_HANDLE);
    char text[64];
    check("link_path(NULL link)", barlink_link_path(NULL, text, sizeof text, &len),
          BARLINK_INVALID_HANDLE);
    check("listener_path(NULL listener)", barlink_listener_path(NULL, text, sizeof text, &len),
          BARLINK_INVALID_HANDLE);
    check("link_path(forged)", barlink_link_path((barlink_link *)small, text, sizeof text, &len),
          BARLINK_INVALID_HANDLE);
    check("deregister_buffer(NULL)", barlink_deregister_buffer(NULL), BARLINK_INVALID_HANDLE);
    check("post_send_buffer(NULL, NULL)",
          barlink_post_send_buffer(NULL, NULL, 0, 1, 0, &request), BARLINK_INVALID_HANDLE);
    check("link_register_buffer(NULL, NULL)", barlink_link_register_buffer(NULL, NULL),
          BARLINK_INVALID_HANDLE);

    /* Forged handles: garbage values and pointers to real memory. */
    check("close(forged 0x1234)", barlink_close((barlink_link *)(uintptr_t)0x1234, 0),
          BARLINK_INVALID_HANDLE);
    check("progress(pointer to a stack array)", barlink_progress((barlink_link *)small),
          BARLINK_INVALID_HANDLE);
    check("deregister(pointer to heap memory)",
          barlink_deregister_buffer((barlink_buffer *)&stats), BARLINK_INVALID_HANDLE);

    /* Bad arguments. */
    barlink_listener *listener = NULL;
    check("listen(NULL name)", barlink_listen(NULL, NULL, &listener), BARLINK_INVALID_ARGUMENT);
    check("listen(empty name)", barlink_listen("", NULL, &listener), BARLINK_INVALID_ARGUMENT);
    check("listen(NULL out)", barlink_listen(name, NULL, NULL), BARLINK_INVALID_ARGUMENT);
    check("config_init(NULL)", barlink_config_init(NULL), BARLINK_INVALID_ARGUMENT);
    /* The symbol itself, as a program built against the 0.4 header calls
       it: it writes that struct's 112 bytes and nothing past them. */
    union { barlink_config config; unsigned char bytes[256]; } old_struct;
    memset(&old_struct, 0xAA, sizeof old_struct);
    check("(barlink_config_init)(a 0.4 struct)", (barlink_config_init)(&old_struct.config), BARLINK_OK);
    int untouched = old_struct.config.struct_size == 112;
    for (size_t i = 112; i < sizeof old_struct.bytes; i++) untouched &= old_struct.bytes[i] == 0xAA;
    check_true("the 0.4 symbol writes 112 bytes, struct_size 112", untouched);
    check("config_init_size(size 100)", barlink_config_init_size(&old_struct.config, 100),
          BARLINK_INVALID_ARGUMENT);
    barlink_config config;
    check("config_init", barlink_config_init(&config), BARLINK_OK);
    barlink_config bad = config;
    bad.struct_size = 0;
    check("listen(struct_size 0)", barlink_listen(name, &bad, &listener), BARLINK_INVALID_ARGUMENT);
    bad = config;
    bad.transport = BARLINK_TRANSPORT_BAR;
    check("listen(BAR transport, no windows)", barlink_listen(name, &bad, &listener),
          BARLINK_INVALID_ARGUMENT);
    check_true("the refusal names own_bar and peer_bar",
               strstr(barlink_last_error(), "own_bar and config.peer_bar") != NULL);
    bad = config;
    bad.own_bar = "0000:01:00.0/1@0+8M";
    check("listen(own_bar without peer_bar)", barlink_listen(name, &bad, &listener),
          BARLINK_INVALID_ARGUMENT);
    bad.peer_bar = "0000:02:00.0";
    check("connect(a malformed peer_bar)", barlink_connect(name, &bad, 10, &(barlink_link *){NULL}),
          BARLINK_INVALID_ARGUMENT);
    check_true("the refusal shows the form",
               strstr(barlink_last_error(), "DEVICE/BAR@OFFSET+LEN") != NULL);
    bad.peer_bar = "0000:02:00.0/1@0+8M";
    check("listen(BAR windows for a peer on another node)",
          barlink_listen("tcp://127.0.0.1:1", &bad, &listener), BARLINK_INVALID_ARGUMENT);
    /* No barlink thread runs yet: setenv cannot race a reader. */
    setenv("BARLINK_QP_TIMEOUT", "99", 1);
    check("listen(BARLINK_QP_TIMEOUT=99)", barlink_listen(name, &config, &listener),
          BARLINK_INVALID_ARGUMENT);
    check_true("the refusal names the variable",
               strstr(barlink_last_error(), "BARLINK_QP_TIMEOUT=\"99\"") != NULL);
    unsetenv("BARLINK_QP_TIMEOUT");
    bad = config;
    bad.transport = BARLINK_TRANSPORT_RDMA;
    check("listen(RDMA transport)", barlink_listen(name, &bad, &listener), BARLINK_NOT_AVAILABLE);
    bad = config;
    bad.flags = 0x40;
    check("listen(unknown flag)", barlink_listen(name, &bad, &listener), BARLINK_INVALID_ARGUMENT);
    bad = config;
    bad.mtu = 3;
    check("listen(mtu 3)", barlink_listen(name, &bad, &listener), BARLINK_INVALID_ARGUMENT);
    bad = config;
    bad.window_bytes = (uint64_t)1 << 62;
    check("listen(window_bytes 2^62)", barlink_listen(name, &bad, &listener),
          BARLINK_INVALID_ARGUMENT);
    check_true("the refusal names window_bytes",
               strstr(barlink_last_error(), "window_bytes") != NULL);
    bad = config;
    bad.window_bytes = 1000;
    check("listen(window_bytes 1000: no room for two packets)",
          barlink_listen(name, &bad, &listener), BARLINK_INVALID_ARGUMENT);
    check_true("the defaults carry a 64 KiB message in one packet", config.mtu >= 65536 + 80);
    check_true("a failed listen leaves *listener NULL", listener == NULL);
    barlink_buffer *buffer = NULL;
    check("register_buffer(NULL ptr)", barlink_register_buffer(NULL, 8, &buffer),
          BARLINK_INVALID_ARGUMENT);
    check("register_buffer(len 0)", barlink_register_buffer(small, 0, &buffer),
          BARLINK_INVALID_ARGUMENT);
    check("register_buffer(len SIZE_MAX)", barlink_register_buffer(small, SIZE_MAX, &buffer),
          BARLINK_INVALID_ARGUMENT);
    check("register_buffer(NULL out)", barlink_register_buffer(small, 8, NULL),
          BARLINK_INVALID_ARGUMENT);
    /* dma-buf registration: what is not an open dma-buf, and bad ranges. */
    buffer = (barlink_buffer *)&stats;
    check("register_dmabuf(fd -1)", barlink_register_dmabuf(-1, 0, 4096, &buffer),
          BARLINK_INVALID_ARGUMENT);
    check_true("a failed register_dmabuf leaves *buffer NULL", buffer == NULL);
    int not_dmabuf = memfd_create("barlink-misuse", MFD_CLOEXEC);
    check_true("memfd_create", not_dmabuf >= 0 && ftruncate(not_dmabuf, 8192) == 0);
    check("register_dmabuf(a memfd)", barlink_register_dmabuf(not_dmabuf, 0, 4096, &buffer),
          BARLINK_INVALID_ARGUMENT);
    check_true("the refusal says it is not a dma-buf",
               strstr(barlink_last_error(), "not a dma-buf") != NULL);
    check("register_dmabuf(len 0)", barlink_register_dmabuf(not_dmabuf, 0, 0, &buffer),
          BARLINK_INVALID_ARGUMENT);
    check("register_dmabuf(len SIZE_MAX)",
          barlink_register_dmabuf(not_dmabuf, 0, SIZE_MAX, &buffer), BARLINK_INVALID_ARGUMENT);
    check("register_dmabuf(offset UINT64_MAX, a memfd)",
          barlink_register_dmabuf(not_dmabuf, UINT64_MAX, 4096, &buffer),
          BARLINK_INVALID_ARGUMENT);
    check("register_dmabuf(NULL out)", barlink_register_dmabuf(not_dmabuf, 0, 4096, NULL),
          BARLINK_INVALID_ARGUMENT);
    close(not_dmabuf);
    check("register_dmabuf(closed fd)", barlink_register_dmabuf(not_dmabuf, 0, 4096, &buffer),
          BARLINK_INVALID_ARGUMENT);

    /* A real link. */
    check("listen", barlink_listen(name, &config, &listener), BARLINK_OK);
    barlink_listener *second = NULL;
    check("listen(same name again)", barlink_listen(name, NULL, &second), BARLINK_NAME_IN_USE);
    barlink_link *link = NULL;
    check("accept", barlink_accept(listener, 10000, &link), BARLINK_OK);
    check("listener_close", barlink_listener_close(listener), BARLINK_OK);
    check("listener_close again (double close)", barlink_listener_close(listener),
          BARLINK_INVALID_HANDLE);
    check("accept on a closed listener", barlink_accept(listener, 0, &(barlink_link *){NULL}),
          BARLINK_INVALID_HANDLE);
    check("link handle passed as a listener",
          barlink_listener_close((barlink_listener *)(void *)link), BARLINK_INVALID_HANDLE);

    /* Buffers too small: the peer's 1000-byte message. */
    check("recv(16-byte buffer)", barlink_recv(link, small, sizeof small, &len, 10000),
          BARLINK_BUFFER_TOO_SMALL);
    check_true("needed size reported (1000)", len == 1000);
    check("recv(NULL, 0) reports the size again", barlink_recv(link, NULL, 0, &len, 0),
          BARLINK_BUFFER_TOO_SMALL);
    check_true("needed size reported again (1000)", len == 1000);
    check("recv(NULL buf, capacity 8)", barlink_recv(link, NULL, 8, &len, 0),
          BARLINK_INVALID_ARGUMENT);
    check("recv(NULL len)", barlink_recv(link, small, sizeof small, NULL, 0),
          BARLINK_INVALID_ARGUMENT);
    char big[1000];
    check("recv(1000-byte buffer) gets the kept message", barlink_recv(link, big, sizeof big, &len, 0),
          BARLINK_OK);
    int intact = len == 1000;
    for (int i = 0; i < 1000 && intact; i++) intact = big[i] == (char)(i * 7);
    check_true("the kept message is intact", intact);
    check("recv with nothing to receive", barlink_recv(link, big, sizeof big, &len, 20),
          BARLINK_TIMEOUT);

    /* Sends and posts with bad arguments. */
    check("send(NULL data, len 4)", barlink_send(link, NULL, 4, 0), BARLINK_INVALID_ARGUMENT);
    check("post_send(NULL request)", barlink_post_send(link, "x", 1, 0, NULL),
          BARLINK_INVALID_ARGUMENT);
    check("post_recv(NULL request)", barlink_post_recv(link, big, sizeof big, 0, NULL),
          BARLINK_INVALID_ARGUMENT);
    check("post_recv(NULL buf, capacity 8)", barlink_post_recv(link, NULL, 8, 0, &request),
          BARLINK_INVALID_ARGUMENT);
    check_true("post_recv refused: request is 0", request == 0);
    check("post_recv(capacity past the address space)",
          barlink_post_recv(link, big, SIZE_MAX, 0, &request), BARLINK_INVALID_ARGUMENT);
    check("poll(NULL array, max 4)", barlink_poll(link, NULL, 4, &count),
          BARLINK_INVALID_ARGUMENT);
    check("poll(NULL count)", barlink_poll(link, completions, 4, NULL), BARLINK_INVALID_ARGUMENT);
    check("test(unknown request)", barlink_test(link, 999999), BARLINK_INVALID_ARGUMENT);
    check("cancel(a send's id)", barlink_cancel(link, 999999), BARLINK_INVALID_ARGUMENT);
    check("cancel(unknown receive)", barlink_cancel(link, (1ull << 63) | 999999),
          BARLINK_INVALID_ARGUMENT);
    barlink_stats tiny = {0};
    tiny.struct_size = 4;
    check("get_stats(struct_size 4)", barlink_get_stats(link, &tiny), BARLINK_INVALID_ARGUMENT);
    check("get_stats(NULL)", barlink_get_stats(link, NULL), BARLINK_INVALID_ARGUMENT);

    /* Registered buffers. */
    char *memory = malloc(65536);
    for (int i = 0; i < 65536; i++) memory[i] = (char)(i ^ (i >> 8));
    check("register_buffer", barlink_register_buffer(memory, 65536, &buffer), BARLINK_OK);
    check("post_send_buffer(range past the end)",
          barlink_post_send_buffer(link, buffer, 65000, 1000, 0, &request), BARLINK_INVALID_ARGUMENT);
    check("post_send_buffer(offset overflow)",
          barlink_post_send_buffer(link, buffer, SIZE_MAX, 2, 0, &request), BARLINK_INVALID_ARGUMENT);
    check("buffer handle passed as a link", barlink_progress((barlink_link *)(void *)buffer),
          BARLINK_INVALID_HANDLE);
    check("link_register_buffer(NULL buffer)", barlink_link_register_buffer(link, NULL),
          BARLINK_INVALID_HANDLE);
    check("link_register_buffer(handles swapped)",
          barlink_link_register_buffer((barlink_link *)(void *)buffer, (barlink_buffer *)(void *)link),
          BARLINK_INVALID_HANDLE);
    check("link_register_buffer(forged buffer)",
          barlink_link_register_buffer(link, (barlink_buffer *)(uintptr_t)0x1234),
          BARLINK_INVALID_HANDLE);
    check("link_register_buffer (a ring link needs no device registration)",
          barlink_link_register_buffer(link, buffer), BARLINK_OK);
    check("post_send_buffer(4096 bytes)",
          barlink_post_send_buffer(link, buffer, 4096, 4096, 42, &request), BARLINK_OK);
    barlink_status busy = barlink_deregister_buffer(buffer);
    /* Not acknowledged yet: that needs a round of progress on this side
       after the peer's, and nothing has driven this side since the post. */
    check("deregister while in flight", busy, BARLINK_BUSY);
    check("wait(request)", barlink_wait(link, request, 10000), BARLINK_OK);
    check("test(request) after it was reported", barlink_test(link, request),
          BARLINK_INVALID_ARGUMENT);
    check("recv the echo", barlink_recv(link, big, sizeof big, &len, 10000),
          BARLINK_BUFFER_TOO_SMALL);
    char *echo = malloc(4096);
    check("recv the echo into 4096 bytes", barlink_recv(link, echo, 4096, &len, 0), BARLINK_OK);
    check_true("the echo is intact", len == 4096 && memcmp(echo, memory + 4096, 4096) == 0);
    free(echo);
    if (busy == BARLINK_BUSY)
        check("deregister_buffer", barlink_deregister_buffer(buffer), BARLINK_OK);
    check("deregister_buffer again (double)", barlink_deregister_buffer(buffer),
          BARLINK_INVALID_HANDLE);
    check("post_send_buffer(deregistered)",
          barlink_post_send_buffer(link, buffer, 0, 1, 0, &request), BARLINK_INVALID_HANDLE);
    check("link_register_buffer(deregistered)", barlink_link_register_buffer(link, buffer),
          BARLINK_INVALID_HANDLE);
    free(memory);

    check("get_stats", barlink_get_stats(link, &stats), BARLINK_OK);
    check("link_path(NULL len)", barlink_link_path(link, big, sizeof big, NULL),
          BARLINK_INVALID_ARGUMENT);
    check("link_path(NULL buf, capacity 8)", barlink_link_path(link, NULL, 8, &len),
          BARLINK_INVALID_ARGUMENT);
    check("link_path(NULL buf, capacity 0) reports the size", barlink_link_path(link, NULL, 0, &len),
          BARLINK_BUFFER_TOO_SMALL);
    check_true("the size counts the NUL", len > 1);
    check("link handle passed as a listener (listener_path)",
          barlink_listener_path((barlink_listener *)(void *)link, big, sizeof big, &len),
          BARLINK_INVALID_HANDLE);
    check("link_path", barlink_link_path(link, big, sizeof big, &len), BARLINK_OK);
    check_true("a link name's path is host-bounce", strncmp(big, "host-bounce: ", 13) == 0);
    check_true("stats: struct_size written back", stats.struct_size == sizeof stats);
    check_true("stats: one posted message acknowledged", stats.messages_sent >= 1);

    /* Received in place: the echo read where barlink holds it and released
       once; another held when the link closes (LSan: the close frees it). */
    barlink_message held;
    check("recv_message(NULL message)", barlink_recv_message(link, NULL, 0),
          BARLINK_INVALID_ARGUMENT);
    check("recv_message(NULL link)", barlink_recv_message(NULL, &held, 0), BARLINK_INVALID_HANDLE);
    check("send for a receive in place", barlink_send(link, "in place", 8, 5000), BARLINK_OK);
    check("recv_message", barlink_recv_message(link, &held, 10000), BARLINK_OK);
    check_true("the echo is read in place", held.len == 8 && memcmp(held.data, "in place", 8) == 0);
    check("release_message", barlink_release_message(link, &held), BARLINK_OK);
    check("release_message again (double)", barlink_release_message(link, &held),
          BARLINK_INVALID_ARGUMENT);
    check("release_message(NULL)", barlink_release_message(link, NULL), BARLINK_INVALID_ARGUMENT);
    check("release_message(NULL link)", barlink_release_message(NULL, &held),
          BARLINK_INVALID_HANDLE);
    /* Given back with the next receive: a zeroed message holds nothing; a
       message not lent (changed) is refused, left as it was, nothing received. */
    barlink_message next;
    memset(&next, 0, sizeof next);
    check("release_and_recv_message(NULL message)", barlink_release_and_recv_message(link, NULL, 0),
          BARLINK_INVALID_ARGUMENT);
    check("release_and_recv_message(NULL link)", barlink_release_and_recv_message(NULL, &next, 0),
          BARLINK_INVALID_HANDLE);
    check("send for a receive that gives back", barlink_send(link, "first", 5, 5000), BARLINK_OK);
    check("release_and_recv_message (nothing held)", barlink_release_and_recv_message(link, &next, 10000),
          BARLINK_OK);
    check_true("the first echo is read in place", next.len == 5 && memcmp(next.data, "first", 5) == 0);
    check("send for the next", barlink_send(link, "second", 6, 5000), BARLINK_OK);
    check("release_and_recv_message (gives the first back)",
          barlink_release_and_recv_message(link, &next, 10000), BARLINK_OK);
    check_true("the second echo is read in place", next.len == 6 && memcmp(next.data, "second", 6) == 0);
    check("get_stats", barlink_get_stats(link, &stats), BARLINK_OK);
    check_true("stats: only the second held", stats.messages_held == 1);
    barlink_message changed = next;
    changed.id += 1000;
    check("release_and_recv_message(a message not lent)",
          barlink_release_and_recv_message(link, &changed, 0), BARLINK_INVALID_ARGUMENT);
    check_true("a refused message is left as it was", changed.data == next.data && changed.len == next.len &&
                                                            changed.id == next.id + 1000);
    check("release_message (the second)", barlink_release_message(link, &next), BARLINK_OK);
    check("send for a message held at close", barlink_send(link, "held", 4, 5000), BARLINK_OK);
    check("recv_message held at close", barlink_recv_message(link, &held, 10000), BARLINK_OK);
    check("get_stats", barlink_get_stats(link, &stats), BARLINK_OK);
    check_true("stats: one message held", stats.messages_held == 1);

    /* Posted receives: one completed with the echo, one left pending when
       the link closes (ASan: barlink writes neither after it is freed). */
    char *posted = malloc(4096);
    check("post_recv(4096 bytes)", barlink_post_recv(link, posted, 4096, 77, &request), BARLINK_OK);
    check("recv while a receive is posted", barlink_recv(link, big, sizeof big, &len, 0),
          BARLINK_BUSY);
    check("send for the posted receive", barlink_send(link, "posted!", 7, 5000), BARLINK_OK);
    barlink_completion posted_done;
    check("wait_completion(posted receive)", barlink_wait_completion(link, request, 10000, &posted_done),
          BARLINK_OK);
    check_true("the echo landed in the posted buffer", memcmp(posted, "posted!", 7) == 0);
    check_true("its completion says its length and tag",
               posted_done.request == request && posted_done.bytes == 7 && posted_done.user_tag == 77 &&
                   posted_done.status == BARLINK_OK);
    check("wait_completion(reported already)", barlink_wait_completion(link, request, 0, &posted_done),
          BARLINK_INVALID_ARGUMENT);
    check_true("a refused wait reports nothing", posted_done.request == 0 &&
                                                     posted_done.status == BARLINK_INVALID_ARGUMENT);
    check("wait_completion(NULL completion)", barlink_wait_completion(link, request, 0, NULL),
          BARLINK_INVALID_ARGUMENT);
    check("wait_completion(NULL link)", barlink_wait_completion(NULL, request, 0, &posted_done),
          BARLINK_INVALID_HANDLE);
    /* A cancelled receive's buffer is freed at once (ASan: barlink never
       writes it again); the next message lands in the receive after it. */
    char *cancelled = malloc(4096);
    uint64_t cancelled_request = 0;
    check("post_recv to cancel", barlink_post_recv(link, cancelled, 4096, 79, &cancelled_request),
          BARLINK_OK);
    check("post_recv after it", barlink_post_recv(link, posted, 4096, 80, &request), BARLINK_OK);
    check("cancel(pending receive)", barlink_cancel(link, cancelled_request), BARLINK_OK);
    free(cancelled);
    check("wait(cancelled receive)", barlink_wait(link, cancelled_request, 10000), BARLINK_CANCELED);
    check("send for the receive after it", barlink_send(link, "second", 6, 5000), BARLINK_OK);
    check("wait(receive after the cancelled one)", barlink_wait(link, request, 10000), BARLINK_OK);
    check_true("the echo landed after the cancelled receive", memcmp(posted, "second", 6) == 0);
    check("cancel(reported receive)", barlink_cancel(link, cancelled_request),
          BARLINK_INVALID_ARGUMENT);
    char *pending = malloc(4096);
    check("post_recv left pending at close", barlink_post_recv(link, pending, 4096, 78, &request),
          BARLINK_OK);

    /* Close, double close, use after close. */
    check("close", barlink_close(link, 5000), BARLINK_OK);
    free(pending);
    free(posted);
    check("close again (double close)", barlink_close(link, 0), BARLINK_INVALID_HANDLE);
    check_true("the message says it was closed", strstr(barlink_last_error(), "closed") != NULL);
    check("send after close", barlink_send(link, "x", 1, 0), BARLINK_INVALID_HANDLE);
    check("recv after close", barlink_recv(link, big, sizeof big, &len, 0), BARLINK_INVALID_HANDLE);
    check("post_send after close", barlink_post_send(link, "x", 1, 0, &request),
          BARLINK_INVALID_HANDLE);
    check("post_recv after close", barlink_post_recv(link, big, sizeof big, 0, &request),
          BARLINK_INVALID_HANDLE);
    check("poll after close", barlink_poll(link, completions, 4, &count), BARLINK_INVALID_HANDLE);
    check("cancel after close", barlink_cancel(link, request), BARLINK_INVALID_HANDLE);
    check("wait_completion after close", barlink_wait_completion(link, request, 0, &posted_done),
          BARLINK_INVALID_HANDLE);
    check("get_stats after close", barlink_get_stats(link, &stats), BARLINK_INVALID_HANDLE);
    check("link_path after close", barlink_link_path(link, big, sizeof big, &len),
          BARLINK_INVALID_HANDLE);
    check("listener_path(a closed listener)", barlink_listener_path(listener, big, sizeof big, &len),
          BARLINK_INVALID_HANDLE);
    check("version after everything", barlink_config_init(&config), BARLINK_OK);

    int status = 0;
    waitpid(child, &status, 0);
    check_true("the peer saw the close and exited 0", WIFEXITED(status) && WEXITSTATUS(status) == 0);

    /* A peer that dies mid-transfer: reported as lost within the peer
     * timeout (500 ms here), never a hang. */
    char dying_name[64];
    snprintf(dying_name, sizeof dying_name, "misuse-c-dying-%d", (int)getpid());
    barlink_config quick = config;
    quick.peer_timeout_ms = 500;
    barlink_listener *dying_listener = NULL;
    check("listen (for a peer that dies)", barlink_listen(dying_name, &quick, &dying_listener),
          BARLINK_OK);
    pid_t dying = fork();
    if (dying == 0) {
        barlink_link *mine = NULL;
        if (barlink_connect(dying_name, &quick, 10000, &mine) != BARLINK_OK) _exit(1);
        char chunk[65536] = {0};
        for (;;) barlink_send(mine, chunk, sizeof chunk, 10000); /* until killed */
    }
    barlink_link *victim = NULL;
    check("accept (a peer that will die)", barlink_accept(dying_listener, 10000, &victim),
          BARLINK_OK);
    check("recv from it while it lives", barlink_recv(victim, big, sizeof big, &len, 10000),
          BARLINK_BUFFER_TOO_SMALL);
    kill(dying, SIGKILL);
    waitpid(dying, &status, 0);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    barlink_status lost = BARLINK_OK;
    char *sink = malloc(65536);
    while (lost == BARLINK_OK || lost == BARLINK_TIMEOUT) {
        /* Messages that arrived before the death are still received. */
        lost = barlink_recv(victim, sink, 65536, &len, 200);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        if (t1.tv_sec - t0.tv_sec > 10) break;
    }
    free(sink);
    double waited = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
    check("recv after the peer was killed", lost, BARLINK_PEER_LOST);
    check_true("reported within 5 s of the kill (peer timeout 500 ms)", waited < 5.0);
    check_true("the message says the peer was lost", strstr(barlink_last_error(), "lost") != NULL);
    check("send to the dead peer", barlink_send(victim, "x", 1, 1000), BARLINK_PEER_LOST);
    check("close a link whose peer died (frees it)", barlink_close(victim, 1000), BARLINK_OK);
    check("listener_close", barlink_listener_close(dying_listener), BARLINK_OK);

    tcp_peers(&config);
    tcp_peer_gone(&config);
    progress_thread(&config);

    printf("misuse: %d passed, %d failed\n", passed, failed);
    return failed == 0 ? 0 : 1;
}
