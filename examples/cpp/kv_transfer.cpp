// kv_transfer: a prefill process hands a request's KV cache to a decode
// process over barlink, as a disaggregated inference server does.
//
// The prefill side fills a KV pool (layers x blocks, each block the K and V
// of `block_tokens` tokens) with a seeded pattern, registers it, and posts
// one zero-copy send per block; barlink reads every block straight from the
// pool, CRC-checks every packet and retransmits what fails. The decode side
// posts a receive for each block at the block's place in its own pool
// before the block comes, so blocks land where they belong as they arrive
// (in order, exactly once, no copy after the checked one); it verifies
// every byte against the pattern, reports the verdict back, and prints the
// throughput and how many blocks landed in place.
//
//   kv_transfer [--layers N] [--blocks N] [--block-tokens N] [--name PEER]
//               [--role both|prefill|decode] [--seed S] [--inflight N]
//               [--expect-seed S] [--own-bar W --peer-bar W]
//               [--sysfs-root DIR] [--setup-timeout-ms MS]
//               [--peer-timeout-ms MS]
//
// --inflight N: sends prefill keeps in flight and receives decode keeps
// posted ahead (64).
//
// --name PEER is where decode listens and prefill connects: a link name on
// this host (the default), or tcp://HOST:PORT or rdma://HOST:PORT to run
// the two on different nodes (setup authenticated with the key file that
// BARLINK_PSK_FILE names, the same on both). Decode prints the path taken.
//
// --own-bar and --peer-bar name decode's BAR window and prefill's, as
// DEVICE/BAR@OFFSET+LEN (e.g. 0000:01:00.0/1@0+8M): two GPUs of this host
// then exchange the blocks over PCIe BARs where the topology allows it
// (prefill takes the two swapped). --sysfs-root reads sysfs elsewhere.
// --setup-timeout-ms: how long decode waits for prefill and prefill for
// decode (10 s). --peer-timeout-ms: how long the other side may be silent
// before the link counts it lost (emulated test beds are slow).
//
// --expect-seed makes decode verify against another seed than the one the
// plan names: every block then mismatches (a test that mismatches are caught).
//
// --role both (the default) forks: the child is the prefill side, the
// parent the decode side. Exit status 0 when every block arrived intact,
// 1 on any mismatch or failure.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <string>
#include <thread>
#include <vector>

#include "barlink.hpp"

namespace {

// The model's KV shape: per layer and block, K and V of `block_tokens`
// tokens x kv_heads x head_dim in fp16.
struct Plan {
    uint32_t magic = 0x4b56424c;  // "LBVK"
    uint32_t layers = 32;
    uint32_t blocks = 128;        // 2048 tokens of 16
    uint32_t block_tokens = 16;
    uint32_t kv_heads = 8;
    uint32_t head_dim = 128;
    uint64_t seed = 0x5eed;

    size_t block_bytes() const {
        return size_t(2) * block_tokens * kv_heads * head_dim * sizeof(uint16_t);
    }
    size_t total_blocks() const { return size_t(layers) * blocks; }
    size_t total_bytes() const { return total_blocks() * block_bytes(); }
};

// What decode sends back.
struct Verdict {
    uint64_t blocks_ok = 0;
    uint64_t blocks_bad = 0;
};

uint64_t splitmix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

// The pattern of block `index`: every 8-byte word differs, and depends on
// the seed, the block and the word's place.
void fill_block(const Plan& plan, size_t index, unsigned char* out) {
    uint64_t base = splitmix64(plan.seed ^ (uint64_t(index) << 32));
    size_t words = plan.block_bytes() / 8;
    for (size_t w = 0; w < words; w++) {
        uint64_t v = base + w * 0x9e3779b97f4a7c15ull;
        v ^= v >> 29;
        std::memcpy(out + w * 8, &v, 8);
    }
}

bool check_block(const Plan& plan, size_t index, const unsigned char* got,
                 std::vector<unsigned char>& scratch) {
    fill_block(plan, index, scratch.data());
    return std::memcmp(got, scratch.data(), plan.block_bytes()) == 0;
}

double seconds_since(std::chrono::steady_clock::time_point start) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Where the link goes and how: the peer's name, BAR windows when named
// (as decode sees them), how long setup may wait for the other side, and
// how long the peer may be silent (0: the default).
struct Route {
    std::string name;
    std::string decode_bar, prefill_bar, sysfs_root;
    uint32_t setup_timeout_ms = 10000;
    uint32_t peer_timeout_ms = 0;
};

barlink::Config link_config(const Route& route, bool is_decode) {
    // One packet per 64 KiB block (the 80-byte header on top); the default
    // 4 MiB rings, which stay in cache (8 MiB ones measured slower here).
    barlink::Config config;
    config.mtu(65536 + 128).sysfs_root(route.sysfs_root);
    if (route.peer_timeout_ms != 0) config.peer_timeout_ms(route.peer_timeout_ms);
    if (is_decode)
        config.bars(route.decode_bar, route.prefill_bar);
    else
        config.bars(route.prefill_bar, route.decode_bar);
    return config;
}

int prefill(const Plan& plan, const Route& route, size_t inflight) {
    std::vector<unsigned char> pool(plan.total_bytes());
    for (size_t i = 0; i < plan.total_blocks(); i++)
        fill_block(plan, i, pool.data() + i * plan.block_bytes());

    // The pool outlives the link (declared first, destroyed last); the link
    // is closed before the buffer is deregistered.
    barlink::Buffer registered(pool.data(), pool.size());
    barlink::Link link = barlink::Link::connect(route.name, link_config(route, false), route.setup_timeout_ms);
    link.set_close_timeout_ms(5000);
    // Asked at setup, not at the first post: a NIC that refuses the pool
    // says so here, and the blocks then go through the staging copy.
    if (!link.register_buffer(registered))
        std::fprintf(stderr, "prefill: %s\n", barlink_last_error());
    if (link.send(&plan, sizeof plan, 5000) != BARLINK_OK) {
        std::fprintf(stderr, "prefill: the plan could not be queued\n");
        return 1;
    }

    // Decode allocates its pool for the plan, then says it is ready. Its
    // two answers are read where barlink holds them (declared after the
    // link: given back before it closes).
    barlink::Message answer;
    if (link.recv_message(answer, 30000) != BARLINK_OK) {
        std::fprintf(stderr, "prefill: decode never said it was ready\n");
        return 1;
    }

    auto start = std::chrono::steady_clock::now();
    std::vector<barlink_completion> done;
    size_t posted = 0, completed = 0, outstanding = 0;
    while (completed < plan.total_blocks()) {
        // Post while the window allows, then collect completions.
        while (posted < plan.total_blocks() && outstanding < inflight) {
            uint64_t request =
                link.post(registered, posted * plan.block_bytes(), plan.block_bytes(), posted);
            if (request == 0) break;  // queue full: poll first
            posted++;
            outstanding++;
        }
        done.clear();
        if (link.poll(done) == 0) std::this_thread::yield();  // let the decode side run
        for (const barlink_completion& c : done) {
            if (c.status != BARLINK_OK) {
                std::fprintf(stderr, "prefill: block %" PRIu64 " failed: %s\n", c.user_tag,
                             barlink_status_string(c.status));
                return 1;
            }
            completed++;
            outstanding--;
        }
    }
    double elapsed = seconds_since(start);

    // The next receive gives "ready" back.
    barlink_status s = link.recv_message(answer, 30000);
    if (s != BARLINK_OK || answer.size() != sizeof(Verdict)) {
        std::fprintf(stderr, "prefill: no verdict from decode (%s)\n", barlink_status_string(s));
        return 1;
    }
    Verdict verdict;
    std::memcpy(&verdict, answer.data(), sizeof verdict);
    answer.reset();
    barlink_stats stats = link.stats();
    std::printf("prefill: sent %zu KV blocks (%.1f MiB) zero-copy in %.3f s: %.2f GB/s acknowledged; "
                "retransmits %" PRIu64 ", crc failures %" PRIu64 "; read in place by the NIC: %" PRIu64
                " packets\n",
                plan.total_blocks(), plan.total_bytes() / 1048576.0, elapsed,
                plan.total_bytes() / elapsed / 1e9, stats.retransmits, stats.crc_failures,
                stats.packets_sent_in_place);
    link.close(5000);
    return verdict.blocks_bad == 0 && verdict.blocks_ok == plan.total_blocks() ? 0 : 1;
}

// The receives decode has posted into its pool, oldest first. However
// decode leaves, those still pending are cancelled before the pool goes:
// barlink writes a posted buffer until its receive completes or is
// cancelled, as a server reclaims a request's KV slots when it aborts.
class PostedBlocks {
public:
    explicit PostedBlocks(barlink::Link& link) : link_(link) {}
    ~PostedBlocks() {
        for (uint64_t request : pending_) link_.cancel(request);
    }
    PostedBlocks(const PostedBlocks&) = delete;
    PostedBlocks& operator=(const PostedBlocks&) = delete;

    void post(unsigned char* slot, size_t len, uint64_t block) {
        pending_.push_back(link_.post_recv(slot, len, block));
    }
    // Receives complete in the order they were posted.
    bool completes_oldest(const barlink_completion& done) {
        if (pending_.empty() || pending_.front() != done.request) return false;
        pending_.pop_front();
        return true;
    }
    size_t size() const { return pending_.size(); }

private:
    barlink::Link& link_;
    std::deque<uint64_t> pending_;
};

int decode(const Route& route, const uint64_t* expect_seed, size_t inflight) {
    barlink::Listener listener(route.name, link_config(route, true));
    barlink::Link link = listener.accept(route.setup_timeout_ms);
    link.set_close_timeout_ms(5000);
    std::printf("decode: path %s\n", link.path().c_str());

    Plan plan;
    size_t len = 0;
    barlink_status s = link.recv(&plan, sizeof plan, len, 10000);
    if (s != BARLINK_OK || len != sizeof plan || plan.magic != Plan().magic) {
        std::fprintf(stderr, "decode: bad plan (%s, %zu bytes)\n", barlink_status_string(s), len);
        return 1;
    }
    // Every page of the pool touched before the blocks come, a slice at a
    // time with a round of progress after each: touching gigabytes takes
    // seconds, longer than prefill lets its peer stay silent.
    std::vector<unsigned char> pool;
    pool.reserve(plan.total_bytes());
    while (pool.size() < plan.total_bytes()) {
        pool.resize(pool.size() + std::min<size_t>(plan.total_bytes() - pool.size(), 64u << 20));
        link.progress();
    }
    const size_t block_bytes = plan.block_bytes();
    const uint64_t landed_before = link.stats().messages_landed;  // the plan's
    // Each block's slot in the pool is posted as a receive before its
    // block comes (up to `inflight` ahead), so barlink assembles the block
    // where it belongs, with no copy after the checked one out of the link.
    PostedBlocks posted(link);
    size_t next = 0;
    while (next < plan.total_blocks() && posted.size() < inflight) {
        posted.post(pool.data() + next * block_bytes, block_bytes, next);
        next++;
    }
    const char ready[] = "ready";
    link.send(ready, sizeof ready, 5000);

    auto start = std::chrono::steady_clock::now();
    auto last_block = start;
    std::vector<barlink_completion> done;
    size_t received = 0;
    while (received < plan.total_blocks()) {
        done.clear();
        if (link.poll(done) == 0) {
            if (seconds_since(last_block) > 10) {
                std::fprintf(stderr, "decode: no block for 10 s after block %zu\n", received);
                return 1;
            }
            std::this_thread::yield();  // let the prefill side run
            continue;
        }
        last_block = std::chrono::steady_clock::now();
        for (const barlink_completion& c : done) {
            if (!posted.completes_oldest(c) || c.status != BARLINK_OK || c.bytes != block_bytes ||
                c.user_tag != received) {
                std::fprintf(stderr, "decode: block %zu: %s (%" PRIu64 " bytes, tag %" PRIu64 ")\n",
                             received, barlink_status_string(c.status), c.bytes, c.user_tag);
                return 1;
            }
            received++;
            if (next < plan.total_blocks()) {
                posted.post(pool.data() + next * block_bytes, block_bytes, next);
                next++;
            }
        }
    }
    // One more round sends the acknowledgement of the last blocks now,
    // not with the next call after the verification below.
    link.progress();
    double elapsed = seconds_since(start);

    if (expect_seed) plan.seed = *expect_seed;
    Verdict verdict;
    std::vector<unsigned char> scratch(plan.block_bytes());
    for (size_t i = 0; i < plan.total_blocks(); i++) {
        if (check_block(plan, i, pool.data() + i * plan.block_bytes(), scratch)) {
            verdict.blocks_ok++;
        } else {
            if (verdict.blocks_bad < 5)
                std::fprintf(stderr, "decode: block %zu (layer %zu, block %zu) differs\n", i,
                             i / plan.blocks, i % plan.blocks);
            verdict.blocks_bad++;
        }
    }
    link.send(&verdict, sizeof verdict, 5000);
    link.flush(5000);
    barlink_stats stats = link.stats();
    std::printf("decode: received %zu KV blocks of %zu KiB (%u layers x %u blocks, %.1f MiB) in %.3f s: "
                "%.2f GB/s; verified %" PRIu64 " intact, %" PRIu64 " corrupted; "
                "crc failures seen %" PRIu64 "; landed in place %" PRIu64 "\n",
                plan.total_blocks(), plan.block_bytes() / 1024, plan.layers, plan.blocks,
                plan.total_bytes() / 1048576.0, elapsed, plan.total_bytes() / elapsed / 1e9,
                verdict.blocks_ok, verdict.blocks_bad, stats.crc_failures,
                stats.messages_landed - landed_before);
    // Wait for prefill to close: it has read the verdict.
    std::vector<unsigned char> rest;
    while (link.recv(rest, 10000) == BARLINK_OK) {
    }
    return verdict.blocks_bad == 0 ? 0 : 1;
}

[[noreturn]] void usage() {
    std::fprintf(stderr,
                 "usage: kv_transfer [--layers N] [--blocks N] [--block-tokens N] [--seed S]\n"
                 "                   [--inflight N] [--name NAME] [--role both|prefill|decode]\n"
                 "                   [--expect-seed S] [--own-bar W --peer-bar W]\n"
                 "                   [--sysfs-root DIR] [--setup-timeout-ms MS]\n"
                 "                   [--peer-timeout-ms MS]\n");
    std::exit(2);
}

}  // namespace

int main(int argc, char** argv) {
    Plan plan;
    std::string role = "both";
    Route route;
    route.name = "kv-transfer-" + std::to_string(getpid());
    size_t inflight = 64;
    uint64_t expect_seed = 0;
    const uint64_t* expect = nullptr;
    for (int i = 1; i < argc; i++) {
        std::string arg = argv[i];
        if (i + 1 >= argc) usage();
        const char* value = argv[++i];
        if (arg == "--layers") plan.layers = static_cast<uint32_t>(std::strtoul(value, nullptr, 10));
        else if (arg == "--blocks") plan.blocks = static_cast<uint32_t>(std::strtoul(value, nullptr, 10));
        else if (arg == "--block-tokens") plan.block_tokens = static_cast<uint32_t>(std::strtoul(value, nullptr, 10));
        else if (arg == "--seed") plan.seed = std::strtoull(value, nullptr, 0);
        else if (arg == "--expect-seed") expect_seed = std::strtoull(value, nullptr, 0), expect = &expect_seed;
        else if (arg == "--inflight") inflight = std::strtoul(value, nullptr, 10);
        else if (arg == "--name") route.name = value;
        else if (arg == "--own-bar") route.decode_bar = value;
        else if (arg == "--peer-bar") route.prefill_bar = value;
        else if (arg == "--sysfs-root") route.sysfs_root = value;
        else if (arg == "--setup-timeout-ms") route.setup_timeout_ms = static_cast<uint32_t>(std::strtoul(value, nullptr, 10));
        else if (arg == "--peer-timeout-ms") route.peer_timeout_ms = static_cast<uint32_t>(std::strtoul(value, nullptr, 10));
        else if (arg == "--role") role = value;
        else usage();
    }
    if (plan.layers == 0 || plan.blocks == 0 || plan.block_tokens == 0 || inflight == 0 ||
        plan.block_bytes() > (size_t(64) << 20) ||
        route.decode_bar.empty() != route.prefill_bar.empty())
        usage();

    if (role == "decode")
        std::printf("kv_transfer: barlink %s, decode side, waiting under \"%s\"\n",
                    barlink::version().c_str(), route.name.c_str());
    else
        std::printf("kv_transfer: barlink %s, %u layers x %u blocks of %zu KiB, seed %#" PRIx64 "\n",
                    barlink::version().c_str(), plan.layers, plan.blocks,
                    plan.block_bytes() / 1024, plan.seed);
    std::fflush(stdout);
    try {
        if (role == "prefill") return prefill(plan, route, inflight);
        if (role == "decode") return decode(route, expect, inflight);
        if (role != "both") usage();
        pid_t child = fork();
        if (child < 0) {
            std::perror("fork");
            return 1;
        }
        if (child == 0) {
            int code = 1;
            try {
                code = prefill(plan, route, inflight);
            } catch (const barlink::Error& e) {
                std::fprintf(stderr, "prefill: %s\n", e.what());
            }
            std::fflush(stdout);
            _exit(code);
        }
        int code = decode(route, expect, inflight);
        int status = 0;
        waitpid(child, &status, 0);
        bool child_ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
        if (!child_ok) std::fprintf(stderr, "kv_transfer: the prefill process failed\n");
        return code == 0 && child_ok ? 0 : 1;
    } catch (const barlink::Error& e) {
        std::fprintf(stderr, "kv_transfer: %s\n", e.what());
        return 1;
    }
}
