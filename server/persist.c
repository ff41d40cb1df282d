/* persist.c -- server checkpoints: what goes in them and when.
 *
 * The front thread copies the state into fresh buffers (one memcpy per
 * tensor, the only time pushes wait) and hands them to the checkpoint
 * writer thread (checkpoint.c), which writes them through liburing while
 * training goes on. Sections:
 *   "meta"          u64 format, u64 previous epoch, u64 tensor count
 *   "tensor/<id>"   a tensor_head, the key, values, momentum (if any),
 *                   the sync accumulator and its chunk flags (if a step
 *                   was being collected)
 *   "workers"       per known rank: rank, clock, pushes
 *   "residual/..."  worker residual snapshots (orphan.c)
 * A crash loses the pushes applied after the newest checkpoint: at most
 * checkpoint_interval_s seconds of updates (docs/operations.md).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checkpoint.h"
#include "log.h"
#include "snapshot.h"

#define META_FORMAT 1

typedef struct tensor_head {
    uint64_t version, n;
    uint32_t chunk, flags; /* flags: 1 momentum, 2 sync accumulator */
    int32_t tau, calm;
    double norm_ema, rate_ema;
    uint32_t ncontrib, npushes;
    uint32_t keylen, pad;
} tensor_head;

typedef struct worker_rec {
    uint32_t rank, alive;
    uint64_t clock, pushes;
} worker_rec;

static int add_section(gddr_ckpt_section **s, size_t *n, size_t *cap, const char *name,
                       void *data, uint64_t len)
{
    if (*n == *cap) {
        size_t nc = *cap ? *cap * 2 : 16;
        gddr_ckpt_section *q = realloc(*s, nc * sizeof *q);
        if (!q)
            return -1;
        *s = q;
        *cap = nc;
    }
    gddr_ckpt_section *x = &(*s)[(*n)++];
    memset(x, 0, sizeof *x);
    snprintf(x->name, sizeof x->name, "%s", name);
    x->data = data;
    x->len = len;
    return 0;
}

/* Builds the sections; every buffer is malloc'd, owned by the caller. */
static int collect(gddr_ps *ps, gddr_ckpt_section **out, size_t *nout)
{
    gddr_ckpt_section *s = NULL;
    size_t n = 0, cap = 0;
    uint64_t *meta = malloc(3 * sizeof *meta);
    if (!meta)
        goto fail;
    meta[0] = META_FORMAT;
    meta[1] = ps->epoch;
    meta[2] = ps->ntensors;
    if (add_section(&s, &n, &cap, "meta", meta, 3 * sizeof *meta) < 0) {
        free(meta);
        goto fail;
    }
    for (size_t i = 0; i < ps->ntensors; i++) {
        ps_tensor *t = ps->tensors[i];
        int has_acc = t->npushes > 0;
        size_t keylen = strlen(t->key);
        size_t len = sizeof(tensor_head) + keylen + t->n * 4 * (1 + (t->mom ? 1 : 0) + has_acc) +
                     (has_acc ? t->nchunks + (size_t)ps->cfg.max_workers : 0);
        char *buf = malloc(len), *p = buf;
        if (!buf)
            goto fail;
        tensor_head h = { t->version, t->n, t->chunk, (t->mom ? 1u : 0u) | (has_acc ? 2u : 0u),
                          t->tau, t->calm, t->norm_ema, t->rate_ema, t->ncontrib, t->npushes,
                          (uint32_t)keylen, 0 };
        memcpy(p, &h, sizeof h), p += sizeof h;
        memcpy(p, t->key, keylen), p += keylen;
        memcpy(p, t->w, t->n * 4), p += t->n * 4;
        if (t->mom)
            memcpy(p, t->mom, t->n * 4), p += t->n * 4;
        if (has_acc) {
            memcpy(p, t->acc, t->n * 4), p += t->n * 4;
            memcpy(p, t->touched, t->nchunks), p += t->nchunks;
            memcpy(p, t->contrib, (size_t)ps->cfg.max_workers);
        }
        char name[64];
        snprintf(name, sizeof name, "tensor/%zu", i);
        if (add_section(&s, &n, &cap, name, buf, len) < 0) {
            free(buf);
            goto fail;
        }
    }
    size_t nw = 0;
    for (int r = 0; r < ps->cfg.max_workers; r++)
        nw += ps->workers[r].known;
    worker_rec *wr = malloc((nw ? nw : 1) * sizeof *wr);
    if (!wr)
        goto fail;
    for (int r = 0, k = 0; r < ps->cfg.max_workers; r++)
        if (ps->workers[r].known)
            wr[k++] = (worker_rec){ (uint32_t)r, (uint32_t)ps->workers[r].alive,
                                    ps->workers[r].clock, ps->workers[r].pushes };
    if (add_section(&s, &n, &cap, "workers", wr, nw * sizeof *wr) < 0) {
        free(wr);
        goto fail;
    }
    if (gddr_ps_orphan_sections(ps, &s, &n, &cap, add_section) < 0)
        goto fail;
    *out = s;
    *nout = n;
    return 0;
fail:
    for (size_t i = 0; i < n; i++)
        free(s[i].data);
    free(s);
    return -1;
}

/* Restores one tensor section; returns 0 or -1 with err filled. */
static int restore_tensor(gddr_ps *ps, const gddr_ckpt_section *sec, char *err, size_t errlen)
{
    tensor_head h;
    if (sec->len < sizeof h) {
        snprintf(err, errlen, "section %s is too short", sec->name);
        return -1;
    }
    memcpy(&h, sec->data, sizeof h);
    int has_mom = h.flags & 1, has_acc = (h.flags & 2) != 0;
    size_t want = sizeof h + h.keylen + h.n * 4 * (1 + has_mom + has_acc);
    if (h.keylen == 0 || h.keylen >= 128 || h.n == 0 || sec->len < want) {
        snprintf(err, errlen, "section %s is inconsistent", sec->name);
        return -1;
    }
    if (h.chunk != (uint32_t)ps->cfg.chunk) {
        snprintf(err, errlen, "checkpoint chunk %u differs from chunk = %lld in the config",
                 h.chunk, ps->cfg.chunk);
        return -1;
    }
    const char *p = (const char *)sec->data + sizeof h;
    char key[128];
    memcpy(key, p, h.keylen);
    key[h.keylen] = 0;
    p += h.keylen;
    /* tensor_new is in server.c; we rebuild through the public registration
     * path's allocator exposed for restores. */
    ps_tensor *t = gddr_ps_tensor_create(ps, key, h.n);
    if (!t) {
        snprintf(err, errlen, "out of memory restoring tensor '%s'", key);
        return -1;
    }
    t->version = h.version;
    t->tau = h.tau;
    t->calm = h.calm;
    t->norm_ema = h.norm_ema;
    t->rate_ema = h.rate_ema;
    memcpy(t->w, p, h.n * 4), p += h.n * 4;
    if (has_mom) {
        t->mom = malloc(h.n * 4);
        if (!t->mom) {
            snprintf(err, errlen, "out of memory");
            return -1;
        }
        memcpy(t->mom, p, h.n * 4), p += h.n * 4;
    }
    if (has_acc) {
        size_t extra = t->nchunks + (size_t)ps->cfg.max_workers;
        if (sec->len < want + extra) {
            snprintf(err, errlen, "section %s: sync step cut short", sec->name);
            return -1;
        }
        memcpy(t->acc, p, h.n * 4), p += h.n * 4;
        memcpy(t->touched, p, t->nchunks), p += t->nchunks;
        memcpy(t->contrib, p, (size_t)ps->cfg.max_workers);
        t->ncontrib = h.ncontrib;
        t->npushes = h.npushes;
    }
    return 0;
}

static uint64_t highest_seq(const char *dir)
{
    uint64_t seqs[1024];
    size_t count = 0;
    if (gddr__ckpt_list(dir, seqs, 1024, &count) != GDDR_OK || count == 0)
        return 0;
    return seqs[0];
}

int gddr_ps_snapshot_restore(gddr_ps *ps, char *err, size_t errlen)
{
    if (!ps->cfg.checkpoint_dir[0])
        return GDDR_OK;
    int rc = gddr__ckpt_writer_start(ps->cfg.checkpoint_dir, (int)ps->cfg.checkpoint_keep, &ps->ckw);
    if (rc != GDDR_OK) {
        snprintf(err, errlen, "cannot start the checkpoint writer for %s", ps->cfg.checkpoint_dir);
        return rc;
    }
    ps->ckpt_seq = highest_seq(ps->cfg.checkpoint_dir);
    ps->last_ckpt_ms = gddr__now_ms();
    gddr_ckpt c;
    memset(&c, 0, sizeof c);
    char lerr[512] = "";
    rc = gddr__ckpt_load_newest(ps->cfg.checkpoint_dir, &c, lerr, sizeof lerr);
    if (rc == 1) {
        gddr_log(GDDR_LOG_INFO, "no checkpoint in %s: starting empty", ps->cfg.checkpoint_dir);
        return GDDR_OK;
    }
    if (rc != GDDR_OK) {
        snprintf(err, errlen, "cannot read checkpoints in %s: %s", ps->cfg.checkpoint_dir, lerr);
        return rc;
    }
    const gddr_ckpt_section *meta = gddr__ckpt_find(&c, "meta");
    if (!meta || meta->len < 24 || ((uint64_t *)meta->data)[0] != META_FORMAT) {
        snprintf(err, errlen, "%s: no usable meta section", c.path);
        gddr__ckpt_free(&c);
        return GDDR_EIO;
    }
    uint64_t nt = ((uint64_t *)meta->data)[2];
    for (uint64_t i = 0; i < nt; i++) {
        char name[64];
        snprintf(name, sizeof name, "tensor/%llu", (unsigned long long)i);
        const gddr_ckpt_section *sec = gddr__ckpt_find(&c, name);
        if (!sec) {
            snprintf(err, errlen, "%s: section %s is missing", c.path, name);
            gddr__ckpt_free(&c);
            return GDDR_EIO;
        }
        char terr[256];
        if (restore_tensor(ps, sec, terr, sizeof terr) < 0) {
            snprintf(err, errlen, "%s: %s", c.path, terr);
            gddr__ckpt_free(&c);
            return GDDR_EIO;
        }
    }
    const gddr_ckpt_section *ws = gddr__ckpt_find(&c, "workers");
    size_t nw = ws ? ws->len / sizeof(worker_rec) : 0;
    int64_t now = gddr__now_ms();
    for (size_t i = 0; i < nw; i++) {
        worker_rec wr;
        memcpy(&wr, (char *)ws->data + i * sizeof wr, sizeof wr);
        if (wr.rank >= (uint32_t)ps->cfg.max_workers)
            continue;
        /* Workers known before the crash get worker_timeout_s to come back
         * before a sync step stops waiting for them. */
        ps_worker *w = &ps->workers[wr.rank];
        w->known = 1;
        w->alive = 1;
        w->last_seen_ms = now;
        w->clock = wr.clock;
        w->pushes = wr.pushes;
        if ((int)wr.rank + 1 > ps->announced_world)
            ps->announced_world = (int)wr.rank + 1;
    }
    if (nw)
        ps->first_hello_ms = now;
    gddr_ps_orphan_restore(ps, &c);
    gddr_log(GDDR_LOG_INFO, "restored checkpoint %s: %llu tensors, %zu workers", c.path,
             (unsigned long long)nt, nw);
    gddr__ckpt_free(&c);
    return GDDR_OK;
}

void gddr_ps_checkpoint_tick(gddr_ps *ps, int final)
{
    if (!ps->ckw)
        return;
    int64_t now = gddr__now_ms();
    int due = final || ps->ckpt_now ||
              (ps->cfg.checkpoint_interval_s > 0 &&
               now - ps->last_ckpt_ms >= (int64_t)(ps->cfg.checkpoint_interval_s * 1000));
    /* Report the write that finished since the last tick. */
    if (ps->ckpt_pending && !gddr__ckpt_writer_busy(ps->ckw)) {
        int rc = GDDR_OK;
        gddr_ckpt_stats st;
        uint64_t seq = 0;
        gddr__ckpt_writer_wait(ps->ckw, 0, &rc, &st, &seq);
        ps->ckpt_pending = 0;
        if (rc == GDDR_OK) {
            ps->ckpt_count++;
            ps->ckpt_last_ms = st.total_ms;
            /* The writer logged the write itself; add what the front thread paid. */
            gddr_log(GDDR_LOG_DEBUG, "checkpoint %llu: state copy took %.1f ms (write %.1f MB, %.1f ms)",
                     (unsigned long long)seq, ps->ckpt_copy_ms, (double)st.bytes / 1e6, st.total_ms);
        } /* a failure was logged by the writer */
    }
    if (!due)
        return;
    if (gddr__ckpt_writer_busy(ps->ckw)) {
        if (!final)
            return; /* the next tick tries again */
        gddr__ckpt_writer_wait(ps->ckw, 60000, NULL, NULL, NULL);
    }
    ps->ckpt_now = 0;
    ps->last_ckpt_ms = now;
    int64_t t0 = gddr__now_ms();
    gddr_ckpt_section *s;
    size_t n;
    if (collect(ps, &s, &n) < 0) {
        gddr_log(GDDR_LOG_ERROR, "checkpoint skipped: out of memory copying the state");
        return;
    }
    ps->ckpt_copy_ms = (double)(gddr__now_ms() - t0);
    if (gddr__ckpt_writer_submit(ps->ckw, ++ps->ckpt_seq, s, n) != GDDR_OK) {
        for (size_t i = 0; i < n; i++)
            free(s[i].data);
        free(s);
        gddr_log(GDDR_LOG_WARN, "checkpoint skipped: the writer is busy");
        return;
    }
    ps->ckpt_pending = 1;
    if (final) {
        int rc = GDDR_OK;
        gddr_ckpt_stats st;
        gddr__ckpt_writer_wait(ps->ckw, 120000, &rc, &st, NULL);
        ps->ckpt_pending = 0;
        if (rc == GDDR_OK)
            gddr_log(GDDR_LOG_INFO, "final checkpoint %llu written: %.1f MB in %.1f ms",
                     (unsigned long long)ps->ckpt_seq, (double)st.bytes / 1e6, st.total_ms);
        else
            gddr_log(GDDR_LOG_ERROR, "final checkpoint failed: %s", gddr_strerror(rc));
        ps->final_ckpt_rc = rc;
    }
}
