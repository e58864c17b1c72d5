/* cache.h — the on-disk kernel cache: one self-verifying file per entry.
 *
 * Layout under the cache directory D ($MOEJIT_CACHE_DIR, else $XDG_CACHE_HOME/moejit, else
 * ~/.cache/moejit), created 0700:
 *   D/v<FORMAT>/entries/<key hex>.mjc    one entry
 *   D/v<FORMAT>/locks/<key hex>.lock     per-key flock (released by the kernel if we die)
 *   D/v<FORMAT>/quarantine/<key hex>.<unix ns>.bad   entries that failed verification
 *   D/v<FORMAT>/tmp/                     temp files being written (unique names, each
 *                                        flock'ed by its writer until renamed)
 *   D/v<FORMAT>/stats.json               running totals of every process's JIT counters
 *   D/v<FORMAT>/locks/stats.lock         serializes updates of stats.json
 * An entry's mtime is its last-used stamp: moejit sets it on every disk hit (not atime).
 */
#ifndef MJ_CACHE_H
#define MJ_CACHE_H

#include "base.h"

#include <stddef.h>
#include <stdint.h>

#define MJ_CACHE_FORMAT 1
#define MJ_CACHE_MAGIC "MOEJITC\n" /* 8 bytes */
#define MJ_CACHE_DEFAULT_MAX_BYTES (1024ll * 1024 * 1024)

/* Key: the SHA-256 (OpenSSL) of the key text, as 64 lowercase hex characters. */
#define MJ_KEY_HEX_LEN 64
void mj_key_hash(const char *key_text, char hex[MJ_KEY_HEX_LEN + 1]);

/* One entry's contents. The cache owns nothing of a caller's entry; lookups return one
 * the caller frees with mj_cache_entry_free. */
typedef struct mj_cache_entry {
    char *key_text;            /* the full key text the hash was taken of                 */
    char *meta_json;           /* JSON object: template, knobs, target, compiler, ptxas... */
    uint8_t *binary;  size_t binary_len;   /* cubin (or a shared object for the sim)      */
    char *ptx;        size_t ptx_len;      /* may be NULL / 0                              */
    char *log;                              /* compile log, may be NULL                    */
    char *source;                           /* the rendered source, may be NULL            */
} mj_cache_entry;
void mj_cache_entry_free(mj_cache_entry *e);

typedef struct mj_cache_stats {
    int64_t disk_hits, disk_misses, stores, quarantined, evicted, lock_waits;
    int64_t refused_unsafe;    /* entries not loaded because the directory is unsafe      */
    int64_t store_failures;    /* stores that did not land: an I/O error (disk full...), or
                                  a cache that is read-only or unsafe                      */
} mj_cache_stats;

typedef struct mj_cache mj_cache;

/* Open (creating 0700 as needed) the cache at dir, or at the default location when dir is
 * NULL. max_bytes <= 0: $MOEJIT_CACHE_MAX_BYTES, else MJ_CACHE_DEFAULT_MAX_BYTES.
 * Never fails for a bad directory: a read-only, missing-and-uncreatable, or unsafe
 * (not ours, or group/world-writable) directory gives a cache that warns once on stderr
 * and then stores nothing (lookups miss; an unsafe directory is never read). Fails only
 * for bad arguments or out of memory. */
mj_status mj_cache_open(const char *dir, int64_t max_bytes, mj_cache **out);
/* The same with flags: MJ_CACHE_NO_CREATE creates no directory (a missing one gives a
 * cache that is neither readable nor writable, whose mj_cache_problem() says it does not
 * exist); MJ_CACHE_READ_ONLY never writes (no stores, locks, quarantine moves, last-used
 * stamps, temp clean-up or totals). With either flag the cache does not warn about what it
 * cannot write (the caller asked, and mj_cache_problem() says why); an unsafe directory is
 * still warned about and never read. */
#define MJ_CACHE_NO_CREATE 1u
#define MJ_CACHE_READ_ONLY 2u
mj_status mj_cache_open_flags(const char *dir, int64_t max_bytes, unsigned flags, mj_cache **out);
void mj_cache_close(mj_cache *c);
/* The directory in use (D above) and whether entries can be read / written there. */
const char *mj_cache_dir(const mj_cache *c);
int mj_cache_readable(const mj_cache *c);
int mj_cache_writable(const mj_cache *c);
/* Whether the directory could be written when it was opened, even by a read-only view. */
int mj_cache_dir_writable(const mj_cache *c);
/* The size cap in force (bytes), and where it came from: "set by the caller",
 * "$MOEJIT_CACHE_MAX_BYTES", "default", or "default; $MOEJIT_CACHE_MAX_BYTES is not valid". */
int64_t mj_cache_max_bytes(const mj_cache *c);
const char *mj_cache_max_bytes_source(const mj_cache *c);
/* Why the cache cannot be written (or read), as the warning at open said it: "" when it
 * can. For a tool's error line. */
const char *mj_cache_problem(const mj_cache *c);

/* Look a key up. *found = 1 and *out filled on a verified hit (its stored key text equals
 * key_text); a truncated, corrupted, wrong-magic, wrong-version or wrong-key entry, or
 * anything at the entry's name that is not a regular file (symlink, FIFO, socket, directory:
 * never opened, so never waited on), is moved to quarantine and reported as a miss. Readers
 * take no lock. */
mj_status mj_cache_lookup(mj_cache *c, const char *key_hex, const char *key_text,
                          mj_cache_entry *out, int *found);
/* Write an entry: unique temp file, fsync, rename into place (a reader never sees half an
 * entry), then evict least-recently-used entries while the total exceeds the cap. On an
 * unwritable or unsafe cache this is a no-op returning MJ_OK. A store that does not land
 * (that no-op, or an I/O error such as a full disk) counts in stats.store_failures; an I/O
 * error is returned (MJ_ERR_IO) and warned about once per handle. */
mj_status mj_cache_store(mj_cache *c, const char *key_hex, const mj_cache_entry *e);

/* The per-key lock, held while compiling so N processes compile a key once. *waited = 1
 * if another holder made us wait. On an unwritable cache: a no-op lock (fd -1). A lock file
 * that cannot be used (a symlink, FIFO or directory at its name, or flock failing) is never
 * followed nor waited on: a warning (once per handle), MJ_OK and fd -1, so the caller
 * compiles without the lock. Errors only for bad arguments. */
mj_status mj_cache_lock(mj_cache *c, const char *key_hex, int *fd, int *waited);
void mj_cache_unlock(int fd);

/* Every entry name <hex>.mjc: its key hex, size and last-used time. One that is not a
 * regular file (a FIFO, say) is listed too, with bytes 0: reading it fails at once and
 * verify quarantines it. */
typedef struct mj_cache_item {
    char key_hex[MJ_KEY_HEX_LEN + 1];
    int64_t bytes;
    int64_t last_used_ns;
} mj_cache_item;
mj_status mj_cache_list(mj_cache *c, mj_cache_item **items, int *n);
/* Parse a whole entry file (for verify and inspect): MJ_ERR_PARSE with the reason when it
 * does not verify. */
mj_status mj_cache_read_file(const char *path, mj_cache_entry *out);
/* Check every entry; bad ones are quarantined. */
mj_status mj_cache_verify(mj_cache *c, int *n_ok, int *n_bad);
/* Evict least-recently-used entries until the total is at most max_bytes (< 0: the cap). */
mj_status mj_cache_gc(mj_cache *c, int64_t max_bytes, int *n_evicted);
void mj_cache_get_stats(const mj_cache *c, mj_cache_stats *out);

/* Running totals of the JIT counters of every process that used this cache (stats.json),
 * in the order of mj_cache_total_names (mj_jit_stats's fields). */
#define MJ_CACHE_N_TOTALS 13
extern const char *const mj_cache_total_names[MJ_CACHE_N_TOTALS];
/* Add one process's counters (best effort: nothing is written on a read-only or unsafe
 * cache, and a symlink or FIFO at stats.json or its lock is refused, never followed). */
void mj_cache_add_totals(mj_cache *c, const double v[MJ_CACHE_N_TOTALS]);
/* Read the totals; *present = 0 when no process has added any yet. */
mj_status mj_cache_totals(const mj_cache *c, double v[MJ_CACHE_N_TOTALS], int64_t *processes,
                          int *present);

/* Entry file encoding, exposed for tests: serialize to a buffer / parse from one. */
mj_status mj_cache_encode(const mj_cache_entry *e, uint8_t **buf, size_t *len);
mj_status mj_cache_decode(const uint8_t *buf, size_t len, mj_cache_entry *out);

#endif
