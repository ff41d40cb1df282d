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
 * (PullReply.parked_us: waiting for a sync step is nobody's cost).
 *
 * It keeps using the kind in use and, every `every` pulls, tries the other
 * kind (a probe). The first pull of a kind after a change of kind is not
 * counted (a reduced pull after a whole one carries every value, as the
 * server's copy of the view must be made exact again). A probe lasts until
 * the other kind's cost stops falling (at least 2 counted pulls, at most
 * PICK_PROBE_MAX pulls): the first whole pulls after reduced ones were
 * measured at 5 ms here and the fourth at 0.6 ms, while the allocator
 * found room for the larger replies (glibc maps a new 1 MiB buffer and
 * faults it in, until freed ones raise its threshold). Then each kind's
 * cost is the least of its recent ones (noise only ever adds), and when
 * the other kind's is below PICK_MARGIN of the kind in use's, it becomes
 * the kind in use.
 *
 * delay_auto (client/src/step.c) uses the same schedule with a stricter
 * rule (`like` and `confirm`): the kind in use's cost is the least of as
 * many of its last costs as the probe counted, and the other kind must
 * win two probes in a row. A held step differs from a dense one by only
 * ~10 % on loopback, which one probe of a few steps calls wrong about one
 * time in three on a busy machine, and over a link shared by other
 * workers a probe can call even a 20-40 % difference wrong; a wrong call
 * stands until the next probe.
 *
 * After every probe, whichever kind won, the interval doubles, up to
 * PICK_MAX: the first probe comes after 16 pulls,
 * the next after 32 more, then 64, ... Over a slow link that is 5 probes
 * of 3 whole pulls in 1,000 pulls, plus a full one after each: about 6%
 * more bytes pulled than 8-bit deltas alone (`gddr-tests integrity`
 * pull_auto_schedule prints it).
 *
 * Pure bookkeeping: no clock, no I/O (the caller times the pulls). */
#include "pullpick.h"

#include <string.h>

void gddr__pullpick_init(gddr__pullpick *p)
{
    memset(p, 0, sizeof *p); /* a zeroed state is a new one (gddr__pullpick_done) */
}

int gddr__pullpick_next_whole(const gddr__pullpick *p)
{
    return p->probing ? !p->whole : p->whole;
}

static void take(gddr__pullpick *p, int kind, double cost)
{
    unsigned n = p->n[kind];
    p->t[kind][n % PICK_KEEP] = cost;
    p->n[kind] = n + 1;
}

/* The least of a kind's last m costs (at most PICK_KEEP): what the pull
 * costs when nothing else is in its way. */
static double cost_of(const gddr__pullpick *p, int kind, unsigned m)
{
    unsigned n = p->n[kind] < PICK_KEEP ? p->n[kind] : PICK_KEEP;
    n = m < n ? m : n;
    double least = p->t[kind][(p->n[kind] - 1) % PICK_KEEP];
    for (unsigned i = 2; i <= n; i++) {
        double v = p->t[kind][(p->n[kind] - i) % PICK_KEEP];
        least = v < least ? v : least;
    }
    return least;
}

/* The probe's kind has two counted costs and the last is not below the one
 * before by more than the margin: it has settled. */
static int probe_settled(const gddr__pullpick *p)
{
    int k = !p->whole;
    unsigned n = p->n[k];
    if (n < PICK_PROBE_MIN - 1) /* (the probe's first pull is not counted) */
        return 0;
    double last = p->t[k][(n - 1) % PICK_KEEP], before = p->t[k][(n - 2) % PICK_KEEP];
    return last >= (1.0 - PICK_MARGIN) * before;
}

/* The end of a probe: keep the kind in use or take the other. */
static void decide(gddr__pullpick *p)
{
    int use = p->whole, other = !p->whole;
    p->probing = 0;
    /* like: as many of the kind in use's last costs as the probe counted
     * (the least of more draws of the same noise is lower, which favours
     * the kind in use whatever the costs); else up to PICK_KEEP of them,
     * a bias that acts as a brake: pull_delta_auto's first probe meets the
     * dearer first whole pulls (above), and the brake measured better for
     * it than like against like with two probes in a row. */
    unsigned m = p->like && p->n[other] ? p->n[other] : PICK_KEEP;
    p->last_cost[use] = p->n[use] ? cost_of(p, use, m) : -1;
    p->last_cost[other] = p->n[other] ? cost_of(p, other, PICK_KEEP) : -1;
    int won = p->n[use] && p->n[other] && p->last_cost[other] < (1.0 - PICK_MARGIN) * p->last_cost[use];
    p->wins = won ? p->wins + 1 : 0;
    if (p->wins >= (p->confirm > 1 ? p->confirm : 1)) {
        p->whole = other; /* the probe's kind is the one in use now: no switch back */
        p->flips++;
        p->wins = 0;
        p->n[use] = 0; /* measured again when next probed */
    } else {
        p->skip = 1; /* back to the kind in use: its first pull is a switch */
    }
    /* Both kinds were just measured, whichever won: the next probe waits
     * twice as long (every change of kind costs the first pulls of the
     * new one; probing again soon after a change would pay it twice). */
    p->every = p->every * 2 <= PICK_MAX ? p->every * 2 : PICK_MAX;
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
    if (p->probing) {
        if (++p->probe_pulls >= PICK_PROBE_MAX || probe_settled(p))
            decide(p);
        return;
    }
    if (--p->left > 0)
        return;
    p->probing = 1; /* try the other kind; its first pull is a switch */
    p->probe_pulls = 0;
    p->skip = 1;
    p->n[!p->whole] = 0; /* only this probe's figures */
    p->probes++;
}
