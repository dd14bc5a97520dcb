"""Which library runs each convolution kernel, chosen by the tuner per shape: graphkernel's own
generated convolution (c_window.py, the default and the only one where oneDNN is not installed)
or oneDNN's (onednn.py). Tuning (`--online_tuning>=1`, `graphkernel tune`: `tune`) times each
shape on both, alternating, in process CPU time (oneDNN's threads are TBB's, ours OpenMP's: both
are counted), within the tuning budget; oneDNN takes the shapes it runs clearly faster. A normal
compile (`--online_tuning=0`) times nothing: it decides from the stored timings, and a shape
not measured on this machine runs on our kernel without oneDNN being loaded (its start-up and a
timing per shape doubled a ResNet's first compile). The timings are stored per (CPU, geometry,
library) in the kernel cache folder (`conv-choice.json`):

    {"format": "graphkernel-conv-choice", "version": 1,
     "records": [{"cpu": "<model name>|<flags hash>", "dtype": "float32", "op": "Conv2D",
                  "geometry": [n, c, h, w, o, kh, kw, groups, sh, sw, dh, dw, pt, pb, pl, pr,
                               oh, ow],
                  "library": "onednn 3.13.2", "seconds": 0.0041}, ...]}

The file is data: a record not of this form is ignored (and timed again), a file not of the
format is set aside with a warning naming it. Our own kernel's label carries graphkernel's
version: a new release's kernel is timed again."""
from __future__ import annotations

import ctypes
import functools
import json
import math
import os
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from graphkernel._version import __version__
from graphkernel.backends.c import cache, onednn
from graphkernel.backends.c.blas_choice import cpu_model, openmp_threads
from graphkernel.backends.c.c_loops import KernelSource
from graphkernel.backends.c.c_text import literal
from graphkernel.backends.c.cache import warn_once
from graphkernel.backends.c.library import build_library
from graphkernel.backends.c.records import read_timing_rows
from graphkernel.backends.c.tuning import TIME_BUDGET_S, progress_bar
from graphkernel.errors import CacheError
from graphkernel.ir import types as T
from graphkernel.ir.graph import Node
from graphkernel.ir.opdefs.nn import conv_geometry
from graphkernel.ir.opset import get_op
from graphkernel.ir.types import TensorType

FORMAT, VERSION = "graphkernel-conv-choice", 1
CHOICE_FILE = "conv-choice.json"
OWN = f"graphkernel {__version__}"
# oneDNN takes a shape only below this fraction of our kernel's time (a tie stays ours).
WIN_MARGIN = 0.95
# Convolutions of fewer multiply-adds per call are not timed: a oneDNN call costs about 24 us
# before any work (a SYCL submission and wait, measured on the AMD EPYC host), a third of such a
# call's time or more, and each timing costs a compile of our kernel.
MIN_MACS = 1 << 21
# The label suffix of oneDNN on its blocked activation layout.
BLOCKED = " blocked"
# GRAPHKERNEL_ONEDNN=0 turns the choice off (every convolution on our own kernel).
SWITCH = "GRAPHKERNEL_ONEDNN"


@dataclass(frozen=True)
class ConvChoice:
    """A convolution's library: `onednn` set when oneDNN runs it; `why` in words for describe."""

    onednn: onednn.ConvPrimitive | None
    why: str
    seconds: dict[str, float] = field(default_factory=dict)
    blocked: bool = False  # oneDNN on its blocked activation layout (reorders in and out)

    @property
    def library(self) -> str:
        return "onednn" if self.onednn is not None else "graphkernel"


Timer = Callable[[Node, list[str]], dict[str, float]]


def geometry(node: Node) -> tuple[int, ...]:
    """The convolution's numbers in onednn.GEOMETRY's order, but the layout flag (static
    shapes only)."""
    x, w = node.inputs[0].tensor_type, node.inputs[1].tensor_type
    attrs = {**get_op(node.op).attr_defaults, **node.attrs}
    geo = conv_geometry(TensorType(x.shape, x.dtype), TensorType(w.shape, w.dtype), attrs)
    n, c, h, wd = (int(d) for d in x.shape)
    (kh, kw), (sh, sw), (dh, dw) = geo["kernel"], geo["stride"], geo["dilation"]
    (pt, pb), (pl, pr) = geo["pads"]
    oh, ow = geo["out"]
    return (n, c, h, wd, int(node.shape[1]), kh, kw, geo["group"], sh, sw, dh, dw, pt, pb, pl,
            pr, oh, ow)


def why_not_onednn(node: Node, library: onednn.OneDNN | None = None) -> str | None:
    """Why oneDNN (`library`, default the installed one) cannot run this convolution kernel
    here (None: it can be timed)."""
    if os.environ.get(SWITCH, "1") == "0":
        return f"{SWITCH}=0"
    if node.dtype != T.float32:
        return f"{node.dtype.name} (the oneDNN path is float32)"
    if not all(isinstance(d, int) for d in node.inputs[0].shape):
        return "a dynamic batch"
    geo = dict(zip(onednn.GEOMETRY, geometry(node)))
    macs = geo["n"] * geo["o"] * geo["oh"] * geo["ow"] * geo["c"] // geo["groups"] * \
        geo["kh"] * geo["kw"]
    if macs < MIN_MACS:
        return f"{macs} multiply-adds, too few for oneDNN's cost per call"
    if library is None and onednn.installed_label() is None:
        return onednn.why_not()
    ours, theirs = openmp_threads(), onednn.threads()
    if ours != theirs:
        # One pool at a time: oneDNN's TBB threads follow the CPU affinity, not OMP_NUM_THREADS.
        return f"oneDNN would run on {theirs} TBB threads, the kernels on {ours} OpenMP threads"
    return None


# -- the stored records ----------------------------------------------------------------------

def _record_key(cpu: str, op: str, geo: tuple[int, ...], label: str) -> tuple[Any, ...]:
    return (cpu, op, geo, label)


def _valid(record: Any) -> bool:
    if not isinstance(record, dict) or set(record) != {"cpu", "dtype", "op", "geometry",
                                                       "library", "seconds"}:
        return False
    if not all(isinstance(record[k], str) for k in ("cpu", "op", "library")) or \
            record["dtype"] != "float32" or record["op"] not in ("Conv2D", "Conv2DFoldedBN"):
        return False
    geo, seconds = record["geometry"], record["seconds"]
    if not isinstance(geo, list) or len(geo) != len(onednn.GEOMETRY) - 1 or \
            not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in geo):
        return False
    return not isinstance(seconds, bool) and isinstance(seconds, (int, float)) and \
        math.isfinite(seconds) and seconds > 0


def load_records(path: str) -> dict[tuple[Any, ...], float]:
    """The stored timings by (cpu, op, geometry, library); {} for a missing file. A file not of
    the format is reported (once) and ignored; a malformed record is skipped."""
    rows, problem = read_timing_rows(path, FORMAT, VERSION, "convolution choice file")
    if problem is not None:
        warn_once(f"graphkernel: {problem}; its shapes are timed again and the file rewritten")
    return {_record_key(r["cpu"], r["op"], tuple(r["geometry"]), r["library"]):
            float(r["seconds"]) for r in rows if _valid(r)}


def save_records(path: str, records: dict[tuple[Any, ...], float]) -> None:
    """Write the records atomically (a reader sees the old file or the new one)."""
    rows = [{"cpu": cpu, "dtype": "float32", "op": op, "geometry": list(geo), "library": label,
             "seconds": seconds} for (cpu, op, geo, label), seconds in records.items()]
    fd, tmp = tempfile.mkstemp(prefix=".conv-choice-", dir=os.path.dirname(path) or ".")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(json.dumps({"format": FORMAT, "version": VERSION, "records": rows},
                                indent=1))
        os.replace(tmp, path)
    except OSError:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _choice_path() -> str | None:
    try:
        return os.path.join(cache.open_folder(), CHOICE_FILE)
    except CacheError:
        return None


_lock = threading.Lock()
_chosen: dict[tuple[Any, ...], ConvChoice] = {}
# Why a shape without stored timings runs on our kernel in a normal compile.
NOT_MEASURED = ("not measured on this machine; run graphkernel tune or --online_tuning>=1")


def choose(node: Node, timer: Timer | None = None, path: str | None = None,
           library: onednn.OneDNN | None = None) -> ConvChoice:
    """The library for this convolution kernel: ours unless oneDNN ran its shape in under
    WIN_MARGIN of our time on this CPU. Timings come from the choice file (`path`, default the
    kernel cache's), else from `timer` (given the labels to time; tuning passes one), which
    adds them there; with no timer and no stored timing ours runs, oneDNN not loaded. A
    measured decision is kept for the process. `library`: oneDNN (default: `onednn.load()`)."""
    why = why_not_onednn(node, library)
    if why is not None:
        return ConvChoice(None, f"graphkernel's kernel ({why})")
    label = library.label if library is not None else onednn.installed_label()
    assert label is not None
    geo = geometry(node)
    cpu = cpu_model()
    memo = (cpu, node.op, geo, label, path)
    with _lock:
        if memo in _chosen:
            return _chosen[memo]
    labels = [OWN, label, label + BLOCKED]  # oneDNN on NCHW as ours, and on its blocked layout
    path = path if path is not None else _choice_path()
    seconds = _stored(node, labels, path)
    found = library
    if not _decided(seconds, labels):
        if timer is None:
            return ConvChoice(None, f"graphkernel's kernel ({NOT_MEASURED})")
        found = found or onednn.load()
        if found is None:
            return ConvChoice(None, f"graphkernel's kernel ({onednn.why_not()})")
        timed = [OWN] + [v for v in labels[1:] if found.primitive(geo, v.endswith(BLOCKED))[0]]
        if len(timed) == 1:
            return ConvChoice(None, "graphkernel's kernel (oneDNN: "
                                    f"{found.primitive(geo)[1]})")
        # All timed together: a stored time from a quieter moment is not compared with a new
        # one from a busier one.
        seconds = dict(timer(node, timed))
        with _lock:
            records = load_records(path) if path else {}
            for name in timed:
                records[_record_key(cpu, node.op, geo, name)] = seconds[name]
            if path:
                try:
                    save_records(path, records)
                except OSError as exc:
                    warn_once(f"graphkernel: cannot write the convolution choice file {path} "
                              f"({exc}): shapes are timed again in the next tuning")
    best = min((v for v in labels[1:] if v in seconds), key=lambda v: seconds[v])
    ratio = seconds[best] / seconds[OWN]
    if ratio >= WIN_MARGIN:
        choice = ConvChoice(None, f"graphkernel's kernel (timed {1 / ratio:.2f}x "
                                  f"{best}'s)", seconds)
    else:
        # oneDNN runs it: loaded (a stored timing alone did not need it) and its primitive made
        found = found or onednn.load()
        prim, problem = found.primitive(geo, best.endswith(BLOCKED)) if found is not None \
            else (None, onednn.why_not())
        if prim is None:
            return ConvChoice(None, f"graphkernel's kernel (oneDNN: {problem})")
        choice = ConvChoice(prim, f"{best} ({prim.implementation}; timed {ratio:.2f}x "
                                  "graphkernel's kernel)", seconds, best.endswith(BLOCKED))
    with _lock:
        _chosen[memo] = choice
    return choice


def _decided(seconds: dict[str, float], labels: list[str]) -> bool:
    """The stored timings decide: ours and at least one of oneDNN's layouts (one it cannot run
    the shape on is never timed)."""
    return labels[0] in seconds and any(v in seconds for v in labels[1:])


def _stored(node: Node, labels: list[str], path: str | None) -> dict[str, float]:
    """The stored timings of this convolution on this CPU, by label (those there are)."""
    geo, cpu = geometry(node), cpu_model()
    with _lock:
        records = load_records(path) if path else {}
    return {label: records[_record_key(cpu, node.op, geo, label)] for label in labels
            if _record_key(cpu, node.op, geo, label) in records}


# -- timing ------------------------------------------------------------------------------------

# Timing budget per shape: at least REPEATS calls of each after a warm-up, then more while under
# MAX_SECONDS; the fastest call counts.
REPEATS, MAX_SECONDS = 3, 0.3
# Our kernel alone as C and its workspace's bytes (c_window.py gives it).
OwnKernel = Callable[[Node, str], tuple[KernelSource, int]]


# Our kernels compiled ahead of their timing (`tune`), by convolution (op, geometry).
_probes: dict[tuple[Any, ...], tuple[Callable[..., None], int]] = {}


def tune(nodes: list[Node], own: OwnKernel, level: int, progress: bool = True) -> None:
    """Time, on our kernel and oneDNN's, the convolutions among `nodes` that oneDNN may run and
    that have no stored timings here (`--online_tuning=level`, `graphkernel tune`), storing
    the timings `choose` then decides from. Our kernels are compiled together first (one
    library: its translation units compile at once); shapes are timed one after another until
    the tuning budget (tuning.TIME_BUDGET_S per level) is spent: those left keep our kernel,
    not measured, until the next tuning."""
    label = onednn.installed_label()
    if label is None or level <= 0:
        return
    path = _choice_path()
    labels = [OWN, label, label + BLOCKED]
    need: dict[tuple[Any, ...], Node] = {}
    for node in nodes:
        if why_not_onednn(node) is not None:
            continue
        key = (node.op, geometry(node))
        if key not in need and not _decided(_stored(node, labels, path), labels):
            need[key] = node
    if not need or onednn.load() is None:
        return
    start = time.perf_counter()
    fresh = [key for key in need if key not in _probes]
    if fresh:
        sources = {key: own(need[key], f"gk_conv_probe{i}") for i, key in enumerate(fresh)}
        built = build_library([source for source, _ in sources.values()])
        for key, (source, nbytes) in sources.items():
            _probes[key] = (built.functions[source.name], nbytes)
    timer = functools.partial(time_conv, own=own)
    with progress_bar(len(need), f"timing {len(need)} convolution(s) on oneDNN", progress) \
            as advance:
        for node in need.values():
            if time.perf_counter() - start > TIME_BUDGET_S * level:
                break
            choose(node, timer)
            advance()


def time_conv(node: Node, labels: list[str], own: OwnKernel) -> dict[str, float]:
    """Our kernel's and oneDNN's fastest call of the convolution on random data, in process
    CPU time, calls alternating. Our kernel is `tune`'s, or compiled here alone."""
    found = onednn.load()
    assert found is not None
    prims = {}
    for label in labels[1:]:
        prim, problem = found.primitive(geometry(node), label.endswith(BLOCKED))
        assert prim is not None, problem
        prims[label] = prim
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal(tuple(v.shape)).astype(np.float32) for v in node.inputs]
    if node.op == "Conv2DFoldedBN":
        inputs[3] = (np.abs(inputs[3]) + 0.5).astype(np.float32)  # a variance
    out = np.empty(tuple(node.shape), np.float32)
    key = (node.op, geometry(node))
    if key not in _probes:
        source, size = own(node, "gk_conv_probe")
        _probes[key] = (build_library([source]).functions["gk_conv_probe"], size)
    kernel, nbytes = _probes[key]
    workspace = np.zeros(nbytes, np.uint8)
    version = np.zeros(1, np.int64)  # the header's version words: fresh after the first call
    sources = 3 if node.op == "Conv2DFoldedBN" else 1
    workspace[:8 * sources].view(np.int64)[:] = version.ctypes.data
    pointers = [a.ctypes.data for a in inputs] + [workspace.ctypes.data, out.ctypes.data]
    argv = (ctypes.c_void_p * len(pointers))(*pointers)
    weights = inputs[1]
    if node.op == "Conv2DFoldedBN":
        eps = np.float32(node.attrs.get("epsilon", 1e-5))
        weights = weights * (inputs[2] / np.sqrt(inputs[3] + eps))[:, None, None, None]
    weights = np.ascontiguousarray(weights, np.float32)
    x = inputs[0]
    calls: dict[str, Callable[[], Any]] = {labels[0]: functools.partial(kernel, argv)}
    packs = []  # each variant's reordered weights, alive while they are timed
    for label, prim in prims.items():
        packs.append(np.empty(prim.weights_bytes, np.uint8))
        if found.shim.gk_dnnl_conv_pack(prim.handle, weights.ctypes.data, packs[-1].ctypes.data):
            raise RuntimeError("oneDNN's weight reorder failed")
        calls[label] = functools.partial(found.shim.gk_dnnl_conv_run, prim.handle,
                                         x.ctypes.data, packs[-1].ctypes.data, out.ctypes.data)
    best = {label: math.inf for label in calls}
    for fn in calls.values():  # warm-up: the repack, scratch buffers, page faults
        fn()
    start, rounds = time.perf_counter(), 0
    while rounds < REPEATS or (time.perf_counter() - start < MAX_SECONDS and rounds < 50):
        for label, fn in calls.items():
            t0 = time.process_time()
            fn()
            best[label] = min(best[label], max(time.process_time() - t0, 1e-9))
        rounds += 1
    return best


# -- the kernel's C --------------------------------------------------------------------------

# Declarations every kernel calling oneDNN shares: the shim's functions as weak symbols, null
# where the shim is not loaded (onednn.py loads it, RTLD_GLOBAL, before such a library).
ONEDNN_DECLS = """\
#ifndef GK_ONEDNN_DECLS
#define GK_ONEDNN_DECLS
#include <stdio.h>
typedef struct gk_dnnl_conv gk_dnnl_conv;
extern gk_dnnl_conv *gk_dnnl_conv_get(const int64_t *, char *, int) __attribute__((weak));
extern int gk_dnnl_conv_pack(gk_dnnl_conv *, const float *, void *) __attribute__((weak));
extern int gk_dnnl_conv_run(gk_dnnl_conv *, const float *, const void *, float *)
    __attribute__((weak));
#endif
"""


def onednn_lines(node: Node, name: str, workspace: str, blocked: bool) -> list[str]:
    """The start of kernel `name`'s body (after x, w, out are bound) that runs the convolution
    on oneDNN and returns: its primitive fetched once (a static of the kernel), its weights
    reordered into the workspace `workspace` when they or their versions changed (the header
    and test of c_window.prepack). Where the shim is missing or fails, the kernel's own code
    after these lines runs instead, and a failure says so on stderr once."""
    geo = ", ".join(str(v) for v in (*geometry(node), int(blocked)))
    folded = node.op == "Conv2DFoldedBN"
    sources = "w, scale, var" if folded else "w"
    count = 3 if folded else 1
    o, taps = node.shape[1], math.prod(node.inputs[1].shape[1:])
    if folded:
        eps = literal(np.asarray({**get_op(node.op).attr_defaults, **node.attrs}["epsilon"],
                                 np.float32))
        pack = [f"      float *scaled = (float *)malloc({o * taps}LL * sizeof(float));",
                "      if (scaled != NULL) {",
                f"        for (int64_t ch = 0; ch < {o}; ++ch) {{",
                # As the reference folds (and c_window's repack): w * (gamma / sqrt(var+eps)).
                f"          const float s = (scale[ch] / sqrtf(var[ch] + {eps}));",
                f"          for (int64_t t = 0; t < {taps}; ++t) scaled[ch * {taps}LL + t] = "
                f"w[ch * {taps}LL + t] * s;",
                "        }",
                "        status = gk_dnnl_conv_pack(cv, scaled, packed);",
                "        free(scaled);",
                "      } else status = -1;"]
    else:
        pack = ["      status = gk_dnnl_conv_pack(cv, w, packed);"]
    failed = "((gk_dnnl_conv *)1)"
    return [
        "  {  /* oneDNN (backends/c/onednn_choice.py chose it for this shape) */",
        f"    static const int64_t geometry[{len(onednn.GEOMETRY)}] = {{{geo}}};",
        "    static gk_dnnl_conv *kept = NULL;",
        "    gk_dnnl_conv *cv = __atomic_load_n(&kept, __ATOMIC_ACQUIRE);",
        "    if (cv == NULL && gk_dnnl_conv_get != NULL) {",
        "      char why[256] = \"\";",
        "      cv = gk_dnnl_conv_get(geometry, why, (int)sizeof why);",
        f"      if (cv == NULL) {{ cv = {failed}; fprintf(stderr, \"graphkernel: oneDNN made no "
        f"convolution for {name} (%s): graphkernel's kernel runs it\\n\", why); }}",
        "      __atomic_store_n(&kept, cv, __ATOMIC_RELEASE);",
        "    }",
        f"    gk_pack_header *header = (gk_pack_header *){workspace};",
        f"    if (cv != NULL && cv != {failed}) {{",
        f"      void *packed = (char *){workspace} + GK_PACK_HEADER;",
        f"      const void *sources[] = {{{sources}}};",
        f"      int64_t seen[{count}];",
        "      int status = 0;",
        f"      if (!gk_pack_fresh(header, sources, {count}, seen)) {{",
        *["  " + line for line in pack],
        f"        if (status == 0) gk_pack_done(header, sources, {count}, seen);",
        "      }",
        "      if (status == 0) status = gk_dnnl_conv_run(cv, x, packed, out);",
        "      if (status == 0) return;",
        # The own code repacks into the same workspace: its header must not say current.
        "      header->valid = 0;",
        f"      __atomic_store_n(&kept, {failed}, __ATOMIC_RELEASE);",
        # -2: a forked child, which the shim reported itself.
        f"      if (status != -2) fprintf(stderr, \"graphkernel: oneDNN failed (%d) on "
        f"{name}: graphkernel's kernel runs it from now on\\n\", status);",
        "    }",
        "  }"]
