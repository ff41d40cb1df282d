/* pullpick.c -- pull_delta_auto: whether a tensor's next gddr_step pull is
 * the configured reduced pull (8- or 16-bit differences, lazy chunks) or a
 * whole float32 one, chosen by what each has cost lately.
 *
 * A reduced pull saves link bytes and spends CPU on both ends (the server
 * encodes against its copy of the worker's view, the worker decodes into
 * its view and the caller's buffer). Over a slow link that pays many times
 * over; over loopback or a link as fast as memory it costs more than it
 * saves (docs/performance.md, "Delta pulls against whole pulls"). The
 * worker cannot know which from its configuration, so it measures: each
 * pull's cost is the time from its request to its values being in the
 * caller's buffer, less what the server says it kept the pull parked
 * (PullReply.parked_us: waiting for a sync step is nobody's cost). It
 * keeps using the kind in use and, every `every` pulls, tries the other
 * kind for PICK_PROBE pulls; the first pull of a kind after a switch is not
 * counted (a reduced pull after a whole one carries every value, as the
 * server's copy of the view must be made exact again). When the other
 * kind's median cost is below PICK_MARGIN of the kind in use's, it
 * becomes the kind in use and the interval starts again at PICK_FIRST;
 * else the interval doubles, up to PICK_MAX, so a settled choice costs
 * few probes: over a slow link, 5 probes in 1,000 pulls (15 whole pulls and
 * 5 full ones), about 6% more bytes pulled than 8-bit deltas alone
 * (`gddr-tests integrity` pull_auto_schedule).
 *
 * Pure bookkeeping: no clock, no I/O (the caller times the pulls). */
#include "pullpick.h"

#include <string.h>

static double median(const double *x, unsigned n)
{
    double s[PICK_KEEP];
    memcpy(s, x, n * sizeof *s);
    for (unsigned i = 1; i < n; i++) /* insertion sort: n <= PICK_KEEP */
        for (unsigned j = i; j > 0 && s[j - 1] > s[j]; j--) {
            double t = s[j];
            s[j] = s[j - 1];
            s[j - 1] = t;
        }
    return n % 2 ? s[n / 2] : 0.5 * (s[n / 2 - 1] + s[n / 2]);
}

void gddr__pullpick_init(gddr__pullpick *p)
{
    memset(p, 0, sizeof *p);
    p->every = PICK_FIRST;
    p->left = PICK_FIRST;
}

int gddr__pullpick_next_whole(const gddr__pullpick *p)
{
    return p->probe ? !p->whole : p->whole;
}

static void take(gddr__pullpick *p, int kind, double cost)
{
    unsigned n = p->n[kind];
    p->t[kind][n % PICK_KEEP] = cost;
    p->n[kind] = n + 1;
}

static double cost_of(const gddr__pullpick *p, int kind)
{
    unsigned n = p->n[kind] < PICK_KEEP ? p->n[kind] : PICK_KEEP;
    return median(p->t[kind], n);
}

/* The end of a probe: keep the kind in use or take the other. */
static void decide(gddr__pullpick *p)
{
    int use = p->whole, other = !p->whole;
    p->last_cost[use] = p->n[use] ? cost_of(p, use) : -1;
    p->last_cost[other] = p->n[other] ? cost_of(p, other) : -1;
    if (p->n[use] && p->n[other] && p->last_cost[other] < (1.0 - PICK_MARGIN) * p->last_cost[use]) {
        p->whole = other; /* the probe's kind is the one in use now: no switch back */
        p->every = PICK_FIRST;
        p->flips++;
        p->n[use] = 0; /* measured again when next probed */
    } else {
        p->every = p->every * 2 <= PICK_MAX ? p->every * 2 : PICK_MAX;
        p->skip = 1; /* back to the kind in use: its first pull is a switch */
    }
    p->left = p->every;
}

void gddr__pullpick_done(gddr__pullpick *p, int was_whole, double cost)
{
    if (!p->every) /* a zeroed state is a new one */
        p->every = p->left = PICK_FIRST;
    if (was_whole != gddr__pullpick_next_whole(p))
        return; /* not the pull the schedule asked for (a retry, a full resync) */
    if (p->skip)
        p->skip = 0;
    else if (cost >= 0)
        take(p, was_whole, cost);
    if (p->probe) {
        if (--p->probe == 0)
            decide(p);
        return;
    }
    if (p->left && --p->left)
        return;
    p->probe = PICK_PROBE; /* try the other kind; its first pull is a switch */
    p->skip = 1;
    p->n[!p->whole] = 0;   /* only this probe's figures */
    p->probes++;
}
