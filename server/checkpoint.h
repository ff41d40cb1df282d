/* checkpoint.h -- durable server checkpoints (docs/design.md section 7).
 *
 * A checkpoint is a list of named binary sections; the server decides what
 * goes in them (tensor values, versions, optimizer state, membership,
 * residual snapshots). This module only stores and checks them: one file
 * <dir>/ckpt-<seq, 20 digits>.gddr per checkpoint, written with liburing to
 * "<name>.tmp", fsync'd, renamed, the directory fsync'd, CRC32C over the
 * content, the newest `keep` kept. The byte layout is in
 * docs/checkpoint-format.md.
 *
 * Files: checkpoint_format.c (the layout, file names, listing),
 * checkpoint_read.c (loading), checkpoint_write.c (writing and the writer
 * thread).
 *
 * Every function returns a gddr_err (GDDR_OK = 0) unless it says otherwise.
 * A directory belongs to one server: two processes writing checkpoints into
 * the same directory is not supported.
 */
#ifndef GDDR_SERVER_CHECKPOINT_H
#define GDDR_SERVER_CHECKPOINT_H

#include <stddef.h>
#include <stdint.h>

#include "gddr_base.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One named section. name is NUL-terminated, 1..63 bytes, unique within a
 * checkpoint. data may be NULL only when len is 0. */
typedef struct gddr_ckpt_section {
    char name[64];
    void *data;
    uint64_t len;
} gddr_ckpt_section;

/* Timings of one gddr__ckpt_write, in milliseconds:
 *   copy_ms   CPU time spent encoding: header/section records and CRC32C
 *             (overlaps the writes, which are issued block by block);
 *   write_ms  from the first write submitted to the last one completed;
 *   fsync_ms  fsync of the file plus fsync of the directory;
 *   total_ms  the whole call, including rename and deleting old files.
 * bytes is the size of the file written. */
typedef struct gddr_ckpt_stats {
    double copy_ms, write_ms, fsync_ms, total_ms;
    uint64_t bytes;
} gddr_ckpt_stats;

/* Writes sections s[0..n) as checkpoint `seq` into dir: to
 * <dir>/ckpt-<seq>.gddr.tmp through io_uring (up to 16 writes of 1 MiB in
 * flight), then fsync, rename to <dir>/ckpt-<seq>.gddr, fsync of dir. Then
 * deletes older checkpoints beyond the newest `keep` (keep <= 0: delete
 * nothing; the file just written is never deleted). st (may be NULL) gets the
 * timings. On failure err (may be NULL) gets "what failed: strerror", no final
 * file is left and the temp file is removed; returns GDDR_EINVAL for bad
 * arguments, GDDR_ENOMEM, or GDDR_EIO. The directory must exist. Falls back to
 * pwritev() with one warning when io_uring is unavailable (seccomp,
 * io_uring_disabled). If only the final directory fsync fails, the checkpoint
 * file stays (it is complete) and GDDR_EIO is returned. */
int gddr__ckpt_write(const char *dir, uint64_t seq, const gddr_ckpt_section *s, size_t n,
                     int keep, gddr_ckpt_stats *st, char *err, size_t errlen);

/* A loaded checkpoint; s[] and every s[i].data are malloc'd and owned by it
 * (s[i].data is never NULL, even for an empty section). */
typedef struct gddr_ckpt {
    uint64_t seq;
    char path[4096];
    size_t n;
    gddr_ckpt_section *s;
} gddr_ckpt;

/* Loads the newest valid checkpoint in dir: the highest seq whose magic,
 * version, lengths, seq and CRC check out. Each invalid newer file is
 * skipped with a gddr_log(GDDR_LOG_WARN, "checkpoint <path> skipped: <why>")
 * line. Returns GDDR_OK and fills out; returns 1 (out->n = 0) when dir has no
 * valid checkpoint or does not exist; GDDR_EIO (err says what) when a
 * directory or file cannot be read (an unreadable newest checkpoint is an
 * error, not a reason to fall back silently to an older one), GDDR_ENOMEM. */
int gddr__ckpt_load_newest(const char *dir, gddr_ckpt *out, char *err, size_t errlen);

/* gddr__ckpt_load_newest among the checkpoints of seq <= max_seq; only:
 * checkpoint max_seq itself or none (1). */
int gddr__ckpt_load_upto(const char *dir, uint64_t max_seq, int only, gddr_ckpt *out, char *err,
                         size_t errlen);

/* The first section named `name`, or NULL. */
const gddr_ckpt_section *gddr__ckpt_find(const gddr_ckpt *c, const char *name);

/* Frees what c owns and zeroes it; safe on a zeroed or already freed one. */
void gddr__ckpt_free(gddr_ckpt *c);

/* Seqs of the ckpt-<seq>.gddr files in dir (valid or not; temp files not
 * counted), newest first. *count gets how many there are; at most max (the
 * newest) are stored in seqs. A missing dir gives GDDR_OK and *count = 0. */
int gddr__ckpt_list(const char *dir, uint64_t *seqs, size_t max, size_t *count);

/* Background writer: the server copies its state into freshly malloc'd
 * sections (a memcpy under its lock) and submits them; the writer thread owns
 * them from then on, writes them with gddr__ckpt_write, frees them and records
 * the outcome. It logs each outcome itself: INFO "checkpoint <path> written:
 * ..." or ERROR "checkpoint <seq> failed: <err>". At most one write in flight.
 *
 * start: creates dir (one level, mode 0750) if it is missing, removes stale
 * ckpt-*.gddr.tmp files left by a crash, starts the thread (all signals
 * blocked in it). GDDR_EIO (logged) when dir is not a writable directory. */
typedef struct gddr_ckpt_writer gddr_ckpt_writer;
int gddr__ckpt_writer_start(const char *dir, int keep, gddr_ckpt_writer **out);

/* Hands s[0..n) to the writer thread. On GDDR_OK the writer owns s (freed
 * with free()) and every s[i].data; on any other return the caller keeps
 * them. GDDR_ESTATE: a write is still in flight (skip this interval);
 * GDDR_ESHUTDOWN: the writer is stopping; GDDR_EINVAL. */
int gddr__ckpt_writer_submit(gddr_ckpt_writer *w, uint64_t seq, gddr_ckpt_section *s, size_t n);

/* Files a and b (0: none) are not deleted to keep `keep` files by the
 * writes submitted from now on: the bases incremental checkpoints need. */
void gddr__ckpt_writer_pin(gddr_ckpt_writer *w, uint64_t a, uint64_t b);

/* 1 while a submitted write has not completed, else 0. */
int gddr__ckpt_writer_busy(gddr_ckpt_writer *w);

/* Blocks until no write is in flight, at most timeout_ms (< 0: no bound);
 * GDDR_ETIMEDOUT otherwise. Then reports the most recent completed write:
 * *last_rc its gddr_err, *last its stats, *last_seq its seq (each pointer may
 * be NULL). Before any write completed: GDDR_OK, zeroed stats, seq 0. */
int gddr__ckpt_writer_wait(gddr_ckpt_writer *w, int timeout_ms, int *last_rc,
                           gddr_ckpt_stats *last, uint64_t *last_seq);

/* Finishes the write in flight, joins the thread, frees, sets *w = NULL. */
void gddr__ckpt_writer_stop(gddr_ckpt_writer **w);

/* The checksum of the format: common/crc32c.h. */
#include "crc32c.h"

/* Tests only (0 in production): GDDR_CKPT_TEST_NO_URING forces the
 * pwritev()/fsync() path; GDDR_CKPT_TEST_NO_FALLOCATE skips reserving the
 * file's space up front, so that write errors surface in the writes. */
enum { GDDR_CKPT_TEST_NO_URING = 1, GDDR_CKPT_TEST_NO_FALLOCATE = 2 };
extern int gddr__ckpt_test_flags;

#ifdef __cplusplus
}
#endif
#endif
