/* table_metrics.c -- the sparse tables' Prometheus families (one sample
 * per table each), and who a table's open sync step waits for. */
#include <stdio.h>
#include <stdlib.h>

#include "ps.h"
#include "syncstep.h"
#include "table.h"
#include "table_wire.h"
#include "table_wire_int.h"

enum { TM_ROWS, TM_CREATED, TM_EVICTED_TTL, TM_EVICTED_CAP, TM_DROPPED, TM_PULLS, TM_ROWS_PULLED,
       TM_PUSHES, TM_ROWS_PUSHED, TM_DUPLICATES, TM_VERSION, TM_N };

static const struct {
    const char *name, *type, *help, *label; /* label: an extra one, or "" */
} tm_family[TM_N] = {
    { "gddr_table_rows", "gauge", "Live rows of a sparse table.", "" },
    { "gddr_table_rows_created_total", "counter", "Rows created.", "" },
    { "gddr_table_rows_evicted_total", "counter",
      "Rows evicted, by reason (ttl: row_ttl; cap: max_rows, max_table_rows or max_table_bytes).",
      ",reason=\"ttl\"" },
    { "gddr_table_rows_evicted_total", NULL, NULL, ",reason=\"cap\"" },
    { "gddr_table_gradients_dropped_total", "counter", "Gradient rows dropped: key not admitted (yet).", "" },
    { "gddr_table_pulls_total", "counter", "Row pulls served.", "" },
    { "gddr_table_rows_pulled_total", "counter", "Rows served by pulls.", "" },
    { "gddr_table_pushes_total", "counter", "Row pushes taken (resends not counted).", "" },
    { "gddr_table_rows_pushed_total", "counter", "Rows stepped by pushes (a sync step counts each row once).", "" },
    { "gddr_table_duplicates_total", "counter", "Row pushes answered as resends (exactly once).", "" },
    { "gddr_table_version", "gauge", "Version of a table.", "" },
};

static void table_metrics(const ps_stable *s, uint64_t *v)
{
    ps_table_counts k;
    ps_table_counts_get(s->tab, &k);
    v[TM_ROWS] = k.rows, v[TM_CREATED] = k.created;
    v[TM_EVICTED_TTL] = k.evicted_ttl, v[TM_EVICTED_CAP] = k.evicted_cap, v[TM_DROPPED] = k.dropped;
    v[TM_PULLS] = s->pulls, v[TM_ROWS_PULLED] = s->rows_pulled;
    v[TM_PUSHES] = s->pushes, v[TM_ROWS_PUSHED] = s->rows_pushed, v[TM_DUPLICATES] = s->duplicates;
    v[TM_VERSION] = ps_table_version(s->tab);
}

char *ps_tables_metrics_text(gddr_ps *ps)
{
    struct ps_tables *ts = ps->tables;
    size_t n = ts ? ts->n : 0;
    /* a sample line is at most 250 bytes (a key is under 128) */
    size_t cap = 4096 + n * TM_N * 250 + n * (size_t)ps->cfg.max_workers * 200, len = 0;
    char *b = malloc(cap);
    uint64_t (*v)[TM_N] = calloc(n ? n : 1, sizeof *v);
    if (!b || !v) {
        free(b), free(v);
        return NULL;
    }
    b[0] = 0;
    for (size_t i = 0; i < n; i++)
        table_metrics(ts->t[i], v[i]);
    /* No family without a table: each family has a sample. */
    for (int f = 0; n && f < TM_N; f++) {
        if (tm_family[f].help)
            len += (size_t)snprintf(b + len, cap - len, "# HELP %s %s\n# TYPE %s %s\n", tm_family[f].name,
                                    tm_family[f].help, tm_family[f].name, tm_family[f].type);
        for (size_t i = 0; i < n; i++)
            len += (size_t)snprintf(b + len, cap - len, "%s{table=\"%s\"%s} %llu\n", tm_family[f].name,
                                    ts->t[i]->key, tm_family[f].label, (unsigned long long)v[i][f]);
    }
    free(v);
    /* Who an open sync step waits for (as gddr_sync_step_rank for tensors;
     * the family only while a step is open). */
    int said = 0;
    for (size_t i = 0; i < n; i++) {
        const ps_stable *s = ts->t[i];
        for (int r = 0; s->ncontrib && r < (int)ps->cfg.max_workers; r++) {
            int st = ps_sync_rank(ps, ps_table_step_pushed, s, r);
            if (st > -2 && !said++)
                len += (size_t)snprintf(b + len, cap - len, "# HELP gddr_table_sync_step_rank A rank in a "
                                        "table's open sync step: 1 pushed, 0 waited for, -1 excused.\n"
                                        "# TYPE gddr_table_sync_step_rank gauge\n");
            if (st > -2)
                len += (size_t)snprintf(b + len, cap - len, "gddr_table_sync_step_rank{table=\"%s\",rank=\"%d\"} %d\n",
                                        s->key, r, st);
        }
    }
    return b;
}
