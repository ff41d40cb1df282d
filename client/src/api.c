/* api.c -- the public face of libgddr-client: every function of gddr.h
 * (common/log.c has gddr_strerror, the error list's own).
 * Each checks its arguments as both backends would, then calls the
 * client's backend (backend.h): one server (single.c) or several
 * (shard.c).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "blas.h"
#include "client_int.h"

/* This file defines the symbols of the first gddr.h that the header's
 * macros now map onto the sized calls. */
#undef gddr_client_open
#undef gddr_client_opts_init
#undef gddr_client_open_ini

const char *gddr_client_errmsg(const gddr_client *c)
{
    return c ? c->errmsg : "no client";
}

/* ---- options and opening (options.c) -------------------------------------------
 * The sized calls take the caller's struct size; the unsized symbols are
 * those of the first gddr.h, whose struct is the frozen prefix (gddr.h maps
 * the names onto the sized calls for code built now). */

void gddr_client_opts_init(gddr_client_opts *o)
{
    gddr__opts_init_sized(o, GDDR_CLIENT_OPTS_V0_SIZE);
}

int gddr_client_opts_init_sized(gddr_client_opts *o, size_t size)
{
    return gddr__opts_init_sized(o, size);
}

size_t gddr_client_opts_size(void)
{
    return gddr__opts_size();
}

const char *gddr_opts_errmsg(void)
{
    return gddr__opts_errmsg();
}

int gddr_opts_set(gddr_client_opts *o, size_t size, const char *name, const char *value)
{
    return gddr__opts_set(o, size, name, value);
}

int gddr_opts_set_ptr(gddr_client_opts *o, size_t size, const char *name, void *value)
{
    return gddr__opts_set_ptr(o, size, name, value);
}

int gddr_opts_get(const gddr_client_opts *o, size_t size, const char *name, char *buf, size_t len)
{
    return gddr__opts_get(o, size, name, buf, len);
}

const char *gddr_opts_describe(size_t i, const char **type, const char **def, const char **choice,
                               const char **help)
{
    return gddr__opts_describe(i, type, def, choice, help);
}

int gddr_client_open(const gddr_client_opts *opts, gddr_client **out)
{
    return gddr__opts_open_sized(opts, GDDR_CLIENT_OPTS_V0_SIZE, out);
}

int gddr_client_open_sized(const gddr_client_opts *opts, size_t size, gddr_client **out)
{
    return gddr__opts_open_sized(opts, size, out);
}

int gddr_client_open_ini(const char *path, const gddr_client_opts *overrides, gddr_client **out,
                         char *errbuf, size_t errlen)
{
    return gddr__opts_open_ini_sized(path, overrides, GDDR_CLIENT_OPTS_V0_SIZE, out, errbuf, errlen);
}

int gddr_client_open_ini_sized(const char *path, const gddr_client_opts *overrides, size_t size,
                               gddr_client **out, char *errbuf, size_t errlen)
{
    return gddr__opts_open_ini_sized(path, overrides, size, out, errbuf, errlen);
}

void gddr_client_close(gddr_client **cp)
{
    if (!cp || !*cp)
        return;
    (*cp)->be->close(*cp);
    *cp = NULL;
}

int gddr_client_info(gddr_client *c, gddr_server_info *out)
{
    if (!c || !out)
        return GDDR_EINVAL;
    *out = c->info;
    out->world_size = c->o.world_size;
    return GDDR_OK;
}

int gddr_client_counters_get(const gddr_client *c, gddr_client_counters *out)
{
    if (!c || !out)
        return GDDR_EINVAL;
    c->be->counters(c, out);
    return GDDR_OK;
}

uint64_t gddr_next_step(gddr_client *c)
{
    return c->be->next_step(c);
}

/* ---- tensors ------------------------------------------------------------------ */

int gddr_register_opt(gddr_client *c, const char *key, const float *init, size_t n,
                      const char *optimizer, int *id, uint64_t *version)
{
    if (!c || !key || !init || n == 0 || !id || strlen(key) >= 128)
        return c ? gddr__set_err(c, GDDR_EINVAL, "register: bad arguments") : GDDR_EINVAL;
    gddr__optim opt;
    char err[256];
    if (gddr__optim_parse(optimizer, &opt, err, sizeof err) < 0)
        return gddr__set_err(c, GDDR_EINVAL, "register '%s': %s", key, err);
    return c->be->reg(c, key, init, n, &opt, id, version);
}

int gddr_register(gddr_client *c, const char *key, const float *init, size_t n, int *id,
                  uint64_t *version)
{
    return gddr_register_opt(c, key, init, n, NULL, id, version);
}

int gddr_set_lr(gddr_client *c, double lr)
{
    if (!c || !isfinite(lr) || lr < 0 || lr > 1e6)
        return c ? gddr__set_err(c, GDDR_EINVAL, "set_lr: %g is not in [0, 1e6]", lr) : GDDR_EINVAL;
    c->be->set_lr(c, lr);
    return GDDR_OK;
}

int gddr_tensor_optimizer(gddr_client *c, int id, char *buf, size_t len)
{
    if (!c || !buf || len == 0)
        return GDDR_EINVAL;
    return c->be->optimizer(c, id, buf, len);
}

int gddr_tensor_version(const gddr_client *c, int id, uint64_t *version)
{
    if (!c || !version)
        return GDDR_EINVAL;
    return c->be->version(c, id, version);
}

/* ---- pull and push (the id and buffer checks are the backends') ---------------- */

int gddr_pull_async(gddr_client *c, int id, float *out, uint64_t min_version, gddr_ticket *ticket)
{
    if (!c)
        return GDDR_EINVAL;
    return c->be->pull_async(c, id, out, min_version, ticket);
}

int gddr_pull(gddr_client *c, int id, float *out, uint64_t min_version, uint64_t *version)
{
    if (!c)
        return GDDR_EINVAL;
    return c->be->pull(c, id, out, min_version, version);
}

int gddr_push_async(gddr_client *c, int id, const float *grad, const gddr_push_tags *tags,
                    gddr_ticket *ticket)
{
    if (!c)
        return GDDR_EINVAL;
    return c->be->push_async(c, id, grad, tags, ticket);
}

int gddr_push_ex(gddr_client *c, int id, const float *grad, const gddr_push_tags *tags,
                 uint64_t *version)
{
    if (!c)
        return GDDR_EINVAL;
    return c->be->push(c, id, grad, tags, version);
}

int gddr_push(gddr_client *c, int id, const float *grad, uint64_t *version)
{
    return gddr_push_ex(c, id, grad, NULL, version);
}

int gddr_wait(gddr_client *c, gddr_ticket ticket, int timeout_ms, uint64_t *version)
{
    if (!c)
        return GDDR_EINVAL;
    return c->be->wait(c, ticket, timeout_ms, version);
}

/* ---- steps ---------------------------------------------------------------------- */

int gddr_step_from(gddr_client *c, const float *const *grads, const float *const *computed_on,
                   const uint64_t *versions, float *const *params)
{
    if (!c)
        return GDDR_EINVAL;
    return c->be->step(c, grads, computed_on, versions, params);
}

int gddr_step(gddr_client *c, const float *const *grads, float *const *params)
{
    return gddr_step_from(c, grads, NULL, NULL, params);
}

int gddr_step_submit(gddr_client *c, const float *const *grads)
{
    if (!c || !grads)
        return GDDR_EINVAL;
    return c->be->submit(c, grads);
}

int gddr_step_wait(gddr_client *c, float *const *params)
{
    if (!c || !params)
        return GDDR_EINVAL;
    return c->be->wait_step(c, params);
}

/* ---- the servers ------------------------------------------------------------------ */

int gddr_server_stats_get(gddr_client *c, gddr_server_stats *out)
{
    if (!c || !out)
        return GDDR_EINVAL;
    return c->be->stats(c, out);
}

int gddr_server_metrics_text(gddr_client *c, char **text)
{
    if (!c || !text)
        return GDDR_EINVAL;
    *text = NULL;
    return c->be->metrics(c, text);
}

int gddr_request_checkpoint(gddr_client *c)
{
    if (!c)
        return GDDR_EINVAL;
    return c->be->checkpoint(c);
}

int gddr_cuda_status(char *why, size_t len)
{
    char tmp[512] = "";
    int ok = gddr_cuda_available(tmp, sizeof tmp) == 1;
    if (why && len)
        snprintf(why, len, "%s", ok ? "" : tmp[0] ? tmp : "no CUDA device");
    return ok;
}

/* ---- sparse tables ------------------------------------------------------------ */

int gddr_table_register_sized(gddr_client *c, const char *key, uint32_t dim,
                              const gddr_table_opts *opts, size_t opts_size, int *table)
{
    if (!c || !key || !table || dim == 0 || dim > 65536)
        return c ? gddr__set_err(c, GDDR_EINVAL, "table register: key, a dim in 1..65536 and table needed")
                 : GDDR_EINVAL;
    /* Fields past the caller's struct get their defaults; a struct larger
     * than this library's is from a newer header (its fields would be
     * ignored). */
    gddr_table_opts o = GDDR_TABLE_OPTS_INIT;
    if (opts) {
        if (opts_size > sizeof o)
            return gddr__set_err(c, GDDR_ENOTSUP, "gddr_table_opts of %zu bytes: this libgddr-client knows %zu; upgrade it",
                                 opts_size, sizeof o);
        memcpy(&o, opts, opts_size);
    }
    if (o.init < GDDR_TINIT_ZEROS || o.init > GDDR_TINIT_NORMAL || o.admit < GDDR_TADMIT_ALWAYS ||
        o.admit > GDDR_TADMIT_PROB || !(o.init_scale >= 0) || !isfinite(o.init_scale) ||
        (o.admit == GDDR_TADMIT_COUNT && o.admit_count < 1) ||
        (o.admit == GDDR_TADMIT_PROB && !(o.admit_prob > 0 && o.admit_prob <= 1)))
        return gddr__set_err(c, GDDR_EINVAL, "table '%s': init, init_scale >= 0, admission and its "
                                             "count (>= 1) or probability (0, 1] must be valid", key);
    return c->be->table_register(c, key, dim, &o, table);
}

int gddr_pull_rows(gddr_client *c, int table, const uint64_t *keys, size_t n, float *out,
                   unsigned flags, uint64_t min_version, uint64_t *version)
{
    if (!c || (n && (!keys || !out)))
        return GDDR_EINVAL;
    /* Each key goes once (docs/protocol.md, "Tables"); repeats are copied
     * from its row here. */
    uint64_t *uk;
    uint32_t *first;
    long nu = gddr__rows_unique(keys, n, &uk, &first);
    if (nu < 0)
        return gddr__set_err(c, GDDR_ENOMEM, "no memory for a pull of %zu rows", n);
    if (!uk)
        return c->be->pull_rows(c, table, keys, n, out, flags, min_version, version);
    /* The unique rows go to the front of out (nu <= n rows), then spread
     * out back to front, so no row is overwritten before it is read. */
    int rc = c->be->pull_rows(c, table, uk, (size_t)nu, out, flags, min_version, version);
    if (rc == GDDR_OK) {
        size_t dim = c->be->table_dim(c, table);
        for (size_t i = n; i-- > 0;)
            if (first[i] != i)
                memcpy(out + i * dim, out + (size_t)first[i] * dim, dim * sizeof *out);
    }
    free(uk);
    free(first);
    return rc;
}

int gddr_push_rows(gddr_client *c, int table, const uint64_t *keys, size_t n, const float *grads,
                   uint64_t *version)
{
    if (!c || (n && (!keys || !grads)))
        return GDDR_EINVAL;
    if (c->o.observer)
        return gddr__set_err(c, GDDR_EWORKER, "an observer cannot push");
    uint32_t dim = c->be->table_dim(c, table);
    if (!dim) /* not a table: the backend says so */
        return c->be->push_rows(c, table, keys, n, grads, version);
    /* Each key goes once: the gradients of a repeated key are summed. */
    uint64_t *uk;
    float *ug;
    long nu = gddr__rows_dedup(keys, n, grads, dim, &uk, &ug);
    if (nu < 0)
        return gddr__set_err(c, GDDR_ENOMEM, "no memory to sum %zu rows", n);
    int rc = c->be->push_rows(c, table, uk ? uk : keys, (size_t)nu, ug ? ug : grads, version);
    free(uk);
    free(ug);
    return rc;
}
