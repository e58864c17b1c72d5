/* loopback.c — a communicator whose ranks are threads of this process: the all-reduce of
 * the interpreter's multi-rank runs and of the tests (NCCL refuses two ranks on one GPU).
 *
 * One group object is shared by the ranks' handles (refcounted: it goes with the last
 * handle). An all-reduce is three trips through a reusable barrier (a mutex, a condition
 * variable and a generation counter):
 *
 *   A  each rank posts {send, recv, count} and arrives; the last to arrive checks the posts
 *      (counts agree, no NULL buffer, the shared scratch big enough) and leaves a verdict
 *      every rank reads, so a bad call fails on every rank alike, with no rank left waiting;
 *   -  each rank sums its chunk of the elements over all ranks' sends, in rank order, into
 *      the scratch: scratch[i] = ((send_0[i] + send_1[i]) + send_2[i]) + ... in f32;
 *   B  after it nobody reads a send again, so each rank copies the scratch to its recv (its
 *      send may be its recv: no rank writes before every rank has finished reading);
 *   C  after it nobody reads the scratch, so the next call may grow it.
 *
 * Every element is summed in the same order whoever sums it, so every rank gets the same
 * bits, run after run, whatever the number of threads.
 *
 * Failure without hanging: a rank that does not arrive at A within the group's timeout
 * (300 s; mj_comm_loopback_set_timeout) aborts the group, naming the missing ranks; so do
 * mj_comm_abort and freeing a rank's handle while others remain. An aborted group answers
 * MJ_ERR_COMM on every rank from then on. B and C cannot be interrupted: once every rank
 * has passed A, each runs only the code below until the call is done, so they will arrive,
 * and no rank returns (and frees its buffers) while another still reads them. */
#include "comm/comm.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

typedef struct lb_slot {
    const float *send;
    float *recv;
    int64_t count;
} lb_slot;

typedef struct lb_group {
    int32_t n;
    pthread_mutex_t mu;
    pthread_cond_t cv;            /* on CLOCK_MONOTONIC, for the timed wait               */
    /* the barrier */
    uint64_t gen;                 /* bumped by the last rank to arrive                    */
    uint64_t arrived;             /* bit r: rank r is at this generation's barrier        */
    int32_t n_arrived;
    /* the current call, as the last rank at A found it */
    mj_status verdict;
    char verdict_msg[2048];
    float *scratch;               /* [scratch_cap] the sum, read by every rank            */
    int64_t scratch_cap;
    /* the group's life */
    int32_t refs;                 /* handles alive                                        */
    int aborted;
    char why[1024];               /* the first reason it was aborted                      */
    double timeout_s;
    lb_slot slot[];               /* [n] each rank's post                                 */
} lb_group;

typedef struct lb_comm {
    struct mj_comm base;
    lb_group *g;
} lb_comm;

/* A count whose bytes fit a size_t and a ptrdiff_t with room to spare. */
#define LB_MAX_COUNT ((int64_t)(PTRDIFF_MAX / (2 * (ptrdiff_t)sizeof(float))))

static mj_status aborted_error(const lb_group *g, int32_t r) {
    return mj_set_error(MJ_ERR_COMM,
                        "loopback communicator (rank %d of %d) is aborted: %s; free every rank's "
                        "handle and create a new group",
                        (int)r, (int)g->n, g->why);
}

/* Abort (the first reason sticks) and wake every waiter. Caller holds g->mu. */
static void abort_locked(lb_group *g, const char *why) {
    if (!g->aborted) {
        g->aborted = 1;
        snprintf(g->why, sizeof g->why, "%s", why);
    }
    pthread_cond_broadcast(&g->cv);
}

/* Arrive as rank r; the last to arrive runs last() (under the lock), then releases all.
 * Caller holds g->mu. With `abortable` (barrier A), an aborted group and the timeout end the
 * wait with MJ_ERR_COMM; B and C wait for ranks that are certain to come. */
static mj_status barrier_locked(lb_group *g, int32_t r, int abortable, void (*last)(lb_group *)) {
    if (abortable && g->aborted) return aborted_error(g, r);
    uint64_t my_gen = g->gen;
    g->arrived |= 1ull << r;
    if (++g->n_arrived == g->n) {
        if (last) last(g);
        g->n_arrived = 0;
        g->arrived = 0;
        g->gen++;
        pthread_cond_broadcast(&g->cv);
        return MJ_OK;
    }
    struct timespec deadline;
    clock_gettime(CLOCK_MONOTONIC, &deadline);
    double whole = floor(g->timeout_s);
    deadline.tv_sec += (time_t)whole;
    deadline.tv_nsec += (long)((g->timeout_s - whole) * 1e9);
    if (deadline.tv_nsec >= 1000000000L) deadline.tv_sec++, deadline.tv_nsec -= 1000000000L;
    while (g->gen == my_gen) {
        if (!abortable) {
            pthread_cond_wait(&g->cv, &g->mu);
            continue;
        }
        if (g->aborted) return aborted_error(g, r);
        if (pthread_cond_timedwait(&g->cv, &g->mu, &deadline) == ETIMEDOUT && g->gen == my_gen &&
            !g->aborted) {
            char missing[400] = "";
            size_t used = 0;
            int n_missing = 0;
            for (int32_t q = 0; q < g->n; q++) {
                if (g->arrived >> q & 1) continue;
                if (used < sizeof missing)
                    used += (size_t)snprintf(missing + used, sizeof missing - used, "%s%d",
                                             n_missing ? ", " : "", (int)q);
                n_missing++;
            }
            char why[sizeof g->why];
            snprintf(why, sizeof why,
                     "rank%s %s of %d did not call mj_comm_all_reduce_f32 within %g s (rank %d "
                     "waited; mj_comm_loopback_set_timeout sets the limit)",
                     n_missing > 1 ? "s" : "", missing, (int)g->n, g->timeout_s, (int)r);
            abort_locked(g, why);
            return aborted_error(g, r);
        }
    }
    return MJ_OK;
}

/* The last rank at A: judge the posts for every rank. */
static void judge_locked(lb_group *g) {
    char *m = g->verdict_msg;
    size_t cap = sizeof g->verdict_msg;
    g->verdict = MJ_OK;
    m[0] = '\0';
    for (int32_t q = 0; q < g->n; q++) {
        const lb_slot *p = &g->slot[q];
        if (p->count < 0 || p->count > LB_MAX_COUNT) {
            snprintf(m, cap, "rank %d passed count %" PRId64 " (a count is 0..%" PRId64 ")", (int)q,
                     p->count, LB_MAX_COUNT);
            g->verdict = MJ_ERR_INVALID_ARG;
            return;
        }
        if (p->count > 0 && (!p->send || !p->recv)) {
            snprintf(m, cap, "rank %d passed a NULL %s buffer for %" PRId64 " floats", (int)q,
                     p->send ? "recv" : "send", p->count);
            g->verdict = MJ_ERR_INVALID_ARG;
            return;
        }
    }
    int agree = 1;
    for (int32_t q = 1; q < g->n; q++) agree &= g->slot[q].count == g->slot[0].count;
    if (!agree) {
        size_t used = (size_t)snprintf(m, cap, "the ranks disagree on the count (");
        for (int32_t q = 0; q < g->n && used < cap; q++)
            used += (size_t)snprintf(m + used, cap - used, "%srank %d: %" PRId64, q ? ", " : "",
                                     (int)q, g->slot[q].count);
        if (used < cap)
            snprintf(m + used, cap - used, "); every rank must pass the same count");
        g->verdict = MJ_ERR_INVALID_ARG;
        return;
    }
    int64_t count = g->slot[0].count;
    if (count > g->scratch_cap) {
        float *grown = realloc(g->scratch, (size_t)count * sizeof(float));
        if (!grown) {
            snprintf(m, cap, "out of memory for the %" PRId64 "-float sum", count);
            g->verdict = MJ_ERR_NOMEM;
            return;
        }
        g->scratch = grown;
        g->scratch_cap = count;
    }
}

/* Where rank r's share of count elements begins: cut at multiples of 16 floats (64 bytes),
 * so two ranks never write one cache line of the scratch. */
static int64_t chunk_begin(int64_t count, int32_t n, int32_t r) {
    if (r >= n) return count;
    int64_t b = count / n * r + count % n * r / n;
    return b / 16 * 16;
}

static mj_status lb_all_reduce(mj_comm_t c, const float *send, float *recv, int64_t count,
                               void *stream) {
    (void)stream; /* host memory: the call is synchronous */
    lb_group *g = ((lb_comm *)c)->g;
    const int32_t r = c->rank, n = g->n;

    pthread_mutex_lock(&g->mu);
    g->slot[r] = (lb_slot){send, recv, count};
    mj_status s = barrier_locked(g, r, 1, judge_locked);
    if (s == MJ_OK && g->verdict != MJ_OK)
        s = mj_set_error(g->verdict, "mj_comm_all_reduce_f32 (loopback, rank %d of %d): %s", (int)r,
                         (int)n, g->verdict_msg);
    pthread_mutex_unlock(&g->mu);
    if (s != MJ_OK || count == 0) return s;

    /* Between A and C the posts and the scratch stay put: read them without the lock (the
     * barriers' lock and unlock order these reads after the writes). */
    float *sum = g->scratch;
    const int64_t lo = chunk_begin(count, n, r), hi = chunk_begin(count, n, r + 1);
    if (hi > lo) {
        memcpy(sum + lo, g->slot[0].send + lo, (size_t)(hi - lo) * sizeof(float));
        for (int32_t q = 1; q < n; q++) {
            const float *x = g->slot[q].send;
            for (int64_t i = lo; i < hi; i++) sum[i] += x[i];
        }
    }
    pthread_mutex_lock(&g->mu);
    barrier_locked(g, r, 0, NULL); /* B: every send read */
    pthread_mutex_unlock(&g->mu);

    memcpy(recv, sum, (size_t)count * sizeof(float));

    pthread_mutex_lock(&g->mu);
    barrier_locked(g, r, 0, NULL); /* C: the scratch read */
    pthread_mutex_unlock(&g->mu);
    return MJ_OK;
}

static mj_status lb_abort(mj_comm_t c, const char *why) {
    lb_group *g = ((lb_comm *)c)->g;
    char text[sizeof g->why];
    snprintf(text, sizeof text, "rank %d aborted the group: %s", (int)c->rank, why);
    pthread_mutex_lock(&g->mu);
    abort_locked(g, text);
    pthread_mutex_unlock(&g->mu);
    return MJ_OK;
}

static void group_destroy(lb_group *g) {
    pthread_cond_destroy(&g->cv);
    pthread_mutex_destroy(&g->mu);
    free(g->scratch);
    free(g);
}

static mj_status lb_free(mj_comm_t c) {
    lb_group *g = ((lb_comm *)c)->g;
    pthread_mutex_lock(&g->mu);
    int last = --g->refs == 0;
    if (!last) {
        /* The others can never complete a collective again: say so instead of hanging. */
        char why[sizeof g->why];
        snprintf(why, sizeof why, "rank %d's handle was freed", (int)c->rank);
        abort_locked(g, why);
    }
    pthread_mutex_unlock(&g->mu);
    if (last) group_destroy(g);
    free(c);
    return MJ_OK;
}

static const mj_comm_ops k_loopback_ops = {
    .kind = MJ_COMM_LOOPBACK,
    .name = "loopback",
    .all_reduce_f32 = lb_all_reduce,
    .abort = lb_abort,
    .free = lb_free,
};

mj_status mj_comm_loopback_create(int32_t n_ranks, mj_comm_t *comms) {
    if (!comms) return mj_set_error(MJ_ERR_INVALID_ARG, "mj_comm_loopback_create: comms is NULL");
    if (n_ranks < 1 || n_ranks > MJ_COMM_MAX_RANKS)
        return mj_set_error(MJ_ERR_INVALID_ARG,
                            "mj_comm_loopback_create: n_ranks %d is out of range (1..%d)",
                            (int)n_ranks, MJ_COMM_MAX_RANKS);
    for (int32_t r = 0; r < n_ranks; r++) comms[r] = NULL;

    lb_group *g = calloc(1, sizeof *g + (size_t)n_ranks * sizeof(lb_slot));
    if (!g) return mj_set_error(MJ_ERR_NOMEM, "mj_comm_loopback_create: out of memory");
    g->n = n_ranks;
    g->timeout_s = MJ_COMM_LOOPBACK_TIMEOUT_S;
    pthread_condattr_t ca;
    int ok = pthread_condattr_init(&ca) == 0;
    if (ok) {
        ok = pthread_condattr_setclock(&ca, CLOCK_MONOTONIC) == 0 && pthread_cond_init(&g->cv, &ca) == 0;
        pthread_condattr_destroy(&ca);
    }
    if (!ok) {
        free(g);
        return mj_set_error(MJ_ERR_INTERNAL, "mj_comm_loopback_create: cannot make a condition variable");
    }
    pthread_mutex_init(&g->mu, NULL);

    lb_comm *made[MJ_COMM_MAX_RANKS];
    for (int32_t r = 0; r < n_ranks; r++) {
        made[r] = calloc(1, sizeof *made[r]);
        if (!made[r]) {
            for (int32_t q = 0; q < r; q++) free(made[q]);
            group_destroy(g);
            return mj_set_error(MJ_ERR_NOMEM, "mj_comm_loopback_create: out of memory");
        }
        made[r]->base = (struct mj_comm){&k_loopback_ops, r, n_ranks};
        made[r]->g = g;
    }
    g->refs = n_ranks;
    for (int32_t r = 0; r < n_ranks; r++) comms[r] = &made[r]->base;
    return MJ_OK;
}

mj_status mj_comm_loopback_set_timeout(mj_comm_t c, double seconds) {
    if (mj_comm_kind(c) != MJ_COMM_LOOPBACK)
        return mj_set_error(MJ_ERR_INVALID_ARG,
                            "mj_comm_loopback_set_timeout: not a loopback communicator");
    if (!(seconds > 0) || !isfinite(seconds) || seconds > 1e7)
        return mj_set_error(MJ_ERR_INVALID_ARG,
                            "mj_comm_loopback_set_timeout: %g s is not a timeout (0 < s <= 1e7)",
                            seconds);
    lb_group *g = ((lb_comm *)c)->g;
    pthread_mutex_lock(&g->mu);
    g->timeout_s = seconds;
    pthread_mutex_unlock(&g->mu);
    return MJ_OK;
}
