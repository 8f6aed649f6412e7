/*
 * relay.pml -- a Promela model of Relay's exactly-once protocol on the path users run: the executor
 * side (model/README.md says what is modelled, what is abstracted, and how each invariant maps to
 * the code). Checked by model/check.py.
 *
 * One Kafka partition with offsets 0..N-1; three instances (blue, green made by the upgrade as a
 * warm standby or, with FAILOVER, blue's hot standby, and the fresh instance a recovery or a stop +
 * deploy makes), each with one lease row, and a second row for blue's continuation after an abort
 * of the upgrade; attempts with epochs; the instance row lock; the source guard (hold, floor, read
 * cap) and the planned end the source records under the row lock; per micro-batch the executor path
 * of pipeline_driver.process_batch: prepare_tasks (a ledger transaction: refuse a zombie, the task
 * range inside the leases at/after the cursors, the predecessors), take_over (fence the
 * predecessors in the SINK and merge their written offsets), the tasks (each ONE sink transaction:
 * check the fence, keep the rows in the range, write idempotently), then commit_cursors (ONE ledger
 * transaction: compare-and-set the cursors); a crash between any two steps. The sink is modelled:
 * without STATEFUL, the Kafka transactional sink of DESIGN-29 D1 (per instance a marker: its fence
 * epoch, a fenced flag and the set of source offsets its committed transactions wrote; the output:
 * how many records each source offset has); with STATEFUL, the PostgreSQL upsert of a stateful
 * pipeline (one window row: its value, written by the newest writer position (generation, batch
 * id)).
 *
 * Build switches (spin -D...):
 *   NO_ROW_LOCK          mutant: the handoff reads blue's lease without locking blue's instance row
 *                        and closes it with an UPDATE that ignores the cursor (READ COMMITTED race)
 *   NO_HANDOFF_LOCK      the handoff does not lock blue's row but keeps the compare-and-set on the
 *                        cursor when it closes blue's lease (the CAS alone must be enough)
 *   NO_EPOCH_CHECK       mutant: the ledger does not compare the attempt's epoch with the instance's
 *   NO_FENCE_CHECK       mutant: the ledger does not refuse a fenced (non-live) instance
 *   STALE_RECOVERY_PLAN  mutant: the recovery plans (reads the cursor, picks the target) BEFORE it
 *                        stops the pipeline and records its gaps from that plan
 *   ABORT_REOPENS        mutant: an abort after green committed reopens blue's lease closed at H
 *                        instead of opening blue a new lease [X, ...)
 *   ABORT_DELETES_GREEN  mutant (D2): an abort after the handoff in which green committed nothing
 *                        deletes green's lease and reopens blue's (the code before DESIGN-29 D2): green,
 *                        whose tasks may have written [H, ...) in the sink, is nobody's predecessor
 *   NO_READ_CAP          mutant: the source guard does not cap blue at H while its closed lease
 *                        [cursor, H) is undrained and its next lease starts at X > H (read_cap)
 *   NO_PLANNED_END       mutant: the handoff ignores blue's recorded planned end (issue #12)
 *   PLAN_RECORD_AFTER    mutant: the source records its planned end in a transaction after the one
 *                        that read the guard
 *   NO_REGROUP           mutant (D1): a batch's rows of the source partition are split over two tasks
 *                        (a shuffle in the transform) and the driver does not regroup them
 *   SKIP_BELOW_MARKER    mutant (D1): the Kafka marker of the code before DESIGN-29: one `end` (every
 *                        offset below it counts as written), a second task of the same attempt and batch
 *                        refused, take-over raises `end` to the predecessor's; and no regroup
 *   TAKE_OVER_RAISES_END mutant (D1): the old marker (one `end`) with the regroup: take-over raises the
 *                        taker's end to its predecessor's, over the taker's own undrained range
 *   NO_TAKE_OVER         mutant: the driver neither fences its predecessors in the sink nor merges
 *                        their written offsets before its tasks write their range
 *   PRED_END_ONLY        mutant (the finding RECOVERY_SKIP_DUP, fixed): a predecessor's lease must end
 *                        exactly where this one starts, not at the start of a chain of gaps leading to
 *                        it: a recovery past the cursor leaves the new lease without predecessor
 *   KNOWN_SKIP_DUP       do not flag a duplicate at or past the target of a recovery that skipped
 *                        past the cursor (narrate it): only for PRED_END_ONLY's history
 *   RETRY                Spark may run a task again after it committed (a retry, or a speculative
 *                        copy: the same rows, the same epoch and batch)
 *   STATEFUL             a stateful pipeline (relay.stateful): green's standby attempts read in shadow
 *                        from the warm-up start W, record their planned ends under green's row lock,
 *                        apply nothing; green is READY after its first shadow batch; the handoff takes
 *                        H at or above green's planned end too. D3: every instance whose query starts
 *                        on an empty checkpoint warms up from W (Kafka's earliest: one window holds
 *                        every offset) up to its lowest cursor S with writes suppressed, no batch
 *                        spanning S. The sink is the window row, newest writer position wins
 *   STATEFUL_NO_WARM_UP  mutant (STATEFUL, D3): an instance that is not an upgrade's standby starts on
 *                        an empty checkpoint with an empty state at its lowest cursor
 *   HEAL                 one attempt of blue finds its checkpoint lost (empty) and starts afresh: a heal
 *                        that finds an empty checkpoint (same instance, same generation)
 *   POS_NO_EPOCH         mutant (with HEAL; the finding HEAL_SAME_GENERATION, fixed): a window row's
 *                        position is (generation, batch id), not (generation, epoch, batch id)
 *   NO_GREEN_PLANNED     mutant (STATEFUL): the handoff ignores green's planned end
 *   SHADOW_FLOOR         mutant (STATEFUL): the lease floor still cuts a stateful green's read
 *   STATEFUL_REOPENS     mutant (STATEFUL): an abort after a handoff in which green applied nothing
 *                        reopens blue's lease instead of opening a new one
 *   DELETE_BEFORE_OPEN   mutant (STATEFUL): the abort deletes green's unapplied lease BEFORE it opens
 *                        blue's new one (SQLite gives the new lease the deleted lease's id again)
 *   HANDOFF_LATEST       H is Kafka's latest offset, read by the handoff BEFORE it locks blue's row,
 *                        raised to the planned ends; default: an explicit H, refused below them
 *   FAILOVER             a hot standby instead of the upgrade (GREEN plays it): created STANDBY
 *                        without a lease and launched; at any moment (the detection is not modelled:
 *                        every false alarm is covered) ONE transaction locks blue's row and green's,
 *                        refuses unless blue is ACTIVE/STARTING and green STANDBY, fences blue, closes
 *                        blue's lease at its cursor read there, opens green's [cursor, ...), green
 *                        STARTING (protocol.failover.fail_over). Stateless pipelines only
 *   FAILOVER_NO_FENCE    mutant (FAILOVER): the failover does not fence blue (it stays live: not
 *                        the standby's predecessor)
 *   FAILOVER_STALE_CURSOR mutant (FAILOVER): the failover reads blue's cursor in an earlier step,
 *                        without blue's row lock, and closes blue's lease there without a
 *                        compare-and-set
 *   PROGRESS             also assert invariants 6 and 7 (below) under ONLY=0
 *   ONLY=k               assert only invariant k (1..14, below); 0 (default) asserts 1..5 and 11..14
 *                        (those of the sink modelled), 6 and 7 with PROGRESS, 8..10 with STATEFUL
 *   N, RET, MAXB         offsets in the partition; how many of them retention may delete; the most
 *                        offsets a batch reads (maxOffsetsPerTrigger: 2 or 3)
 *   BLUE_ATTEMPTS, GREEN_ATTEMPTS, REC_ATTEMPTS   attempts the supervision may start per instance
 *   NO_UPGRADE, NO_RECOVERY                       leave that operation out (FAILOVER: no upgrade)
 *   REC_AT_CURSOR        the recovery's target is the cursor (strategy earliest, nothing deleted past
 *                        it): a stop + deploy (a redeploy); default: any target at or past it
 *   ATOMIC_COMMIT        the commit transaction as one step (default: two, with a crash between)
 *   NO_CRASHES           no explicit crash branches
 */

#ifndef N
#define N 4
#endif
#ifndef RET
#define RET 1
#endif
#ifndef ONLY
#define ONLY 0
#endif
#ifndef BLUE_ATTEMPTS
#define BLUE_ATTEMPTS 2
#endif
#ifndef GREEN_ATTEMPTS
#define GREEN_ATTEMPTS 2
#endif
#ifndef REC_ATTEMPTS
#define REC_ATTEMPTS 1
#endif
#ifndef MAXB
#define MAXB 2
#endif
#if defined(FAILOVER) && defined(STATEFUL)
#error "a stateful pipeline refuses a hot standby (pipeline_driver: its shadow reads pass the cursors)"
#endif
#if (defined(FAILOVER_NO_FENCE) || defined(FAILOVER_STALE_CURSOR)) && !defined(FAILOVER)
#error "the FAILOVER_* mutants need -DFAILOVER"
#endif
#if defined(NO_REGROUP) || defined(SKIP_BELOW_MARKER)
#define SPLIT 1     /* a source partition's rows of a batch reach two tasks */
#endif
#if defined(SKIP_BELOW_MARKER) || defined(TAKE_OVER_RAISES_END)
#define OLD_MARKER 1  /* the Kafka marker before DESIGN-29 D1: one `end` */
#endif

#define OPEN 15     /* a lease's end while it is open ("end_offset IS NULL"); any value > N */
#define NL 4        /* lease rows: 0 = blue's, 1 = green's (handoff), 2 = the recovered instance's,
                     * 3 = blue's continuation after an abort that followed the handoff */
#define NI 3        /* instances; instance x's first lease is row x, blue's second is row BCONT */
#define BLUE 0
#define GREEN 1
#define REC 2
#define BCONT 3

/* instance states (relay.ledger.models.InstanceState); 0 = not created yet */
#define STARTING 1
#define ACTIVE 2
#define DRAINING 3
#define STOPPED 4
#define FAILED 5
#define FENCED 6
#define STANDBY 7   /* green before the handoff: no lease, its source holds (READY is the same here) */
#define LIVE(x) (ist[x] == STARTING || ist[x] == ACTIVE || ist[x] == DRAINING || ist[x] == STANDBY)
/* green's attempts read in shadow while it is a standby (a stateful pipeline only) */
#ifdef STATEFUL
#define SHADOW(x) (x == GREEN && ist[GREEN] == STANDBY)
#else
#define SHADOW(x) false
#endif

/* the source guard's floor (the lowest start of the instance's leases: nothing below is its to read;
 * lease starts never move, and row x starts lowest) and where a batch from position p really starts.
 * A stateful pipeline's source drops the floors (kafka_source._shadowed): it reads on from where it
 * is, so its state holds every record since its start; the leases alone decide what it applies. */
#define FLOOR(x) (l_valid[x] -> l_start[x] : 0)
#if defined(STATEFUL) && !defined(SHADOW_FLOOR)
#define FROM(x, p) (p)
#else
#define FROM(x, p) (FLOOR(x) > p -> FLOOR(x) : p)
#endif

/* sets of offsets (N <= 7) as bit masks: [a, b), and everything below b */
#define RANGE(a, b) ((1 << (b)) - (1 << (a)))
#define BELOW(b) ((1 << (b)) - 1)
#define HAS(m, o) (((m) >> (o)) & 1)

/* the instance's Spark checkpoint: empty, offsets/N written (planned), commits/N written (done) */
#define CK_EMPTY 0
#define CK_PLANNED 1
#define CK_DONE 2

/* the operations table: at most one upgrade or recovery in progress per pipeline */
#define OP_NONE 0
#define OP_UPGRADE 1
#define OP_RECOVERY 2

/* a process may die between any two of its steps: an extra branch at each step (-DNO_CRASHES drops
 * them); CRASH_SAY, defined before each proctype, narrates it in a counterexample */
#ifdef NO_CRASHES
#define CRASH(lbl)
#else
#define CRASH(lbl) :: atomic { CRASH_SAY; goto lbl }
#endif

#ifdef NO_EPOCH_CHECK
#define EPOCH_OK(x, ep) true
#else
#define EPOCH_OK(x, ep) (cur_epoch[x] == ep)
#endif
#ifdef NO_FENCE_CHECK
#define FENCE_OK(x) true
#else
#define FENCE_OK(x) LIVE(x)
#endif

/* predecessors.lease_predecessors: another instance's lease that ENDS where this one starts (D2), or
 * where a chain of gaps leading to its start begins (a recovery past the cursor closes the old lease
 * at c, declares [c, t) lost and opens the new one at t: the fix of the finding RECOVERY_SKIP_DUP).
 * Every offset of [end, start) a gap; N is at most 4. PRED_END_ONLY: the rule before that fix. */
#define GAP_AT(k, a, b) (k < a || k >= b || gap[k])
#if N > 3
#define GAPS_COVER(a, b) (GAP_AT(0, a, b) && GAP_AT(1, a, b) && GAP_AT(2, a, b) && GAP_AT(3, a, b))
#else
#define GAPS_COVER(a, b) (GAP_AT(0, a, b) && GAP_AT(1, a, b) && GAP_AT(2, a, b))
#endif
#ifdef PRED_END_ONLY
#define PRED_END(q, r) (l_end[q] == l_start[r])
#else
#define PRED_END(q, r) (l_end[q] != OPEN && l_end[q] <= l_start[r] && GAPS_COVER(l_end[q], l_start[r]))
#endif

/* ------------------------------------------------------------------ the ledger (shared state) */
byte ist[NI];           /* instance state */
byte cur_epoch[NI];     /* instances.current_epoch */
byte lockh[NI];         /* holder of the instance row lock (SELECT ... FOR UPDATE): 0 = free, else _pid+1 */
bit  l_valid[NL];       /* the lease row exists */
byte l_inst[NL];
byte l_start[NL];
byte l_end[NL];         /* OPEN while open */
byte l_cur[NL];         /* next_offset: the cursor */
byte op;                /* the operation in progress, if any */
byte planned_b;         /* instances.planned_ends of blue: the highest end its source planned, recorded
                         * under blue's row lock before Spark runs the batch */
byte planned_g;         /* ... and of green while it is a standby (only a stateful green plans then) */
#ifdef STATEFUL
bit  g_ready;           /* green READY: set by its first shadow batch (mark_ready, from STANDBY only) */
byte l_id[NL];          /* the lease row's id: max(id) + 1 at insert (SQLite's rowid without
                         * AUTOINCREMENT, so a deleted highest id is taken again); the writer
                         * generation of an instance is the highest id among its leases */
#endif

/* ------------------------------------------------------------------ the sink */
byte mk_ep[NI];         /* the instance's fence epoch in the sink (Kafka: its range marker and instance
                         * record; PostgreSQL: its fence row): fence_epoch raises it */
bit  mk_fen[NI];        /* fenced for good in the sink (take_over of a predecessor) */
#ifndef STATEFUL
byte mk_w[NI];          /* D1: the marker's `written` intervals: the source offsets committed
                         * transactions of the instance wrote (a bit mask); SKIP_BELOW_MARKER: BELOW(end) */
byte cnt[N];            /* the output topic read read_committed: records per source offset (0..2) */
#ifdef OLD_MARKER
byte mk_rep[NI];        /* the old marker's range_epoch: the epoch of the task that wrote it last */
#endif
#else
byte wv;                /* the window row (one window holds every offset, one group key): its value */
byte wg;                /* ... and its position: the writer's generation (0: no row yet) ... */
byte wb;                /* ... and batch id (newest wins: (generation, batch id) compared in order) */
byte ck_w[NI];          /* where the checkpoint's state starts (W): it holds every record of [W, position) */
#ifdef HEAL
byte ck_n[NI];          /* the checkpoint's batch id (offsets/N: the in-flight or the last batch) */
#ifdef POS_NO_EPOCH
#define BATCH_ID bn     /* a heal empties the checkpoint: batch ids start again at 0 */
#else
#define BATCH_ID (ep * 8 + bn)   /* stateful.state_position: (generation, epoch, batch id) */
#endif
#define STATE_W aw      /* ... and so does the state: an attempt keeps the W of its checkpoint */
#else
/* One checkpoint per instance: within it batch ids grow with the batch's end offset, and W is the
 * checkpoint's. So the batch id is represented by the end offset (fewer states, the same order). */
#define BATCH_ID e
#define STATE_W ck_w[i]
#endif
#endif

/* ------------------------------------------------------------------ outside the ledger */
byte ck[NI];            /* each instance's checkpoint (shared by all its attempts) */
byte ck_s[NI];
byte ck_e[NI];
byte earliest;          /* Kafka's earliest offset (retention moves it up) */
#ifdef HANDOFF_LATEST
byte latest;            /* Kafka's latest offset as far as it matters: the highest end planned so far */
#endif
bit  launched[NI];      /* submitted: the cluster's supervision may start attempts */
byte budget[NI];        /* attempts the supervision may still start (bounds the model) */
byte cap[NI];           /* derived from the leases and cursors: where the source guard stops reading
                         * (0 = hold: a standby without a lease plans nothing) */
#ifdef HEAL
bit  healed;            /* blue's checkpoint was lost once (a heal finds it empty) */
#endif

/* ------------------------------------------------------------------ ghosts, for the invariants */
byte applied[N];        /* how many times each offset was applied in the LEDGER (a cursor moved over it
                         * inside a lease) */
bit  gap[N];            /* declared lost or skipped (a gap record) */
byte ghostH = OPEN;     /* the handoff offset H (OPEN: no handoff yet); FAILOVER: the cursor at which
                         * the failover closed blue's lease and opened green's */
byte ghostX = OPEN;     /* green's range is [ghostH, ghostX): OPEN while the handoff is in force; after
                         * an abort, X (green applied [H, X)) or H (green applied nothing); FAILOVER:
                         * OPEN for good (blue never gets a lease again) */
byte blue_reach;        /* 1 + the highest offset blue applied (0: none) */
bit  rec_skip;          /* the recovery's target was past the cursor (KNOWN_SKIP_DUP) */
#ifdef STATEFUL
byte g_shadow;          /* the highest end of a batch green ran in shadow (read, applied nothing) */
#endif

/* one bit per invariant; each goes to 0 when its invariant is violated, and is asserted */
bit no_double_apply = 1;        /* 1: no offset applied twice (in the ledger) */
bit no_skip_without_gap = 1;    /* 2: every offset is applied, in a gap, or still ahead of a cursor */
bit single_writer = 1;          /* 3: only the attempt holding its live instance's current epoch commits */
bit blue_outside_green = 1;     /* 4: blue never applies an offset of green's range [H, X) */
bit gap_only_unapplied = 1;     /* 5: a gap never covers an applied offset */
bit no_stranded_offset = 1;     /* 6: no live instance's read position passes an offset its own
                                 *    unfinished lease still has to apply (it could never read it) */
bit one_task_range = 1;         /* 7: the offsets a batch may apply form one range (prepare_tasks'
                                 *    _task_ranges refuses the batch otherwise, for ever) */
bit shadow_below_H = 1;         /* 8 (STATEFUL): green never read, in a shadow batch, an offset at or
                                 *    past H: applied by nobody */
bit green_reads_from_W = 1;     /* 9 (STATEFUL): every batch green plans starts at its position */
bit blue_newer_writer = 1;      /* 10 (STATEFUL): after an abort that followed the handoff, blue's
                                 *    writer generation is above green's */
bit sink_no_duplicate = 1;      /* 11 (Kafka): no source offset has output from two committed
                                 *    transactions */
bit sink_holds_applied = 1;     /* 12 (Kafka): every offset applied in the ledger has its output in the
                                 *    sink (when the cursor moves over it, and at quiescence exactly once) */
bit window_complete = 1;        /* 13 (STATEFUL): a window value that wins in the sink is never below
                                 *    the records a complete state holds at its batch's end */
bit window_current = 1;         /* 14 (STATEFUL): once a cursor moved to e, the stored window value
                                 *    counts every record below e that Kafka holds */

/* scratch for loops inside atomic steps (always reset to 0 after use) */
byte ho;
byte hl;
byte hx;
byte hf;
byte hg;
byte hm;

#if ONLY == 0 || ONLY == 1
#define CHECK1 assert(no_double_apply)
#else
#define CHECK1 skip
#endif
#if ONLY == 0 || ONLY == 2
#define CHECK2 assert(no_skip_without_gap)
#else
#define CHECK2 skip
#endif
#if ONLY == 0 || ONLY == 3
#define CHECK3 assert(single_writer)
#else
#define CHECK3 skip
#endif
#if ONLY == 0 || ONLY == 4
#define CHECK4 assert(blue_outside_green)
#else
#define CHECK4 skip
#endif
#if ONLY == 0 || ONLY == 5
#define CHECK5 assert(gap_only_unapplied)
#else
#define CHECK5 skip
#endif
/* 6 and 7 are computed only when asserted (their ghost bits would split states for nothing) */
#if ONLY == 6 || (ONLY == 0 && defined(PROGRESS))
#define CHECK6 assert(no_stranded_offset)
#define WATCH6 1
#else
#define CHECK6 skip
#define WATCH6 0
#endif
#if ONLY == 7 || (ONLY == 0 && defined(PROGRESS))
#define CHECK7 assert(one_task_range)
#define WATCH7 1
#else
#define CHECK7 skip
#define WATCH7 0
#endif
/* 8..10 and 13, 14 exist only in the stateful model (their ghosts too); 11 and 12 only without it */
#if defined(STATEFUL) && (ONLY == 0 || ONLY == 8)
#define CHECK8 assert(shadow_below_H)
#else
#define CHECK8 skip
#endif
#if defined(STATEFUL) && (ONLY == 0 || ONLY == 9)
#define CHECK9 assert(green_reads_from_W)
#else
#define CHECK9 skip
#endif
#if defined(STATEFUL) && (ONLY == 0 || ONLY == 10)
#define CHECK10 assert(blue_newer_writer)
#else
#define CHECK10 skip
#endif
#if !defined(STATEFUL) && (ONLY == 0 || ONLY == 11)
#define CHECK11 assert(sink_no_duplicate)
#else
#define CHECK11 skip
#endif
#if !defined(STATEFUL) && (ONLY == 0 || ONLY == 12)
#define CHECK12 assert(sink_holds_applied)
#else
#define CHECK12 skip
#endif
#if defined(STATEFUL) && (ONLY == 0 || ONLY == 13)
#define CHECK13 assert(window_complete)
#else
#define CHECK13 skip
#endif
#if defined(STATEFUL) && (ONLY == 0 || ONLY == 14)
#define CHECK14 assert(window_current)
#else
#define CHECK14 skip
#endif

inline say(x) {
  if
  :: x == BLUE -> printf("blue")
  :: x == GREEN -> printf("green")
  :: else -> printf("recovered")
  fi
}

inline say_end(x) {
  if
  :: x == OPEN -> printf("open")
  :: else -> printf("%d", x)
  fi
}

/* a set of offsets, as its members: {0,2} */
inline say_set(m) {
  printf("{");
  hf = 0;
  for (ho : 0 .. N - 1) {
    if
    :: HAS(m, ho) -> if :: hf -> printf(",") :: else -> skip fi; printf("%d", ho); hf = 1
    :: else -> skip
    fi
  }
  printf("}");
  ho = 0; hf = 0
}

/* a Kafka marker's progress: the written offsets (D1), or the old marker's one `end` */
inline say_marker(m) {
#ifdef OLD_MARKER
  hg = 0;
  for (ho : 0 .. N - 1) { if :: HAS(m, ho) -> hg = ho + 1 :: else -> skip fi }
  ho = 0;
  printf("end %d", hg);
  hg = 0
#else
  say_set(m)
#endif
}

/* Every offset is applied, declared a gap, or still owned by a lease at or after its cursor. */
inline check_accounted() {
  for (ho : 0 .. N - 1) {
    if
    :: applied[ho] == 0 && !gap[ho] ->
      hf = 0;
      for (hl : 0 .. NL - 1) {
        if
        :: l_valid[hl] && l_start[hl] <= ho && ho < l_end[hl] && ho >= l_cur[hl] -> hf = 1
        :: else -> skip
        fi
      }
      if
      :: !hf ->
        printf("@@ VIOLATION no_skip_without_gap: offset %d is neither applied, nor a gap, nor owned\n", ho);
        no_skip_without_gap = 0
      :: else -> skip
      fi
    :: else -> skip
    fi
  }
  ho = 0; hl = 0; hf = 0
}

/* A live instance reads on from its checkpoint's position (the next batch starts where the last one
 * ended; an in-flight batch is replayed from its start) and never goes back: an offset its own
 * unfinished lease has yet to apply (at or after the cursor) but that lies below that position can
 * never be read by it (each later batch starts past the cursor: SourceGapError, for ever). */
inline check_stranded() {
#if WATCH6
  for (hx : 0 .. NI - 1) {
    if
    :: LIVE(hx) && ck[hx] != CK_EMPTY ->
      hg = (ck[hx] == CK_DONE -> ck_e[hx] : ck_s[hx]);
      for (hl : 0 .. NL - 1) {
        if
        :: l_valid[hl] && l_inst[hl] == hx && l_cur[hl] < l_end[hl] && l_cur[hl] < hg ->
          printf("@@ VIOLATION no_stranded_offset: "); say(hx);
          printf(" reads on from %d, its lease %d still has to apply %d\n", hg, hl, l_cur[hl]);
          no_stranded_offset = 0
        :: else -> skip
        fi
      }
    :: else -> skip
    fi
  }
  hx = 0; hl = 0; hg = 0
#else
  skip
#endif
}

inline check_all() {
  check_accounted();
  check_stranded();
  CHECK1; CHECK2; CHECK3; CHECK4; CHECK5; CHECK6; CHECK7; CHECK8; CHECK9; CHECK10;
  CHECK11; CHECK12; CHECK13; CHECK14
}

/* What the source guard lets each instance read up to (relay.source_guard.read_cap; never past
 * Kafka's end N): a standby without leases holds (0); no lease otherwise, or an open one: uncapped,
 * unless a closed, undrained lease is followed by a later lease that starts past its end (blue after
 * an abort that green committed before: [cursor, H) then [X, ...)): that end; all leases closed:
 * the highest end. Depends on the cursors: recomputed after every commit too. */
inline recompute_caps() {
  for (hx : 0 .. NI - 1) {
    hf = 0; hg = 0; ho = 0;
    for (hl : 0 .. NL - 1) {
      if
      :: l_valid[hl] && l_inst[hl] == hx ->
        hg = 1;
        if
        :: l_end[hl] == OPEN -> hf = 1
        :: else -> ho = (l_end[hl] > ho -> l_end[hl] : ho)
        fi
      :: else -> skip
      fi
    }
    if
#ifdef STATEFUL
    :: !hg -> cap[hx] = N   /* a stateful standby reads in shadow: no hold (kafka_source._shadowed) */
#else
    :: !hg -> cap[hx] = (ist[hx] == STANDBY -> 0 : N)
#endif
    :: hg && !hf -> cap[hx] = (ho < N -> ho : N)
    :: hg && hf ->
      cap[hx] = N;
#ifndef NO_READ_CAP
      if
      :: hx == BLUE && l_valid[0] && l_valid[BCONT] && l_end[0] != OPEN && l_cur[0] < l_end[0] &&
         l_start[BCONT] > l_end[0] -> cap[hx] = l_end[0]
      :: else -> skip
      fi
#endif
    fi
  }
  hx = 0; hl = 0; ho = 0; hf = 0; hg = 0
}

/* The commit transaction moves a cursor over offset o: o is applied in the LEDGER. The output of a
 * Kafka sink must be in the sink by then (the tasks wrote before the driver commits). */
inline apply(x, o) {
  if
  :: applied[o] > 0 ->
    printf("@@ VIOLATION no_double_apply: offset %d applied again in the ledger, by ", o); say(x); printf("\n");
    no_double_apply = 0
  :: else -> skip
  fi;
  if
  :: gap[o] ->
    printf("@@ VIOLATION gap_only_unapplied: offset %d is a gap and is applied\n", o);
    gap_only_unapplied = 0
  :: else -> skip
  fi;
  if
  :: x == BLUE && o >= ghostH && o < ghostX ->
    printf("@@ VIOLATION blue_outside_green: blue applies offset %d of green's range [%d,", o, ghostH);
    say_end(ghostX); printf(")\n");
    blue_outside_green = 0
  :: else -> skip
  fi;
#ifndef STATEFUL
  if
  :: cnt[o] == 0 ->
    printf("@@ VIOLATION sink_holds_applied: offset %d is applied in the ledger (cursor moved over it) but has no output in the sink\n", o);
    sink_holds_applied = 0
  :: else -> skip
  fi;
#endif
  if
  :: applied[o] < 2 -> applied[o]++
  :: else -> skip
  fi;
  if
  :: x == BLUE && o + 1 > blue_reach -> blue_reach = o + 1
  :: else -> skip
  fi
}

#ifndef STATEFUL
/* A committed Kafka transaction of instance x holds the output record of source offset o. */
inline sink_write(x, o) {
  printf("@@     output of offset %d written\n", o);
  if
  :: cnt[o] > 0 ->
#ifdef KNOWN_SKIP_DUP
    if
    :: rec_skip && l_valid[2] && o >= l_start[2] ->
      printf("@@ KNOWN DEFECT RECOVERY_SKIP_DUP: offset %d written again, past the skipping recovery's target\n", o)
    :: else ->
#endif
      printf("@@ VIOLATION sink_no_duplicate: offset %d has output from two committed transactions (the second by ", o);
      say(x); printf(")\n");
      sink_no_duplicate = 0
#ifdef KNOWN_SKIP_DUP
    fi
#endif
  :: else -> skip
  fi;
  if
  :: cnt[o] < 2 -> cnt[o]++
  :: else -> skip
  fi
}
#endif

/* The id of a lease row inserted now: one above the highest id of the rows that exist (SQLite's
 * rowid: a deleted highest id is taken again). Only the stateful model keeps ids (the generation). */
#ifdef STATEFUL
inline new_id(row) {
  hg = 0;
  for (hl : 0 .. NL - 1) {
    if
    :: l_valid[hl] && hl != row && l_id[hl] > hg -> hg = l_id[hl]
    :: else -> skip
    fi
  }
  l_id[row] = hg + 1;
  hl = 0; hg = 0
}
#define NEW_ID(row) new_id(row)
#else
#define NEW_ID(row) skip
#endif

inline record_gap(o) {
  if
  :: applied[o] > 0 ->
    printf("@@ VIOLATION gap_only_unapplied: a gap is recorded over applied offset %d\n", o);
    gap_only_unapplied = 0
  :: else -> skip
  fi;
  gap[o] = 1
}

/* ------------------------------------------------------------------ the tasks' sink transactions */
#ifndef STATEFUL
/* One Kafka transaction of a task of instance i holding rows R (a set of source offsets) of the
 * source partition, whose batch range is [rf, rl) (KafkaTransactionalSink._write_group, kafka_markers).
 * The transactional id of (instance, source partition) serialises every transaction of it and the
 * driver's fences (init_transactions fences an older producer), so the read of the marker, the fence
 * check, the rows and the new marker are one atomic step. */
inline kafka_task(R) {
  if
  :: mk_fen[i] || mk_ep[i] > ep ->
    printf("@@ "); say(i); printf(" e%d's task is refused by the sink (fenced %d, epoch %d there): a zombie\n",
           ep, mk_fen[i], mk_ep[i]);
    goto gone
  :: else -> skip
  fi;
#ifdef OLD_MARKER
  /* the old marker: one `end`; everything below it counts as written */
  hg = 0;
  for (o : 0 .. N - 1) { if :: HAS(mk_w[i], o) -> hg = o + 1 :: else -> skip fi }
  hm = (R) & ~BELOW(hg);
#else
  /* D1: send the rows of [rf, rl) outside every written interval */
  hm = (R) & ~mk_w[i];
#endif
  printf("@@ "); say(i); printf(" e%d's task holds rows ", ep); say_set(R);
  printf(" of [%d,%d); its marker has ", rf, rl); say_marker(mk_w[i]); printf("; it sends "); say_set(hm);
  printf("\n");
  for (o : 0 .. N - 1) {
    if
    :: HAS(hm, o) -> sink_write(i, o)
    :: else -> skip
    fi
  }
  o = 0;
  if
  :: hm != 0 ->
#ifdef OLD_MARKER
    mk_w[i] = BELOW(hg > rl -> hg : rl);
    mk_rep[i] = ep;
#else
    mk_w[i] = mk_w[i] | RANGE(rf, rl);   /* the batch range merged into `written` */
#endif
    mk_ep[i] = ep
  :: else -> skip   /* nothing to send: no transaction */
  fi;
  hm = 0; hg = 0
}
#else
/* a window row's position: (generation, batch id); without HEAL the batch is named by its end offset,
 * which orders an instance's batches as their ids do */
inline say_pos(g, b) {
#ifdef HEAL
  printf("(generation %d, batch #%d)", g, b)
#else
  printf("(generation %d, batch to %d)", g, b)
#endif
}

/* One PostgreSQL transaction of the task holding the window row (PostgresUpsertSink): the fence row
 * FOR SHARE (this exact epoch, not fenced), then the upsert whose position (generation, batch id)
 * must be newer than the stored one. A batch with no range writes nothing (state_ranges). */
inline pg_task() {
  if
  :: mk_fen[i] || mk_ep[i] != ep ->
    printf("@@ "); say(i); printf(" e%d's task is refused by the fence row (fenced %d, epoch %d): a zombie\n",
           ep, mk_fen[i], mk_ep[i]);
    goto gone
  :: else -> skip
  fi;
  if
  :: rf < rl ->
    /* relay.stateful.generation: the highest id among the instance's leases (read by the driver
     * after prepare_tasks, before the tasks: here, right before the task) */
    hm = 0;
    for (hl : 0 .. NL - 1) {
      if :: l_valid[hl] && l_inst[hl] == i && l_id[hl] > hm -> hm = l_id[hl] :: else -> skip fi
    }
    hl = 0;
    hg = e - STATE_W;   /* the state holds every record of [W, e): the window's count */
    if
    :: hm > wg || (hm == wg && BATCH_ID > wb) ->
      printf("@@ "); say(i); printf(" e%d's task writes the window: %d (state from %d to %d) at ", ep, hg, STATE_W, e);
      say_pos(hm, BATCH_ID); printf(" over %d at ", wv); say_pos(wg, wb); printf("\n");
      wv = hg; wg = hm; wb = BATCH_ID;
      if
      :: wv + earliest < e ->
        printf("@@ VIOLATION window_complete: the window holds %d records below %d that Kafka has, the newest writer wrote %d\n",
               e - earliest, e, wv);
        window_complete = 0
      :: else -> skip
      fi
    :: else ->
      printf("@@ "); say(i); printf(" e%d's task: its window value %d at ", ep, hg); say_pos(hm, BATCH_ID);
      printf(" loses to the stored %d at ", wv); say_pos(wg, wb); printf(": unchanged\n")
    fi;
    hg = 0; hm = 0
  :: else -> skip
  fi
}
#endif

/* ------------------------------------------------------------------ an attempt (one driver process) */
#define CRASH_SAY printf("@@ "); say(i); printf(" e%d crashes\n", ep)
#ifdef STATEFUL
#define WCAP(k) (s >= ws || s + k <= ws)   /* D3: no batch spans S */
#else
#define WCAP(k) true
#endif
proctype Attempt(byte i) {
  byte ep;              /* this attempt's epoch */
  byte s;               /* the batch being run: [s, e) */
  byte e;
  byte pos;             /* where the next batch starts */
  byte o;
  byte t;
  byte t3;
  bit ok;
  bit rp;               /* the attempt replays the checkpoint's in-flight batch */
  bit rv;               /* the instance's leases as the commit transaction read them: row i ... */
  byte rc;
  byte re;
  bit rv3;              /* ... and, for blue, its continuation (row BCONT) */
  byte rc3;
  byte re3;
  byte rf;              /* the task range [rf, rl) prepare_tasks computed (rf == rl: nothing to apply) */
  byte rl;
  byte pr;              /* the predecessors of the leases the batch writes, not yet taken over */
  byte tk;              /* the predecessors this driver took over (take_over_once's `done`) */
  byte rw;              /* the rows a task holds (source offsets of the partition) */
#ifdef RETRY
  bit rt;               /* Spark retried the task of this batch (once) */
#endif
#ifdef SPLIT
  byte m;               /* the rows of the first of the two tasks (a shuffle split the partition) */
  bit t1;               /* the first task committed a transaction */
#endif
#ifdef STATEFUL
  byte ws = OPEN;       /* D3: S, the lowest cursor at an empty start: no batch spans it */
#ifdef HEAL
  byte bn;              /* the batch id */
  byte aw;              /* W: where the state of this attempt's checkpoint starts */
#endif
#endif

  /* Ledger.start_attempt: lock the instance row, refuse a non-live instance, take a new epoch.
   * Then the driver opens the checkpoint: an in-flight batch (offsets/N without commits/N) runs
   * again; an empty checkpoint starts at the lowest cursor of the instance's undrained leases
   * (driver_checks.starting_offsets), or at Kafka's earliest offset when it has none (a standby);
   * stateful (D3): at W, its state rebuilt by the warm-up replay. */
  atomic {
    lockh[i] == 0 ->
    if
    :: LIVE(i) -> cur_epoch[i]++; ep = cur_epoch[i]
    :: else -> goto gone
    fi;
    printf("@@ "); say(i); printf(" attempt e%d starts\n", ep);
#ifdef HEAL
    if
    :: i == BLUE && !healed && ck[i] != CK_EMPTY ->
      healed = 1; ck[i] = CK_EMPTY; ck_s[i] = 0; ck_e[i] = 0;
#ifdef STATEFUL
      ck_n[i] = 0;
#endif
      printf("@@ blue e%d finds its checkpoint lost (empty): the heal relaunched the same instance\n", ep)
    :: true -> skip
    fi;
#endif
    if
    :: ck[i] == CK_PLANNED ->
      s = ck_s[i]; e = ck_e[i]; rp = 1;
#if defined(STATEFUL) && defined(HEAL)
      bn = ck_n[i];
#endif
      printf("@@ "); say(i); printf(" e%d replays the in-flight batch [%d,%d)\n", ep, s, e)
    :: ck[i] == CK_DONE -> pos = ck_e[i]
#ifdef STATEFUL
    :: ck[i] == CK_EMPTY && SHADOW(i) ->
      /* pipeline_driver._starting_offsets: a stateful standby starts warm_up_s back, at W (here
       * Kafka's earliest offset: one window holds every offset) */
      pos = earliest; ck_w[i] = pos;
      printf("@@ green e%d warms up from W=%d (shadow reading)\n", ep, pos)
#endif
    :: ck[i] == CK_EMPTY && !SHADOW(i) ->
      pos = OPEN;
      for (hl : 0 .. NL - 1) {
        if
        :: l_valid[hl] && l_inst[hl] == i && l_cur[hl] < l_end[hl] && l_cur[hl] < pos -> pos = l_cur[hl]
        :: else -> skip
        fi
      }
      hl = 0;
      if :: pos == OPEN -> pos = earliest :: else -> skip fi;
#ifdef STATEFUL
#ifdef STATEFUL_NO_WARM_UP
      ck_w[i] = pos;
      printf("@@ "); say(i); printf(" e%d starts at %d with an EMPTY state (no warm-up)\n", ep, pos)
#else
      /* D3: W = the warm-up start (never below Kafka's earliest, never above S); read [W, S) with
       * writes suppressed (outside the leases: empty task ranges); no batch spans S */
      ws = pos;
      ck_w[i] = (earliest < pos -> earliest : pos);
      pos = ck_w[i];
      printf("@@ "); say(i); printf(" e%d warms up from W=%d up to S=%d (writes suppressed below S)\n", ep, pos, ws)
#endif
#endif
    fi;
#if defined(STATEFUL) && defined(HEAL)
    aw = ck_w[i];
#endif
  }
  /* sink.fence_epoch before the first batch: the sink's epoch of the instance becomes this one
   * (refused: the sink knows a newer epoch, or the instance is fenced: a zombie) */
  if
  :: atomic {
      if
      :: mk_fen[i] || mk_ep[i] > ep ->
        printf("@@ "); say(i); printf(" e%d: fence_epoch refused by the sink (fenced %d, epoch %d): a zombie\n",
               ep, mk_fen[i], mk_ep[i]);
        goto gone
      :: else -> mk_ep[i] = ep
      fi;
      if :: rp -> rp = 0; goto batch :: else -> skip fi
    }
  CRASH(gone)
  fi;

plan:
  /* The source plans the next batch: nothing while the guard holds (a standby without a lease) or
   * the instance is not live; from its position, moved up to its lease floor (a warm standby's
   * position is far below H); within the guard's cap and maxOffsetsPerTrigger (1..MAXB here).
   * Spark writes it to offsets/N. (Idle for ever is the same, for everybody else, as a crash here.) */
end_idle:
  atomic {
#ifdef PLAN_RECORD_AFTER
    LIVE(i) && cap[i] > FROM(i, pos) ->
#else
    /* source_guard.plan_under_guard: ONE transaction holding the instance's row lock reads the
     * guard, plans and records the planned end */
    lockh[i] == 0 && LIVE(i) && cap[i] > FROM(i, pos) ->
#endif
    s = FROM(i, pos);
#ifdef STATEFUL
    /* green's state holds every record from W up to its position (the end of its last batch, the
     * checkpoint's or this attempt's): a batch must start there, or its state misses [pos, s) */
    if
    :: i == GREEN && s != pos ->
      printf("@@ VIOLATION green_reads_from_W: green e%d plans from %d, past its position %d: it never reads [%d,%d)\n",
             ep, s, pos, pos, s);
      green_reads_from_W = 0
    :: else -> skip
    fi;
    CHECK9;
#endif
    if
    :: e = s + 1
    :: s + 2 <= cap[i] && WCAP(2) -> e = s + 2
#if MAXB >= 3
    :: s + 3 <= cap[i] && WCAP(3) -> e = s + 3
#endif
    fi;
#ifdef PLAN_RECORD_AFTER
    printf("@@ "); say(i); printf(" e%d plans [%d,%d) (not recorded yet)\n", ep, s, e)
  }
  atomic {
    lockh[i] == 0 ->  /* the record, in a transaction of its own */
#endif
    if
    :: i == BLUE && e > planned_b -> planned_b = e
    :: SHADOW(i) && e > planned_g -> planned_g = e   /* green's own row, under green's row lock */
    :: else -> skip
    fi;
#if defined(STATEFUL) && defined(HEAL)
    bn = (ck[i] == CK_EMPTY -> 0 : ck_n[i] + 1);
    ck_n[i] = bn;
#endif
    ck[i] = CK_PLANNED; ck_s[i] = s; ck_e[i] = e;
#ifdef HANDOFF_LATEST
    if :: e > latest -> latest = e :: else -> skip fi;
#endif
#ifdef PLAN_RECORD_AFTER
    printf("@@ "); say(i); printf(" e%d records its planned end %d; Spark writes offsets/N\n", ep, e)
#else
    printf("@@ "); say(i); printf(" e%d plans [%d,%d)\n", ep, s, e)
#endif
  }

batch:
  if
#ifdef STATEFUL
  /* ... unless green is still a standby (driver_runtime._batch reads its state, without a lock, once
   * per batch until it has left STANDBY/READY): pipeline_driver.shadow_batch runs the tasks with no
   * range to apply (the records go into green's state, nothing is written), marks green READY
   * (STANDBY -> READY only) and commits nothing in the ledger; Spark then writes commits/N. */
  :: atomic {
      SHADOW(i) ->
      if
      :: s < earliest ->
        ist[i] = FAILED;
        printf("@@ green e%d: offset %d was deleted by retention: instance FAILED\n", ep, s);
        goto gone
      :: else -> skip
      fi;
      printf("@@ green e%d runs shadow batch [%d,%d): read into its state, nothing written or committed\n",
             ep, s, e);
      if :: e > g_shadow -> g_shadow = e :: else -> skip fi;
      g_ready = 1
    }
    goto written
#endif
  /* protocol.prepare_tasks: ONE ledger transaction: lock the row and refuse a zombie (stale epoch or
   * non-live instance); per lease, the span from its cursor to the planned end capped at the lease's
   * end; the task range is their union, which must be one range (_task_ranges: SourceGapError
   * otherwise); the predecessors of each lease the batch writes whose cursor is at its start
   * (relay.predecessors: the non-live instances whose lease ends where it starts). */
  :: atomic {
      lockh[i] == 0 && !SHADOW(i) ->
      if
      :: !FENCE_OK(i) || !EPOCH_OK(i, ep) ->
        printf("@@ "); say(i); printf(" e%d is a zombie (refused by prepare_tasks)\n", ep);
        goto gone
      :: else -> skip
      fi;
      rf = OPEN; rl = 0; hm = 0; pr = 0;
      for (hl : 0 .. NL - 1) {
        if
        :: l_valid[hl] && l_inst[hl] == i ->
          hg = (e < l_end[hl] -> e : l_end[hl]);
          if
          :: hg > l_cur[hl] ->
            if :: l_cur[hl] < rf -> rf = l_cur[hl] :: else -> skip fi;
            if :: hg > rl -> rl = hg :: else -> skip fi;
            hm = hm + hg - l_cur[hl];
            if
            :: l_cur[hl] == l_start[hl] ->
              for (hx : 0 .. NL - 1) {
                if
                :: l_valid[hx] && l_inst[hx] != i && PRED_END(hx, hl) && !LIVE(l_inst[hx]) ->
                  pr = pr | (1 << l_inst[hx])
                :: else -> skip
                fi
              }
            :: else -> skip
            fi
          :: else -> skip
          fi
        :: else -> skip
        fi
      }
      hl = 0; hx = 0; hg = 0;
      if :: rf == OPEN -> rf = 0 :: else -> skip fi;
      if
      :: rl - rf != hm ->
#if WATCH7
        printf("@@ VIOLATION one_task_range: "); say(i);
        printf(" e%d's batch [%d,%d) may apply offsets that are not one range within [%d,%d)\n", ep, s, e, rf, rl);
        one_task_range = 0;
        CHECK7;
#endif
        printf("@@ "); say(i); printf(" e%d: SourceGapError (not one task range): the attempt ends\n", ep);
        goto gone
      :: else -> skip
      fi;
      hm = 0;
      pr = pr & ~tk;
      printf("@@ "); say(i); printf(" e%d prepares batch [%d,%d): task range [%d,%d)", ep, s, e, rf, rl);
      for (hx : 0 .. NI - 1) {
        if :: HAS(pr, hx) -> printf(", predecessor "); say(hx) :: else -> skip fi
      }
      hx = 0;
      printf("\n")
    }
  CRASH(gone)
  fi;

  /* _take_over (take_over_once): before its tasks write, the driver fences each predecessor for good
   * in the sink (kafka_fencing.fence: its zombie tasks can commit nothing more) and merges its final
   * written offsets into its own marker (D1; PostgreSQL: the fence only, newest wins does the rest). */
  if
  :: pr != 0 ->
    if
    :: atomic {
#ifndef STATEFUL
        if
        :: mk_fen[i] || mk_ep[i] > ep ->
          printf("@@ "); say(i); printf(" e%d may not take over (fenced, or a newer epoch in the sink): a zombie\n", ep);
          goto gone
        :: else -> skip
        fi;
#endif
        for (hx : 0 .. NI - 1) {
          if
          :: HAS(pr, hx) ->
#ifdef NO_TAKE_OVER
            printf("@@ "); say(i); printf(" e%d does NOT take over from ", ep); say(hx); printf("\n")
#else
            mk_fen[hx] = 1;
            printf("@@ "); say(i); printf(" e%d takes over from ", ep); say(hx); printf(": fenced in the sink");
#ifndef STATEFUL
            printf(", its marker "); say_marker(mk_w[hx]);
#ifdef OLD_MARKER
            hg = 0;
            for (o : 0 .. N - 1) { if :: HAS(mk_w[hx] | mk_w[i], o) -> hg = o + 1 :: else -> skip fi }
            o = 0;
            mk_w[i] = BELOW(hg); hg = 0;
            printf(" raises its own to ")
#else
            mk_w[i] = mk_w[i] | mk_w[hx];
            printf(" merged into its own: ")
#endif
            say_marker(mk_w[i]);
#endif
            printf("\n")
#endif
          :: else -> skip
          fi
        }
        hx = 0;
        tk = tk | pr; pr = 0
      }
    CRASH(gone)
    fi
  :: else -> skip
  fi;

  /* The tasks (mapInArrow(partition_writer)): each reads its records (failOnDataLoss: a batch whose
   * start retention deleted fails, and the driver marks the instance FAILED, an UPDATE of its row)
   * and writes its rows through the sink in ONE sink transaction. D1: the driver regroups the
   * transformed rows by source partition, so one task holds every row of the range; Spark may run it
   * again (a retry, a speculative copy: the same rows). */
task:
  if
  :: atomic {
      s < earliest && lockh[i] == 0 ->
      ist[i] = FAILED;
      printf("@@ "); say(i); printf(" e%d: offset %d was deleted by retention: instance FAILED\n", ep, s);
      goto gone
    }
  :: atomic {
      s >= earliest ->
#ifdef STATEFUL
      pg_task();
#elif defined(SPLIT)
      /* a shuffle: the range's rows are split over two tasks; the first holds the rows m */
      if
      :: rf < rl ->
        m = 0;
        rw = (s > rf -> s : rf);
        for (o : rw .. rl - 1) {
          if
          :: m = m | (1 << o)
          :: skip
          fi
        }
        o = 0; rw = m;
        kafka_task(rw);
        rw = 0;
        t1 = 1
      :: else -> skip
      fi;
#else
      if
      :: rf < rl ->
        rw = (s > rf -> s : rf); rw = RANGE(rw, rl);
        kafka_task(rw);
        rw = 0
      :: else -> skip
      fi;
#endif
      check_all()
    }
  CRASH(gone)
  fi;
#ifdef SPLIT
  /* the second task: the other rows of the range */
  if
  :: atomic {
      rf < rl ->
      rw = (s > rf -> s : rf); hm = RANGE(rw, rl) & ~m; rw = 0;
      if
      :: hm == 0 -> skip   /* it holds no row of this partition: no group, no transaction */
#ifdef SKIP_BELOW_MARKER
      /* the old plan_group: a committed marker of the same epoch and batch covering the range,
       * other rows: "rows reached more than one task" (SinkError): the attempt fails */
      :: hm != 0 && t1 && mk_rep[i] == ep && m != 0 ->
        printf("@@ "); say(i); printf(" e%d's second task (rows ", ep); say_set(hm);
        printf(") is refused: rows of the partition reached more than one task (SinkError); the attempt fails\n");
        hm = 0;
        goto gone
#endif
      :: else -> rw = hm; hm = 0; kafka_task(rw); rw = 0
      fi;
      hm = 0;
      check_all()
    }
  :: atomic { rf == rl -> skip }
  CRASH(gone)
  fi;
#endif

  /* The commit transaction (commit_cursors), part 1: lock the instance row, refuse a zombie (stale
   * epoch or non-live instance), read the instance's leases. */
  if
  :: atomic {
      lockh[i] == 0 ->
      lockh[i] = _pid + 1;
      if
      :: !FENCE_OK(i) || !EPOCH_OK(i, ep) ->
        lockh[i] = 0;
        printf("@@ "); say(i); printf(" e%d is a zombie (refused at commit)\n", ep);
        goto gone
      :: else -> skip
      fi;
      rv = l_valid[i]; rc = l_cur[i]; re = l_end[i];
      printf("@@ "); say(i); printf(" e%d locks its row, reads its lease: cursor %d, end ", ep, rc);
      say_end(re);
      if
      :: i == BLUE && l_valid[BCONT] ->
        rv3 = 1; rc3 = l_cur[BCONT]; re3 = l_end[BCONT];
        printf("; its lease [%d,", l_start[BCONT]); say_end(re3); printf(") at cursor %d", rc3)
      :: else -> skip
      fi;
      printf("\n");
#ifndef ATOMIC_COMMIT
    }
#ifdef RETRY
  :: atomic {
      !rt && rf < rl -> rt = 1;
      printf("@@ "); say(i); printf(" e%d: Spark runs the task again (a retry after its commit)\n", ep);
      goto task
    }
#endif
  CRASH(gone)   /* crash after the tasks: the next attempt replays the batch */
  fi;
  if
  :: atomic {
#endif
      /* Part 2 (protocol._planned_moves): for each lease the batch moves (its planned end, capped at
       * the lease's end, is past the cursor), refuse a batch that starts past the cursor and
       * compare-and-set the cursor; record the batch, commit. The offsets the cursors move over
       * are applied in the ledger: their output must be in the sink already. */
      ok = 1;
      t = (e < re -> e : re);
      t3 = (e < re3 -> e : re3);
      if
      :: rv && t > rc ->
        if
        :: s > rc ->
          printf("@@ "); say(i); printf(" e%d: batch starts at %d past cursor %d: refused\n", ep, s, rc);
          ok = 0
        :: else -> skip
        fi;
        if
        :: !(l_valid[i] && l_cur[i] == rc) ->
          printf("@@ "); say(i); printf(" e%d: cursor moved away from %d: CAS lost\n", ep, rc);
          ok = 0
        :: else -> skip
        fi
      :: else -> skip
      fi;
      if
      :: rv3 && t3 > rc3 ->
        if
        :: s > rc3 ->
          printf("@@ "); say(i); printf(" e%d: batch starts at %d past cursor %d: refused\n", ep, s, rc3);
          ok = 0
        :: else -> skip
        fi;
        if
        :: !(l_valid[BCONT] && l_cur[BCONT] == rc3) ->
          printf("@@ "); say(i); printf(" e%d: cursor moved away from %d: CAS lost\n", ep, rc3);
          ok = 0
        :: else -> skip
        fi
      :: else -> skip
      fi;
      if
      :: ok ->
        if
        :: !(cur_epoch[i] == ep && LIVE(i)) ->
          printf("@@ VIOLATION single_writer: "); say(i);
          printf(" e%d commits while the instance is at epoch %d, state %d\n", ep, cur_epoch[i], ist[i]);
          single_writer = 0
        :: else -> skip
        fi;
        printf("@@ "); say(i); printf(" e%d commits batch [%d,%d)\n", ep, s, e);
        if
        :: rv && t > rc ->
          for (o : rc .. t - 1) {
            if
            :: o >= s && o >= l_start[i] ->
              printf("@@   applies offset %d\n", o);
              apply(i, o)
            :: else -> skip
            fi
          }
          l_cur[i] = t;
          printf("@@   cursor: %d -> %d\n", rc, t)
        :: else -> skip
        fi;
        if
        :: rv3 && t3 > rc3 ->
          for (o : rc3 .. t3 - 1) {
            if
            :: o >= s && o >= l_start[BCONT] ->
              printf("@@   applies offset %d\n", o);
              apply(i, o)
            :: else -> skip
            fi
          }
          l_cur[BCONT] = t3;
          printf("@@   cursor of [%d,...): %d -> %d\n", l_start[BCONT], rc3, t3)
        :: else -> skip
        fi;
#ifdef STATEFUL
        /* the window row must now count every record below the new cursor that Kafka holds */
        hg = 0;
        if :: rv && t > rc -> hg = t :: else -> skip fi;
        if :: rv3 && t3 > rc3 && t3 > hg -> hg = t3 :: else -> skip fi;
        if
        :: hg > 0 && wv + earliest < hg ->
          printf("@@ VIOLATION window_current: the cursor is at %d but the window row holds %d (at ", hg, wv);
          say_pos(wg, wb); printf("), not the %d records below it\n", hg - earliest);
          window_current = 0
        :: else -> skip
        fi;
        hg = 0;
#endif
        if :: ist[i] == STARTING -> ist[i] = ACTIVE :: else -> skip fi;
        recompute_caps();
        check_all()
      :: else -> skip
      fi;
      lockh[i] = 0;
      rv = 0; rc = 0; re = 0; rv3 = 0; rc3 = 0; re3 = 0; o = 0; t = 0; t3 = 0;
      if
      :: !ok -> goto gone    /* SourceGapError or CursorConflictError: the attempt ends */
      :: else -> ok = 0
      fi
    }
  CRASH(gone)   /* crash inside the transaction, holding the row lock: rolled back, the lock
                 * released (with ATOMIC_COMMIT: crash after the tasks) */
  fi;

  /* Spark writes commits/N */
written:
  if
  :: atomic {
      ck[i] = CK_DONE; ck_s[i] = 0; ck_e[i] = e; pos = e; s = 0; e = 0; rf = 0; rl = 0;
#ifdef RETRY
      rt = 0;
#endif
#ifdef SPLIT
      m = 0; t1 = 0;
#endif
      check_stranded(); CHECK6
    }
  CRASH(gone)   /* crash before commits/N: the next attempt replays the batch (a no-op) */
  fi;
  goto plan;

gone:
  /* the process is gone; the database rolls back its open transaction and releases its lock */
  atomic {
    if :: lockh[i] == _pid + 1 -> lockh[i] = 0 :: else -> skip fi;
    ep = 0; s = 0; e = 0; pos = 0; o = 0; t = 0; t3 = 0; ok = 0; rp = 0; rv = 0; rc = 0; re = 0;
    rv3 = 0; rc3 = 0; re3 = 0; rf = 0; rl = 0; pr = 0; tk = 0; rw = 0;
#ifdef RETRY
    rt = 0;
#endif
#ifdef SPLIT
    m = 0; t1 = 0;
#endif
#ifdef STATEFUL
    ws = 0;
#ifdef HEAL
    bn = 0; aw = 0;
#endif
#endif
    skip
  }
}

/* The cluster's supervision: starts attempts of submitted instances, at any time. A new attempt
 * while the previous one still runs makes that one a zombie. */
proctype Cluster() {
end_sup:
  do
  :: atomic { budget[BLUE] > 0 && LIVE(BLUE) -> budget[BLUE]--; run Attempt(BLUE) }
  :: atomic { launched[GREEN] && budget[GREEN] > 0 && LIVE(GREEN) -> budget[GREEN]--; run Attempt(GREEN) }
  :: atomic { launched[REC] && budget[REC] > 0 && LIVE(REC) -> budget[REC]--; run Attempt(REC) }
  od
}

/* Retention deletes the oldest records. */
proctype Retention() {
end_ret:
  do
  :: atomic { earliest < RET -> earliest++; printf("@@ retention deletes offset %d\n", earliest - 1) }
  od
}

#undef CRASH_SAY
#define CRASH_SAY printf("@@ the recovery process crashes\n")
/* plan_recovery for one partition: the one unfinished lease, its cursor, and the target: strategy
 * earliest (max(cursor, earliest)) or a skip to any later offset (latest, timestamp, offsets);
 * REC_AT_CURSOR: strategy earliest only (without retention: a stop + deploy at the cursor). */
inline PLAN_RECOVERY() {
  if
  :: atomic {
      n = 0;
      for (hl : 0 .. NL - 1) {
        if
        :: l_valid[hl] && (l_end[hl] == OPEN || l_cur[hl] < l_end[hl]) -> n++; sel = hl; c = l_cur[hl]
        :: else -> skip
        fi
      }
      hl = 0;
      t = (c > earliest -> c : earliest);
#ifndef REC_AT_CURSOR
      do
      :: t < N -> t++
      :: break
      od;
#endif
      printf("@@ recovery plan: cursor %d, target %d\n", c, t)
    }
  CRASH(rec_end)   /* crash */
  fi
}

/* relay upgrade: green as a warm standby, the handoff at H, then forward (blue drains to H and
 * stops) or abort (before or after green committed) while blue has not stopped. */
#undef CRASH_SAY
#define CRASH_SAY printf("@@ the upgrade process crashes\n")
/* the handoff's transaction ends (commit or rollback): the row locks it holds are released */
#define RELEASE_ROWS \
  if :: lockh[BLUE] == _pid + 1 -> lockh[BLUE] = 0 :: else -> skip fi; \
  if :: lockh[GREEN] == _pid + 1 -> lockh[GREEN] = 0 :: else -> skip fi
proctype Upgrade() {
  byte c0;
  byte pl;              /* blue's planned end, as the handoff read it under blue's row lock */
  byte pg;              /* green's planned end, as the handoff read it under green's row lock */
#ifdef HANDOFF_LATEST
  byte kl;              /* Kafka's latest offset, as the handoff read it before the lock */
#endif
  byte H = OPEN;        /* the handoff offset, once the handoff committed */
  byte X;               /* green's cursor, as the abort read it */
  bit touched;

end_wait:
  atomic { op == OP_NONE && ist[BLUE] == ACTIVE -> op = OP_UPGRADE; printf("@@ upgrade opened\n") }

  /* start_green: green is created STANDBY without a lease and submitted; its attempts may start,
   * and their source holds (plans nothing) until a lease exists (a stateful green's source reads in
   * shadow instead). Blue runs on uncapped. */
  if
  :: atomic {
      ist[GREEN] = STANDBY; launched[GREEN] = 1;
      recompute_caps();
      printf("@@ green created as a warm standby (no lease) and submitted\n")
    }
  CRASH(up_end)   /* crash */
  fi;

  /* green READY, or a failed launch or READY wait: abort before the handoff */
  if
  :: goto abort
#ifdef STATEFUL
  :: g_ready -> skip   /* a stateful green is READY once it ran a shadow batch */
#else
  :: skip
#endif
  fi;

#ifdef HANDOFF_LATEST
  /* _handoff reads Kafka's latest offset before its transaction: blue may plan past it meanwhile */
  if
  :: atomic { kl = latest; printf("@@ handoff reads Kafka's latest offset: %d\n", kl) }
  CRASH(up_end)   /* crash */
  fi;
#endif
  /* _handoff, ONE transaction. Part 1: (lock blue's row, then green's, and) read blue's open lease
   * and both planned ends (lock_planned); refuse unless blue is ACTIVE and green READY (a standby:
   * only the abort, in this process, fences it). The two locks are taken in one step: a plan of
   * green's between them touches neither blue's row nor anything part 1 reads of it, so it commutes
   * with taking blue's lock. */
  if
#if defined(NO_ROW_LOCK) || defined(NO_HANDOFF_LOCK)
  :: atomic {
      c0 = l_cur[0]; pl = planned_b; pg = planned_g;
      printf("@@ handoff reads blue's lease WITHOUT locking blue's row: cursor %d\n", c0)
    }
#else
  :: atomic {
      lockh[BLUE] == 0 && lockh[GREEN] == 0 -> lockh[BLUE] = _pid + 1; lockh[GREEN] = _pid + 1;
      if
#ifdef STATEFUL
      :: ist[BLUE] != ACTIVE || ist[GREEN] != STANDBY || !g_ready ->
#else
      :: ist[BLUE] != ACTIVE || ist[GREEN] != STANDBY ->
#endif
        printf("@@ handoff refused (blue not ACTIVE or green not READY): nothing changed\n");
        goto up_end
      :: else -> skip
      fi;
      c0 = l_cur[0]; pl = planned_b; pg = planned_g;
      printf("@@ handoff locks blue's row, reads blue's lease: cursor %d, planned end %d\n", c0, pl);
      printf("@@ handoff locks green's row, reads green's planned end %d\n", pg)
    }
#endif
  CRASH(up_end)   /* crash */
  fi;
  /* Part 2: choose H, close blue's lease at H, open green's at H, green STARTING, blue DRAINING;
   * commit. */
  if
  :: atomic {
      /* H: an explicit offset (never below the cursor read), or Kafka's latest offset (or later) */
      H = c0;
#ifdef HANDOFF_LATEST
      if :: kl > H -> H = kl :: else -> skip fi;
#endif
      do
      :: H < N -> H++
      :: break
      od;
#ifndef NO_PLANNED_END
      /* upgrade_steps.handoff_offset: never below blue's planned end (a batch that may be in flight) */
      if
      :: H < pl ->
#ifdef HANDOFF_LATEST
        printf("@@ handoff raises H from %d to blue's planned end %d\n", H, pl);
        H = pl
#else
        printf("@@ handoff refused: H=%d is below blue's planned end %d (rolled back)\n", H, pl);
        RELEASE_ROWS;
        c0 = 0; pl = 0; pg = 0; H = OPEN;
        goto abort
#endif
      :: else -> skip
      fi;
#endif
#ifndef NO_GREEN_PLANNED
      /* ... nor below green's (a stateful green's shadow reads: it applies nothing below H, and blue
       * nothing from H on) */
      if
      :: H < pg ->
#ifdef HANDOFF_LATEST
        printf("@@ handoff raises H from %d to green's planned end %d\n", H, pg);
        H = pg
#else
        printf("@@ handoff refused: H=%d is below green's planned end %d (rolled back)\n", H, pg);
        RELEASE_ROWS;
        c0 = 0; pl = 0; pg = 0; H = OPEN;
        goto abort
#endif
      :: else -> skip
      fi;
#endif
#ifndef NO_ROW_LOCK
      /* close_lease: compare-and-set on the cursor read (cannot fail while blue's row is locked) */
      if
      :: l_cur[0] != c0 ->
        printf("@@ handoff: blue's cursor moved from %d: CAS lost, rolled back\n", c0);
        RELEASE_ROWS;
        goto up_end
      :: else -> skip
      fi;
#endif
      l_end[0] = H;
      NEW_ID(1);
      l_valid[1] = 1; l_inst[1] = GREEN; l_start[1] = H; l_end[1] = OPEN; l_cur[1] = H;
      ist[GREEN] = STARTING;
      ist[BLUE] = DRAINING;
      ghostH = H; ghostX = OPEN;
      printf("@@ handoff commits: blue's lease closed at H=%d (its cursor is now %d), green opens [%d,...)\n",
             H, l_cur[0], H);
      if
      :: blue_reach > H ->
        printf("@@ VIOLATION blue_outside_green: blue already applied up to %d, past H=%d\n", blue_reach, H);
        blue_outside_green = 0
      :: else -> skip
      fi;
#ifdef STATEFUL
      if
      :: g_shadow > H ->
        printf("@@ VIOLATION shadow_below_H: green read up to %d in shadow (applying nothing), past H=%d\n",
               g_shadow, H);
        shadow_below_H = 0
      :: else -> skip
      fi;
#endif
      RELEASE_ROWS;
      c0 = 0; pl = 0; pg = 0;
#ifdef HANDOFF_LATEST
      kl = 0;
#endif
      recompute_caps();
      check_all()
    }
  CRASH(up_end)   /* crash: rolled back (the lock is released at up_end) */
  fi;

  if
  :: goto abort   /* the cutover gate failed (blue has not stopped) */
  :: atomic {
      /* green passed the gate: blue drains [cursor, H) ... */
      l_cur[0] >= l_end[0] -> printf("@@ blue drained up to %d\n", l_end[0])
    }
    /* ... and is stopped */
    if
    :: atomic { lockh[BLUE] == 0 -> ist[BLUE] = STOPPED; op = OP_NONE; printf("@@ upgrade done: blue stopped\n") }
    CRASH(up_end)   /* crash */
    fi;
    goto up_end
  CRASH(up_end)     /* crash (or blue never drains) */
  fi;

abort:
  /* _abort. First fence green: an UPDATE of green's row, which waits for an in-flight commit of
   * green (that holds the row lock); from here on green's commits are refused. */
  atomic { lockh[GREEN] == 0 -> ist[GREEN] = FENCED; printf("@@ abort: green fenced\n") }
  /* the abort transaction: read green's lease, ... */
  if
  :: atomic {
      touched = (l_valid[1] && l_cur[1] != l_start[1]);
      X = (touched -> l_cur[1] : 0);
      printf("@@ abort reads green's lease: touched=%d, cursor %d\n", touched, l_cur[1])
    }
  CRASH(up_end)   /* crash */
  fi;
  /* ... and (D2) close it where it is: at its cursor X (green keeps [H, X)), or at H when green
   * applied nothing ([H, H), never deleted: green's tasks may have written [H, ...) in the sink, and
   * green must stay the predecessor of whoever continues from its end); blue's lease stays closed at
   * H (blue drains [cursor, H)) and blue gets a NEW lease from green's end: [X, ...) or [H, ...)
   * (a higher id, so blue's writer generation beats green's too); blue DRAINING -> ACTIVE; commit. */
  if
  :: atomic {
      if
      :: l_valid[1] && !touched ->
#if defined(ABORT_DELETES_GREEN) || defined(DELETE_BEFORE_OPEN)
        l_valid[1] = 0   /* deleted (the code before DESIGN-29 D2) */
#else
        /* close_lease at its start: compare-and-set on the cursor read (untouched) */
        if
        :: l_cur[1] != l_start[1] || l_end[1] != OPEN ->
          printf("@@ abort: green's cursor moved from %d: CAS lost, rolled back\n", l_start[1]);
          goto up_end
        :: else -> skip
        fi;
        l_end[1] = l_start[1]   /* [H, H) */
#endif
      :: l_valid[1] && touched ->
        /* close_lease: compare-and-set on the cursor read */
        if
        :: l_cur[1] != X || l_end[1] != OPEN ->
          printf("@@ abort: green's cursor moved from %d: CAS lost, rolled back\n", X);
          goto up_end
        :: else -> skip
        fi;
        l_end[1] = X
      :: else -> skip
      fi;
      if
      :: l_valid[0] && l_end[0] == H && H != OPEN ->
        if
#ifdef ABORT_REOPENS
        :: touched -> l_end[0] = OPEN
#else
        :: touched ->
          NEW_ID(BCONT);
          l_valid[BCONT] = 1; l_inst[BCONT] = BLUE; l_start[BCONT] = X; l_end[BCONT] = OPEN; l_cur[BCONT] = X
#endif
#if defined(ABORT_DELETES_GREEN) || defined(STATEFUL_REOPENS)
        :: !touched -> l_end[0] = OPEN
#else
        :: !touched ->
          NEW_ID(BCONT);
          l_valid[BCONT] = 1; l_inst[BCONT] = BLUE; l_start[BCONT] = H; l_end[BCONT] = OPEN; l_cur[BCONT] = H
#endif
        fi
      :: else -> skip
      fi;
      if :: ist[BLUE] == DRAINING -> ist[BLUE] = ACTIVE :: else -> skip fi;
      if :: ghostH != OPEN -> ghostX = (touched -> X : ghostH) :: else -> skip fi;
      op = OP_NONE;
      if
      :: H == OPEN -> printf("@@ abort commits before the handoff: blue untouched\n")
#if defined(ABORT_DELETES_GREEN) || defined(STATEFUL_REOPENS)
      :: H != OPEN && !touched ->
        printf("@@ abort commits: green applied nothing, its lease ");
        if :: l_valid[1] -> printf("closed at %d", H) :: else -> printf("DELETED") fi;
        printf("; blue's lease REOPENED at its cursor %d\n", l_cur[0])
#else
      :: H != OPEN && !touched ->
        printf("@@ abort commits: green applied nothing, its lease ");
        if :: l_valid[1] -> printf("closed at %d", H) :: else -> printf("DELETED") fi;
        printf("; blue's lease stays closed at %d (cursor %d), blue opens [%d,...)\n", H, l_cur[0], H)
#endif
      :: H != OPEN && touched ->
#ifdef ABORT_REOPENS
        printf("@@ abort commits: green keeps [%d,%d), blue's lease REOPENED at its cursor %d\n", H, X, l_cur[0])
#else
        printf("@@ abort commits: green keeps [%d,%d); blue's lease stays closed at %d (cursor %d), blue opens [%d,...)\n",
               H, X, H, l_cur[0], X)
#endif
      fi;
#ifdef STATEFUL
      /* relay.stateful.generation: blue's (its highest lease id) must now beat green's */
      if
      :: H != OPEN ->
        hg = (l_valid[0] -> l_id[0] : 0);
        if :: l_valid[BCONT] && l_id[BCONT] > hg -> hg = l_id[BCONT] :: else -> skip fi;
        if
        :: hg <= l_id[1] ->
          printf("@@ VIOLATION blue_newer_writer: blue's generation %d is not above green's %d\n", hg, l_id[1]);
          blue_newer_writer = 0
        :: else -> skip
        fi;
        hg = 0
      :: else -> skip
      fi;
#endif
      recompute_caps();
      check_all()
    }
  CRASH(up_end)   /* crash: rolled back */
  fi;
up_end:
  atomic {
    RELEASE_ROWS;
    c0 = 0; pl = 0; pg = 0; H = 0; X = 0; touched = 0;
#ifdef HANDOFF_LATEST
    kl = 0
#endif
  }
}

#ifdef FAILOVER
#undef CRASH_SAY
#define CRASH_SAY printf("@@ the failover process crashes\n")
/* A hot standby (relay.operations.standby.ensure_standby; spark_jobs/hot_standby.py, watch): green is
 * a second instance of blue's version, created STANDBY without a lease and launched, exactly like the
 * upgrade's green before the handoff (its source holds). Its driver's watch judges blue dead on its
 * own clock: here at ANY moment, so every false alarm is covered (blue's attempts still running,
 * tasks in flight, a commit in progress). Then protocol.failover.fail_over, ONE ledger transaction:
 * lock blue's instance row (it waits for an in-flight commit of blue, which holds that lock) and
 * green's; refuse (nothing changes) unless blue is ACTIVE or STARTING and green still a standby (and
 * no operation in progress); fence blue (FENCED: its later prepare and commit are refused, no new
 * attempt of it starts); Ledger.take_over: blue's open lease closed at its cursor, read in this
 * transaction, and green's lease [cursor, ...) opened (a new row); green STARTING. No cooperation
 * from blue: blue, non-live with a lease ENDING where green's STARTS, is green's predecessor, so
 * green's driver takes it over in the sink (fence, merge its written offsets) before its tasks write. */
proctype Failover() {
  byte c0;              /* blue's cursor, as the failover read it */

  /* ensure_standby: created STANDBY (no lease) and submitted; the supervision may start its
   * attempts, whose source holds until a lease exists */
  if
  :: atomic {
      ist[GREEN] = STANDBY; launched[GREEN] = 1;
      recompute_caps();
      printf("@@ green created as a hot standby (blue's version, no lease) and submitted\n")
    }
  CRASH(fo_end)   /* crash */
  fi;
#ifdef FAILOVER_STALE_CURSOR
  /* mutant: blue's cursor read in a step of its own, without blue's row lock (blue may commit
   * before the transaction below, which closes the lease there without a compare-and-set) */
  if
  :: atomic { c0 = l_cur[0]; printf("@@ failover reads blue's cursor %d WITHOUT blue's row lock\n", c0) }
  CRASH(fo_end)   /* crash */
  fi;
#endif
  /* fail_over: ONE transaction. Both row locks are taken and released within the step: the
   * transaction's reads and writes are all under them (a commit of blue in progress holds blue's lock:
   * the failover waits for it), so it is one atomic step at the moment it holds both. */
  if
  :: atomic {
      lockh[BLUE] == 0 && lockh[GREEN] == 0 ->
      if
      :: !(ist[BLUE] == ACTIVE || ist[BLUE] == STARTING) || ist[GREEN] != STANDBY || op != OP_NONE ->
        printf("@@ failover refused (blue not ACTIVE/STARTING, or green no longer a standby): nothing changed\n");
        goto fo_end
      :: else -> skip
      fi;
#ifndef FAILOVER_STALE_CURSOR
      c0 = l_cur[0];   /* Ledger.take_over reads the leases inside the transaction, under the locks */
#endif
#ifdef FAILOVER_NO_FENCE
      printf("@@ failover locks blue's row and green's; blue's cursor %d; blue is NOT fenced (it stays live)\n", c0);
#else
      ist[BLUE] = FENCED;
      printf("@@ failover locks blue's row and green's; blue's cursor %d; blue FENCED\n", c0);
#endif
      /* Ledger.take_over: blue's open lease closed at the cursor read (under blue's lock nothing moves
       * it; FAILOVER_STALE_CURSOR: closed at the stale one, whatever the cursor is now) */
      l_end[0] = c0;
      l_valid[1] = 1; l_inst[1] = GREEN; l_start[1] = c0; l_end[1] = OPEN; l_cur[1] = c0;
      ist[GREEN] = STARTING;
      ghostH = c0; ghostX = OPEN;
      printf("@@ failover commits: blue's lease closed at %d (its cursor is %d), green opens [%d,...), STARTING\n",
             c0, l_cur[0], c0);
      if
      :: blue_reach > c0 ->
        printf("@@ VIOLATION blue_outside_green: blue already applied up to %d, past the failover's %d\n",
               blue_reach, c0);
        blue_outside_green = 0
      :: else -> skip
      fi;
      recompute_caps();
      check_all()
    }
  CRASH(fo_end)   /* crash: the transaction rolled back */
  fi;
fo_end:
  atomic { c0 = 0 }
}
#endif

#undef CRASH_SAY
#define CRASH_SAY printf("@@ the recovery process crashes\n")
/* relay recover: stop everything, record the lost/skipped ranges as gaps, open a lease at the
 * target for a fresh instance. Refused while an upgrade is in progress. */
proctype Recovery() {
  byte c;
  byte t;
  byte sel;
  byte n;

end_wait:
  atomic { op == OP_NONE -> op = OP_RECOVERY; printf("@@ recovery opened\n") }
#ifdef STALE_RECOVERY_PLAN
  /* plan_recovery reads the cursor, and chooses the target, BEFORE the pipeline is stopped */
  PLAN_RECOVERY();
#endif
  /* stop: each instance's state is moved by an UPDATE of its row (waits for an in-flight commit) */
  if
  :: atomic { lockh[BLUE] == 0 -> if :: LIVE(BLUE) -> ist[BLUE] = STOPPED :: else -> skip fi }
  CRASH(rec_end)   /* crash */
  fi;
  if
  :: atomic {
      lockh[GREEN] == 0 -> if :: LIVE(GREEN) -> ist[GREEN] = STOPPED :: else -> skip fi;
      printf("@@ recovery: pipeline stopped\n")
    }
  CRASH(rec_end)   /* crash */
  fi;
#ifndef STALE_RECOVERY_PLAN
  /* the plan is made once nothing runs */
  PLAN_RECOVERY();
#endif
  /* ONE transaction: close the unfinished lease at its cursor, gaps [cursor, target), new lease. */
  if
  :: atomic {
      if
      :: n != 1 -> printf("@@ recovery refused: %d unfinished leases\n", n); goto rec_end
      :: else -> skip
      fi;
      /* open_lease refuses an overlap with any other lease (the old one closed at its cursor NOW) */
      hf = 0;
      for (hl : 0 .. NL - 1) {
        if
        :: l_valid[hl] && hl != sel && t < l_end[hl] -> hf = 1
        :: hl == sel && t < l_cur[hl] -> hf = 1
        :: else -> skip
        fi
      }
      hl = 0;
      if
      :: hf -> hf = 0; printf("@@ recovery: a lease at %d overlaps, rolled back\n", t); goto rec_end
      :: else -> skip
      fi;
      l_end[sel] = l_cur[sel];
      rec_skip = (t > c);
      for (ho : c .. N - 1) {
        if :: ho < t -> record_gap(ho) :: else -> skip fi
      }
      ho = 0;
      NEW_ID(2);
      l_valid[2] = 1; l_inst[2] = REC; l_start[2] = t; l_end[2] = OPEN; l_cur[2] = t;
      ist[REC] = STARTING;
      launched[REC] = 1;
      op = OP_NONE;
      printf("@@ recovery commits: lease %d closed at %d, gaps [%d,%d), the recovered instance opens [%d,...)\n",
             sel, l_end[sel], c, t, t);
      recompute_caps();
      check_all()
    }
  CRASH(rec_end)   /* crash: rolled back */
  fi;
rec_end:
  atomic {
    c = 0; t = 0; sel = 0; n = 0
  }
}

/* At quiescence (nothing can move any more): below the frontier (the lowest cursor of an unfinished
 * lease, or N), every offset was applied exactly once or is a gap. */
proctype Quiescence() {
  byte frontier;
  timeout ->
  atomic {
    frontier = N;
    for (hl : 0 .. NL - 1) {
      if
      :: l_valid[hl] && (l_end[hl] == OPEN || l_cur[hl] < l_end[hl]) && l_cur[hl] < frontier ->
        frontier = l_cur[hl]
      :: else -> skip
      fi
    }
    hl = 0;
    for (ho : 0 .. N - 1) {
      if
      :: ho < frontier && !((applied[ho] == 1 && !gap[ho]) || (applied[ho] == 0 && gap[ho])) ->
        printf("@@ VIOLATION no_skip_without_gap at quiescence: offset %d applied %d times, gap %d\n",
               ho, applied[ho], gap[ho]);
        no_skip_without_gap = 0
      :: else -> skip
      fi;
#ifndef STATEFUL
      /* ... and its output is in the sink (exactly once: twice is invariant 11's) */
      if
      :: ho < frontier && applied[ho] == 1 && !gap[ho] && cnt[ho] == 0 ->
        printf("@@ VIOLATION sink_holds_applied at quiescence: offset %d is applied, no output in the sink\n", ho);
        sink_holds_applied = 0
      :: else -> skip
      fi
#endif
    }
    ho = 0;
    printf("@@ quiescent: frontier %d\n", frontier);
    check_all()
  }
}

init {
  atomic {
    /* blue is deployed: STARTING with one open lease [0, ...), submitted */
    ist[BLUE] = STARTING;
    NEW_ID(0);
    l_valid[0] = 1; l_inst[0] = BLUE; l_start[0] = 0; l_end[0] = OPEN; l_cur[0] = 0;
    l_end[1] = OPEN; l_end[2] = OPEN; l_end[BCONT] = OPEN;
    launched[BLUE] = 1;
    budget[BLUE] = BLUE_ATTEMPTS; budget[GREEN] = GREEN_ATTEMPTS; budget[REC] = REC_ATTEMPTS;
    recompute_caps();
    run Cluster();
#if RET > 0
    run Retention();
#endif
#ifdef FAILOVER
    run Failover();
#elif !defined(NO_UPGRADE)
    run Upgrade();
#endif
#ifndef NO_RECOVERY
    run Recovery();
#endif
    run Quiescence()
  }
}
