/* LD_PRELOAD shim for tests: this process's wall clock (CLOCK_REALTIME, gettimeofday, time) is
 * SKEWED_CLOCK_SECONDS off, as on a host whose clock is wrong; its monotonic clock is not (timers,
 * sleeps and timeouts run as on any host).
 *
 * On a real host with a wrong clock the kernel's CLOCK_REALTIME is the wrong one too, so a wait
 * until a deadline read from that clock (pthread_cond_timedwait, sem_timedwait, ...) lasts as long
 * as meant. Here only this process reads the wrong time while the kernel keeps the right one: a
 * deadline computed from the shifted clock would wait SKEWED_CLOCK_SECONDS too long (librdkafka
 * computes its condition-variable deadlines from the wall clock, and stalled for 10 minutes under
 * an earlier version of this shim). So every wait on a realtime deadline gets the skew taken off
 * again. Built by tests/checker/test_clock_skew.py with gcc. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdlib.h>
#include <sys/time.h>
#include <threads.h>
#include <time.h>

/* The next definition of ``name`` (libc's), looked up once. */
#define REAL(name) \
    static __typeof__(&name) real_##name = NULL; \
    if (!real_##name) real_##name = (__typeof__(&name))dlsym(RTLD_NEXT, #name)

static long skew(void) {
    static long seconds = -1;
    if (seconds == -1) {
        const char *text = getenv("SKEWED_CLOCK_SECONDS");
        seconds = text ? atol(text) : 0;
    }
    return seconds;
}

static int is_realtime(clockid_t id) { return id == CLOCK_REALTIME || id == CLOCK_REALTIME_COARSE; }

int clock_gettime(clockid_t id, struct timespec *ts) {
    REAL(clock_gettime);
    int done = real_clock_gettime(id, ts);
    if (done == 0 && is_realtime(id)) ts->tv_sec += skew();
    return done;
}

int gettimeofday(struct timeval *tv, void *tz) {
    REAL(gettimeofday);
    int done = real_gettimeofday(tv, tz);
    if (done == 0) tv->tv_sec += skew();
    return done;
}

time_t time(time_t *out) {
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    if (out) *out = now.tv_sec;
    return now.tv_sec;
}

/* A deadline on the kernel's clock: the skew taken off one read from the shifted wall clock. */
static struct timespec on_kernel_clock(const struct timespec *deadline, int from_wall_clock) {
    struct timespec real = *deadline;
    if (from_wall_clock) real.tv_sec -= skew();
    return real;
}

/* pthread_cond_timedwait's clock is the condition's (realtime unless set to monotonic), which
 * glibc keeps private: a deadline nearer the shifted wall clock than the monotonic clock was read
 * from the wall clock (the two are decades apart). */
static int read_from_wall_clock(const struct timespec *deadline) {
    struct timespec wall, mono;
    REAL(clock_gettime);
    real_clock_gettime(CLOCK_REALTIME, &wall);
    real_clock_gettime(CLOCK_MONOTONIC, &mono);
    long to_wall = labs((long)deadline->tv_sec - ((long)wall.tv_sec + skew()));
    long to_mono = labs((long)deadline->tv_sec - (long)mono.tv_sec);
    return to_wall < to_mono;
}

int pthread_cond_timedwait(pthread_cond_t *cond, pthread_mutex_t *mutex,
                           const struct timespec *deadline) {
    REAL(pthread_cond_timedwait);
    struct timespec real = on_kernel_clock(deadline, read_from_wall_clock(deadline));
    return real_pthread_cond_timedwait(cond, mutex, &real);
}

int pthread_cond_clockwait(pthread_cond_t *cond, pthread_mutex_t *mutex, clockid_t id,
                           const struct timespec *deadline) {
    REAL(pthread_cond_clockwait);
    struct timespec real = on_kernel_clock(deadline, is_realtime(id));
    return real_pthread_cond_clockwait(cond, mutex, id, &real);
}

/* C11's condition variables (librdkafka's) wait on TIME_UTC, the wall clock; so do the rest. */
int cnd_timedwait(cnd_t *cond, mtx_t *mutex, const struct timespec *deadline) {
    REAL(cnd_timedwait);
    struct timespec real = on_kernel_clock(deadline, 1);
    return real_cnd_timedwait(cond, mutex, &real);
}

int mtx_timedlock(mtx_t *mutex, const struct timespec *deadline) {
    REAL(mtx_timedlock);
    struct timespec real = on_kernel_clock(deadline, 1);
    return real_mtx_timedlock(mutex, &real);
}

int sem_timedwait(sem_t *sem, const struct timespec *deadline) {
    REAL(sem_timedwait);
    struct timespec real = on_kernel_clock(deadline, 1);
    return real_sem_timedwait(sem, &real);
}

int pthread_mutex_timedlock(pthread_mutex_t *mutex, const struct timespec *deadline) {
    REAL(pthread_mutex_timedlock);
    struct timespec real = on_kernel_clock(deadline, 1);
    return real_pthread_mutex_timedlock(mutex, &real);
}

int sem_clockwait(sem_t *sem, clockid_t id, const struct timespec *deadline) {
    REAL(sem_clockwait);
    struct timespec real = on_kernel_clock(deadline, is_realtime(id));
    return real_sem_clockwait(sem, id, &real);
}

int clock_nanosleep(clockid_t id, int flags, const struct timespec *request,
                    struct timespec *remain) {
    REAL(clock_nanosleep);
    if (!(flags & TIMER_ABSTIME)) return real_clock_nanosleep(id, flags, request, remain);
    struct timespec real = on_kernel_clock(request, is_realtime(id));
    return real_clock_nanosleep(id, flags, &real, remain);
}
