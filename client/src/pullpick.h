/* pullpick.h -- pull_delta_auto's choice between reduced and whole pulls,
 * and delay_auto's between held and dense pushes (pullpick.c says how it
 * chooses). */
#ifndef GDDR_PULLPICK_H
#define GDDR_PULLPICK_H

#include <stdint.h>

enum {
    PICK_FIRST = 16,  /* pulls before the first probe (each next one waits twice as long) */
    PICK_MAX = 1024,  /* the longest interval between probes */
    PICK_PROBE_MIN = 3, /* pulls of the other kind per probe, at least (the first not counted) */
    PICK_PROBE_MAX = 8, /* ... and at most, when its cost keeps falling */
    PICK_KEEP = 5,    /* recent costs kept per kind */
    PICK_PAIRED_STEPS = 9 /* a paired probe's steps: 3 turns of 3, 3 counted of each kind */
};
#define PICK_MARGIN 0.05 /* the other kind must be this much cheaper to be taken */

typedef struct gddr__pullpick {
    int whole;          /* the kind in use: 1 whole float32 pulls, 0 the configured ones */
    int probing;        /* the other kind is being tried */
    int probe_pulls;    /* pulls of this probe so far */
    int skip;           /* the next pull's cost is not counted (it follows a switch) */
    uint32_t left;      /* pulls of the kind in use before the next probe */
    uint32_t every;     /* the interval between probes now */
    double t[2][PICK_KEEP]; /* recent costs per kind (microseconds), a ring */
    unsigned n[2];      /* costs taken per kind since it was last reset */
    /* The rule (zero: pull_delta_auto's; delay_auto sets both, step.c):
     * paired -- a probe runs both kinds in turns (PICK_PAIRED_STEPS,
     * pullpick.c) and compares them on its own steps alone; confirm --
     * probes in a row the other kind must win to be taken (0 or 1: one). */
    int paired, confirm;
    int wins;           /* probes in a row the other kind has won */
    uint64_t probes, flips;
    double last_cost[2]; /* the costs the last decision compared, per kind */
} gddr__pullpick;

/* A new state (all zero: a zeroed ctensor's is new too). */
void gddr__pullpick_init(gddr__pullpick *p);
/* 1: the next pull should be whole; 0: the configured reduced pull. */
int gddr__pullpick_next_whole(const gddr__pullpick *p);
/* A pull of that kind finished, costing `cost` (any unit; < 0: not
 * measured, e.g. an error); moves the schedule on. A pull of the kind the
 * schedule did not ask for is ignored. */
void gddr__pullpick_done(gddr__pullpick *p, int was_whole, double cost);

#endif
