/* latency-probe FILE SIZE_MIB WINDOW_MS OUT
 *
 * Creates FILE of SIZE_MIB (or reuses it when it is that large already), reads it through twice
 * (so that its pages are on the active list: a hot working set, whose refaults after eviction
 * the kernel counts as memory stall, not only as I/O), then keeps reading
 * random 4 KiB blocks of it with pread, sleeping 100 us between reads (so it does not eat the
 * CPUs), and appends one line per WINDOW_MS to OUT:
 *
 *   ready <size_bytes>
 *   w <start_ms> <end_ms> <count> <p50_ns> <p99_ns> <max_ns> <errors> <lower_ns>:<n> ...
 *
 * start_ms/end_ms are CLOCK_REALTIME milliseconds; latencies are CLOCK_MONOTONIC. The trailing
 * pairs are the window's histogram: bucket lower bounds in ns (8 buckets per power of two, so
 * a bucket spans at most 12.5 %) with their counts, for merging windows exactly. Percentiles of a
 * window are bucket lower bounds. SIGTERM/SIGINT exit 0 (it runs as a container's pid 1). */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define BLOCK 4096
#define BUCKETS 300

static uint64_t counts[BUCKETS];

static void on_term(int sig) { (void)sig; _exit(0); }

static uint64_t now_ns(clockid_t c) {
    struct timespec ts;
    clock_gettime(c, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int bucket(uint64_t v) {
    if (v < 8) return (int)v;
    int e = 63 - __builtin_clzll(v);
    int i = 8 * (e - 2) + (int)((v >> (e - 3)) & 7);
    return i < BUCKETS ? i : BUCKETS - 1;
}

static uint64_t lower(int i) {
    if (i < 8) return (uint64_t)i;
    int e = i / 8 + 2;
    return (8ull + (uint64_t)(i % 8)) << (e - 3);
}

/* The lower bound of the bucket holding the q-quantile of n samples. */
static uint64_t quantile(uint64_t n, double q) {
    uint64_t rank = (uint64_t)((double)(n - 1) * q), seen = 0;
    for (int i = 0; i < BUCKETS; i++) {
        seen += counts[i];
        if (seen > rank) return lower(i);
    }
    return lower(BUCKETS - 1);
}

static void out_line(int out, const char *line, size_t len) {
    while (len > 0) {
        ssize_t w = write(out, line, len);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return;
        line += w;
        len -= (size_t)w;
    }
}

/* Two sequential passes: every page referenced twice, so activated. */
static int warm(int fd, off_t size) {
    static char chunk[1 << 20];
    for (int pass = 0; pass < 2; pass++) {
        for (off_t at = 0; at < size; at += (off_t)sizeof chunk) {
            if (pread(fd, chunk, sizeof chunk, at) != (ssize_t)sizeof chunk) return -1;
        }
    }
    return 0;
}

static int fill(int fd, off_t size) {
    static char chunk[1 << 20];
    for (size_t i = 0; i < sizeof chunk; i++) chunk[i] = (char)(i * 31 + 7);
    for (off_t at = 0; at < size; at += (off_t)sizeof chunk) {
        if (pwrite(fd, chunk, sizeof chunk, at) != (ssize_t)sizeof chunk) return -1;
    }
    return fsync(fd);
}

int main(int argc, char **argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: %s FILE SIZE_MIB WINDOW_MS OUT\n", argv[0]);
        return 2;
    }
    struct sigaction sa = {0};
    sa.sa_handler = on_term;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    off_t size = (off_t)atoll(argv[2]) << 20;
    uint64_t window = (uint64_t)atoll(argv[3]) * 1000000ull;
    int out = open(argv[4], O_WRONLY | O_CREAT | O_APPEND, 0644);
    int fd = open(argv[1], O_RDWR | O_CREAT, 0644);
    struct stat st;
    if (out < 0 || fd < 0 || fstat(fd, &st) != 0 || size < BLOCK || window == 0) {
        perror("latency-probe: open");
        return 1;
    }
    if (st.st_size < size && fill(fd, size) != 0) {
        perror("latency-probe: fill");
        return 1;
    }
    if (warm(fd, size) != 0) {
        perror("latency-probe: warm");
        return 1;
    }
    static char line[BUCKETS * 24 + 128];
    int len = snprintf(line, sizeof line, "ready %lld\n", (long long)size);
    out_line(out, line, (size_t)len);

    uint64_t blocks = (uint64_t)size / BLOCK, rng = now_ns(CLOCK_MONOTONIC) | 1;
    uint64_t n = 0, max = 0, errors = 0;
    uint64_t start_ms = now_ns(CLOCK_REALTIME) / 1000000, end = now_ns(CLOCK_MONOTONIC) + window;
    const struct timespec nap = {0, 100000};
    char buf[BLOCK];
    for (;;) {
        rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17; /* xorshift64 */
        uint64_t t0 = now_ns(CLOCK_MONOTONIC);
        ssize_t r = pread(fd, buf, BLOCK, (off_t)((rng % blocks) * BLOCK));
        uint64_t t1 = now_ns(CLOCK_MONOTONIC), lat = t1 - t0;
        if (r != BLOCK) {
            errors++;
        } else {
            counts[bucket(lat)]++;
            n++;
            if (lat > max) max = lat;
        }
        if (t1 >= end) {
            uint64_t end_ms = now_ns(CLOCK_REALTIME) / 1000000;
            len = snprintf(line, sizeof line, "w %llu %llu %llu %llu %llu %llu %llu",
                           (unsigned long long)start_ms, (unsigned long long)end_ms,
                           (unsigned long long)n,
                           (unsigned long long)(n ? quantile(n, 0.5) : 0),
                           (unsigned long long)(n ? quantile(n, 0.99) : 0),
                           (unsigned long long)max, (unsigned long long)errors);
            for (int i = 0; i < BUCKETS; i++) {
                if (counts[i] == 0) continue;
                len += snprintf(line + len, sizeof line - (size_t)len, " %llu:%llu",
                                (unsigned long long)lower(i), (unsigned long long)counts[i]);
            }
            line[len++] = '\n';
            out_line(out, line, (size_t)len);
            memset(counts, 0, sizeof counts);
            n = max = errors = 0;
            start_ms = end_ms;
            end = now_ns(CLOCK_MONOTONIC) + window;
        }
        nanosleep(&nap, NULL);
    }
}
