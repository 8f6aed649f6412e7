/*
 * relay.pml -- a Promela model of Relay's exactly-once protocol (model/README.md says what is
 * modelled, what is abstracted, and how each invariant maps to the code). Checked by model/check.py.
 *
 * One Kafka partition with offsets 0..N-1; three instances (blue, green made by the upgrade, and the
 * fresh instance a recovery makes), each with one lease row; attempts with epochs; the instance row
 * lock; the commit transaction; the blue-green handoff, its abort and the drain; the recovery;
 * retention; and a crash between any two steps of every process.
 *
 * Build switches (spin -D...):
 *   NO_ROW_LOCK          mutant: the handoff reads blue's lease without locking blue's instance row
 *                        and closes it with an UPDATE that ignores the cursor (READ COMMITTED race)
 *   NO_HANDOFF_LOCK      the handoff does not lock blue's row but keeps the compare-and-set on the
 *                        cursor when it closes blue's lease (the CAS alone must be enough)
 *   NO_EPOCH_CHECK       mutant: the commit does not compare the attempt's epoch with the instance's
 *   NO_FENCE_CHECK       mutant: the commit does not refuse a fenced (non-live) instance
 *   STALE_RECOVERY_PLAN  mutant: the recovery plans (reads the cursor, picks the target) BEFORE it
 *                        stops the pipeline and records its gaps from that plan (recover.py did until
 *                        _open_new_instance read the cursors in its own transaction)
 *   ONLY=k               assert only invariant k (1..5, below); 0 (default) asserts all of them
 *   N, RET               offsets in the partition; how many of them retention may delete
 *   BLUE_ATTEMPTS, GREEN_ATTEMPTS, REC_ATTEMPTS   attempts the supervision may start per instance
 *   NO_UPGRADE, NO_RECOVERY                       leave that operation out
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

#define OPEN 15     /* a lease's end while it is open ("end_offset IS NULL"); any value > N */
#define NL 3        /* lease rows: 0 = blue's, 1 = green's (handoff), 2 = the recovered instance's */
#define NI 3        /* instances */
#define BLUE 0
#define GREEN 1
#define REC 2

/* instance states (relay.ledger.models.InstanceState); 0 = not created yet */
#define STARTING 1
#define ACTIVE 2
#define DRAINING 3
#define STOPPED 4
#define FAILED 5
#define FENCED 6
#define LIVE(x) (ist[x] == STARTING || ist[x] == ACTIVE || ist[x] == DRAINING)

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

/* ------------------------------------------------------------------ outside the ledger */
byte ck[NI];            /* each instance's checkpoint (shared by all its attempts) */
byte ck_s[NI];
byte ck_e[NI];
byte earliest;          /* Kafka's earliest offset (retention moves it up) */
bit  launched[NI];      /* submitted: the cluster's supervision may start attempts */
byte budget[NI];        /* attempts the supervision may still start (bounds the model) */
byte cap[NI];           /* derived from the leases: where the source guard stops reading */

/* ------------------------------------------------------------------ ghosts, for the invariants */
byte applied[N];        /* how many times each offset was applied (written by a committed batch) */
bit  gap[N];            /* declared lost or skipped (a gap record) */
byte ghostH = OPEN;     /* the handoff offset H */
bit  h_active;          /* a handoff is in force (not aborted) */
byte blue_reach;        /* 1 + the highest offset blue applied (0: none) */

/* one bit per invariant; each goes to 0 when its invariant is violated, and is asserted */
bit no_double_apply = 1;        /* 1: no offset applied twice */
bit no_skip_without_gap = 1;    /* 2: every offset is applied, in a gap, or still ahead of a cursor */
bit single_writer = 1;          /* 3: only the attempt holding its live instance's current epoch commits */
bit blue_below_H = 1;           /* 4: after the handoff, blue has applied nothing at or past H */
bit gap_only_unapplied = 1;     /* 5: a gap never covers an applied offset */

/* scratch for loops inside atomic steps (always reset to 0 after use) */
byte ho;
byte hl;
byte hx;
byte hf;
byte hg;

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
#define CHECK4 assert(blue_below_H)
#else
#define CHECK4 skip
#endif
#if ONLY == 0 || ONLY == 5
#define CHECK5 assert(gap_only_unapplied)
#else
#define CHECK5 skip
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

inline check_all() {
  check_accounted();
  CHECK1; CHECK2; CHECK3; CHECK4; CHECK5
}

/* What the source guard lets each instance read up to (relay.source_guard): uncapped while it has
 * an open lease or no lease at all, else the highest end of its leases; never past Kafka's end N. */
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
    cap[hx] = ((hf || !hg) -> N : (ho < N -> ho : N))
  }
  hx = 0; hl = 0; ho = 0; hf = 0; hg = 0
}

inline apply(x, o) {
  if
  :: applied[o] > 0 ->
    printf("@@ VIOLATION no_double_apply: offset %d applied again, by ", o); say(x); printf("\n");
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
  :: x == BLUE && h_active && o >= ghostH ->
    printf("@@ VIOLATION blue_below_H: blue applies offset %d, the handoff is at %d\n", o, ghostH);
    blue_below_H = 0
  :: else -> skip
  fi;
  if
  :: applied[o] < 2 -> applied[o]++
  :: else -> skip
  fi;
  if
  :: x == BLUE && o + 1 > blue_reach -> blue_reach = o + 1
  :: else -> skip
  fi
}

inline record_gap(o) {
  if
  :: applied[o] > 0 ->
    printf("@@ VIOLATION gap_only_unapplied: a gap is recorded over applied offset %d\n", o);
    gap_only_unapplied = 0
  :: else -> skip
  fi;
  gap[o] = 1
}

/* ------------------------------------------------------------------ an attempt (one driver process) */
#define CRASH_SAY printf("@@ "); say(i); printf(" e%d crashes\n", ep)
proctype Attempt(byte i) {
  byte ep;              /* this attempt's epoch */
  byte s;               /* the batch being run: [s, e) */
  byte e;
  byte pos;             /* where the next batch starts */
  byte o;
  byte t;
  bit ok;
  bit rv;               /* the instance's lease (row i) as the commit transaction read it */
  byte rc;
  byte re;

  /* Ledger.start_attempt: lock the instance row, refuse a non-live instance, take a new epoch.
   * Then the driver opens the checkpoint: an in-flight batch (offsets/N without commits/N) runs
   * again; an empty checkpoint starts at the instance's undrained cursor
   * (reference_job.starting_offsets), or at Kafka's earliest offset when it has none. */
  atomic {
    lockh[i] == 0 ->
    if
    :: LIVE(i) -> cur_epoch[i]++; ep = cur_epoch[i]
    :: else -> goto gone
    fi;
    printf("@@ "); say(i); printf(" attempt e%d starts\n", ep);
    if
    :: ck[i] == CK_PLANNED ->
      s = ck_s[i]; e = ck_e[i];
      printf("@@ "); say(i); printf(" e%d replays the in-flight batch [%d,%d)\n", ep, s, e);
      goto batch
    :: ck[i] == CK_DONE -> pos = ck_e[i]
    :: ck[i] == CK_EMPTY ->
      if
      :: l_valid[i] && (l_end[i] == OPEN || l_cur[i] < l_end[i]) -> pos = l_cur[i]
      :: else -> pos = earliest
      fi
    fi
  }

plan:
  /* The source plans the next batch within the guard's cap and maxOffsetsPerTrigger (1 or 2 here),
   * and Spark writes it to offsets/N. A stopped or fenced instance plans nothing (idle for ever is
   * the same, for everybody else, as a crash here). */
end_idle:
  atomic {
    LIVE(i) && cap[i] > pos ->
    s = pos;
    if
    :: e = s + 1
    :: s + 2 <= cap[i] -> e = s + 2
    fi;
    ck[i] = CK_PLANNED; ck_s[i] = s; ck_e[i] = e;
    printf("@@ "); say(i); printf(" e%d plans [%d,%d)\n", ep, s, e)
  }

batch:
  /* The commit transaction, part 1: read the records (failOnDataLoss), lock the instance row,
   * refuse a zombie (stale epoch or non-live instance), read the instance's lease. */
  if
  :: atomic {
      lockh[i] == 0 ->
      if
      :: s < earliest ->
        /* DataLossError: the driver marks the instance FAILED (an UPDATE of its row) and ends */
        ist[i] = FAILED;
        printf("@@ "); say(i); printf(" e%d: offset %d was deleted by retention: instance FAILED\n", ep, s);
        goto gone
      :: else -> skip
      fi;
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
      say_end(re); printf("\n");
#ifndef ATOMIC_COMMIT
    }
  CRASH(gone)   /* crash after offsets/N: the next attempt replays the batch */
  fi;
  if
  :: atomic {
#endif
      /* Part 2: refuse a batch that starts past the cursor, keep the records inside the lease and
       * at or after its cursor, write them, compare-and-set the cursor to the planned end (capped
       * at the lease's end), record the batch, commit. */
      ok = 1;
      t = (e < re -> e : re);
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
        if :: ist[i] == STARTING -> ist[i] = ACTIVE :: else -> skip fi;
        check_all()
      :: else -> skip
      fi;
      lockh[i] = 0;
      rv = 0; rc = 0; re = 0; o = 0; t = 0;
      if
      :: !ok -> goto gone    /* SourceGapError or CursorConflictError: the attempt ends */
      :: else -> ok = 0
      fi
    }
  CRASH(gone)   /* crash inside the transaction, holding the row lock: rolled back, the lock
                 * released (with ATOMIC_COMMIT: crash after offsets/N) */
  fi;

  /* Spark writes commits/N */
  if
  :: atomic { ck[i] = CK_DONE; ck_s[i] = 0; ck_e[i] = e; pos = e; s = 0; e = 0 }
  CRASH(gone)   /* crash before commits/N: the next attempt replays the batch (a no-op) */
  fi;
  goto plan;

gone:
  /* the process is gone; the database rolls back its open transaction and releases its lock */
  atomic {
    if :: lockh[i] == _pid + 1 -> lockh[i] = 0 :: else -> skip fi;
    ep = 0; s = 0; e = 0; pos = 0; o = 0; t = 0; ok = 0; rv = 0; rc = 0; re = 0
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
 * earliest (max(cursor, earliest)) or a skip to any later offset (latest, timestamp, offsets). */
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
      do
      :: t < N -> t++
      :: break
      od;
      printf("@@ recovery plan: cursor %d, target %d\n", c, t)
    }
  CRASH(rec_end)   /* crash */
  fi
}

/* relay upgrade: blue -> green with an exact handoff at H; or abort before green commits. */
#undef CRASH_SAY
#define CRASH_SAY printf("@@ the upgrade process crashes\n")
proctype Upgrade() {
  byte c0;
  byte H;
  bit touched;

end_wait:
  atomic { op == OP_NONE && ist[BLUE] == ACTIVE -> op = OP_UPGRADE; printf("@@ upgrade opened\n") }

  /* _handoff, ONE transaction. Part 1: (lock blue's row and) read blue's open lease. */
  if
#if defined(NO_ROW_LOCK) || defined(NO_HANDOFF_LOCK)
  :: atomic {
      c0 = l_cur[0];
      printf("@@ handoff reads blue's lease WITHOUT locking blue's row: cursor %d\n", c0)
    }
#else
  :: atomic {
      lockh[BLUE] == 0 -> lockh[BLUE] = _pid + 1;
      if
      :: ist[BLUE] != ACTIVE ->
        printf("@@ handoff: blue is no longer ACTIVE, nothing changed\n");
        goto up_end
      :: else -> skip
      fi;
      c0 = l_cur[0];
      printf("@@ handoff locks blue's row, reads blue's lease: cursor %d\n", c0)
    }
#endif
  CRASH(up_end)   /* crash */
  fi;
  /* Part 2: choose H, close blue's lease at H, open green's at H, blue DRAINING; commit. */
  if
  :: atomic {
      /* H: Kafka's latest offset at handoff time, or an explicit one: never below the cursor read */
      H = c0;
      do
      :: H < N -> H++
      :: break
      od;
#ifndef NO_ROW_LOCK
      /* close_lease: compare-and-set on the cursor read (cannot fail while blue's row is locked) */
      if
      :: l_cur[0] != c0 ->
        printf("@@ handoff: blue's cursor moved from %d: CAS lost, rolled back\n", c0);
        lockh[BLUE] = 0;
        goto up_end
      :: else -> skip
      fi;
#endif
      l_end[0] = H;
      l_valid[1] = 1; l_inst[1] = GREEN; l_start[1] = H; l_end[1] = OPEN; l_cur[1] = H;
      ist[GREEN] = STARTING;
      ist[BLUE] = DRAINING;
      ghostH = H; h_active = 1;
      printf("@@ handoff commits: blue's lease closed at H=%d (its cursor is now %d), green opens [%d,...)\n",
             H, l_cur[0], H);
      if
      :: blue_reach > H ->
        printf("@@ VIOLATION blue_below_H: blue already applied up to %d, past H=%d\n", blue_reach, H);
        blue_below_H = 0
      :: else -> skip
      fi;
      if :: lockh[BLUE] == _pid + 1 -> lockh[BLUE] = 0 :: else -> skip fi;
      c0 = 0;
      recompute_caps();
      check_all()
    }
  CRASH(up_end)   /* crash: rolled back (the lock is released at up_end) */
  fi;

  if
  :: launched[GREEN] = 1    /* green submitted */
  CRASH(up_end)            /* crash */
  fi;

  if
  :: atomic {
      /* a gate failed before green committed: _abort. First fence green: an UPDATE of green's row,
       * which waits for an in-flight commit of green (that holds the row lock). */
      lockh[GREEN] == 0 -> ist[GREEN] = FENCED; printf("@@ abort: green fenced\n")
    }
    /* the abort transaction: read green's lease, ... */
    if
    :: atomic {
        touched = (l_valid[1] && l_cur[1] != l_start[1]);
        printf("@@ abort reads green's lease: touched=%d\n", touched)
      }
    CRASH(up_end)   /* crash */
    fi;
    /* ... delete it (unless green committed: then only forward), reopen blue's lease, commit */
    if
    :: atomic {
        if
        :: touched -> printf("@@ abort: green committed, the upgrade must go forward\n"); goto up_end
        :: else -> skip
        fi;
        l_valid[1] = 0;
        if :: l_end[0] == ghostH -> l_end[0] = OPEN :: else -> skip fi;
        if :: ist[BLUE] == DRAINING -> ist[BLUE] = ACTIVE :: else -> skip fi;
        h_active = 0;
        op = OP_NONE;
        printf("@@ abort commits: green's lease deleted, blue's lease reopened\n");
        recompute_caps();
        check_all()
      }
    CRASH(up_end)   /* crash: rolled back */
    fi
  :: atomic {
      /* green committed: blue drains [cursor, H) ... */
      l_cur[0] >= l_end[0] -> printf("@@ blue drained up to %d\n", l_end[0])
    }
    /* ... and is stopped */
    if
    :: atomic { lockh[BLUE] == 0 -> ist[BLUE] = STOPPED; op = OP_NONE; printf("@@ upgrade done: blue stopped\n") }
    CRASH(up_end)   /* crash */
    fi
  CRASH(up_end)     /* crash (or blue never drains) */
  fi;
up_end:
  atomic {
    if :: lockh[BLUE] == _pid + 1 -> lockh[BLUE] = 0 :: else -> skip fi;
    c0 = 0; H = 0; touched = 0
  }
}

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
      for (ho : c .. N - 1) {
        if :: ho < t -> record_gap(ho) :: else -> skip fi
      }
      ho = 0;
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
      fi
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
    l_valid[0] = 1; l_inst[0] = BLUE; l_start[0] = 0; l_end[0] = OPEN; l_cur[0] = 0;
    l_end[1] = OPEN; l_end[2] = OPEN;
    launched[BLUE] = 1;
    budget[BLUE] = BLUE_ATTEMPTS; budget[GREEN] = GREEN_ATTEMPTS; budget[REC] = REC_ATTEMPTS;
    recompute_caps();
    run Cluster();
#if RET > 0
    run Retention();
#endif
#ifndef NO_UPGRADE
    run Upgrade();
#endif
#ifndef NO_RECOVERY
    run Recovery();
#endif
    run Quiescence()
  }
}
