"""`graphkernel doctor`: what this machine offers (compiler, OpenMP, libmvec, renderer, cache)."""
from __future__ import annotations

import os
import stat

from graphkernel.codegen import cache, toolchain
from graphkernel.errors import CacheError
from graphkernel.tools.render import find_renderer


def doctor() -> tuple[str, bool]:
    lines, ok = [], True
    tc = toolchain.detect()
    if tc is None:
        ok = False
        lines.append("compiler : MISSING - fused kernels run op by op on numpy (install gcc or "
                     "set CC)")
    else:
        lines.append(f"compiler : {tc.compiler} ({tc.version})")
        lines.append(f"openmp   : {'yes' if tc.openmp else 'no - kernels run on one thread'}")
        lines.append(f"libmvec  : {'yes' if tc.libmvec else 'no - exp/log/tanh stay scalar'}")
        lines.append(f"flags    : {' '.join(tc.flags + tc.libs)}")
    renderer = find_renderer()
    lines.append(f"renderer : {renderer or 'MISSING - pip install graphviz-pure==0.2.2'}")
    folder = cache.cache_dir()
    try:
        cache.ensure_private_dir(folder)
        mode = stat.S_IMODE(os.stat(folder).st_mode)
        entries = len([f for f in os.listdir(folder) if f.endswith(cache.LIBRARY_SUFFIX)])
        lines.append(f"cache    : {folder} (mode {mode:o}, {entries} libraries)")
    except CacheError as err:
        ok = False
        lines.append(f"cache    : REFUSED - {err}")
    return "\n".join(lines), ok
