/* A process's wall clock moved by CLOCK_SHIFT_S seconds (LD_PRELOAD): CLOCK_REALTIME and
 * gettimeofday/time only. The monotonic clocks and sleeping are left alone, so the process runs
 * as it would on a machine whose clock is off. libfaketime 0.9.10 (Debian 12) is not used: with
 * it, every time.sleep of Python 3.11 fails with EINVAL (DONT_FAKE_MONOTONIC=1) or hangs. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <sys/time.h>
#include <time.h>

static long shift_seconds(void) {
    const char *text = getenv("CLOCK_SHIFT_S");
    return text ? strtol(text, NULL, 10) : 0;
}

int clock_gettime(clockid_t clock, struct timespec *ts) {
    static int (*real)(clockid_t, struct timespec *);
    if (!real) real = (int (*)(clockid_t, struct timespec *))dlsym(RTLD_NEXT, "clock_gettime");
    int rc = real(clock, ts);
    if (rc == 0 && (clock == CLOCK_REALTIME || clock == CLOCK_REALTIME_COARSE)) ts->tv_sec += shift_seconds();
    return rc;
}

int gettimeofday(struct timeval *tv, void *tz) {
    struct timespec ts;
    int rc = clock_gettime(CLOCK_REALTIME, &ts);
    if (rc == 0 && tv) {
        tv->tv_sec = ts.tv_sec;
        tv->tv_usec = ts.tv_nsec / 1000;
    }
    (void)tz;
    return rc;
}

time_t time(time_t *out) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    if (out) *out = ts.tv_sec;
    return ts.tv_sec;
}
