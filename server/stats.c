/* stats.c -- staleness statistics and the Prometheus text of gddr-ps. */
#include <stdio.h>
#include <stdlib.h>
#include <stdarg.h>
#include <string.h>

#include "ps.h"
#include "syncstep.h"
#include "pushlog.h"
#include "snapshot.h"

void ps_stale_add(ps_stale *s, uint64_t tau, double decay)
{
    s->ema = s->count ? decay * s->ema + (1.0 - decay) * (double)tau : (double)tau;
    s->count++;
    s->sum += tau;
    if (tau > s->max)
        s->max = tau;
    s->hist[tau < PS_HIST - 1 ? tau : PS_HIST - 1]++;
}

double ps_stale_mean(const ps_stale *s)
{
    return s->count ? (double)s->sum / (double)s->count : 0.0;
}

/* A growing string buffer for the metrics page. */
typedef struct sbuf {
    char *p;
    size_t len, cap;
} sbuf;

__attribute__((format(printf, 2, 3))) static void sb_printf(sbuf *b, const char *fmt, ...)
{
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(b->p ? b->p + b->len : NULL, b->p ? b->cap - b->len : 0, fmt, ap);
        va_end(ap);
        if (n < 0)
            return;
        if (b->p && b->len + (size_t)n < b->cap) {
            b->len += (size_t)n;
            return;
        }
        size_t cap = b->cap ? b->cap * 2 : 4096;
        while (cap < b->len + (size_t)n + 1)
            cap *= 2;
        char *q = realloc(b->p, cap);
        if (!q)
            return;
        b->p = q;
        b->cap = cap;
    }
}

static const char *err_label(int code)
{
    switch (code) {
#define GDDR__ERR_NAME(name, num, text) case num: return #name;
        GDDR_ERRORS(GDDR__ERR_NAME)
#undef GDDR__ERR_NAME
    }
    return "OTHER";
}

char *ps_metrics_text(gddr_ps *ps)
{
    sbuf b = { 0 };
    sb_printf(&b, "# HELP gddr_pushes_total Pushes accepted, one per tensor (a step of a model of T tensors is T pushes).\n# TYPE gddr_pushes_total counter\n"
                  "gddr_pushes_total %llu\n", (unsigned long long)ps->pushes);
    sb_printf(&b, "# HELP gddr_pulls_total Pulls served, one per tensor.\n# TYPE gddr_pulls_total counter\n"
                  "gddr_pulls_total %llu\n", (unsigned long long)ps->pulls_served);
    sb_printf(&b, "# HELP gddr_bytes_received_total Bytes received.\n# TYPE gddr_bytes_received_total counter\n"
                  "gddr_bytes_received_total %llu\n", (unsigned long long)ps->bytes_in);
    sb_printf(&b, "# HELP gddr_bytes_sent_total Bytes sent.\n# TYPE gddr_bytes_sent_total counter\n"
                  "gddr_bytes_sent_total %llu\n", (unsigned long long)ps->bytes_out);
    sb_printf(&b, "# HELP gddr_versions_total Updates applied over all tensors.\n# TYPE gddr_versions_total counter\n"
                  "gddr_versions_total %llu\n", (unsigned long long)ps->versions_total);
    sb_printf(&b, "# HELP gddr_pushes_validated_in_apply_total Pushes whose payload was checked (finite, norm) in the read that applied it, not in a read before, refused ones included (server/push.c says when).\n"
                  "# TYPE gddr_pushes_validated_in_apply_total counter\n"
                  "gddr_pushes_validated_in_apply_total %llu\n", (unsigned long long)ps->validated_in_apply);
    /* Every reason from the start, at 0 until it happens: a series that
     * appears only at the first rejection shows "No data" on a healthy
     * server's dashboard, and rate() misses its first increase. OTHER
     * counts codes outside the table (none today). */
    sb_printf(&b, "# HELP gddr_rejected_total Requests rejected, by reason.\n# TYPE gddr_rejected_total counter\n");
    uint64_t other = ps->rejected[0];
    for (int i = 1; i < PS_NERR; i++) {
        if (strcmp(err_label(i), "OTHER") == 0)
            other += ps->rejected[i];
        else
            sb_printf(&b, "gddr_rejected_total{reason=\"%s\"} %llu\n", err_label(i),
                      (unsigned long long)ps->rejected[i]);
    }
    sb_printf(&b, "gddr_rejected_total{reason=\"OTHER\"} %llu\n", (unsigned long long)other);
    sb_printf(&b, "# HELP gddr_staleness Staleness tau measured at apply.\n# TYPE gddr_staleness histogram\n");
    uint64_t cum = 0;
    for (int i = 0; i < PS_HIST - 1; i++) {
        cum += ps->stale.hist[i];
        sb_printf(&b, "gddr_staleness_bucket{le=\"%d\"} %llu\n", i, (unsigned long long)cum);
    }
    cum += ps->stale.hist[PS_HIST - 1];
    sb_printf(&b, "gddr_staleness_bucket{le=\"+Inf\"} %llu\ngddr_staleness_sum %llu\ngddr_staleness_count %llu\n",
              (unsigned long long)cum, (unsigned long long)ps->stale.sum,
              (unsigned long long)ps->stale.count);
    sb_printf(&b, "# HELP gddr_staleness_ema EMA of staleness.\n# TYPE gddr_staleness_ema gauge\ngddr_staleness_ema %g\n",
              ps->stale.ema);
    sb_printf(&b, "# HELP gddr_staleness_max Largest staleness seen.\n# TYPE gddr_staleness_max gauge\ngddr_staleness_max %llu\n",
              (unsigned long long)ps->stale.max);
    sb_printf(&b, "# HELP gddr_auth_rejected_total Connections refused by the CURVE allowlist.\n# TYPE gddr_auth_rejected_total counter\n"
                  "gddr_auth_rejected_total %llu\n", (unsigned long long)ps->auth_rejected);
    sb_printf(&b, "# HELP gddr_live_workers Workers alive.\n# TYPE gddr_live_workers gauge\ngddr_live_workers %d\n",
              ps_live_workers(ps));
    sb_printf(&b, "# HELP gddr_worker_pushes_total Pushes accepted per worker, one per tensor.\n# TYPE gddr_worker_pushes_total counter\n");
    for (int r = 0; r < ps->cfg.max_workers; r++)
        if (ps->workers[r].state != PS_W_NONE)
            sb_printf(&b, "gddr_worker_pushes_total{rank=\"%d\"} %llu\n", r,
                      (unsigned long long)ps->workers[r].pushes);
    sb_printf(&b, "# HELP gddr_worker_staleness_mean Mean staleness of a worker's pushes.\n# TYPE gddr_worker_staleness_mean gauge\n");
    for (int r = 0; r < ps->cfg.max_workers; r++)
        if (ps->workers[r].state != PS_W_NONE)
            sb_printf(&b, "gddr_worker_staleness_mean{rank=\"%d\"} %g\n", r,
                      ps_stale_mean(&ps->workers[r].stale));
    sb_printf(&b, "# HELP gddr_worker_staleness_max Largest staleness of a worker's pushes.\n# TYPE gddr_worker_staleness_max gauge\n");
    for (int r = 0; r < ps->cfg.max_workers; r++)
        if (ps->workers[r].state != PS_W_NONE)
            sb_printf(&b, "gddr_worker_staleness_max{rank=\"%d\"} %llu\n", r,
                      (unsigned long long)ps->workers[r].stale.max);
    sb_printf(&b, "# HELP gddr_worker_staleness_ema EMA of a worker's staleness.\n# TYPE gddr_worker_staleness_ema gauge\n");
    for (int r = 0; r < ps->cfg.max_workers; r++)
        if (ps->workers[r].state != PS_W_NONE)
            sb_printf(&b, "gddr_worker_staleness_ema{rank=\"%d\"} %g\n", r, ps->workers[r].stale.ema);
    /* For gddr-ctl top: where each worker is and when it was last heard. */
    sb_printf(&b, "# HELP gddr_worker_state A worker's state: 1 live, 2 dead (silent past worker_timeout_s), 3 left (said bye).\n"
                  "# TYPE gddr_worker_state gauge\n");
    for (int r = 0; r < ps->cfg.max_workers; r++)
        if (ps->workers[r].state != PS_W_NONE)
            sb_printf(&b, "gddr_worker_state{rank=\"%d\"} %d\n", r, ps->workers[r].state);
    sb_printf(&b, "# HELP gddr_worker_step A worker's clock: its highest step pushed, plus one.\n# TYPE gddr_worker_step gauge\n");
    for (int r = 0; r < ps->cfg.max_workers; r++)
        if (ps->workers[r].state != PS_W_NONE)
            sb_printf(&b, "gddr_worker_step{rank=\"%d\"} %llu\n", r, (unsigned long long)ps->workers[r].clock);
    sb_printf(&b, "# HELP gddr_worker_duplicates_total Resent pushes of a worker answered as duplicates.\n"
                  "# TYPE gddr_worker_duplicates_total counter\n");
    for (int r = 0; r < ps->cfg.max_workers; r++)
        if (ps->workers[r].state != PS_W_NONE)
            sb_printf(&b, "gddr_worker_duplicates_total{rank=\"%d\"} %llu\n", r,
                      (unsigned long long)ps->workers[r].duplicates);
    int64_t now = gddr__now_ms();
    sb_printf(&b, "# HELP gddr_worker_last_seen_seconds Seconds since a worker's last request.\n"
                  "# TYPE gddr_worker_last_seen_seconds gauge\n");
    for (int r = 0; r < ps->cfg.max_workers; r++)
        if (ps->workers[r].state != PS_W_NONE)
            sb_printf(&b, "gddr_worker_last_seen_seconds{rank=\"%d\"} %.3f\n", r,
                      (double)(now - ps->workers[r].last_seen_ms) / 1000.0);
    sb_printf(&b, "# HELP gddr_worker_deaths_total Workers declared dead.\n# TYPE gddr_worker_deaths_total counter\n"
                  "gddr_worker_deaths_total %llu\n", (unsigned long long)ps->deaths);
    sb_printf(&b, "# HELP gddr_config_reloads_total SIGHUP reloads of the config file applied.\n"
                  "# TYPE gddr_config_reloads_total counter\ngddr_config_reloads_total %llu\n"
                  "# HELP gddr_config_reload_failures_total SIGHUP reloads refused (the old settings kept).\n"
                  "# TYPE gddr_config_reload_failures_total counter\ngddr_config_reload_failures_total %llu\n",
              (unsigned long long)ps->reloads, (unsigned long long)ps->reload_failures);
    sb_printf(&b, "# HELP gddr_sync_stalls_total Sync steps closed as they were after waiting sync_stall_s for live workers.\n"
                  "# TYPE gddr_sync_stalls_total counter\ngddr_sync_stalls_total %llu\n",
              (unsigned long long)ps->sync_stalls);
    sb_printf(&b, "# HELP gddr_tau GDDR delay bound per tensor.\n# TYPE gddr_tau gauge\n");
    for (size_t i = 0; i < ps->ntensors; i++)
        sb_printf(&b, "gddr_tau{tensor=\"%s\"} %d\n", ps->tensors[i]->key, ps->tensors[i]->tau);
    sb_printf(&b, "# HELP gddr_tensor_version Updates applied per tensor.\n# TYPE gddr_tensor_version gauge\n");
    for (size_t i = 0; i < ps->ntensors; i++)
        sb_printf(&b, "gddr_tensor_version{tensor=\"%s\"} %llu\n", ps->tensors[i]->key,
                  (unsigned long long)ps->tensors[i]->version);
    /* Who an open sync step waits for: when a sync run stops, which worker
     * (the family only while a step is open: no family without a sample). */
    int said = 0;
    for (size_t i = 0; i < ps->ntensors; i++) {
        const ps_tensor *t = ps->tensors[i];
        for (int r = 0; t->npushes && r < ps->cfg.max_workers; r++) {
            int st = ps_sync_rank(ps, ps_sync_tensor_pushed, t, r);
            if (st > -2 && !said++)
                sb_printf(&b, "# HELP gddr_sync_step_rank A rank in a tensor's open sync step: 1 pushed, 0 "
                              "waited for, -1 excused (a new process that has not pushed to it yet).\n"
                              "# TYPE gddr_sync_step_rank gauge\n");
            if (st > -2)
                sb_printf(&b, "gddr_sync_step_rank{tensor=\"%s\",rank=\"%d\"} %d\n", t->key, r, st);
        }
    }
    if (ps->plog) {
        ps_plog_stats pst;
        ps_plog_stats_get(ps, &pst);
        const struct {
            const char *name, *type, *help;
            unsigned long long v;
        } rows[] = {
            { "records_total", "counter", "Requests appended to the push log.", pst.records },
            { "bytes_total", "counter", "Bytes written to the push log.", pst.bytes },
            { "syncs_total", "counter", "Writes of the push log synced to disk (group commits).", pst.syncs },
            { "unsynced_records", "gauge", "Records appended but not yet on disk.",
              pst.appended_lsn - pst.durable_lsn },
            { "held_replies", "gauge", "Replies waiting for their record to be on disk (push_log = always).",
              pst.held_replies },
            { "replayed_records", "gauge", "Records replayed at this start.", pst.replayed },
            { "replay_ms", "gauge", "Milliseconds the replay at this start took.", pst.replay_ms },
            { "torn_bytes", "gauge", "Bytes of a torn record cut from the log at this start.", pst.torn_bytes },
            { "write_errors", "gauge", "Whether writing the push log failed (1) since the start.",
              pst.write_error ? 1u : 0u },
            { "gap", "gauge", "Whether records after the restored checkpoint were missing at this start (1): nothing after them was replayed.",
              pst.gap },
            { "writer_waits_total", "counter", "batch: times the front thread waited for the log's writer (the disk slower than the pushes).",
              pst.waits },
        };
        for (size_t i = 0; i < sizeof rows / sizeof *rows; i++)
            sb_printf(&b, "# HELP gddr_push_log_%s %s\n# TYPE gddr_push_log_%s %s\ngddr_push_log_%s %llu\n",
                      rows[i].name, rows[i].help, rows[i].name, rows[i].type, rows[i].name, rows[i].v);
    }
    sb_printf(&b, "# HELP gddr_checkpoints_total Checkpoints written.\n# TYPE gddr_checkpoints_total counter\n"
                  "gddr_checkpoints_total %llu\n", (unsigned long long)ps->ckpt_count);
    sb_printf(&b, "# HELP gddr_checkpoints_skipped_total Periodic checkpoints not written: the state was the one the last checkpoint holds.\n"
                  "# TYPE gddr_checkpoints_skipped_total counter\n"
                  "gddr_checkpoints_skipped_total %llu\n", (unsigned long long)ps->ckpt_skipped);
    sb_printf(&b, "# HELP gddr_checkpoint_age_seconds Seconds since the state on disk was last known current (a checkpoint written, or skipped as unchanged); -1: none yet.\n"
                  "# TYPE gddr_checkpoint_age_seconds gauge\n"
                  "gddr_checkpoint_age_seconds %.3f\n",
              ps->ckpt_done_ms ? (double)(gddr__now_ms() - ps->ckpt_done_ms) / 1000.0 : -1.0);
    sb_printf(&b, "# HELP gddr_checkpoint_last_ms Duration of the last checkpoint write.\n# TYPE gddr_checkpoint_last_ms gauge\n"
                  "gddr_checkpoint_last_ms %g\n", ps->ckpt_last_ms);
    ps_orphan_counts oc;
    ps_orphan_stats(ps, &oc);
    sb_printf(&b, "# HELP gddr_orphans_handed_total Dead workers' residuals handed to live workers.\n# TYPE gddr_orphans_handed_total counter\n"
                  "gddr_orphans_handed_total %llu\n", (unsigned long long)oc.handed);
    sb_printf(&b, "# HELP gddr_orphans_recovered_total Orphans re-injected by the workers they were handed to.\n# TYPE gddr_orphans_recovered_total counter\n"
                  "gddr_orphans_recovered_total %llu\n", (unsigned long long)oc.recovered);
    sb_printf(&b, "# HELP gddr_recovery_seconds Last time from a death to its orphan re-injected.\n# TYPE gddr_recovery_seconds gauge\n"
                  "gddr_recovery_seconds %g\n", oc.last_recovery_s);
    sb_printf(&b, "# HELP gddr_dead_residual_l1_total Residual mass (sum of |r|) dead workers last reported holding.\n# TYPE gddr_dead_residual_l1_total counter\n"
                  "gddr_dead_residual_l1_total %g\n", oc.held_l1);
    sb_printf(&b, "# HELP gddr_dead_residual_handed_l1_total Of that, the mass their snapshots handed to survivors.\n# TYPE gddr_dead_residual_handed_l1_total counter\n"
                  "gddr_dead_residual_handed_l1_total %g\n", oc.handed_l1);
    sb_printf(&b, "# HELP gddr_dead_residual_lost_l1_total Of that, the mass lost (held after the last snapshot, or no snapshot).\n# TYPE gddr_dead_residual_lost_l1_total counter\n"
                  "gddr_dead_residual_lost_l1_total %g\n", oc.lost_l1);
    sb_printf(&b, "# HELP gddr_snapshot_bytes Memory held by residual snapshots and pending orphans.\n# TYPE gddr_snapshot_bytes gauge\n"
                  "gddr_snapshot_bytes %llu\n", (unsigned long long)oc.bytes);
    sb_printf(&b, "# HELP gddr_duplicate_pushes_total Resent pushes answered with their first outcome, not applied again.\n# TYPE gddr_duplicate_pushes_total counter\n"
                  "gddr_duplicate_pushes_total %llu\n", (unsigned long long)ps->duplicates);
    sb_printf(&b, "# HELP gddr_push_chunks_total Chunks of pushes that passed the layout checks: sent, or held back by the worker's GDDR residual.\n# TYPE gddr_push_chunks_total counter\n"
                  "gddr_push_chunks_total{outcome=\"sent\"} %llu\ngddr_push_chunks_total{outcome=\"held\"} %llu\n",
              (unsigned long long)ps->push_chunks_sent, (unsigned long long)ps->push_chunks_held);
    sb_printf(&b, "# HELP gddr_push_parts_total Messages of pushes sent in parts (Push.parts > 1) taken in.\n# TYPE gddr_push_parts_total counter\n"
                  "gddr_push_parts_total %llu\n", (unsigned long long)ps->push_parts);
    sb_printf(&b, "# HELP gddr_pull_parts_total Replies of pulls answered in parts (Pull.part_bytes).\n# TYPE gddr_pull_parts_total counter\n"
                  "gddr_pull_parts_total %llu\n", (unsigned long long)ps->pull_parts);
    sb_printf(&b, "# HELP gddr_lazy_pulls_total Pulls answered lazily (Pull.delay_fraction: only chunks the worker lacks, some held back).\n# TYPE gddr_lazy_pulls_total counter\n"
                  "gddr_lazy_pulls_total %llu\n", (unsigned long long)ps->lazy_pulls);
    sb_printf(&b, "# HELP gddr_lazy_chunks_total Chunks of lazy pulls, by what happened to them.\n# TYPE gddr_lazy_chunks_total counter\n"
                  "gddr_lazy_chunks_total{outcome=\"sent\"} %llu\ngddr_lazy_chunks_total{outcome=\"held\"} %llu\n"
                  "gddr_lazy_chunks_total{outcome=\"unchanged\"} %llu\n",
              (unsigned long long)ps->lazy_chunks_sent, (unsigned long long)ps->lazy_chunks_held,
              (unsigned long long)ps->lazy_chunks_same);
    sb_printf(&b, "# HELP gddr_delta_pulls_total Pulls answered with 8/16-bit differences from the worker's view (Pull.delta_bits), and the chunks they encoded.\n# TYPE gddr_delta_pulls_total counter\n"
                  "gddr_delta_pulls_total %llu\n# HELP gddr_delta_chunks_total Chunks sent as differences by delta pulls.\n# TYPE gddr_delta_chunks_total counter\ngddr_delta_chunks_total %llu\n",
              (unsigned long long)ps->delta_pulls, (unsigned long long)ps->delta_chunks);
    sb_printf(&b, "# HELP gddr_pull_view_bytes Memory of the workers' views kept for lazy and delta pulls (10 bytes a chunk per worker and tensor; delta pulls add 4 bytes a value and 1 a chunk).\n# TYPE gddr_pull_view_bytes gauge\n"
                  "gddr_pull_view_bytes %lld\n", ps_pview_bytes());
    sb_printf(&b, "# HELP gddr_pull_views_refused_total Lazy or delta pulls answered whole because a new view would pass max_pull_view_bytes.\n# TYPE gddr_pull_views_refused_total counter\n"
                  "gddr_pull_views_refused_total %llu\n", (unsigned long long)ps->pview_refused);
    sb_printf(&b, "# HELP gddr_pull_view_resyncs_total Lazy or delta pulls answered in full because the worker's Pull.view_seq was not the latest reply's (a reply was lost, or the request came late on an abandoned connection).\n# TYPE gddr_pull_view_resyncs_total counter\n"
                  "gddr_pull_view_resyncs_total %llu\n", (unsigned long long)ps->pview_resyncs);
    sb_printf(&b, "# HELP gddr_handshake_failures_total Connections that failed the ZMTP/CURVE handshake (plaintext or wrong server key).\n# TYPE gddr_handshake_failures_total counter\n"
                  "gddr_handshake_failures_total %llu\n", (unsigned long long)ps->handshake_failed);
    sb_printf(&b, "# HELP gddr_connections Peer connections the server keeps accounts for.\n# TYPE gddr_connections gauge\n"
                  "gddr_connections %zu\n", ps_conns_count(ps));
    unsigned long long optb = 0;
    for (size_t i = 0; i < ps->ntensors; i++)
        optb += (unsigned long long)ps->tensors[i]->n * 4 *
                (unsigned long long)((ps->tensors[i]->s1 ? 1 : 0) + (ps->tensors[i]->s2 ? 1 : 0));
    sb_printf(&b, "# HELP gddr_optimizer_state_bytes Memory of the optimizers' state (momentum; Adam's two moments; Adagrad's sum of squares), 4 bytes a value each.\n# TYPE gddr_optimizer_state_bytes gauge\n"
                  "gddr_optimizer_state_bytes %llu\n", optb);
    sb_printf(&b, "# HELP gddr_fill_bytes Memory of the workers' fill credits (fill_held: 4 bytes a value and 1 a chunk per worker and tensor).\n# TYPE gddr_fill_bytes gauge\n"
                  "gddr_fill_bytes %lld\n", ps_fill_bytes());
    sb_printf(&b, "# HELP gddr_queued_reply_bytes Reply bytes handed to ZeroMQ and not yet sent, all peers.\n# TYPE gddr_queued_reply_bytes gauge\n"
                  "gddr_queued_reply_bytes %lld\n", ps_conns_queued_bytes(ps));
    sb_printf(&b, "# HELP gddr_pull_buffer_bytes Memory of tensor versions kept for pull replies (current ones and those unsent replies hold).\n# TYPE gddr_pull_buffer_bytes gauge\n"
                  "gddr_pull_buffer_bytes %lld\n", ps_vbuf_bytes());
    sb_printf(&b, "# HELP gddr_checkpoint_requests_total Checkpoints asked for by requests.\n# TYPE gddr_checkpoint_requests_total counter\n"
                  "gddr_checkpoint_requests_total %llu\n", (unsigned long long)ps->ckpt_requests);
    sb_printf(&b, "# HELP gddr_checkpoint_requests_joined_total Requests that joined a checkpoint in flight or due.\n# TYPE gddr_checkpoint_requests_joined_total counter\n"
                  "gddr_checkpoint_requests_joined_total %llu\n", (unsigned long long)ps->ckpt_joined);
    sb_printf(&b, "# HELP gddr_shard_info This server's place in a sharded model (shard_index of shard_count; 0 of 1: the whole model).\n# TYPE gddr_shard_info gauge\n"
                  "gddr_shard_info{shard_index=\"%lld\",shard_count=\"%lld\"} 1\n",
              ps->cfg.shard_index, ps->cfg.shard_count);
    return b.p;
}
