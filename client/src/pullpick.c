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
 * the other kind's cost stops falling (a pull that is no new low; at least
 * 2 counted pulls, at most PICK_PROBE_MAX pulls): the first whole pulls
 * after reduced ones were measured at 5 ms here, while the allocator
 * found room for the larger replies (glibc maps a new 1 MiB buffer and
 * faults it in, until freed ones raise its threshold), and then falling a
 * few percent a pull for several more (probe_settled). Then each kind's
 * cost is the least of its recent ones (noise only ever adds), and when
 * the other kind's is below PICK_MARGIN of the kind in use's, it becomes
 * the kind in use.
 *
 * delay_auto (client/src/step.c) uses the same schedule with paired
 * probes and two wins in a row (`paired`, `confirm`). A held step differs
 * from a dense one by only ~10 % on loopback, while this machine's load
 * moves the cost of the same step 2x between one second and the next: a
 * probe compared with the steps before it (the rule above) calls the
 * difference by which period was busier. A paired probe runs both kinds
 * in turns of three steps (paired_turn: the change to dense, which also
 * flushes the residual and is not counted, one dense, one held), three
 * turns, and compares the least of its own three of each kind, timed
 * within the same few milliseconds. Pulls do not take turns: each reduced
 * pull after a whole one is a full resync; a change of push kind costs
 * only the flush step. Over a link shared by other workers a probe can
 * still call a 20-40 % difference wrong (a burst of their traffic), so
 * the other kind must win two probes in a row, and a lost one clears the
 * count.
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

/* A paired probe's turn at its step i: whole (1) or not, and whether its
 * cost is left out. Each turn of three runs a whole step after a reduced
 * one, which is not counted (for delay_auto's pushes, the dense step after
 * held ones also sends the residual: a flush), then one whole step and one
 * reduced step that are; starting from the kind in use, so that the
 * probe's first step is a change of kind and its last is the kind in use. */
static int paired_turn(const gddr__pullpick *p, int i, int *uncounted)
{
    static const int from_reduced[3] = { 1, 1, 0 }, from_whole[3] = { 0, 1, 1 };
    int pos = i % 3;
    *uncounted = p->whole ? pos == 1 : pos == 0;
    return p->whole ? from_whole[pos] : from_reduced[pos];
}

int gddr__pullpick_next_whole(const gddr__pullpick *p)
{
    int uncounted;
    if (p->probing && p->paired)
        return paired_turn(p, p->probe_pulls, &uncounted);
    return p->probing ? !p->whole : p->whole;
}

static void take(gddr__pullpick *p, int kind, double cost)
{
    unsigned n = p->n[kind];
    p->t[kind][n % PICK_KEEP] = cost;
    p->n[kind] = n + 1;
}

/* The least of a kind's recent costs (at most PICK_KEEP): what the pull
 * costs when nothing else is in its way. */
static double cost_of(const gddr__pullpick *p, int kind)
{
    unsigned n = p->n[kind] < PICK_KEEP ? p->n[kind] : PICK_KEEP;
    double least = p->t[kind][0];
    for (unsigned i = 1; i < n; i++)
        least = p->t[kind][i] < least ? p->t[kind][i] : least;
    return least;
}

/* The probe's kind has two counted costs and the last is no new low (not
 * below the least of the probe's earlier ones): it has settled. Not a
 * margin: the first whole pulls of a process fall by a few percent a pull
 * for several pulls (4.6 ms, 4.8, 874 us, 791, 754, ... to ~550), and a
 * probe that stopped where the fall slowed under 5 % compared 754 with the
 * reduced pulls' 765 and kept them. Under steady noise a new low is ever
 * rarer, and a probe counts about 2.7 pulls on average. */
static int probe_settled(const gddr__pullpick *p)
{
    int k = !p->whole;
    unsigned n = p->n[k];
    if (n < PICK_PROBE_MIN - 1) /* (the probe's first pull is not counted) */
        return 0;
    double last = p->t[k][(n - 1) % PICK_KEEP];
    for (unsigned i = 2; i <= n && i <= PICK_KEEP; i++)
        if (last >= p->t[k][(n - i) % PICK_KEEP])
            return 1;
    return 0;
}

/* The end of a probe: keep the kind in use or take the other. */
static void decide(gddr__pullpick *p)
{
    int use = p->whole, other = !p->whole;
    p->probing = 0;
    /* Each kind's least recent cost (a paired probe: its own three of each
     * kind, as it reset both). Unpaired, the kind in use's are up to
     * PICK_KEEP from before the probe, against the probe's 2-7: the least
     * of more draws of the same noise is lower, a bias towards the kind in
     * use that acts as a brake (pull_delta_auto's first probe meets the
     * dearer first whole pulls, above). */
    p->last_cost[use] = p->n[use] ? cost_of(p, use) : -1;
    p->last_cost[other] = p->n[other] ? cost_of(p, other) : -1;
    int won = p->n[use] && p->n[other] && p->last_cost[other] < (1.0 - PICK_MARGIN) * p->last_cost[use];
    p->wins = won ? p->wins + 1 : 0;
    if (p->wins >= (p->confirm > 1 ? p->confirm : 1)) {
        p->whole = other; /* the probe's kind is the one in use now: no switch back */
        p->flips++;
        p->wins = 0;
        p->n[use] = 0; /* measured again when next probed */
    } else {
        /* back to the kind in use: its first pull is a switch (a paired
         * probe ends on the kind in use) */
        p->skip = !p->paired;
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
    if (p->probing && p->paired) {
        int uncounted;
        paired_turn(p, p->probe_pulls, &uncounted);
        if (!uncounted && cost >= 0)
            take(p, was_whole, cost);
        if (++p->probe_pulls >= PICK_PAIRED_STEPS)
            decide(p);
        return;
    }
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
    p->skip = !p->paired;
    p->n[!p->whole] = 0; /* only this probe's figures */
    if (p->paired)
        p->n[p->whole] = 0; /* both kinds: only this probe's turns */
    p->probes++;
}
