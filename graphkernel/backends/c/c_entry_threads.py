"""Keeping OpenMP's idle threads awake between the kernels of one call: the compiled entry's C
for it (backends/c/c_entry.py puts it before `gk_run`) and its Python side (whether a plan gets
it, and the note the backend records on the plan for reports).

The entry's program loop calls `GK_BEFORE_KERNEL(pc)` before each kernel; `gk_run` holds
`gk_awake` (AWAKE_LOCAL), begins before the program (AWAKE_BEGIN) and ends on every way out
(AWAKE_END). GK_AWAKE_PLAN is a constant beside the entry's tables, so gk_run is the same C for
every plan (tests/test_compile_depth.py).
"""
from __future__ import annotations

import ctypes
import os
import resource
import threading

from graphkernel.backends.c import toolchain
from graphkernel.runtime.plan import ExecutionPlan, StepKind


def awake_between_kernels(plan: ExecutionPlan) -> bool:
    """Whether the entry keeps OpenMP's idle threads awake from one kernel to the next within
    a call (`_AWAKE`): a plan of two kernels or more, each of which may start a parallel
    region."""
    return sum(step.kind is StepKind.KERNEL for step in plan.steps) >= 2


# graphkernel's OpenMP threads wait passively (OMP_WAIT_POLICY=PASSIVE, backends/c/library.py):
# an idle one sleeps at once, so that a loaded machine's cores go to whoever needs them. Each
# kernel's parallel region then starts by waking the others: 10-60 us on this project's 2-vCPU
# VM (an idle virtual CPU wakes through the hypervisor), paid once per kernel. The digits CNN
# at two threads took 561 us a call, and 415 with its threads spinning between kernels
# (s9-digits.md). Within a call the entry lets them spin (LLVM libomp's blocktime, 1 ms: the
# gap between two kernels is microseconds); before the call's last kernel it puts the
# blocktime back, so that the threads of that kernel's region wait passively after it and
# sleep between calls as before. Only where the wait is passive (a blocktime of 0: the user
# chose no other), and only under libomp (GNU libgomp has no such call: the weak symbols stay
# NULL and the call runs as before). A call that ends early (refused, failed) puts the
# blocktime back too. Spinning pays only while the threads have their cores: on a machine
# whose other processes want the cores too (load 11-12 on the 2 vCPUs) the spinning threads lost
# their turns and the digits CNN took 1000 us against 840 passive. So the call after the
# calling thread was preempted (an involuntary context switch since its last call) waits
# passively, as before. One call, not more: at 16 a quiet 2-vCPU host, where a stray
# preemption comes every few calls, kept ResNet-18 b1 passive most of the time (10.0 ms a call
# against 8.35 at 1 and 8.27 never passive; ResNet-50 b1 22.5 against 19.4), while at load
# ~1 one call already ties never-passive (perf-notes, "Spinning after a preemption").
PASSIVE_CALLS_AFTER_PREEMPTION = 1
# Cores taken by other processes: a kernel's parallel region waits at its join for a worker that
# another process's turn keeps off its core, once per region. Within a call the thresholds let
# small kernels go on threads (calibration.within_call: the awake fork/join), so a plan of many
# small kernels pays it many times: ONNX MobileNetV3-small b1 took 2.0 ms a call beside one
# CPU-bound process (1.3 with the passive thresholds) and 13.7 beside two, against 3.0 on one
# thread. So the entry of a static plan times its calls and runs them in the faster of two
# modes, on threads or on the calling thread alone (omp_set_num_threads(1)): every
# `gk_interval` calls it probes the other mode for PROBE_CALLS calls and switches when both of
# the probe's last two beat PROBE_MARGIN x the median of the current mode's latest KEEP_CALLS
# calls (the first call of a probe wakes the team or finds it cold: not counted; on threads
# with the cores taken a call is now and then as fast as on a quiet host, so one fast call is
# not enough, and a median leaves out the call after another library's threads held the
# cores). A probe that keeps the mode doubles the interval (from FIRST_PROBE, or RECHECK after
# a switch, whose cause may have passed: another library's threads spinning after its call),
# up to PROBE_MAX, so a quiet host probes rarely; SLOW_STREAK calls in a row on threads each
# SLOW_FACTOR x the fastest such call probe at once (load that arrives). Neither runs where the
# fastest call alone so far is not under PROBE_MARGIN x the calls on threads (their median; a
# streak: each slow call): such a probe would lose. A model whose kernels all split well runs
# alone at about half its speed on two cores, so noise that slows its calls on threads 1.5x
# could make it probe again and again, each probe a call at a single thread's speed
# (ResNet-50 b1, 37 ms a call on threads, had a 67 ms sample in a bench run whose others took
# 37-41 ms: such a call's time, though the run did not record probes). A skipped probe doubles
# the interval as a lost one does.
PROBE_CALLS = 3
KEEP_CALLS = 8
PROBE_MARGIN = 0.9
FIRST_PROBE = 32
PROBE_MAX = 2048
SLOW_FACTOR = 1.5
SLOW_STREAK = 3
RECHECK = 8  # calls after a switch before the first probe back
# A probe ends early where it cannot win: a counted call not under PROBE_MARGIN x the current
# mode's median, or a first call alone over HOPELESS_FIRST_ALONE x it (going alone wakes no
# team, and the caches it finds cold are a fraction of a call). On a quiet host a probe alone
# costs the calls it runs at a single thread's speed: ResNet-50 b1 took 36-38 ms for each of
# the probe's three calls against 21 on threads, a 0.35 s call every 32 calls at first.
HOPELESS_FIRST_ALONE = 1.5
_AWAKE = """#define GK_PASSIVE_CALLS @PASSIVE_CALLS@
extern int kmp_get_blocktime(void) __attribute__((weak));
extern void kmp_set_blocktime(int) __attribute__((weak));
int omp_get_max_threads(void);
void omp_set_num_threads(int);
#include <sys/resource.h>
#include <time.h>
#ifndef RUSAGE_THREAD
#define RUSAGE_THREAD 1  /* Linux's; elsewhere getrusage refuses it and the wait stays passive */
#endif
static __thread long gk_preempted_seen = -1;  /* the calling thread's count at its last call */
static __thread int gk_passive_calls = 0;  /* calls left to wait passively after a preemption */
static __thread int gk_alone = 0;  /* the mode calls run in: 0 on threads, 1 alone */
static __thread int gk_mode = -1;  /* this call's mode; -1: not timed */
static __thread int gk_probe = 0;  /* calls left of a probe of the other mode */
static __thread int gk_interval = @FIRST@, gk_countdown = @FIRST@;
static __thread int gk_slow = 0, gk_team = 0;
static __thread double gk_t0 = 0, gk_best = 0, gk_probe_best = 0;
static __thread double gk_last[@KEEP@];  /* the current mode's latest calls, seconds (0: none) */
static __thread int gk_next = 0;
static __thread long long gk_calls_alone = 0, gk_probes = 0, gk_switches = 0;
static __thread long long gk_probes_skipped = 0;
static __thread double gk_alone_best = 0;  /* the fastest call alone so far, seconds (0: none) */
static double gk_now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}
static double gk_recent(void) {  /* the median of the current mode's latest calls */
  double kept[@KEEP@];
  int n = 0;
  for (int i = 0; i < @KEEP@; ++i) {
    if (gk_last[i] <= 0) continue;
    int j = n++;
    for (; j > 0 && kept[j - 1] > gk_last[i]; --j) kept[j] = kept[j - 1];
    kept[j] = gk_last[i];
  }
  return n ? kept[n / 2] : 0;
}
/* Whether a call alone could beat calls on threads taking `on` seconds by the margin, as far
   as the fastest call alone so far says (none yet: it could). */
static int gk_alone_could_win(double on) {
  return gk_alone_best == 0 || gk_alone_best < @MARGIN@ * on;
}
/* The mode of a timed call about to start (1: alone), a probe's calls the other one. */
static int gk_next_mode(void) {
  int alone = gk_alone;
  if (gk_probe > 0) {
    --gk_probe;
    alone = !alone;
  }
  return alone;
}
/* A timed call of `mode` took dt seconds: the mode of the calls after it. */
static void gk_account(int mode, double dt) {
  if (mode == 1 && (gk_alone_best == 0 || dt < gk_alone_best)) gk_alone_best = dt;
  if (mode != gk_alone) {  /* a probe's call: the first wakes or warms, the others count */
    if (gk_probe < @PROBE@ - 1 && dt > gk_probe_best) gk_probe_best = dt;  /* the slower */
    /* A probe that cannot win ends at once: a counted call not under the margin, or a first
       call alone over @HOPELESS@x the current mode's median (no warming explains that). */
    if (gk_probe > 0 && (gk_probe_best >= @MARGIN@ * gk_recent() ||
                         (mode == 1 && gk_probe == @PROBE@ - 1 &&
                          dt > @HOPELESS@ * gk_recent()))) {
      gk_probe = 0;
      if (gk_probe_best < dt) gk_probe_best = dt;
    }
    if (gk_probe > 0) return;
    ++gk_probes;
    if (gk_probe_best < @MARGIN@ * gk_recent()) {
      gk_alone = mode;
      for (int i = 0; i < @KEEP@; ++i) gk_last[i] = 0;
      gk_interval = @RECHECK@;  /* soon again: a switch on a passing disturbance undone */
      ++gk_switches;
    } else {
      gk_interval = gk_interval * 2 < @PROBE_MAX@ ? gk_interval * 2 : @PROBE_MAX@;
    }
    gk_countdown = gk_interval;
    gk_slow = 0;
    return;
  }
  gk_last[gk_next] = dt;
  gk_next = (gk_next + 1) % @KEEP@;
  int now = 0;
  if (mode == 0) {
    if (gk_best == 0 || dt < gk_best) gk_best = dt;
    gk_slow = dt > @SLOW_FACTOR@ * gk_best && gk_alone_could_win(dt) ? gk_slow + 1 : 0;
    now = gk_slow >= @STREAK@;  /* slow on threads now, slower than alone was: probe at once */
  }
  if (--gk_countdown <= 0 || now) {
    if (!now && !gk_alone && !gk_alone_could_win(gk_recent())) {
      /* a call alone has been slower than the margin allows: the probe would lose */
      ++gk_probes_skipped;
      gk_interval = gk_interval * 2 < @PROBE_MAX@ ? gk_interval * 2 : @PROBE_MAX@;
      gk_countdown = gk_interval;
      return;
    }
    gk_probe = @PROBE@;
    gk_probe_best = 0;
  }
}
/* After a call that ran to its end: its time, and the mode of the calls after it. */
static void gk_awake_timed(void) {
  if (gk_mode < 0) return;
  const int mode = gk_mode;
  gk_mode = -1;
  gk_account(mode, gk_now() - gk_t0);
}
/* 1: the team spins between kernels (blocktime 1 ms) until the last kernel; 2: the call runs
   on the calling thread alone; 0: as it was. gk_awake_end(state) undoes it. */
static int gk_awake_begin(void) {
  gk_mode = -1;
  if (!GK_AWAKE_PLAN) return 0;  /* fewer than two kernels: nothing to keep awake */
  if (kmp_get_blocktime == NULL || kmp_set_blocktime == NULL) return 0;
  const int team = omp_get_max_threads();
  if (team < 2 || kmp_get_blocktime() != 0) return 0;
  struct rusage ru;
  if (getrusage(RUSAGE_THREAD, &ru) != 0) return 0;
  if (ru.ru_nivcsw != gk_preempted_seen) {  /* another task took this core since last time */
    if (gk_preempted_seen >= 0) gk_passive_calls = GK_PASSIVE_CALLS;
    gk_preempted_seen = ru.ru_nivcsw;
  }
  int alone = gk_alone;
  if (GK_TIMED_PLAN) {
    alone = gk_next_mode();
    gk_mode = alone;
    gk_t0 = gk_now();
  }
  if (alone) {
    ++gk_calls_alone;
    gk_team = team;
    omp_set_num_threads(1);
    return 2;
  }
  /* a timed plan's probes step back from a busy machine; an untimed one waits passively */
  if (gk_passive_calls > 0) {
    --gk_passive_calls;
    if (!GK_TIMED_PLAN) return 0;
  }
  kmp_set_blocktime(1);
  return 1;
}
static void gk_awake_end(int state) {
  if (state == 2) omp_set_num_threads(gk_team); else kmp_set_blocktime(0);
}
static PyObject *gk_threads_stats(PyObject *self, PyObject *unused) {
  return Py_BuildValue("{s:L,s:L,s:L,s:L,s:i,s:d,s:d}", "calls_alone", gk_calls_alone,
                       "probes", gk_probes, "probes_skipped", gk_probes_skipped, "switches",
                       gk_switches, "alone_now", gk_alone, "recent_call_s", gk_recent(),
                       "alone_best_s", gk_alone_best);
}
/* The probes' rules on given call times, no call run (their tests): for each (seconds on
   threads, seconds alone), the mode the rules pick and the time fed back for it; the modes. */
static PyObject *gk_threads_replay(PyObject *self, PyObject *calls) {
  PyObject *seq = PySequence_Fast(calls, "threads_replay takes (threads_s, alone_s) pairs");
  if (seq == NULL) return NULL;
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  PyObject *modes = PyList_New(n);
  for (Py_ssize_t i = 0; modes != NULL && i < n; ++i) {
    double on, alone;
    if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, i), "dd", &on, &alone)) {
      Py_CLEAR(modes);
      break;
    }
    const int mode = gk_next_mode();
    gk_account(mode, mode ? alone : on);
    PyList_SET_ITEM(modes, i, PyLong_FromLong(mode));
  }
  Py_DECREF(seq);
  return modes;
}
#define GK_BEFORE_KERNEL(pc) \\
  do { if (gk_awake == 1 && (pc) == GK_LAST_KERNEL) { gk_awake_end(1); gk_awake = 0; } } while (0)
""".replace("@PASSIVE_CALLS@", str(PASSIVE_CALLS_AFTER_PREEMPTION)).replace(
    "@FIRST@", str(FIRST_PROBE)).replace("@KEEP@", str(KEEP_CALLS)).replace(
    "@PROBE_MAX@", str(PROBE_MAX)).replace("@RECHECK@", str(RECHECK)).replace(
    "@PROBE@", str(PROBE_CALLS)).replace("@MARGIN@", repr(PROBE_MARGIN)).replace(
    "@STREAK@", str(SLOW_STREAK)).replace("@SLOW_FACTOR@", repr(SLOW_FACTOR)).replace(
    "@HOPELESS@", repr(HOPELESS_FIRST_ALONE)).split("\n")


def entry_step_kinds(plan: ExecutionPlan) -> bool:
    """Whether `plan`'s steps are all of kinds the compiled entry runs and no result is copied
    out (c_entry.py `entry_source`'s first test; answered here without the entry writer, which
    a warm build does not import)."""
    kinds = {s.kind for s in plan.steps}
    return StepKind.KERNEL in kinds and not any(plan.copy_out) and \
        kinds <= {StepKind.KERNEL, StepKind.ASSIGN, StepKind.LIBRARY, StepKind.VIEW}


def libomp_folder() -> str | None:
    """The folder of the LLVM libomp the kernels link, where the bracket can work (Linux's
    RUSAGE_THREAD); None under GNU libgomp (no blocktime to set), without OpenMP, elsewhere."""
    tc = toolchain.detect()
    if tc is None or not tc.openmp or not tc.openmp_lib or \
            not hasattr(resource, "RUSAGE_THREAD"):
        return None
    return tc.openmp_lib


def team_kept_awake(plan: ExecutionPlan) -> bool:
    """Whether the entry and the runner keep `plan`'s team spinning between its kernels (the
    fork of a kernel after the first then finds it awake): a plan `awake_between_kernels`
    under LLVM libomp on Linux (RUSAGE_THREAD), as `gk_awake_begin` requires."""
    return awake_between_kernels(plan) and libomp_folder() is not None


def awake_definitions(plan: ExecutionPlan) -> list[str]:
    """The C before `gk_run`: the plan's choices as constants (whether it keeps the team
    awake; whether its calls are timed: a static plan, each call the same work), then
    `_AWAKE`."""
    return [f"#define GK_AWAKE_PLAN {int(awake_between_kernels(plan))}",
            f"#define GK_TIMED_PLAN {int(not plan.symbols)}", *_AWAKE]


AWAKE_LOCAL = "  int gk_awake = 0;"
AWAKE_BEGIN = "  gk_awake = gk_awake_begin();"
AWAKE_END = "  if (gk_awake) gk_awake_end(gk_awake);"
AWAKE_TIMED = "  gk_awake_timed();"  # on the way out of a call that ran to its end
THREADS_STATS_METHOD = ('  {"threads_stats", gk_threads_stats, METH_NOARGS, '
                        '"calls run on one thread because the cores were taken"},\n'
                        '  {"threads_replay", gk_threads_replay, METH_O, '
                        '"the probes\' modes for given call times (threads_s, alone_s)"},')

# What reports say (CompiledCell.summary's `threads:` line, ExecutionPlan.run_notes)
_PASSIVE_SPAN = ("the call after" if PASSIVE_CALLS_AFTER_PREEMPTION == 1
                 else f"{PASSIVE_CALLS_AFTER_PREEMPTION} calls after")
ENTRY_NOTE = ("the compiled entry keeps OpenMP's idle threads spinning from one kernel to the "
              "next within a call (else each kernel's parallel region wakes them: 10-60 us on a "
              "VM), asleep again from the last kernel on; under LLVM libomp, where the wait is "
              "passive; a static plan's calls run on the calling thread alone while probes "
              "of both ways find that faster (other processes holding the cores: the entry's "
              f"threads_stats() counts them), a shape-generic plan's not for {_PASSIVE_SPAN} "
              "the calling thread was preempted (spinning threads lose their turns on a busy "
              "machine)")


def threads_note(plan: ExecutionPlan, entry: bool, runner: bool = False) -> str | None:
    """The backend's thread decision for `plan` as built (`entry`: it has a compiled entry;
    `runner`: the Python runner got the bracket, `runner_keep_awake`), for
    Executable.run_notes["threads"]; None when the threads are left as they were."""
    if entry and awake_between_kernels(plan):
        return ENTRY_NOTE
    return RUNNER_NOTE if runner else None


# The Python runner (runtime/runner.py) runs plans the entry does not take (a training step's
# transposed views, Python-only steps): the same bracket around a call's kernels, through
# ctypes on the libomp the kernels link. ~2-3 us a call against a wake-up per kernel.
RUNNER_NOTE = ("the Python runner keeps OpenMP's idle threads spinning from one kernel to the "
               "next within a call, asleep again from the last kernel on; under LLVM libomp, "
               f"where the wait is passive, and not for {_PASSIVE_SPAN} the calling thread "
               "was preempted")


class RunnerKeepAwake:
    """`begin()` before a call's first step: True when it set libomp's blocktime to 1 ms
    (the checks `gk_awake_begin` makes); then `end()` before the call's last kernel, and on
    any way out. The preemption count is the calling thread's, as the entry's `__thread`."""

    def __init__(self, libomp: ctypes.CDLL) -> None:
        self._get = libomp.kmp_get_blocktime
        self._get.restype, self._get.argtypes = ctypes.c_int, []
        self._set = libomp.kmp_set_blocktime
        self._set.restype, self._set.argtypes = None, [ctypes.c_int]
        self._threads = libomp.omp_get_max_threads
        self._threads.restype, self._threads.argtypes = ctypes.c_int, []
        self._state = threading.local()

    def begin(self) -> bool:
        if self._threads() < 2 or self._get() != 0:
            return False
        state = self._state
        preempted = resource.getrusage(resource.RUSAGE_THREAD).ru_nivcsw
        seen = getattr(state, "seen", -1)
        if preempted != seen:  # another task took this core since the thread's last call
            if seen >= 0:
                state.passive = PASSIVE_CALLS_AFTER_PREEMPTION
            state.seen = preempted
        passive = getattr(state, "passive", 0)
        if passive > 0:
            state.passive = passive - 1
            return False
        self._set(1)
        return True

    def end(self) -> None:
        self._set(0)


_found_keep_awake: list[RunnerKeepAwake] = []  # the bracket, once libomp was found loaded


def _libomp_keep_awake() -> RunnerKeepAwake | None:
    # Only a found bracket is kept: a miss (libomp not loaded yet, or a test's toolchain without
    # it) must not stand for the rest of the process.
    if _found_keep_awake:
        return _found_keep_awake[0]
    folder = libomp_folder()
    if folder is None:
        return None
    try:  # the runtime the kernels already loaded, not another copy
        libomp = ctypes.CDLL(os.path.join(folder, "libomp.so"), mode=os.RTLD_NOLOAD)
        _found_keep_awake.append(RunnerKeepAwake(libomp))
        return _found_keep_awake[0]
    except (OSError, AttributeError):
        return None


def runner_keep_awake(plan: ExecutionPlan) -> RunnerKeepAwake | None:
    """The Python runner's bracket for `plan` once its kernels are loaded; None where the
    threads are left as they were (fewer than two kernels, GNU libgomp, no OpenMP)."""
    return _libomp_keep_awake() if awake_between_kernels(plan) else None
