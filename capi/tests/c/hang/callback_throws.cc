// callback_throws.cc: C++ callbacks that throw or exit (spec.md S7.8, the
// header's "Callbacks"), from a C++ program using the C API. The process
// must not abort (std::terminate) or hang (the watchdog), and the cache
// must stay consistent:
//  1. `reg` throws std::runtime_error with a local object that has a
//     destructor: mrcache_acquire returns MRCACHE_REGISTRAR, errno
//     ECANCELED, the message carries what(); the destructor ran; the next
//     acquire of the range registers it.
//  2. `reg` throws an int: the same, the message says it was not a
//     std::exception.
//  3. `dereg` throws during mrcache_flush: the flush returns OK, the entry
//     is gone (the handle counts as deregistered: its failure is counted).
//  4. `reg` calls pthread_exit with a local object that has a destructor:
//     the destructor runs (the unwind went through the callback's frames),
//     pthread_join gives the value.
//  5. `dereg` throws on the monitor's service thread (after a munmap of a
//     cached range): later munmaps still return; the cache deregisters.
// Every check also runs under the userfaultfd monitor (mrcache_create with
// MRCACHE_MONITOR_UFFD; MRCACHE_UNSUPPORTED skips with 77 unless
// MRCACHE_REQUIRE_UFFD=1).
//
//   callback_throws [ROUNDS]   (or HANG_ITERS; default 3)
#include <mrcache.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <pthread.h>
#include <stdexcept>
#include <string>
#include <sys/mman.h>
#include <unistd.h>

namespace {

std::atomic<int> failures{0};

#define EXPECT(cond)                                                                      \
    do {                                                                                  \
        if (!(cond)) {                                                                    \
            std::fprintf(stderr, "callback_throws: %s:%d: expected %s\n", __FILE__, __LINE__, #cond); \
            failures++;                                                                   \
        }                                                                                 \
    } while (0)

enum class Act { None, ThrowStd, ThrowInt, Exit };

thread_local Act reg_act = Act::None;
thread_local Act dereg_act = Act::None;
std::atomic<bool> service_throw{false};
std::atomic<int> destructors{0}, regs{0}, deregs{0}, threw_in_dereg{0};

struct Witness {
    ~Witness() { destructors++; }
};

int reg(void *, void *addr, size_t, uint32_t, void **handle, uint32_t *lkey, uint32_t *rkey) {
    Witness w;
    Act act = reg_act;
    reg_act = Act::None;
    switch (act) {
    case Act::ThrowStd: throw std::runtime_error("boom from reg");
    case Act::ThrowInt: throw 42;
    case Act::Exit: pthread_exit(reinterpret_cast<void *>(0x5eed));
    case Act::None: break;
    }
    regs++;
    *handle = addr;
    *lkey = *rkey = 1;
    return 0;
}

int dereg(void *, void *) {
    char name[16] = "";
    pthread_getname_np(pthread_self(), name, sizeof name);
    bool on_service = std::strcmp(name, "mrcache-svc") == 0;
    Act act = dereg_act;
    dereg_act = Act::None;
    if (act == Act::ThrowStd || (on_service && service_throw.exchange(false))) {
        threw_in_dereg++;
        throw std::runtime_error("boom from dereg");
    }
    deregs++;
    return 0;
}

size_t page() { return static_cast<size_t>(sysconf(_SC_PAGESIZE)); }

char *map(size_t len) {
    void *p = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        std::perror("mmap");
        std::exit(1);
    }
    std::memset(p, 1, len);
    return static_cast<char *>(p);
}

mrcache_t *create() {
    mrcache_config_t cfg;
    mrcache_config_init(&cfg);
    cfg.monitor = MRCACHE_MONITOR_UFFD;
    mrcache_registrar_t r = {nullptr, reg, dereg};
    mrcache_t *c = nullptr;
    mrcache_status_t st = mrcache_create(&cfg, &r, &c);
    if (st == MRCACHE_UNSUPPORTED) {
        const char *req = std::getenv("MRCACHE_REQUIRE_UFFD");
        if (req && std::strcmp(req, "1") == 0) {
            std::fprintf(stderr, "callback_throws: the userfaultfd monitor is required: %s\n", mrcache_last_error(nullptr));
            std::exit(1);
        }
        std::printf("callback_throws: SKIPPED: no userfaultfd monitor (%s)\n", mrcache_last_error(nullptr));
        std::exit(77);
    }
    if (st != MRCACHE_OK) {
        std::fprintf(stderr, "callback_throws: mrcache_create: %s\n", mrcache_status_name(st));
        std::exit(1);
    }
    return c;
}

bool touch(mrcache_t *c, const void *addr, size_t len) {
    mrcache_lease_t l;
    mrcache_status_t st = mrcache_acquire(c, addr, len, MRCACHE_ACCESS_LOCAL_WRITE, &l);
    if (st != MRCACHE_OK) return false;
    return mrcache_release(c, l) == MRCACHE_OK;
}

void expect_thrown(mrcache_t *c, char *buf, Act act, const char *needle) {
    int before = destructors.load();
    reg_act = act;
    mrcache_lease_t l;
    EXPECT(mrcache_acquire(c, buf, page(), MRCACHE_ACCESS_LOCAL_WRITE, &l) == MRCACHE_REGISTRAR);
    int err = 0;
    std::string msg = mrcache_last_error(&err);
    EXPECT(err == ECANCELED);
    if (msg.find(needle) == std::string::npos) {
        std::fprintf(stderr, "callback_throws: message \"%s\" lacks \"%s\"\n", msg.c_str(), needle);
        failures++;
    }
    EXPECT(destructors.load() == before + 1);
    EXPECT(touch(c, buf, page()));
}

void *exit_in_reg(void *arg) {
    reg_act = Act::Exit;
    auto c = static_cast<mrcache_t *>(arg);
    char *buf = map(page());
    mrcache_lease_t l;
    mrcache_acquire(c, buf, page(), MRCACHE_ACCESS_LOCAL_WRITE, &l);
    std::fprintf(stderr, "callback_throws: the acquire returned although reg called pthread_exit\n");
    failures++;
    return nullptr;
}

void one_round() {
    mrcache_t *c = create();
    char *buf = map(8 * page());
    // 1 and 2
    expect_thrown(c, buf, Act::ThrowStd, "boom from reg");
    expect_thrown(c, buf + page(), Act::ThrowInt, "not a std::exception");
    // 3
    EXPECT(touch(c, buf + 2 * page(), page()));
    dereg_act = Act::ThrowStd;
    EXPECT(mrcache_flush(c) == MRCACHE_OK);
    mrcache_stats_t s{};
    s.size = sizeof s;
    EXPECT(mrcache_stats(c, &s) == MRCACHE_OK);
    EXPECT(s.cached_entries == 0);
    dereg_act = Act::None;
    // 4
    int before = destructors.load();
    pthread_t t;
    void *ret = nullptr;
    EXPECT(pthread_create(&t, nullptr, exit_in_reg, c) == 0);
    EXPECT(pthread_join(t, &ret) == 0);
    EXPECT(ret == reinterpret_cast<void *>(0x5eed));
    EXPECT(destructors.load() == before + 1);
    // 5
    for (int i = 0; i < 3; i++) {
        char *b = map(4 * page());
        EXPECT(touch(c, b, 4 * page()));
        if (i == 0) service_throw = true;
        EXPECT(munmap(b, 4 * page()) == 0);
    }
    for (int spin = 0; spin < 5000 && service_throw.load(); spin++) usleep(1000);
    EXPECT(!service_throw.load());
    EXPECT(mrcache_flush(c) == MRCACHE_OK);
    EXPECT(mrcache_stats(c, &s) == MRCACHE_OK);
    EXPECT(s.leases_held == 0 && s.cached_entries == 0);
    EXPECT(mrcache_destroy(c) == MRCACHE_OK);
    EXPECT(regs.load() == deregs.load() + threw_in_dereg.load());
    regs = deregs = threw_in_dereg = 0;
    munmap(buf, 8 * page());
}

}  // namespace

int main(int argc, char **argv) {
    setvbuf(stdout, nullptr, _IOLBF, 0);
    const char *n = argc > 1 ? argv[1] : std::getenv("HANG_ITERS");
    long rounds = n && std::atol(n) > 0 ? std::atol(n) : 3;
    for (long i = 0; i < rounds; i++) one_round();
    if (failures.load()) {
        std::fprintf(stderr, "callback_throws: FAILED: %d checks failed\n", failures.load());
        return 1;
    }
    std::printf("callback_throws: all checks passed\n");
    return 0;
}
