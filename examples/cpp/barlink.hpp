// barlink.hpp: a small C++17 RAII wrapper over the barlink C API
// (ffi/include/barlink.h). Header-only; link with libbarlink_c
// (`pkg-config --cflags --libs barlink`).
//
// Ownership follows the C API (docs/FFI.md): a Link, Listener or Buffer
// owns its handle and releases it in its destructor; they are movable, not
// copyable. Destroy a Link before the Buffers it sends from (closing a link
// lets go of all their memory); a Buffer's destructor deregisters, and
// terminates the program if sends from it are still in flight (the memory
// would be freed while barlink reads it).
//
// Errors: calls throw barlink::Error for failures, and return the status for
// outcomes a caller is expected to handle (a timeout, a full queue, a buffer
// too small, an orderly close).
#pragma once

#include <cstddef>
#include <cstdint>
#include <exception>
#include <initializer_list>
#include <new>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "barlink.h"

namespace barlink {

// A failed barlink call: the status and barlink_last_error() at the time.
class Error : public std::runtime_error {
public:
    Error(barlink_status status, const std::string& message)
        : std::runtime_error(message), status_(status) {}
    barlink_status status() const noexcept { return status_; }

private:
    barlink_status status_;
};

// Throws unless `status` is OK or one of `expected`.
inline barlink_status check(barlink_status status, const char* what,
                            std::initializer_list<barlink_status> expected = {}) {
    if (status == BARLINK_OK) return status;
    for (barlink_status e : expected)
        if (status == e) return status;
    throw Error(status, std::string(what) + " failed: " + barlink_last_error());
}

inline std::string version() { return barlink_version(); }

// barlink_config with defaults, and setters that chain.
class Config {
public:
    Config() { check(barlink_config_init(&config_), "barlink_config_init"); }
    Config& mtu(uint32_t bytes) { config_.mtu = bytes; return *this; }
    Config& window_bytes(uint64_t bytes) { config_.window_bytes = bytes; return *this; }
    Config& max_message_bytes(uint64_t bytes) { config_.max_message_bytes = bytes; return *this; }
    Config& peer_timeout_ms(uint32_t ms) { config_.peer_timeout_ms = ms; return *this; }
    // Most bytes of copies kept for unacknowledged sends (0: the default).
    Config& send_queue_bytes(uint64_t bytes) { config_.send_queue_bytes = bytes; return *this; }
    Config& transport(barlink_transport t) { config_.transport = static_cast<uint32_t>(t); return *this; }
    // The BAR windows of a peer on this host, "DEVICE/BAR@OFFSET+LEN": the
    // one this side's ring lives in, then the peer's (which names them
    // swapped). Empty strings: none.
    Config& bars(std::string own, std::string peer) {
        own_bar_ = std::move(own);
        peer_bar_ = std::move(peer);
        return *this;
    }
    // Where sysfs is read (a fixture tree in tests); empty: "/".
    Config& sysfs_root(std::string root) { sysfs_root_ = std::move(root); return *this; }
    // Valid while this Config lives and is not changed.
    const barlink_config* get() const noexcept {
        auto text = [](const std::string& s) { return s.empty() ? nullptr : s.c_str(); };
        config_.own_bar = text(own_bar_);
        config_.peer_bar = text(peer_bar_);
        config_.sysfs_root = text(sysfs_root_);
        return &config_;
    }

private:
    mutable barlink_config config_{};
    std::string own_bar_, peer_bar_, sysfs_root_;
};

// Caller memory registered for zero-copy sends. The memory stays the
// caller's: keep it alive, and unmodified while sends from it are in flight.
class Buffer {
public:
    Buffer() = default;
    Buffer(const void* data, size_t len) {
        check(barlink_register_buffer(data, len, &handle_), "barlink_register_buffer");
    }
    ~Buffer() { reset(); }
    Buffer(Buffer&& other) noexcept : handle_(std::exchange(other.handle_, nullptr)) {}
    Buffer& operator=(Buffer&& other) noexcept {
        if (this != &other) {
            reset();
            handle_ = std::exchange(other.handle_, nullptr);
        }
        return *this;
    }
    Buffer(const Buffer&) = delete;
    Buffer& operator=(const Buffer&) = delete;

    // Deregisters now; throws barlink::Error (BARLINK_BUSY) while sends are
    // in flight, leaving it registered.
    void deregister() {
        if (handle_) {
            check(barlink_deregister_buffer(handle_), "barlink_deregister_buffer");
            handle_ = nullptr;
        }
    }
    barlink_buffer* get() const noexcept { return handle_; }

private:
    void reset() noexcept {
        if (!handle_) return;
        // BUSY means barlink still reads this memory for sends in flight:
        // going on would let the owner free it under barlink. Close the
        // Link first (see the top of this file).
        if (barlink_deregister_buffer(handle_) == BARLINK_BUSY) std::terminate();
        handle_ = nullptr;
    }
    barlink_buffer* handle_ = nullptr;
};

// A message received in place (Link::recv_message): read size() bytes at
// data() where barlink holds them. The next receive into the same Message
// gives it back in the same call; so do reset() and the destructor.
// Destroy or reset it before its Link is closed or moved from (closing
// gives back what is still held, and data() then dangles).
class Message {
public:
    Message() = default;
    ~Message() { reset(); }
    Message(Message&& other) noexcept
        : link_(std::exchange(other.link_, nullptr)), message_(std::exchange(other.message_, {})) {}
    Message& operator=(Message&& other) noexcept {
        if (this != &other) {
            reset();
            link_ = std::exchange(other.link_, nullptr);
            message_ = std::exchange(other.message_, {});
        }
        return *this;
    }
    Message(const Message&) = delete;
    Message& operator=(const Message&) = delete;

    const unsigned char* data() const noexcept {
        return static_cast<const unsigned char*>(message_.data);
    }
    size_t size() const noexcept { return message_.len; }
    explicit operator bool() const noexcept { return message_.id != 0; }

    // Gives the message back now.
    void reset() noexcept {
        if (link_ && message_.id != 0) barlink_release_message(link_, &message_);
        link_ = nullptr;
        message_ = {};
    }

private:
    friend class Link;
    barlink_link* link_ = nullptr;
    barlink_message message_{};
};

// A link. Every call drives its progress; nothing runs in the background.
class Link {
public:
    Link() = default;
    explicit Link(barlink_link* handle) noexcept : handle_(handle) {}
    ~Link() { close(close_timeout_ms_, std::nothrow); }
    Link(Link&& other) noexcept : handle_(std::exchange(other.handle_, nullptr)) {}
    Link& operator=(Link&& other) noexcept {
        if (this != &other) {
            close(close_timeout_ms_, std::nothrow);
            handle_ = std::exchange(other.handle_, nullptr);
        }
        return *this;
    }
    Link(const Link&) = delete;
    Link& operator=(const Link&) = delete;

    static Link connect(const std::string& name, const Config& config, uint32_t timeout_ms) {
        barlink_link* handle = nullptr;
        check(barlink_connect(name.c_str(), config.get(), timeout_ms, &handle), "barlink_connect");
        return Link(handle);
    }

    // The path the link took and why ("tcp: the peer is on another node, ...").
    std::string path() const {
        size_t len = 0;
        barlink_link_path(handle_, nullptr, 0, &len);  // BUFFER_TOO_SMALL: len is the size
        std::string text(len, '\0');
        check(barlink_link_path(handle_, text.data(), text.size(), &len), "barlink_link_path");
        text.resize(len > 0 ? len - 1 : 0);
        return text;
    }

    // Queues a copy (a long message: reads `data` in place until the peer
    // acknowledges it, else copies it); `data` is the caller's again on
    // return. OK or TIMEOUT (queue still full); a long message the link
    // dropped unacknowledged throws with the link's status.
    barlink_status send(const void* data, size_t len, uint32_t timeout_ms) {
        return check(barlink_send(handle_, data, len, timeout_ms), "barlink_send",
                     {BARLINK_TIMEOUT});
    }

    // Receives into buf: OK (len set), TIMEOUT, BUFFER_TOO_SMALL (len = the
    // size needed; the message is kept) or CLOSED (the peer closed).
    barlink_status recv(void* buf, size_t capacity, size_t& len, uint32_t timeout_ms) {
        return check(barlink_recv(handle_, buf, capacity, &len, timeout_ms), "barlink_recv",
                     {BARLINK_TIMEOUT, BARLINK_BUFFER_TOO_SMALL, BARLINK_CLOSED});
    }

    // Receives a whole message of any size into `out`.
    barlink_status recv(std::vector<unsigned char>& out, uint32_t timeout_ms) {
        size_t len = 0;
        barlink_status s = recv(out.data(), out.size(), len, timeout_ms);
        if (s == BARLINK_BUFFER_TOO_SMALL) {
            out.resize(len);
            s = recv(out.data(), out.size(), len, 0);
        }
        if (s == BARLINK_OK) out.resize(len);
        return s;
    }

    // Receives the next message in place into `message`, giving back the
    // one it held (in the same call when it is this link's): OK, TIMEOUT
    // or CLOSED (the peer closed); on any but OK `message` holds nothing.
    barlink_status recv_message(Message& message, uint32_t timeout_ms) {
        if (message.link_ != handle_) message.reset();
        message.link_ = handle_;
        return check(barlink_release_and_recv_message(handle_, &message.message_, timeout_ms),
                     "barlink_release_and_recv_message", {BARLINK_TIMEOUT, BARLINK_CLOSED});
    }

    // Registers `buffer` with this link's device now rather than at the
    // first post from it. True when posts from it go in place; false when
    // the NIC refused it (barlink_last_error() says why): posts still work,
    // through the link's staging copy.
    bool register_buffer(const Buffer& buffer) {
        barlink_status s = check(barlink_link_register_buffer(handle_, buffer.get()),
                                 "barlink_link_register_buffer", {BARLINK_NOT_AVAILABLE});
        return s == BARLINK_OK;
    }

    // Zero-copy post of a registered range; returns the request id, or 0
    // when the send queue is full (poll, then retry).
    uint64_t post(const Buffer& buffer, size_t offset, size_t len, uint64_t user_tag) {
        uint64_t request = 0;
        barlink_status s = check(
            barlink_post_send_buffer(handle_, buffer.get(), offset, len, user_tag, &request),
            "barlink_post_send_buffer", {BARLINK_WOULD_BLOCK});
        return s == BARLINK_OK ? request : 0;
    }

    // Posts a receive: the next message not yet received lands in buf (as
    // it arrives, when the buffer is posted before the message begins).
    // Returns the request id; barlink writes buf until its completion is
    // reported (poll) or the receive is cancelled.
    uint64_t post_recv(void* buf, size_t capacity, uint64_t user_tag) {
        uint64_t request = 0;
        check(barlink_post_recv(handle_, buf, capacity, user_tag, &request), "barlink_post_recv");
        return request;
    }

    // Cancels a posted receive: barlink never writes its buffer again. OK,
    // or INVALID_ARGUMENT when it had completed and its completion was
    // taken already.
    barlink_status cancel(uint64_t request) noexcept { return barlink_cancel(handle_, request); }

    // Waits at most timeout_ms for one posted request and fills `done` as
    // poll would once it is reported (a receive's length in done.bytes):
    // OK, TIMEOUT (not finished yet), BUFFER_TOO_SMALL (done.bytes = the
    // size needed) or CANCELED.
    barlink_status wait(uint64_t request, uint32_t timeout_ms, barlink_completion& done) {
        return check(barlink_wait_completion(handle_, request, timeout_ms, &done),
                     "barlink_wait_completion",
                     {BARLINK_TIMEOUT, BARLINK_BUFFER_TOO_SMALL, BARLINK_CANCELED});
    }

    // Drives the link once (moves packets and acknowledgements both ways).
    barlink_status progress() {
        return check(barlink_progress(handle_), "barlink_progress", {BARLINK_CLOSED});
    }

    // Drives progress once; appends up to 64 completions to `out`.
    size_t poll(std::vector<barlink_completion>& out) {
        barlink_completion batch[64];
        size_t count = 0;
        check(barlink_poll(handle_, batch, 64, &count), "barlink_poll");
        out.insert(out.end(), batch, batch + count);
        return count;
    }

    // Waits until every queued message is acknowledged; OK or TIMEOUT.
    barlink_status flush(uint32_t timeout_ms) {
        return check(barlink_flush(handle_, timeout_ms), "barlink_flush", {BARLINK_TIMEOUT});
    }

    barlink_stats stats() const {
        barlink_stats stats{};
        stats.struct_size = sizeof stats;
        check(barlink_get_stats(handle_, &stats), "barlink_get_stats");
        return stats;
    }

    // Closes in order (queued messages first), waiting at most timeout_ms.
    void close(uint32_t timeout_ms) {
        if (handle_) {
            barlink_status s = barlink_close(std::exchange(handle_, nullptr), timeout_ms);
            check(s, "barlink_close", {BARLINK_TIMEOUT});
        }
    }
    void close(uint32_t timeout_ms, const std::nothrow_t&) noexcept {
        if (handle_) barlink_close(std::exchange(handle_, nullptr), timeout_ms);
    }

    void set_close_timeout_ms(uint32_t ms) noexcept { close_timeout_ms_ = ms; }
    barlink_link* get() const noexcept { return handle_; }
    explicit operator bool() const noexcept { return handle_ != nullptr; }

private:
    barlink_link* handle_ = nullptr;
    uint32_t close_timeout_ms_ = 1000;
};

// The accepting side of a name.
class Listener {
public:
    Listener(const std::string& name, const Config& config) {
        check(barlink_listen(name.c_str(), config.get(), &handle_), "barlink_listen");
    }
    ~Listener() {
        if (handle_) barlink_listener_close(handle_);
    }
    Listener(Listener&& other) noexcept : handle_(std::exchange(other.handle_, nullptr)) {}
    Listener& operator=(Listener&&) = delete;
    Listener(const Listener&) = delete;
    Listener& operator=(const Listener&) = delete;

    Link accept(uint32_t timeout_ms) {
        barlink_link* link = nullptr;
        check(barlink_accept(handle_, timeout_ms, &link), "barlink_accept");
        return Link(link);
    }

private:
    barlink_listener* handle_ = nullptr;
};

}  // namespace barlink
