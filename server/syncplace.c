/* syncplace.c -- the "syncplace" section of a checkpoint: each rank's
 * place in each tensor's and table's sync steps (members.c ps_sync_place),
 * so that a restore lines up a rank that was catching up by where it was,
 * not as if its last push had been on time (sync.c tensor_wanted). Layout:
 * u64 tensors T, u64 tables B, u64 ranks R, then T x R and B x R u64
 * places (0: not known), in id order. Written in sync mode only; a server
 * before 2026-12-03 ignores it, and without it places are not known. */
#include <stdlib.h>
#include <string.h>

#include "checkpoint.h"
#include "ps.h"
#include "snapshot.h"
#include "syncstep.h"

void *ps_places_section(gddr_ps *ps, uint64_t *len)
{
    size_t mw = (size_t)ps->cfg.max_workers, nt = ps->ntensors, nb = ps_tables_count(ps);
    uint64_t *place = ps->cfg.mode == GDDR_PS_MODE_SYNC ? malloc((3 + (nt + nb) * mw) * 8) : NULL;
    if (!place)
        return NULL;
    place[0] = nt, place[1] = nb, place[2] = mw;
    for (size_t i = 0; i < nt; i++)
        memcpy(place + 3 + i * mw, ps->tensors[i]->sstep, mw * 8);
    ps_tables_places_get(ps, place + 3 + nt * mw);
    *len = (3 + (nt + nb) * mw) * 8;
    return place;
}

void ps_places_restore(gddr_ps *ps, const gddr_ckpt_section *sec)
{
    const uint64_t *p = sec && sec->len >= 24 ? (const uint64_t *)sec->data : NULL;
    if (!p || p[2] == 0 || p[2] > 1u << 20 || p[0] > 1u << 30 || p[1] > 1u << 30 ||
        sec->len != (3 + (p[0] + p[1]) * p[2]) * 8)
        return;
    size_t per = (size_t)p[2], mw = (size_t)ps->cfg.max_workers;
    for (size_t i = 0; i < ps->ntensors && i < p[0]; i++) {
        ps_tensor *t = ps->tensors[i];
        for (size_t r = 0; r < mw && r < per; r++) {
            const ps_worker *w = &ps->workers[r];
            t->sstep[r] = t->id < w->nwt && w->wt[t->id].set ? p[3 + i * per + r] : 0;
        }
    }
    ps_tables_places_set(ps, p + 3 + p[0] * per, (size_t)p[1], per);
}
