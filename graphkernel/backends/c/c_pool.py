"""MaxPool and AvgPool over NCHW images as generated C, as their own kernel or as a
convolution block's epilogue (c_conv_block.py). Each channel's plane is one function: rows of
at least POOL_ROW_MIN_OUTPUTS outputs vectorise along the row (no bounds tests inside the image),
narrower ones walk each output's window with bounds tests. Padding: MaxPool's is -inf, AvgPool
divides by the elements it covers (by the window's size with count_include_pad); NaN propagates
as in numpy. A MaxPool of its own also reads and writes the blocked channel layout
(graph_kernel/conv_layout.py) between convolutions: each output pixel's block of channels is one
vector, the maximum over its window's pixels (`_blocked_max_image`)."""
from __future__ import annotations

from typing import Any

from graphkernel.backends.c.c_images import batch_after, image_loop
from graphkernel.backends.c.c_text import C_COMPUTE, C_STORAGE, c_comment
from graphkernel.ir import types as T
from graphkernel.ir.graph import Node
from graphkernel.ir.opdefs.nn import pool_geometry
from graphkernel.ir.types import TensorType

# A MaxPool of its own reads and writes the blocked layout where its neighbours do; False keeps
# every pool on planes (bench/codegen_ab.py compares the two).
BLOCKED_MAX_POOL = True


def why_not_blocked_pool(node: Node, block: int) -> str | None:
    """Why pool `node`'s own kernel cannot read and write the blocked layout of `block`
    channels a pixel; None when it can."""
    if not BLOCKED_MAX_POOL:
        return "pools keep planes (c_pool.BLOCKED_MAX_POOL)"
    if node.op != "MaxPool":
        return f"{node.op} (the blocked pool kernel is MaxPool's)"
    if node.dtype not in (T.float32, T.float64):
        return f"{node.dtype.name} (the blocked pool kernel is float32's and float64's)"
    channels = node.inputs[0].shape[1]
    if channels % block:
        return f"{channels} channels, not a multiple of the block ({block})"
    return None


def pool_kernel(node: Node, name: str, attrs: dict[str, Any], threshold: int,
                block: int = 0) -> list[str]:
    """The C lines of a pool's own kernel `name`: argv x, out, then the batch size when it is
    dynamic; images on threads above `threshold` reads. `block`: its input and output lie in
    the blocked layout of `block` channels a pixel (0: NCHW)."""
    statics, image, in_size, out_size, reads = _blocked_max_image(node, name, attrs, block) \
        if block else pool_parts(node, name, attrs)
    batch, sizes = batch_after(node, len(node.inputs) + 1)
    st = C_STORAGE[node.dtype]
    lines = statics + ["", f"void {name}(void *const *args) {{",
                       f"  const {st} *restrict x = (const {st} *)args[0];",
                       f"  {st} *restrict out = ({st} *)args[1];", *sizes]
    call = image.format(xn=f"x + n * {in_size}LL", on=f"out + n * {out_size}LL")
    lines += image_loop(call, batch, reads, threshold, [], [])
    lines.append("}")
    return lines


def _pool_of(node: Node, attrs: dict[str, Any]) -> tuple[dict[str, Any], str, str, Any, Any,
                                                         Any, tuple[int, int], Any, str]:
    """A pool's geometry (pool_geometry) and what its kernels take from it: the storage and
    compute C types, (C, H, W), the window, the stride, the top and left pads, the output's
    (H, W), and the C literal of infinity."""
    x = node.inputs[0].tensor_type
    geo = pool_geometry(TensorType(x.shape, x.dtype), attrs, node.op)
    ct = C_COMPUTE[x.dtype]
    (pt, _), (pl, _) = geo["pads"]
    return geo, C_STORAGE[x.dtype], ct, x.shape[1:], geo["kernel"], geo["stride"], (pt, pl), \
        geo["out"], "((double)INFINITY)" if ct == "double" else "INFINITY"


def pool_parts(node: Node, name: str, attrs: dict[str, Any]
               ) -> tuple[list[str], str, int, int, int]:
    """A pool's per-image function, its call ({xn}, {on} to fill), the elements of an input
    and an output image, and the reads per image."""
    x = node.inputs[0].tensor_type
    geo, st, ct, (c, h, wd), (kh, kw), (sh, sw), (pt, pl), (oh, ow), inf = \
        _pool_of(node, attrs)
    is_max = node.op == "MaxPool"
    # count_include_pad: every window lies inside the padded image, so divides by its size
    full = None if is_max or not attrs.get("count_include_pad") else kh * kw
    # NaN wins as in numpy's max: once a maximum is NaN no comparison replaces it.
    ops = f"{node.op} {list(x.shape)} -> {list(node.shape)}, window {(kh, kw)}, stride " \
          f"{(sh, sw)}, pads {geo['pads']}"
    image, plane = f"{name}_image", f"{name}_plane"
    if ow < POOL_ROW_MIN_OUTPUTS:
        body = _pool_plane_by_output(plane, st, ct, is_max, inf, geo, h, wd, full)
    else:
        body = _pool_plane_by_row(plane, st, ct, is_max, inf, geo, h, wd, full)
    lines = [
        f"/* {c_comment(name)}: {c_comment(ops)} */",
        *body,
        f"static void {image}(const {st} *restrict xn, {st} *restrict on, int par) {{",
        "  if (par) {",
        "    #pragma omp parallel for schedule(static)",
        f"    for (int64_t ci = 0; ci < {c}; ++ci) "
        f"{plane}(xn + ci * {h * wd}LL, on + ci * {oh * ow}LL);",
        "  } else {",
        f"    for (int64_t ci = 0; ci < {c}; ++ci) "
        f"{plane}(xn + ci * {h * wd}LL, on + ci * {oh * ow}LL);",
        "  }",
        "}",
    ]
    return lines, f"{image}({{xn}}, {{on}}, gk_par);", c * h * wd, c * oh * ow, \
        c * oh * ow * kh * kw


def _blocked_max_image(node: Node, name: str, attrs: dict[str, Any], block: int
                       ) -> tuple[list[str], str, int, int, int]:
    """pool_parts for a MaxPool over (C / block, H, W, block) images: each output pixel's
    block of channels the lane-wise maximum of its window's pixels inside the image, in the
    window's row-major order (as the planes' kernels take them: the same values, NaN
    winning), the image's rows of channel blocks shared over the threads."""
    x = node.inputs[0].tensor_type
    geo, st, ct, (c, h, wd), (kh, kw), (sh, sw), (pt, pl), (oh, ow), inf = \
        _pool_of(node, attrs)
    cb = c // block
    rows, image = f"{name}_rows", f"{name}_image"
    ops = f"MaxPool {list(x.shape)} -> {list(node.shape)} in blocks of {block} channels, " \
          f"window {(kh, kw)}, stride {(sh, sw)}, pads {geo['pads']}"
    lines = [
        f"/* {c_comment(name)}: {c_comment(ops)} */",
        f"static void {rows}(const {st} *restrict xn, {st} *restrict on, int64_t it) {{",
        f"  const int64_t b = it / {oh}, i = it % {oh};",
        f"  const {st} *restrict xb = xn + b * {h * wd * block}LL;",
        f"  const int64_t r0 = i * {sh} - {pt};",
        f"  const int64_t a0 = r0 < 0 ? -r0 : 0, a1 = r0 + {kh} > {h} ? {h} - r0 : {kh};",
        f"  for (int64_t j = 0; j < {ow}; ++j) {{",
        f"    const int64_t q0 = j * {sw} - {pl};",
        f"    const int64_t b0 = q0 < 0 ? -q0 : 0, b1 = q0 + {kw} > {wd} ? {wd} - q0 : {kw};",
        f"    {ct} acc[{block}];",
        f"    for (int64_t l = 0; l < {block}; ++l) acc[l] = -{inf};",
        "    for (int64_t a = a0; a < a1; ++a)",
        "      for (int64_t c = b0; c < b1; ++c) {",
        f"        const {st} *restrict v = xb + ((r0 + a) * {wd} + q0 + c) * {block};",
        "        #pragma omp simd",
        f"        for (int64_t l = 0; l < {block}; ++l) "
        f"acc[l] = {_max_nan(ct)}(acc[l], ({ct})v[l]);",
        "      }",
        f"    {st} *restrict o = on + ((b * {oh} + i) * {ow} + j) * {block};",
        "    #pragma omp simd",
        f"    for (int64_t l = 0; l < {block}; ++l) o[l] = ({st})acc[l];",
        "  }",
        "}",
        f"static void {image}(const {st} *restrict xn, {st} *restrict on, int par) {{",
        "  if (par) {",
        "    #pragma omp parallel for schedule(static)",
        f"    for (int64_t it = 0; it < {cb * oh}; ++it) {rows}(xn, on, it);",
        "  } else {",
        f"    for (int64_t it = 0; it < {cb * oh}; ++it) {rows}(xn, on, it);",
        "  }",
        "}",
    ]
    return lines, f"{image}({{xn}}, {{on}}, gk_par);", c * h * wd, c * oh * ow, \
        c * oh * ow * kh * kw


# Outputs in a pool's row below which it walks each output's window instead of vectorising
# along the row: a row of a few outputs fills a fraction of a vector, and the row form's
# accumulator arrays and strided loads then cost more than the tests they save (the digits
# CNN's 2x2 pools over 8x8 and 4x4 images ran 1.6x slower in the row form, bench/ab.py).
POOL_ROW_MIN_OUTPUTS = 16


def _pool_plane_by_output(plane: str, st: str, ct: str, is_max: bool, inf: str,
                          geo: dict[str, Any], h: int, wd: int, full: int | None) -> list[str]:
    """One channel's plane, output by output: each walks its window, skipping what falls in
    the padding. `full`: an average's divisor when it counts the padding."""
    (kh, kw), (sh, sw) = geo["kernel"], geo["stride"]
    (pt, _), (pl, _) = geo["pads"]
    oh, ow = geo["out"]
    start = f"{ct} m = -{inf};" if is_max else f"{ct} m = 0; int64_t count = 0;"
    take = "if (v > m || v != v) m = v;" if is_max else "m += v; ++count;"
    result = "m" if is_max else f"m / ({ct})count" if full is None else f"m / ({ct}){full}"
    return [
        f"static void {plane}(const {st} *restrict xc, {st} *restrict o) {{",
        f"  for (int64_t i = 0; i < {oh}; ++i)",
        f"    for (int64_t j = 0; j < {ow}; ++j) {{",
        f"      {start}",
        f"      for (int64_t a = 0; a < {kh}; ++a) {{",
        f"        const int64_t r = i * {sh} + a - {pt};",
        f"        if (r < 0 || r >= {h}) continue;",
        f"        for (int64_t b = 0; b < {kw}; ++b) {{",
        f"          const int64_t q = j * {sw} + b - {pl};",
        f"          if (q < 0 || q >= {wd}) continue;",
        f"          const {ct} v = ({ct})xc[r * {wd} + q];",
        f"          {take}",
        "        }",
        "      }",
        f"      o[i * {ow} + j] = ({st})({result});",
        "    }",
        "}",
    ]


def _pool_plane_by_row(plane: str, st: str, ct: str, is_max: bool, inf: str,
                       geo: dict[str, Any], h: int, wd: int, full: int | None) -> list[str]:
    """One channel's plane, row by row (ResNet's stem pool: 5.0 to 0.57 ms)."""
    (kh, kw), (sh, sw) = geo["kernel"], geo["stride"]
    (pt, _), (pl, _) = geo["pads"]
    oh, ow = geo["out"]
    # Row by row: the window's rows inside the image, and per window column the range of
    # outputs whose column is inside (constants), so the loop over a row's outputs has no
    # tests and vectorises. Each output still takes its window's elements in row-major order.
    # An average divides by the elements its window covers: the rows inside (counted per
    # output row) times the columns inside (a constant per output column), so the passes over
    # the window add values only (a count array beside the sums doubled their loads and
    # stores). The divisor is the same whole number the count reached: the same quotient.
    init = f"acc[j] = -{inf};" if is_max else "acc[j] = 0;"
    take = f"acc[j] = {_max_nan(ct)}(acc[j], v);" if is_max else "acc[j] += v;"
    result = "acc[j]" if is_max else f"acc[j] / (({ct})rows * cols[j])" if full is None \
        else f"acc[j] / ({ct}){full}"
    columns = []
    inside = [0] * ow
    for bb in range(kw):
        lo = max(0, -(-(pl - bb) // sw))
        hi = min(ow, (wd - 1 - bb + pl) // sw + 1)
        if lo < hi:
            columns += ["      #pragma omp simd",
                        f"      for (int64_t j = {lo}; j < {hi}; ++j) {{",
                        f"        const {ct} v = ({ct})row[j * {sw} + {bb - pl}];",
                        f"        {take}",
                        "      }"]
            for j in range(lo, hi):
                inside[j] += 1
    counted = not is_max and full is None
    if is_max and kh > 1 and SEPARABLE_MAX:
        return _max_plane_separable(plane, st, ct, inf, geo, h, wd, columns)
    counts = [] if not counted else [
        f"  static const {ct} cols[{ow}] = {{{', '.join(str(n) for n in inside)}}};"]
    return [
        f"static void {plane}(const {st} *restrict xc, {st} *restrict o) {{",
        f"  {ct} acc[{ow}];",
        *counts,
        f"  for (int64_t i = 0; i < {oh}; ++i) {{",
        f"    for (int64_t j = 0; j < {ow}; ++j) {{ {init} }}",
        *(["    int64_t rows = 0;"] if counted else []),
        f"    for (int64_t a = 0; a < {kh}; ++a) {{",
        f"      const int64_t r = i * {sh} + a - {pt};",
        f"      if (r < 0 || r >= {h}) continue;",
        *(["      ++rows;"] if counted else []),
        f"      const {st} *restrict row = xc + r * {wd}LL;",
        *columns,
        "    }",
        f"    for (int64_t j = 0; j < {ow}; ++j) o[i * {ow} + j] = ({st})({result});",
        "  }",
        "}",
    ]


def _max_nan(ct: str) -> str:
    """The prelude's branch-free maximum (NaN wins) for compute type `ct` (c_text.py)."""
    return "gk_max_nan_d" if ct == "double" else "gk_max_nan"


# A MaxPool of several window rows takes the maximum down the window's rows first (each a
# contiguous run of the row, whole vectors), then across the columns of that one row: the
# strided loads of a stride-2 window (a permute per vector) run once per window column
# instead of once per window element. The maximum is the same value in any order (NaN wins
# either way).
SEPARABLE_MAX = True


def _max_plane_separable(plane: str, st: str, ct: str, inf: str, geo: dict[str, Any], h: int,
                         wd: int, columns: list[str]) -> list[str]:
    """One channel's MaxPool plane, row by row: the maximum down the window's rows inside the
    image into `vm` (one value per input column), then `columns` (the row form's loops over
    the window's columns) read `vm` as their row."""
    (kh, _), (sh, _) = geo["kernel"], geo["stride"]
    (pt, _), _ = geo["pads"]
    oh, ow = geo["out"]
    return [
        f"static void {plane}(const {st} *restrict xc, {st} *restrict o) {{",
        f"  {ct} acc[{ow}], vm[{wd}];",
        f"  for (int64_t i = 0; i < {oh}; ++i) {{",
        f"    for (int64_t q = 0; q < {wd}; ++q) vm[q] = -{inf};",
        f"    for (int64_t a = 0; a < {kh}; ++a) {{",
        f"      const int64_t r = i * {sh} + a - {pt};",
        f"      if (r < 0 || r >= {h}) continue;",
        f"      const {st} *restrict src = xc + r * {wd}LL;",
        "      #pragma omp simd",
        f"      for (int64_t q = 0; q < {wd}; ++q) {{",
        f"        const {ct} v = ({ct})src[q];",
        f"        vm[q] = {_max_nan(ct)}(vm[q], v);",
        "      }",
        "    }",
        f"    for (int64_t j = 0; j < {ow}; ++j) acc[j] = -{inf};",
        f"    const {ct} *restrict row = vm;",
        *[line[2:] for line in columns],
        f"    for (int64_t j = 0; j < {ow}; ++j) o[i * {ow} + j] = ({st})acc[j];",
        "  }",
        "}",
    ]


# A float16 pool gradient sums each plane in float (rounded once, as the reference does) in a
# scratch plane on the thread's stack (OpenMP threads have >= 2 MiB); larger planes keep the
# reference (c_window.why_not_window_kernel).
POOL_GRAD_STACK_BYTES = 256 << 10


def pool_grad_scratch_bytes(x: TensorType) -> int:
    """Bytes of stack a pool gradient's plane takes for its sums (0: it sums in its result)."""
    st, ct = C_STORAGE[x.dtype], C_COMPUTE[x.dtype]
    if st == ct:
        return 0
    return int(x.shape[2]) * int(x.shape[3]) * (8 if ct == "double" else 4)


def pool_grad_kernel(node: Node, name: str, attrs: dict[str, Any], threshold: int) -> list[str]:
    """The C lines of MaxPoolGrad or AvgPoolGrad as kernel `name`: argv x, the pool's output
    (unused: the maximum is recomputed from x), dout, dx, then the batch size when it is
    dynamic. Each (image, channel) plane is one call; planes run on threads above `threshold`
    window reads.

    A plane's outputs go in reverse row-major order, each adding its gradient to the input
    elements its window chose: an input element then receives its windows' shares in the order
    of their window offsets, the order the reference's scatter adds them in, so the sums are
    the reference's to the bit. MaxPoolGrad recomputes each window's first maximum (row-major)
    from x rather than keeping the forward's argmax: the forward (its own kernel or a
    convolution block's epilogue) stays as it is and no index tensor lives through the step;
    a window holding NaN gives no gradient (the reference's maximum is NaN, which no element
    equals), and one whose maximum is -inf gives it to its first element, dropped when that is
    padding (padding is -inf and comes first)."""
    x = node.inputs[0].tensor_type
    geo = pool_geometry(TensorType(x.shape, x.dtype), attrs, node.op[:-len("Grad")])
    st, ct = C_STORAGE[x.dtype], C_COMPUTE[x.dtype]
    _, c, h, wd = x.shape
    (kh, kw), (sh, sw) = geo["kernel"], geo["stride"]
    (pt, _), (pl, _) = geo["pads"]
    oh, ow = geo["out"]
    is_max = node.op == "MaxPoolGrad"
    inf = "((double)INFINITY)" if ct == "double" else "INFINITY"
    ops = f"{node.op} {list(x.shape)} from {[c, oh, ow]}, window {(kh, kw)}, stride " \
          f"{(sh, sw)}, pads {geo['pads']}"
    plane = f"{name}_plane"
    in_place = st == ct
    sums = "dc" if in_place else "acc"
    if is_max:
        body = _max_grad_plane(plane, st, ct, inf, geo, h, wd, sums, in_place)
    else:
        full = kh * kw if attrs.get("count_include_pad") else None
        count = str(full) if full is not None else "(ahi - alo) * (bhi - blo)"
        per_output = [
            "      if (ahi <= alo || bhi <= blo) continue;  /* all padding: lands nowhere */",
            f"      const {ct} share = ({ct})gc[i * {ow} + j] / ({ct})({count});",
            "      for (int64_t a = alo; a < ahi; ++a)",
            "        for (int64_t b = blo; b < bhi; ++b)",
            f"          {sums}[(r0 + a) * {wd} + q0 + b] += share;",
        ]
        body = [
            f"static void {plane}(const {st} *restrict xc, const {st} *restrict gc, "
            f"{st} *restrict dc) {{",
            *([] if in_place else [f"  {ct} acc[{h * wd}];"]),
            f"  for (int64_t p = 0; p < {h * wd}; ++p) {sums}[p] = 0;",
            f"  for (int64_t i = {oh - 1}; i >= 0; --i) {{",
            f"    const int64_t r0 = i * {sh} - {pt};",
            "    const int64_t alo = r0 < 0 ? -r0 : 0;",
            f"    const int64_t ahi = {h} - r0 < {kh} ? {h} - r0 : {kh};",
            f"    for (int64_t j = {ow - 1}; j >= 0; --j) {{",
            f"      const int64_t q0 = j * {sw} - {pl};",
            "      const int64_t blo = q0 < 0 ? -q0 : 0;",
            f"      const int64_t bhi = {wd} - q0 < {kw} ? {wd} - q0 : {kw};",
            *per_output,
            "    }",
            "  }",
            *([] if in_place else
              [f"  for (int64_t p = 0; p < {h * wd}; ++p) dc[p] = ({st})acc[p];"]),
            "}",
        ]
        body.insert(1, "  (void)xc;")
    batch, sizes = batch_after(node, len(node.inputs) + 1)
    in_size, out_size = h * wd, oh * ow
    call = f"{plane}(x + p * {in_size}LL, g + p * {out_size}LL, dx + p * {in_size}LL);"
    return [
        f"/* {c_comment(name)}: {c_comment(ops)} */",
        *body,
        "",
        f"void {name}(void *const *args) {{",
        f"  const {st} *restrict x = (const {st} *)args[0];",
        f"  const {st} *restrict g = (const {st} *)args[2];",
        f"  {st} *restrict dx = ({st} *)args[3];",
        *sizes,
        f"  const int64_t planes = (int64_t)({batch}) * {c};",
        f"  if (planes > 1 && planes * (int64_t){out_size * kh * kw} >= (int64_t){threshold}) {{",
        "    #pragma omp parallel for schedule(static)",
        f"    for (int64_t p = 0; p < planes; ++p) {call}",
        "  } else {",
        f"    for (int64_t p = 0; p < planes; ++p) {call}",
        "  }",
        "}",
    ]


def _max_grad_plane(plane: str, st: str, ct: str, inf: str, geo: dict[str, Any], h: int,
                    wd: int, sums: str, in_place: bool) -> list[str]:
    """One plane of MaxPoolGrad, output row by output row from the last: the row's first
    maxima found along the row (per window element, the outputs whose column is inside are a
    constant range: no tests, vectorised, as the forward's row form), then its gradients
    added from its last output to its first."""
    (kh, kw), (sh, sw) = geo["kernel"], geo["stride"]
    (pt, _), (pl, _) = geo["pads"]
    oh, ow = geo["out"]
    columns = []
    for bb in range(kw):
        lo = max(0, -(-(pl - bb) // sw))
        hi = min(ow, (wd - 1 - bb + pl) // sw + 1)
        if lo < hi:
            columns += [
                "      #pragma omp simd",
                f"      for (int64_t j = {lo}; j < {hi}; ++j) {{",
                f"        const {ct} v = ({ct})row[j * {sw} + {bb - pl}];",
                "        const int taken = v > m[j];  /* strictly: the first maximum stays */",
                f"        at[j] = taken ? r * {wd} + j * {sw} + {bb - pl} : at[j];",
                "        m[j] = taken ? v : m[j];",
                "        nan[j] |= v != v;",
                "      }"]
    return [
        f"static void {plane}(const {st} *restrict xc, const {st} *restrict gc, "
        f"{st} *restrict dc) {{",
        *([] if in_place else [f"  {ct} acc[{h * wd}];"]),
        f"  {ct} m[{ow}];",
        f"  int64_t at[{ow}];",
        f"  int nan[{ow}];",
        f"  for (int64_t p = 0; p < {h * wd}; ++p) {sums}[p] = 0;",
        f"  for (int64_t i = {oh - 1}; i >= 0; --i) {{",
        f"    const int64_t r0 = i * {sh} - {pt};",
        f"    for (int64_t j = 0; j < {ow}; ++j) {{ m[j] = -{inf}; at[j] = -1; nan[j] = 0; }}",
        f"    for (int64_t a = 0; a < {kh}; ++a) {{",
        "      const int64_t r = r0 + a;",
        f"      if (r < 0 || r >= {h}) continue;",
        f"      const {st} *restrict row = xc + r * {wd}LL;",
        *columns,
        "    }",
        f"    for (int64_t j = {ow - 1}; j >= 0; --j) {{",
        "      if (nan[j]) continue;  /* the reference's maximum is NaN: no element equals it */",
        "      int64_t p = at[j];",
        "      if (p < 0) {  /* every element -inf: the window's first, unless padding */",
        f"        const int64_t q0 = j * {sw} - {pl};",
        f"        if (r0 < 0 || r0 >= {h} || q0 < 0 || q0 >= {wd}) continue;",
        f"        p = r0 * {wd} + q0;",
        "      }",
        f"      {sums}[p] += ({ct})gc[i * {ow} + j];",
        "    }",
        "  }",
        *([] if in_place else [f"  for (int64_t p = 0; p < {h * wd}; ++p) dc[p] = ({st})acc[p];"]),
        "}",
    ]
