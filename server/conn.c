/* conn.c -- the peers of the ROUTER, and pull replies without copies.
 *
 * Connections. A ROUTER sees a peer as a routing id. The table here keeps,
 * per routing id, what the server must bound per peer: the reply bytes
 * handed to ZeroMQ and not yet sent (a peer that pulls and never reads
 * would otherwise make the server queue copies of tensors without limit)
 * and the pulls parked for it. A peer idle for a while with nothing in
 * flight is forgotten. The id also stands for a session when a request
 * carries none (workers.c).
 *
 * Zero-copy pulls. A tensor's values live in a reference-counted buffer
 * (ps_vbuf); every pull reply points ZeroMQ at the current one
 * (zmq_msg_init_data) with a small token whose free callback, run by
 * ZeroMQ's I/O thread once the bytes are on the wire, gives back the peer's
 * queued bytes and drops the references. An update writes in place when no
 * reply holds the buffer, and into a fresh (recycled) one when some does
 * (copy on write, tensor.c), so a reply is never torn and never shows a
 * newer version than its header says, and no pull copies the tensor.
 */
#include <pthread.h>
#include <stdio.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "gddr_hash.h"
#include "ps.h"
#include "view.h"

#define CONN_BUCKETS 4096
#define CONN_IDLE_MS 120000

struct ps_conns {
    ps_conn *bucket[CONN_BUCKETS];
    size_t count;
    uint64_t next_session;
};

int ps_conns_open(gddr_ps *ps)
{
    ps->conns = calloc(1, sizeof *ps->conns);
    if (!ps->conns)
        return GDDR_ENOMEM;
    /* Sessions that stand for connections live in their own range. */
    ps->conns->next_session = (1ull << 63) | ((uint64_t)ps->epoch << 20);
    return GDDR_OK;
}

static void conn_unref(ps_conn *c)
{
    if (atomic_fetch_sub(&c->refs, 1) == 1)
        free(c);
}

static uint32_t id_hash(const uint8_t *p, size_t n)
{
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 16777619u;
    return h;
}

ps_conn *ps_conn_get(gddr_ps *ps, zmq_msg_t *ident)
{
    struct ps_conns *t = ps->conns;
    size_t n = zmq_msg_size(ident);
    const uint8_t *id = zmq_msg_data(ident);
    if (n > 255)
        return NULL;
    uint32_t b = id_hash(id, n) % CONN_BUCKETS;
    for (ps_conn *c = t->bucket[b]; c; c = c->next)
        if (c->idlen == n && memcmp(c->id, id, n) == 0) {
            c->last_ms = gddr__now_ms();
            return c;
        }
    ps_conn *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    atomic_init(&c->refs, 1);
    atomic_init(&c->queued, 0);
    c->idlen = (uint8_t)n;
    memcpy(c->id, id, n);
    c->last_ms = gddr__now_ms();
    c->session = ++t->next_session;
    c->next = t->bucket[b];
    t->bucket[b] = c;
    t->count++;
    return c;
}

void ps_conns_sweep(gddr_ps *ps)
{
    struct ps_conns *t = ps->conns;
    int64_t now = gddr__now_ms();
    for (size_t b = 0; b < CONN_BUCKETS; b++) {
        for (ps_conn **pp = &t->bucket[b]; *pp;) {
            ps_conn *c = *pp;
            if (now - c->last_ms > CONN_IDLE_MS && c->parked == 0 && atomic_load(&c->queued) == 0) {
                *pp = c->next;
                t->count--;
                conn_unref(c);
            } else {
                pp = &c->next;
            }
        }
    }
}

size_t ps_conns_count(gddr_ps *ps)
{
    return ps->conns ? ps->conns->count : 0;
}

void ps_conns_close(gddr_ps *ps)
{
    struct ps_conns *t = ps->conns;
    if (!t)
        return;
    for (size_t b = 0; b < CONN_BUCKETS; b++)
        while (t->bucket[b]) {
            ps_conn *c = t->bucket[b];
            t->bucket[b] = c->next;
            conn_unref(c);
        }
    free(t);
    ps->conns = NULL;
}

long long ps_conns_queued_bytes(gddr_ps *ps)
{
    long long sum = 0;
    for (size_t b = 0; ps->conns && b < CONN_BUCKETS; b++)
        for (ps_conn *c = ps->conns->bucket[b]; c; c = c->next)
            sum += atomic_load(&c->queued);
    return sum;
}

/* ---- pull replies ----------------------------------------------------------- */

typedef struct reply_token {
    ps_conn *conn;
    ps_vbuf *buf;   /* the version buffer the values are in, or NULL: a malloc'd copy */
    size_t bytes;   /* of this reply (a part may be less than the buffer) */
} reply_token;

/* ZeroMQ is done with a reply's values (sent or dropped): any thread. */
static void reply_sent(void *data, void *hint)
{
    reply_token *k = hint;
    atomic_fetch_sub(&k->conn->queued, (long long)k->bytes);
    conn_unref(k->conn);
    if (k->buf)
        ps_vbuf_unref(k->buf);
    else
        free(data);
    free(k);
}

/* A pull reply's values handed to ZeroMQ: the token counts them against the
 * connection's queued bytes until they are sent, and holds the buffer (b),
 * or frees the copy (b NULL) then. r/pr: the header, filled for t. */
static reply_token *pull_reply_begin(gddr_ps *ps, ps_conn *c, ps_vbuf *b, size_t bytes,
                                     uint64_t req_id, const ps_tensor *t, uint64_t parked_us,
                                     Gddr__Reply *r, Gddr__PullReply *pr)
{
    reply_token *k = malloc(sizeof *k);
    if (!k)
        return NULL;
    if (b)
        atomic_fetch_add(&b->refs, 1);
    atomic_fetch_add(&c->refs, 1);
    atomic_fetch_add(&c->queued, (long long)bytes);
    k->conn = c;
    k->buf = b;
    k->bytes = bytes;
    gddr__pull_reply__init(pr);
    ps_reply_init(ps, r, req_id, t);
    pr->id = t->id;
    pr->version = t->version;
    pr->payload_bytes = bytes;
    pr->parked_us = parked_us;
    r->body_case = GDDR__REPLY__BODY_PULL;
    r->pull = pr;
    return k;
}

/* One reply of a pull: values [lo, lo + len) of t's current buffer, sent
 * without a copy (the reply holds a reference to the buffer). */
static int send_part(gddr_ps *ps, zmq_msg_t *ident, ps_conn *c, uint64_t req_id, ps_tensor *t,
                     size_t lo, size_t len, uint32_t part, uint32_t parts, uint64_t parked_us)
{
    ps_vbuf *b = t->cur; /* sent as it is: the next update will not write into it */
    size_t bytes = len * sizeof(float);
    Gddr__Reply r;
    Gddr__PullReply pr;
    reply_token *k = pull_reply_begin(ps, c, b, bytes, req_id, t, parked_us, &r, &pr);
    if (!k) {
        ps_reject(ps, ident, req_id, GDDR_ENOMEM, "no memory for a %zu-byte reply", bytes);
        return -1;
    }
    pr.offset = lo;
    pr.part = part;
    pr.parts = parts;
    gddr__raw raw = { b->data + lo, bytes, reply_sent, k };
    ps_send_reply(ps, ident, &r, &raw, 1);
    return 0;
}

static int send_lazy(gddr_ps *ps, zmq_msg_t *ident, ps_conn *c, uint64_t req_id, ps_tensor *t,
                     uint32_t rank, float alpha, int full, int bits, uint64_t view_seq,
                     uint64_t parked_us);

static void send_values(gddr_ps *ps, zmq_msg_t *ident, ps_conn *c, uint64_t req_id, ps_tensor *t,
                        uint64_t part_bytes, uint32_t rank, float lazy, int full, int bits,
                        uint64_t view_seq, uint64_t parked_us)
{
    size_t bytes = t->n * sizeof(float);
    long long queued = c ? atomic_load(&c->queued) : 0;
    /* One reply is always allowed; more only within the bound. */
    if (c && queued > 0 && queued + (long long)bytes > ps->cfg.max_queued_reply_bytes) {
        ps_reject(ps, ident, req_id, GDDR_EBUSY,
                  "%lld reply bytes not yet read by this connection (max_queued_reply_bytes = %lld)",
                  queued, ps->cfg.max_queued_reply_bytes);
        return;
    }
    if (!c) {
        ps_reject(ps, ident, req_id, GDDR_ENOMEM, "no memory for a %zu-byte reply", bytes);
        return;
    }
    ps_tensor_settle(ps, t); /* the update in flight is this version's */
    if ((lazy > 0 || bits) && send_lazy(ps, ident, c, req_id, t, rank, lazy, full, bits, view_seq, parked_us) == 0)
        return;
    /* Parts of whole chunks; one part is the plain reply. */
    size_t per = part_bytes / ((size_t)t->chunk * sizeof(float));
    if (per < 1)
        per = 1;
    size_t parts = part_bytes ? (t->nchunks + per - 1) / per : 1;
    if (parts <= 1) {
        if (send_part(ps, ident, c, req_id, t, 0, t->n, 0, 0, parked_us) == 0)
            ps->pulls_served++;
        return;
    }
    for (size_t k = 0; k < parts; k++) {
        size_t lo = k * per * t->chunk;
        size_t hi = lo + per * t->chunk < t->n ? lo + per * t->chunk : t->n;
        if (send_part(ps, ident, c, req_id, t, lo, hi - lo, (uint32_t)k, (uint32_t)parts, parked_us) < 0)
            return;
        ps->pull_parts++;
    }
    ps->pulls_served++;
}

/* ---- lazy and delta pulls (pull-side savings) --------------------------------- */

/* A worker's view of one tensor, as the server knows it: the version each
 * chunk had when the worker last got it, and how many lazy pulls in a row
 * held it back while it had changed: 10 bytes a chunk (a chunk is 1024
 * floats by default: 0.24% of the tensor) per worker and tensor pulled.
 * Delta pulls (Pull.delta_bits) add an exact copy of the worker's values
 * (4 bytes a value) and a byte a chunk saying whether it still differs. */
typedef struct ps_pview {
    uint64_t *seen;
    uint16_t *age;
    size_t nchunks;
    uint64_t pulls;   /* lazy pulls so far: the hold mask's step */
    uint64_t seq;     /* replies that changed this record (PullReply.view_seq) */
    float *mirror;    /* delta pulls: the worker's values, bit for bit */
    uint8_t *inexact; /* delta pulls: per chunk, mirror != server values */
    size_t n;
} ps_pview;

static atomic_llong pview_bytes;

long long ps_pview_bytes(void)
{
    return atomic_load(&pview_bytes);
}

static long long pview_size(const ps_pview *v)
{
    return (long long)(v->nchunks * 10) + (v->mirror ? (long long)(v->n * 4 + v->nchunks) : 0);
}

void ps_pviews_free(ps_worker *w)
{
    for (size_t i = 0; i < w->npv; i++)
        if (w->pv[i]) {
            atomic_fetch_sub(&pview_bytes, pview_size(w->pv[i]));
            free(w->pv[i]->seen);
            free(w->pv[i]->age);
            free(w->pv[i]->mirror);
            free(w->pv[i]->inexact);
            free(w->pv[i]);
        }
    free(w->pv);
    w->pv = NULL;
    w->npv = 0;
}

/* Whether `more` bytes of views fit under max_pull_view_bytes (0: the
 * expected workers times the model with its views' chunk records, as for
 * residual snapshots): a stranger asking for delta pulls under every free
 * rank cannot make the server copy the model once per rank. Beyond it the
 * pull is answered whole, which is always correct. */
static int pview_fits(gddr_ps *ps, long long more)
{
    long long cap = ps->cfg.max_pull_view_bytes;
    if (cap <= 0)
        cap = (long long)ps_per_worker_bound(ps, 4, 11, 0); /* pview_size with a mirror */
    if (atomic_load(&pview_bytes) + more <= cap)
        return 1;
    if (ps->pview_refused++ == 0)
        gddr_log(GDDR_LOG_WARN, "pull views would pass max_pull_view_bytes = %lld: lazy and delta "
                 "pulls beyond it are answered whole (gddr_pull_views_refused_total)", cap);
    return 0;
}

/* rank's view of t, with the copy of its values when `mirror`; *fresh = 1
 * when the server does not know the worker's values (a view just made, or a
 * copy just added): everything goes, as float32. NULL when out of memory or
 * over max_pull_view_bytes. */
static ps_pview *pview_get(gddr_ps *ps, uint32_t rank, const ps_tensor *t, int mirror, int *fresh)
{
    ps_worker *w = &ps->workers[rank];
    *fresh = 0;
    ps_pview *have = t->id < w->npv ? w->pv[t->id] : NULL;
    long long more = (have ? 0 : (long long)t->nchunks * 10) +
                     (mirror && (!have || !have->mirror) ? (long long)(t->n * 4 + t->nchunks) : 0);
    if (more && !pview_fits(ps, more))
        return NULL;
    if (t->id >= w->npv) {
        size_t n = t->id + 1;
        ps_pview **nv = realloc(w->pv, n * sizeof *nv);
        if (!nv)
            return NULL;
        memset(nv + w->npv, 0, (n - w->npv) * sizeof *nv);
        w->pv = nv;
        w->npv = n;
    }
    ps_pview *v = w->pv[t->id];
    if (!v) {
        v = calloc(1, sizeof *v);
        if (!v || !(v->seen = calloc(t->nchunks, sizeof *v->seen)) ||
            !(v->age = calloc(t->nchunks, sizeof *v->age))) {
            if (v)
                free(v->seen), free(v);
            return NULL;
        }
        v->nchunks = t->nchunks;
        v->n = t->n;
        atomic_fetch_add(&pview_bytes, pview_size(v));
        w->pv[t->id] = v;
        *fresh = 1;
    }
    if (mirror && !v->mirror) {
        float *m = malloc(t->n * sizeof(float) + 4);
        uint8_t *x = calloc(t->nchunks + 1, 1);
        if (!m || !x) {
            free(m), free(x);
            return NULL;
        }
        long long before = pview_size(v);
        v->mirror = m;
        v->inexact = x;
        atomic_fetch_add(&pview_bytes, pview_size(v) - before);
        *fresh = 1;
    }
    return v;
}

/* A lazy or delta reply: the chunks rank's view lacks, some held back (at
 * most the tensor's tau pulls in a row) when alpha > 0, packed as float32
 * values or (bits 8/16, once the server knows the worker's values) as
 * scaled differences from them, with their bitmap. Returns -1 when it could
 * not be built (no memory): the caller answers whole. */
static int send_lazy(gddr_ps *ps, zmq_msg_t *ident, ps_conn *c, uint64_t req_id, ps_tensor *t,
                     uint32_t rank, float alpha, int full, int bits, uint64_t view_seq,
                     uint64_t parked_us)
{
    int fresh;
    ps_pview *v = pview_get(ps, rank, t, bits != 0, &fresh);
    if (v && !fresh && !full && view_seq != v->seq) {
        /* The worker did not get our last reply (or this request is a late
         * one from an abandoned connection): what we think it holds is not
         * what it holds. Answered whole, so the record and the view agree
         * again (the worker's next request then names this reply). */
        full = 1;
        ps->pview_resyncs++;
    }
    size_t bmlen = (t->nchunks + 7) / 8;
    uint8_t *bm = v ? calloc(bmlen ? bmlen : 1, 1) : NULL;
    uint8_t *packed = bm ? malloc(t->n * sizeof(float) + t->nchunks * 4 + 4) : NULL;
    if (!packed) {
        free(bm);
        return -1;
    }
    const uint64_t V = t->version;
    const uint32_t tau = (uint32_t)(t->tau > 0 ? t->tau : 1);
    const uint64_t prefix = gddr__hash_prefix(0x6c617a79ull /* "lazy" */, rank, t->keyhash, v->pulls++);
    int enc = bits && !fresh && !full ? bits : 0;
    uint64_t view = V;
    size_t held = 0, sent = 0, same = 0;
    /* Which chunks go. */
    for (size_t ch = 0; ch < t->nchunks; ch++) {
        int inexact = v->inexact && v->inexact[ch];
        if (!fresh && !full && t->mod[ch] <= v->seen[ch] && !(inexact && enc)) {
            v->seen[ch] = V; /* unchanged since the worker got it: its copy is current */
            v->age[ch] = 0;
            same++;
            continue;
        }
        int hold = !fresh && !full && alpha > 0 && v->age[ch] < tau &&
                   gddr__u32_to_uniform(gddr__hash_chunk(prefix, (uint32_t)ch)) < alpha;
        if (hold) {
            v->age[ch]++;
            if (v->seen[ch] < view)
                view = v->seen[ch];
            held++;
            continue;
        }
        bm[ch / 8] |= (uint8_t)(1u << (ch % 8));
        v->seen[ch] = V;
        v->age[ch] = 0;
        sent++;
    }
    size_t nsel = sent;
    /* The payload; a delta reply moves the server's copy of the view as the
     * worker's decoder will move the view (common/view.c). */
    size_t o = gddr__view_pack(t->w, t->n, t->chunk, bm, enc, NULL, v->mirror, v->inexact, packed);
    if (o == SIZE_MAX) { /* a difference overflows: this reply goes as values */
        enc = 0;
        o = gddr__view_pack(t->w, t->n, t->chunk, bm, 0, NULL, v->mirror, v->inexact, packed);
    }
    ps->lazy_pulls += alpha > 0;
    ps->lazy_chunks_held += held;
    ps->lazy_chunks_sent += sent;
    ps->lazy_chunks_same += same;
    if (enc) {
        ps->delta_pulls++;
        ps->delta_chunks += nsel;
    }
    size_t bytes = o;
    Gddr__Reply r;
    Gddr__PullReply pr;
    reply_token *tk = pull_reply_begin(ps, c, NULL, bytes, req_id, t, parked_us, &r, &pr);
    if (!tk) {
        free(bm), free(packed);
        if (v->mirror) { /* the whole reply that follows is the worker's view */
            memcpy(v->mirror, t->w, t->n * sizeof(float));
            memset(v->inexact, 0, t->nchunks);
        }
        v->seq++; /* (a whole reply carries no view_seq: the next request resyncs) */
        return -1; /* (the view was updated: the whole reply that follows covers it) */
    }
    pr.view_seq = ++v->seq;
    pr.bitmap.data = bm;
    pr.bitmap.len = bmlen;
    pr.view_version = view;
    pr.delta_bits = (uint32_t)enc;
    gddr__raw raw = { packed, bytes, reply_sent, tk };
    ps_send_reply(ps, ident, &r, &raw, 1);
    free(bm);
    ps->pulls_served++;
    return 0;
}

/* ---- pulls ------------------------------------------------------------------ */

/* Whether a pull can be answered now. */
static int pull_ready(gddr_ps *ps, ps_tensor *t, uint64_t min_version, uint64_t step)
{
    if (t->version < min_version)
        return 0;
    if (ps->cfg.mode == GDDR_PS_MODE_SSP) {
        uint64_t slow = ps_min_live_clock(ps);
        if (slow != UINT64_MAX && step > slow + (uint64_t)ps->cfg.staleness_bound)
            return 0;
    }
    return 1;
}

int ps_pull_request(gddr_ps *ps, zmq_msg_t *ident, ps_conn *c, const Gddr__Request *rq, int owner)
{
    const Gddr__Pull *p = rq->pull;
    /* Lazy replies only to the worker whose view the server keeps. */
    float lazy = owner && isfinite(p->delay_fraction) && p->delay_fraction > 0
                     ? (p->delay_fraction < 1 ? p->delay_fraction : 1)
                     : 0;
    if (p->delta_bits != 0 && p->delta_bits != 8 && p->delta_bits != 16)
        return ps_reject(ps, ident, rq->req_id, GDDR_EINVAL,
                         "pull with delta_bits %u: 0, 8 or 16 only", p->delta_bits);
    int bits = owner ? (int)p->delta_bits : 0;
    ps_tensor *t = ps_tensor_by_id(ps, p->id);
    if (!t)
        return ps_reject(ps, ident, rq->req_id, GDDR_ENOKEY, "no tensor with id %u (%zu registered)",
                         p->id, ps->ntensors);
    if (pull_ready(ps, t, p->min_version, p->step)) {
        send_values(ps, ident, c, rq->req_id, t, p->part_bytes, rq->rank, lazy, p->full, bits, p->view_seq,
                    0);
        return GDDR_OK;
    }
    /* A sync step or the ssp bound will release it. A min_version far ahead
     * of anything a step can produce is a client bug, not a wait. */
    if (p->min_version > t->version + 1 + (uint64_t)ps_expected_workers(ps) + t->nflushes)
        return ps_reject(ps, ident, rq->req_id, GDDR_EVERSION,
                         "pull asks for version %llu of tensor '%s', which is at %llu",
                         (unsigned long long)p->min_version, t->key, (unsigned long long)t->version);
    if (!c)
        return ps_reject(ps, ident, rq->req_id, GDDR_ENOMEM, "no memory to park a pull");
    if (c->parked >= (uint32_t)ps->cfg.max_parked_pulls)
        return ps_reject(ps, ident, rq->req_id, GDDR_EBUSY,
                         "%u pulls of this connection wait already (max_parked_pulls)", c->parked);
    if (ps->npulls == ps->cap_pulls) {
        size_t cap = ps->cap_pulls ? ps->cap_pulls * 2 : 64;
        ps_pull *np = realloc(ps->pulls, cap * sizeof *np);
        if (!np)
            return ps_reject(ps, ident, rq->req_id, GDDR_ENOMEM, "no memory to park a pull");
        ps->pulls = np;
        ps->cap_pulls = cap;
    }
    uint64_t wait = p->wait_ms;
    if (wait > (uint64_t)ps->cfg.pull_wait_max_ms)
        wait = (uint64_t)ps->cfg.pull_wait_max_ms;
    ps_pull *q = &ps->pulls[ps->npulls++];
    zmq_msg_init(&q->ident);
    zmq_msg_copy(&q->ident, ident);
    q->conn = c;
    atomic_fetch_add(&c->refs, 1);
    c->parked++;
    q->req_id = rq->req_id;
    q->rank = rq->rank;
    q->id = t->id;
    q->min_version = p->min_version;
    q->part_bytes = p->part_bytes;
    q->lazy = lazy;
    q->full = p->full;
    q->view_seq = p->view_seq;
    q->bits = bits;
    q->step = p->step;
    q->deadline_ms = gddr__now_ms() + (int64_t)wait;
    q->parked_us = gddr__now_us();
    return GDDR_OK;
}

static void pull_done(ps_pull *p)
{
    zmq_msg_close(&p->ident);
    p->conn->parked--;
    conn_unref(p->conn);
}

void ps_release_pulls(gddr_ps *ps)
{
    int64_t now = gddr__now_ms();
    size_t keep = 0;
    for (size_t i = 0; i < ps->npulls; i++) {
        ps_pull *p = &ps->pulls[i];
        ps_tensor *t = ps_tensor_by_id(ps, p->id);
        if (t && pull_ready(ps, t, p->min_version, p->step)) {
            int64_t waited = gddr__now_us() - p->parked_us;
            send_values(ps, &p->ident, p->conn, p->req_id, t, p->part_bytes, p->rank, p->lazy, p->full,
                        p->bits, p->view_seq, waited > 0 ? (uint64_t)waited : 0);
        } else if (!t || now >= p->deadline_ms || ps->stop) {
            if (ps->stop)
                ps_reject(ps, &p->ident, p->req_id, GDDR_ESHUTDOWN, "server is shutting down");
            else
                ps_reject(ps, &p->ident, p->req_id, GDDR_ETIMEDOUT,
                          "pull of tensor %u waited too long for version %llu (now %llu)%s", p->id,
                          (unsigned long long)p->min_version,
                          (unsigned long long)(t ? t->version : 0),
                          ps->cfg.mode == GDDR_PS_MODE_SSP ? " or for the slowest worker" : "");
        } else {
            if (keep != i)
                ps->pulls[keep] = ps->pulls[i];
            keep++;
            continue;
        }
        pull_done(p);
    }
    ps->npulls = keep;
}

int ps_pulls_next_timeout(gddr_ps *ps, int cap)
{
    int64_t now = gddr__now_ms(), t = cap;
    for (size_t i = 0; i < ps->npulls; i++) {
        int64_t d = ps->pulls[i].deadline_ms - now;
        if (d < t)
            t = d < 0 ? 0 : d;
    }
    return (int)t;
}

void ps_pulls_free(gddr_ps *ps)
{
    for (size_t i = 0; i < ps->npulls; i++)
        pull_done(&ps->pulls[i]);
    free(ps->pulls);
    ps->pulls = NULL;
    ps->npulls = ps->cap_pulls = 0;
}
