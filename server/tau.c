/* tau.c -- the dynamic tau controller: each tensor's GDDR delay bound,
 * moved by how fast its pushed gradient norms change. The server hands
 * tau to the workers in every reply's header (reply.c); a worker holds a
 * chunk back at most tau steps. */
#include "log.h"
#include "ps.h"

int ps_tau_update(const gddr_ps_config *cfg, ps_tensor *t, double norm)
{
    /* The seed's controller: track the pushed gradient norm's EMA m and the
     * EMA of its relative change rho = |norm - m| / m. A fast-changing
     * landscape (rho high) makes held chunks go stale quickly, so tau is
     * halved; a calm one lets tau grow back one step at a time. Both
     * decisions read the EMA of rho, not one push's rho: with minibatch
     * gradients a single push's rho exceeds 0.5 on ~7% of pushes (softmax,
     * Fashion-MNIST, batch 64, measured), which pinned tau at tau_min;
     * a real spike (a norm several times m) still lifts the EMA over
     * tau_rate_high at once. */
    /* norm 0: a push without a fresh gradient (the residual a closing
     * worker flushes) says nothing about how fast the landscape moves. */
    if (!cfg->tau_dynamic || !(norm > 0))
        return 0;
    const double e = cfg->tau_ema;
    if (t->norm_ema <= 0) {
        t->norm_ema = norm;
        return 0;
    }
    /* One push moves the controller by a bounded amount: a norm far off the
     * EMA (a real regime change, or a bogus report) counts as 8x the EMA at
     * most, so a single absurd value (3e38) cannot hold tau at tau_min for
     * the ~800 pushes its EMA would otherwise take to decay; a genuine
     * change still comes through within a few pushes. */
    if (norm > 8.0 * t->norm_ema)
        norm = 8.0 * t->norm_ema;
    double rate = (norm - t->norm_ema) / t->norm_ema;
    if (rate < 0)
        rate = -rate;
    t->rate_ema = e * t->rate_ema + (1 - e) * rate;
    t->norm_ema = e * t->norm_ema + (1 - e) * norm;
    int old = t->tau;
    if (t->rate_ema > cfg->tau_rate_high) {
        /* A spike: shorten at once, then hold for tau_patience pushes. The
         * hold-off also runs down while the turbulence lasts, so a change
         * rate that stays high halves tau again every tau_patience + 1
         * pushes until tau_min (resetting it on every turbulent push would
         * leave tau stuck at its first halving). */
        if (t->calm >= 0) {
            int nt = t->tau / 2;
            t->tau = nt < cfg->tau_min ? (int)cfg->tau_min : nt;
            t->calm = -(int)cfg->tau_patience;
        } else {
            t->calm++;
        }
    } else if (t->rate_ema < cfg->tau_rate_low) {
        if (++t->calm >= cfg->tau_patience) {
            if (t->tau < cfg->tau_max)
                t->tau++;
            t->calm = 0;
        }
    } else if (t->calm < 0) {
        t->calm++;
    } else {
        t->calm = 0;
    }
    return t->tau != old;
}

void ps_tau_feed(const gddr_ps_config *cfg, ps_tensor *t, double norm)
{
    if (ps_tau_update(cfg, t, norm))
        gddr_log(GDDR_LOG_DEBUG, "tensor '%s': tau now %d (norm EMA %.4g, change rate %.3f)", t->key,
                 t->tau, t->norm_ema, t->rate_ema);
}

void ps_tau_defer(const gddr_ps_config *cfg, ps_tensor *t, uint32_t rank, double norm)
{
    /* rank is below max_workers (server.c refuses others), and tau_pend
     * has that many slots (ps_tensor_create). */
    if (!cfg->tau_dynamic || !(norm > 0))
        return;
    if (t->tau_pend[rank] > 0) /* a second push of the rank in the open step (a late one) */
        ps_tau_feed(cfg, t, t->tau_pend[rank]);
    t->tau_pend[rank] = norm;
    if (rank >= t->tau_pend_n)
        t->tau_pend_n = rank + 1;
}

void ps_tau_step_close(const gddr_ps_config *cfg, ps_tensor *t)
{
    for (uint32_t r = 0; r < t->tau_pend_n; r++) /* the ranks that pushed, not max_workers */
        if (t->tau_pend[r] > 0) {
            ps_tau_feed(cfg, t, t->tau_pend[r]);
            t->tau_pend[r] = 0;
        }
    t->tau_pend_n = 0;
}
