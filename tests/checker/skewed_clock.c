/* LD_PRELOAD shim for tests: this process's wall clock (CLOCK_REALTIME, gettimeofday, time) is
 * SKEWED_CLOCK_SECONDS off, as on a host whose clock is wrong; its monotonic clock is not (timers,
 * sleeps and timeouts run as on any host). Built by tests/checker/test_clock_skew.py with gcc. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <sys/time.h>
#include <time.h>

static long skew(void) {
    static long seconds = -1;
    if (seconds == -1) {
        const char *text = getenv("SKEWED_CLOCK_SECONDS");
        seconds = text ? atol(text) : 0;
    }
    return seconds;
}

int clock_gettime(clockid_t id, struct timespec *ts) {
    static int (*real)(clockid_t, struct timespec *) = NULL;
    if (!real) real = (int (*)(clockid_t, struct timespec *))dlsym(RTLD_NEXT, "clock_gettime");
    int done = real(id, ts);
    if (done == 0 && (id == CLOCK_REALTIME || id == CLOCK_REALTIME_COARSE)) ts->tv_sec += skew();
    return done;
}

int gettimeofday(struct timeval *tv, void *tz) {
    static int (*real)(struct timeval *, void *) = NULL;
    if (!real) real = (int (*)(struct timeval *, void *))dlsym(RTLD_NEXT, "gettimeofday");
    int done = real(tv, tz);
    if (done == 0 && tv) tv->tv_sec += skew();
    return done;
}

time_t time(time_t *out) {
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    if (out) *out = now.tv_sec;
    return now.tv_sec;
}
