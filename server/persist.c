/* persist.c -- server checkpoints: what goes in them and when.
 *
 * The front thread copies the state into fresh buffers (one memcpy per
 * tensor, the only time pushes wait) and hands them to the checkpoint
 * writer thread (checkpoint_write.c), which writes them through liburing
 * while training goes on. Sections:
 *   "meta"          u64 format (4), u64 previous epoch, u64 tensor count,
 *                   u64 table count (format 4)
 *   "tensor/<id>"   a tensor_head, the key, values, the optimizer state
 *                   (s1, s2 as present), the sync accumulator, its chunk
 *                   flags and counts (if a step was being collected)
 *   "opt/<id>"      the tensor's optimizer (an opt_rec); absent: the
 *                   server's [optimizer] section (format 2 files)
 *   "flushv/<id>/<k>" a flush waiting for tensor id's open sync step:
 *                   a flush_head, the bitmap (if sparse), the values
 *                   (format 2 files: "flush/..." with the lr folded in)
 *   "fill/<rank>/<id>" a worker's fill credits (fill.c)
 *   "workers"       per live or dead worker (not those that said bye): a
 *                   worker_rec, then its per-tensor exactly-once records
 *                   (ps_wtensor), so a push applied before the checkpoint
 *                   is not applied again when its worker resends it
 *   "snap/..." "orphan/..."  residual snapshots and orphans (orphan.c)
 *   "table/<i>" "trows/<i>" (or "tdelta/<i>", "tbase")  tables (table_persist.c)
 *   "plog"          u64: the push log's LSN this state holds (pushlog.c);
 *                   absent (older files): 0
 * A crash loses the pushes applied after the newest checkpoint: at most
 * checkpoint_interval_s seconds of updates (docs/operations.md). Format 1
 * files (before exactly-once), 2 (before optimizers and fill) and 3
 * (before tables) still load.
 *
 * Checkpoints asked for by a request are coalesced: while one is being
 * written, or one was started less than a second ago, a request joins it
 * instead of queueing another, so a flood of requests costs at most one
 * checkpoint a second.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checkpoint.h"
#include "pushlog.h"
#include "syncstep.h"
#include "crc32c.h"
#include "log.h"
#include "residual.h"
#include "snapshot.h"

#define META_FORMAT 4
#define REQUEST_GAP_MS 1000

typedef struct tensor_head {
    uint64_t version, n;
    uint32_t chunk, flags; /* flags: 1 s1 (momentum), 2 sync accumulator, 4 s2,
                            * 8 per-chunk counts after the chunk flags */
    int32_t tau, calm;
    double norm_ema, rate_ema;
    uint32_t ncontrib, npushes;
    uint32_t keylen, sync_divisor; /* format 1: sync_divisor was padding (0) */
} tensor_head;

typedef struct worker_rec_v1 {
    uint32_t rank, alive;
    uint64_t clock, pushes;
} worker_rec_v1;

typedef struct worker_rec {
    uint32_t rank, state;
    uint64_t session, clock, pushes;
    uint32_t nwt, pad;
} worker_rec;

typedef struct flush_head_v2 {
    float scale; /* lr_eff / workers */
    uint32_t has_bitmap;
    uint64_t nvals;
} flush_head_v2;

typedef struct flush_head {
    float vscale;
    uint32_t has_bitmap;
    uint64_t nvals;
    double lr;
    uint32_t rank, pad;
} flush_head;

typedef struct opt_rec {
    int32_t kind, explicit_;
    double lr, momentum, beta1, beta2, eps, weight_decay;
    double step_lr;
} opt_rec;

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
    uint64_t *meta = malloc(4 * sizeof *meta);
    if (!meta)
        goto fail;
    meta[0] = META_FORMAT;
    meta[1] = ps->epoch;
    meta[2] = ps->ntensors;
    meta[3] = ps_tables_count(ps);
    if (add_section(&s, &n, &cap, "meta", meta, 4 * sizeof *meta) < 0) {
        free(meta);
        goto fail;
    }
    /* The push log's LSN this state holds: a restart replays the records
     * after it (pushlog.c); the log goes on in a new segment. */
    uint64_t *lsn = malloc(sizeof *lsn);
    if (!lsn)
        goto fail;
    *lsn = ps_plog_rotate(ps);
    if (add_section(&s, &n, &cap, "plog", lsn, sizeof *lsn) < 0) {
        free(lsn);
        goto fail;
    }
    /* Sync: each rank's place in each tensor's and table's steps. */
    uint64_t plen = 0;
    void *place = ps_places_section(ps, &plen);
    if (place && add_section(&s, &n, &cap, "syncplace", place, plen) < 0) {
        free(place);
        goto fail;
    }
    ps_settle_all(ps); /* the copy is of whole versions */
    for (size_t i = 0; i < ps->ntensors; i++) {
        ps_tensor *t = ps->tensors[i];
        int has_acc = t->npushes > 0;
        size_t keylen = strlen(t->key);
        size_t len = sizeof(tensor_head) + keylen +
                     t->n * 4 * (1 + (t->s1 ? 1 : 0) + (t->s2 ? 1 : 0) + has_acc) +
                     (has_acc ? t->nchunks * 5 + (size_t)ps->cfg.max_workers : 0);
        char *buf = malloc(len), *p = buf;
        if (!buf)
            goto fail;
        tensor_head h = { t->version, t->n, t->chunk,
                          (t->s1 ? 1u : 0u) | (has_acc ? 2u | 8u : 0u) | (t->s2 ? 4u : 0u),
                          t->tau, t->calm, t->norm_ema, t->rate_ema, t->ncontrib, t->npushes,
                          (uint32_t)keylen, t->sync_divisor };
        memcpy(p, &h, sizeof h), p += sizeof h;
        memcpy(p, t->key, keylen), p += keylen;
        memcpy(p, t->w, t->n * 4), p += t->n * 4;
        if (t->s1)
            memcpy(p, t->s1, t->n * 4), p += t->n * 4;
        if (t->s2)
            memcpy(p, t->s2, t->n * 4), p += t->n * 4;
        if (has_acc) {
            memcpy(p, t->acc, t->n * 4), p += t->n * 4;
            memcpy(p, t->touched, t->nchunks), p += t->nchunks;
            memcpy(p, t->contrib, (size_t)ps->cfg.max_workers), p += ps->cfg.max_workers;
            memcpy(p, t->cnt, t->nchunks * 4);
        }
        char name[64];
        snprintf(name, sizeof name, "tensor/%zu", i);
        if (add_section(&s, &n, &cap, name, buf, len) < 0) {
            free(buf);
            goto fail;
        }
        opt_rec *o = malloc(sizeof *o);
        if (!o)
            goto fail;
        *o = (opt_rec){ t->opt.kind, t->opt.explicit_, t->opt.lr, t->opt.momentum, t->opt.beta1,
                        t->opt.beta2, t->opt.eps, t->opt.weight_decay, t->step_lr };
        snprintf(name, sizeof name, "opt/%zu", i);
        if (add_section(&s, &n, &cap, name, o, sizeof *o) < 0) {
            free(o);
            goto fail;
        }
    }
    for (size_t i = 0; i < ps->ntensors; i++) {
        ps_tensor *t = ps->tensors[i];
        int k = 0;
        for (ps_flush *f = t->flushes; f; f = f->next, k++) {
            size_t nb = f->bitmap ? (t->nchunks + 7) / 8 : 0, nv = 0;
            if (f->bitmap)
                gddr_bitmap_count(f->bitmap, t->n, t->chunk, &(size_t){ 0 }, &nv);
            else
                nv = t->n;
            size_t len = sizeof(flush_head) + nb + nv * 4;
            char *buf = malloc(len), *p = buf;
            if (!buf)
                goto fail;
            flush_head h = { f->vscale, f->bitmap != NULL, nv, f->lr, f->rank, 0 };
            memcpy(p, &h, sizeof h), p += sizeof h;
            if (nb)
                memcpy(p, f->bitmap, nb), p += nb;
            memcpy(p, f->vals, nv * 4);
            char name[64];
            snprintf(name, sizeof name, "flushv/%zu/%d", i, k);
            if (add_section(&s, &n, &cap, name, buf, len) < 0) {
                free(buf);
                goto fail;
            }
        }
    }
    size_t wlen = 0;
    for (int r = 0; r < ps->cfg.max_workers; r++) {
        ps_worker *w = &ps->workers[r];
        if (w->state == PS_W_LIVE || w->state == PS_W_DEAD)
            wlen += sizeof(worker_rec) + w->nwt * sizeof(ps_wtensor);
    }
    char *wbuf = malloc(wlen ? wlen : 1), *wp = wbuf;
    if (!wbuf)
        goto fail;
    for (int r = 0; r < ps->cfg.max_workers; r++) {
        ps_worker *w = &ps->workers[r];
        if (w->state != PS_W_LIVE && w->state != PS_W_DEAD)
            continue;
        worker_rec wr = { (uint32_t)r, (uint32_t)w->state, w->session, w->clock, w->pushes,
                          (uint32_t)w->nwt, 0 };
        memcpy(wp, &wr, sizeof wr), wp += sizeof wr;
        if (w->nwt)
            memcpy(wp, w->wt, w->nwt * sizeof(ps_wtensor)), wp += w->nwt * sizeof(ps_wtensor);
    }
    if (add_section(&s, &n, &cap, "workers", wbuf, wlen) < 0) {
        free(wbuf);
        goto fail;
    }
    if (ps_orphan_sections(ps, &s, &n, &cap, add_section) < 0 ||
        ps_fill_sections(ps, &s, &n, &cap, add_section) < 0 ||
        ps_tables_ckpt_sections(ps, &s, &n, &cap, add_section) < 0)
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
    int has_s1 = h.flags & 1, has_acc = (h.flags & 2) != 0, has_s2 = (h.flags & 4) != 0;
    int has_cnt = (h.flags & 8) != 0;
    size_t want = sizeof h + h.keylen + h.n * 4 * (1 + has_s1 + has_s2 + has_acc);
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
    /* The allocator a registration uses (tensor.c). */
    ps_tensor *t = ps_tensor_create(ps, key, h.n);
    if (!t) {
        snprintf(err, errlen, "out of memory restoring tensor '%s'", key);
        return -1;
    }
    t->version = h.version;
    t->sync_divisor = h.sync_divisor;
    t->tau = h.tau;
    t->calm = h.calm;
    t->norm_ema = h.norm_ema;
    t->rate_ema = h.rate_ema;
    memcpy(t->w, p, h.n * 4), p += h.n * 4;
    float **state[2] = { &t->s1, &t->s2 };
    int has[2] = { has_s1, has_s2 };
    for (int k = 0; k < 2; k++) {
        if (!has[k])
            continue;
        *state[k] = malloc(h.n * 4);
        if (!*state[k]) {
            snprintf(err, errlen, "out of memory");
            return -1;
        }
        memcpy(*state[k], p, h.n * 4), p += h.n * 4;
    }
    if (has_acc) {
        size_t extra = t->nchunks + (size_t)ps->cfg.max_workers + (has_cnt ? t->nchunks * 4 : 0);
        if (sec->len < want + extra) {
            snprintf(err, errlen, "section %s: sync step cut short", sec->name);
            return -1;
        }
        memcpy(t->acc, p, h.n * 4), p += h.n * 4;
        memcpy(t->touched, p, t->nchunks), p += t->nchunks;
        memcpy(t->contrib, p, (size_t)ps->cfg.max_workers), p += ps->cfg.max_workers;
        t->ncontrib = h.ncontrib;
        t->npushes = h.npushes;
        if (has_cnt) {
            memcpy(t->cnt, p, t->nchunks * 4);
        } else {
            /* Format 2 had no fill and folded lr into the accumulator: every
             * push counted in every chunk, and the step's lr is the one
             * the pushes were scaled with. */
            for (size_t c = 0; c < t->nchunks; c++)
                t->cnt[c] = t->touched[c] ? h.npushes : 0;
            t->step_lr = 1.0; /* acc holds lr_eff * g already */
        }
    }
    return 0;
}

/* Moves a checkpoint that could not be read out of the way (never deletes
 * it: the operator may want it), so retention and later starts skip it. */
static void move_aside(const char *dir, uint64_t seq)
{
    char from[4200], to[4300];
    snprintf(from, sizeof from, "%s/ckpt-%020llu.gddr", dir, (unsigned long long)seq);
    snprintf(to, sizeof to, "%s.damaged", from);
    if (rename(from, to) == 0)
        gddr_log(GDDR_LOG_WARN, "unreadable checkpoint moved aside to %s", to);
    else
        gddr_log(GDDR_LOG_WARN, "unreadable checkpoint %s could not be moved aside: %s", from,
                 strerror(errno));
}

/* The optimizers ("opt/<id>"); a tensor without one keeps the section's. */
static void restore_optimizers(gddr_ps *ps, const gddr_ckpt *c)
{
    for (size_t i = 0; i < c->n; i++) {
        const gddr_ckpt_section *sec = &c->s[i];
        unsigned long long id;
        opt_rec o;
        if (sscanf(sec->name, "opt/%llu", &id) != 1)
            continue;
        if (id >= ps->ntensors || sec->len != sizeof o) {
            gddr_log(GDDR_LOG_WARN, "checkpoint section %s does not fit the tensors: ignored", sec->name);
            continue;
        }
        memcpy(&o, sec->data, sizeof o);
        ps_tensor *t = ps->tensors[id];
        ps_optim po = { o.kind, o.explicit_, o.lr, o.momentum, o.beta1, o.beta2, o.eps, o.weight_decay };
        char msg[128];
        if (ps_optim_check(&po, msg, sizeof msg) < 0) {
            gddr_log(GDDR_LOG_WARN, "checkpoint section %s: %s: ignored", sec->name, msg);
            continue;
        }
        if (!o.explicit_ && po.kind != ps->cfg.opt_kind) {
            gddr_log(GDDR_LOG_WARN, "tensor '%s' was trained with %s (the [optimizer] section then); "
                     "kind = %s now: its optimizer state starts from zero", t->key,
                     ps_optim_name(po.kind), ps_optim_name(ps->cfg.opt_kind));
            free(t->s1), free(t->s2);
            t->s1 = t->s2 = NULL;
        }
        if (o.explicit_)
            t->opt = po;
        t->step_lr = o.step_lr;
    }
}

static void restore_flushes(gddr_ps *ps, const gddr_ckpt *c)
{
    for (size_t i = 0; i < c->n; i++) {
        const gddr_ckpt_section *sec = &c->s[i];
        unsigned long long id;
        int k;
        flush_head h;
        int v2 = sscanf(sec->name, "flush/%llu/%d", &id, &k) == 2;
        if (!v2 && sscanf(sec->name, "flushv/%llu/%d", &id, &k) != 2)
            continue;
        if (id >= ps->ntensors || sec->len < (v2 ? sizeof(flush_head_v2) : sizeof h))
            continue;
        ps_tensor *t = ps->tensors[id];
        size_t hl = sizeof h;
        if (v2) {
            /* lr_eff / workers was folded in: keep it as the flush's lr
             * (the step's 1/workers then divides once more: undo it). */
            flush_head_v2 o;
            memcpy(&o, sec->data, sizeof o);
            h = (flush_head){ 1.0f, o.has_bitmap, o.nvals, 0, 0, 0 };
            h.lr = (double)o.scale * (double)(t->sync_divisor ? t->sync_divisor : 1);
            hl = sizeof o;
        } else {
            memcpy(&h, sec->data, sizeof h);
        }
        size_t nb = h.has_bitmap ? (t->nchunks + 7) / 8 : 0;
        if (sec->len != hl + nb + h.nvals * 4 || h.nvals > t->n || h.rank >= (uint32_t)ps->cfg.max_workers) {
            gddr_log(GDDR_LOG_WARN, "checkpoint section %s does not fit the tensors: ignored", sec->name);
            continue;
        }
        ps_flush *f = calloc(1, sizeof *f);
        if (!f || !(f->vals = malloc(h.nvals * 4 + 4)) || (nb && !(f->bitmap = malloc(nb)))) {
            if (f)
                free(f->vals), free(f);
            continue;
        }
        const char *p = (const char *)sec->data + hl;
        if (nb)
            memcpy(f->bitmap, p, nb), p += nb;
        memcpy(f->vals, p, h.nvals * 4);
        f->vscale = h.vscale;
        f->lr = h.lr;
        f->rank = h.rank;
        ps_flush **pp = &t->flushes;
        while (*pp)
            pp = &(*pp)->next;
        *pp = f;
        t->nflushes++;
    }
}

/* Workers known before the crash get worker_timeout_s to come back before
 * a sync step stops waiting for them; until one says hello again, any
 * session may take its rank (its connection is gone with the old server),
 * and the same session keeps its exactly-once records. */
static size_t restore_workers(gddr_ps *ps, const gddr_ckpt_section *ws, int format)
{
    int64_t now = gddr__now_ms();
    size_t nw = 0;
    const char *p = ws ? ws->data : NULL, *end = ws ? (const char *)ws->data + ws->len : NULL;
    while (p && p < end) {
        worker_rec wr;
        memset(&wr, 0, sizeof wr);
        if (format == 1) {
            worker_rec_v1 v1;
            if ((size_t)(end - p) < sizeof v1)
                break;
            memcpy(&v1, p, sizeof v1), p += sizeof v1;
            wr = (worker_rec){ v1.rank, PS_W_LIVE, 0, v1.clock, v1.pushes, 0, 0 };
        } else {
            if ((size_t)(end - p) < sizeof wr)
                break;
            memcpy(&wr, p, sizeof wr), p += sizeof wr;
            if ((size_t)(end - p) < (size_t)wr.nwt * sizeof(ps_wtensor))
                break;
        }
        const char *wt = p;
        p += (size_t)wr.nwt * sizeof(ps_wtensor);
        if (wr.rank >= (uint32_t)ps->cfg.max_workers)
            continue;
        ps_worker *w = &ps->workers[wr.rank];
        w->state = wr.state == PS_W_DEAD ? PS_W_DEAD : PS_W_LIVE;
        w->restored = 1;
        w->session = wr.session;
        w->ckpt_session = wr.session;
        w->last_seen_ms = now;
        w->clock = wr.clock;
        w->pushes = wr.pushes;
        if (wr.nwt && (w->wt = malloc((size_t)wr.nwt * sizeof(ps_wtensor)))) {
            memcpy(w->wt, wt, (size_t)wr.nwt * sizeof(ps_wtensor));
            w->nwt = wr.nwt;
        }
        if ((int)wr.rank + 1 > ps->announced_world)
            ps->announced_world = (int)wr.rank + 1;
        nw++;
    }
    if (nw)
        ps->first_hello_ms = now;
    return nw;
}

int ps_snapshot_restore(gddr_ps *ps, char *err, size_t errlen)
{
    if (!ps->cfg.checkpoint_dir[0])
        return GDDR_OK;
    int rc = gddr__ckpt_writer_start(ps->cfg.checkpoint_dir, (int)ps->cfg.checkpoint_keep, &ps->ckw);
    if (rc != GDDR_OK) {
        snprintf(err, errlen, "cannot start the checkpoint writer for %s", ps->cfg.checkpoint_dir);
        return rc;
    }
    uint64_t seqs[1024];
    size_t count = 0;
    if (gddr__ckpt_list(ps->cfg.checkpoint_dir, seqs, 1024, &count) != GDDR_OK)
        count = 0;
    ps->ckpt_seq = count ? seqs[0] : 0;
    ps->last_ckpt_ms = gddr__now_ms();
    gddr_ckpt c, base;
    memset(&c, 0, sizeof c), memset(&base, 0, sizeof base);
    char lerr[512] = "";
    rc = ps_tables_ckpt_load(ps->cfg.checkpoint_dir, &c, &base, lerr, sizeof lerr);
    if (rc == 1 && count == 0) {
        gddr_log(GDDR_LOG_INFO, "no checkpoint in %s: starting empty", ps->cfg.checkpoint_dir);
        return GDDR_OK;
    }
    if (rc == 1) {
        /* Checkpoints are there but none can be read: starting empty would
         * throw the model away without anyone deciding so. */
        if (!ps->cfg.checkpoint_allow_empty) {
            snprintf(err, errlen,
                     "%s holds %zu checkpoint(s) and none is readable (see the lines above); "
                     "refusing to start empty. To start without the model anyway, set "
                     "checkpoint_allow_empty = true (the files are then moved aside, not deleted)",
                     ps->cfg.checkpoint_dir, count);
            return GDDR_EIO;
        }
        for (size_t i = 0; i < count && i < 1024; i++)
            move_aside(ps->cfg.checkpoint_dir, seqs[i]);
        gddr_log(GDDR_LOG_WARN, "no readable checkpoint in %s: starting empty (checkpoint_allow_empty)",
                 ps->cfg.checkpoint_dir);
        return GDDR_OK;
    }
    if (rc != GDDR_OK) {
        snprintf(err, errlen, "cannot read checkpoints in %s: %s", ps->cfg.checkpoint_dir, lerr);
        return rc;
    }
    /* Newer files than the one loaded were skipped as unreadable. */
    for (size_t i = 0; i < count && i < 1024 && seqs[i] > c.seq; i++)
        move_aside(ps->cfg.checkpoint_dir, seqs[i]);
    const gddr_ckpt_section *meta = gddr__ckpt_find(&c, "meta");
    uint64_t format = meta && meta->len >= 24 ? ((uint64_t *)meta->data)[0] : 0;
    if (format < 1 || format > META_FORMAT || (format >= 4 && meta->len < 32)) {
        snprintf(err, errlen, "%s: no usable meta section (format %llu)", c.path,
                 (unsigned long long)format);
        gddr__ckpt_free(&c), gddr__ckpt_free(&base);
        return GDDR_EIO;
    }
    uint64_t nt = ((uint64_t *)meta->data)[2];
    const gddr_ckpt_section *plog = gddr__ckpt_find(&c, "plog");
    if (plog && plog->len == sizeof(uint64_t))
        memcpy(&ps->plog_lsn0, plog->data, sizeof ps->plog_lsn0);
    for (uint64_t i = 0; i < nt; i++) {
        char name[64];
        snprintf(name, sizeof name, "tensor/%llu", (unsigned long long)i);
        const gddr_ckpt_section *sec = gddr__ckpt_find(&c, name);
        if (!sec) {
            snprintf(err, errlen, "%s: section %s is missing", c.path, name);
            gddr__ckpt_free(&c), gddr__ckpt_free(&base);
            return GDDR_EIO;
        }
        char terr[256];
        if (restore_tensor(ps, sec, terr, sizeof terr) < 0) {
            snprintf(err, errlen, "%s: %s", c.path, terr);
            gddr__ckpt_free(&c), gddr__ckpt_free(&base);
            return GDDR_EIO;
        }
    }
    for (size_t i = 0; i < ps->ntensors; i++)
        ps_tensor_mode(ps, ps->tensors[i]); /* hybrid: ends the warm-up if it was over */
    restore_optimizers(ps, &c);
    restore_flushes(ps, &c);
    size_t nw = restore_workers(ps, gddr__ckpt_find(&c, "workers"), (int)format);
    ps_fill_restore(ps, &c);
    ps_orphan_restore(ps, &c, (int)format);
    uint64_t ntab = format >= 4 ? ((uint64_t *)meta->data)[3] : 0;
    if (ps_tables_ckpt_restore(ps, &c, &base, ntab, lerr, sizeof lerr) < 0) {
        snprintf(err, errlen, "%s: %s", c.path, lerr);
        gddr__ckpt_free(&c), gddr__ckpt_free(&base);
        return GDDR_EIO;
    }
    ps_places_restore(ps, gddr__ckpt_find(&c, "syncplace"));
    ps_sync_restored(ps); /* tensors' and tables' open sync steps */
    gddr_log(GDDR_LOG_INFO, "restored checkpoint %s: %llu tensors, %zu workers, %llu tables", c.path,
             (unsigned long long)nt, nw, (unsigned long long)ntab);
    gddr__ckpt_free(&c), gddr__ckpt_free(&base);
    return GDDR_OK;
}

void ps_checkpoint_request(gddr_ps *ps, char *text, size_t len)
{
    ps->ckpt_requests++;
    if (!ps->ckw) {
        snprintf(text, len, "no checkpoint_dir: nothing to write");
        return;
    }
    /* The one being written joins only a request that has nothing newer to
     * save: after a push since its copy, the request asks for the next. */
    if (ps->ckpt_pending && gddr__ckpt_writer_busy(ps->ckw) && !ps->ckpt_now &&
        ps->pushes == ps->ckpt_pending_pushes &&
        ps->ntensors + ps_tables_count(ps) == ps->ckpt_pending_tensors) {
        ps->ckpt_joined++;
        snprintf(text, len, "joined checkpoint %llu, being written", (unsigned long long)ps->ckpt_seq);
        return;
    }
    if (ps->ckpt_now) {
        ps->ckpt_joined++;
        snprintf(text, len, "joined checkpoint %llu, due within a second",
                 (unsigned long long)ps->ckpt_seq + 1);
        return;
    }
    ps->ckpt_now = 1;
    snprintf(text, len, "checkpoint %llu requested", (unsigned long long)ps->ckpt_seq + 1);
}

void ps_checkpoint_tick(gddr_ps *ps, int final)
{
    if (!ps->ckw)
        return;
    int64_t now = gddr__now_ms();
    int due = final ||
              (ps->ckpt_now && (!ps->ckpt_started_ms || now - ps->ckpt_started_ms >= REQUEST_GAP_MS)) ||
              (ps->cfg.checkpoint_interval_s > 0 &&
               now - ps->last_ckpt_ms >= (int64_t)(ps->cfg.checkpoint_interval_s * 1000));
    /* Report the write that finished since the last tick. */
    if (ps->ckpt_pending && !gddr__ckpt_writer_busy(ps->ckw)) {
        int rc = GDDR_OK;
        gddr_ckpt_stats st;
        uint64_t seq = 0;
        gddr__ckpt_writer_wait(ps->ckw, 0, &rc, &st, &seq);
        ps->ckpt_pending = 0;
        ps->ckpt_state_known = rc == GDDR_OK;
        ps->ckpt_state_crc = ps->ckpt_pending_crc;
        if (rc == GDDR_OK)
            ps->ckpt_done_ms = gddr__now_ms();
        if (rc == GDDR_OK) {
            ps->ckpt_count++;
            ps->ckpt_last_ms = st.total_ms;
            ps_plog_prune(ps); /* the segments before the oldest kept checkpoint */
            /* The writer logged the write itself; add what the front thread paid. */
            gddr_log(GDDR_LOG_DEBUG, "checkpoint %llu: state copy took %.1f ms (write %.1f MiB, %.1f ms)",
                     (unsigned long long)seq, ps->ckpt_copy_ms, (double)st.bytes / (1024.0 * 1024.0), st.total_ms);
        } /* a failure was logged by the writer */
    }
    if (!due)
        return;
    if (gddr__ckpt_writer_busy(ps->ckw)) {
        if (!final)
            return; /* the next tick tries again */
        gddr__ckpt_writer_wait(ps->ckw, 60000, NULL, NULL, NULL);
    }
    int requested = ps->ckpt_now;
    ps->ckpt_now = 0;
    ps->last_ckpt_ms = now;
    ps->ckpt_started_ms = now;
    int64_t t0 = gddr__now_ms();
    gddr_ckpt_section *s;
    size_t n;
    if (collect(ps, &s, &n) < 0) {
        gddr_log(GDDR_LOG_ERROR, "checkpoint skipped: out of memory copying the state");
        return;
    }
    ps->ckpt_copy_ms = (double)(gddr__now_ms() - t0);
    /* An idle server's periodic checkpoint would rewrite the same bytes:
     * skip it when the state is the one the last checkpoint holds. A
     * requested or final one is written whatever. */
    uint32_t crc = 0;
    for (size_t i = 0; i < n; i++) {
        crc = gddr__crc32c(crc, s[i].name, strlen(s[i].name));
        crc = gddr__crc32c(crc, &s[i].len, sizeof s[i].len);
        crc = gddr__crc32c(crc, s[i].data, s[i].len);
    }
    if (!final && !requested && ps->ckpt_state_known && crc == ps->ckpt_state_crc) {
        for (size_t i = 0; i < n; i++)
            free(s[i].data);
        free(s);
        ps->ckpt_skipped++;
        ps->ckpt_done_ms = now;
        gddr_log(GDDR_LOG_DEBUG, "checkpoint skipped: nothing changed since checkpoint %llu",
                 (unsigned long long)ps->ckpt_seq);
        return;
    }
    ps->ckpt_pending_crc = crc;
    ps->ckpt_pending_pushes = ps->pushes;
    ps->ckpt_pending_tensors = ps->ntensors + ps_tables_count(ps);
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
        ps->ckpt_state_known = rc == GDDR_OK;
        ps->ckpt_state_crc = crc;
        if (rc == GDDR_OK)
            ps->ckpt_done_ms = gddr__now_ms();
        if (rc == GDDR_OK) {
            ps->ckpt_count++;
            ps_plog_prune(ps);
            gddr_log(GDDR_LOG_INFO, "final checkpoint %llu written: %.1f MiB in %.1f ms",
                     (unsigned long long)ps->ckpt_seq, (double)st.bytes / (1024.0 * 1024.0), st.total_ms);
        } else {
            gddr_log(GDDR_LOG_ERROR, "final checkpoint failed: %s", gddr_strerror(rc));
        }
        ps->final_ckpt_rc = rc;
    }
}
