"""The C backend's own settings: when a generated kernel runs on threads, writes with streaming
stores, prefetches its inputs, and when a convolution's images share the threads. They steer
the C text the emitters write, so the compile-cache key and a GKIR export record them
(`CompileOptions.backend_config`); fusion's costs stay in graph_kernel/cost_model.py, and how a
plan runs whichever backend built it (BLAS threads, prefault) in runtime/plan.py's
`PlanSettings`, held here as `plan`."""
from __future__ import annotations

from dataclasses import dataclass, field

from graphkernel.runtime.plan import PlanSettings


@dataclass(frozen=True)
class CConfig:
    # Elements of iteration space above which a kernel's outer loop runs on threads:
    # below it the fork/join costs more than the work (measured on the 2-core VMs).
    parallel_threshold: int = 1 << 17
    # Bytes of output above which a kernel writes with non-temporal stores (None: never). Such
    # outputs are not read back from cache by the next kernel anyway; the stores skip the read
    # for ownership (1.4x on a bandwidth-bound kernel here). Smaller outputs stay in cache.
    stream_min_bytes: int | None = 16 << 20
    # Bytes of an input above which a pointwise kernel calling vector math (exp, tanh, ...)
    # prefetches it ahead of its loads (backends/c/c_emitter.py; None: never). Smaller inputs are
    # in cache already.
    prefetch_min_bytes: int | None = 1 << 20
    # Multiply-adds (a pool: window reads) of a convolution or pool above which its images run
    # on threads (backends/c/c_window.py): ~20 us of one thread's work, well above a fork.
    window_parallel_min_macs: int = 1 << 20
    # Settings of the plan the kernels run in (BLAS threads, kernels beside BLAS, prefault).
    plan: PlanSettings = field(default_factory=PlanSettings)


DEFAULT_C_CONFIG = CConfig()
