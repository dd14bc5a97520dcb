"""Attention as one kernel (graph_kernel/attention.py): per batch x head, K^T and V packed once
on the thread's stack, then blocks of `ROWS` query rows: their scores (q @ K^T, a register tile
of `ROWS` rows by two 64-byte vectors, as c_gemm.py's small-product kernel), scale, mask,
softmax (the generated kernels' exp), and their context (P @ V) written where the context
product (or the head merge it writes through) keeps it. The scores block, ROWS x keys, stays
in L1: nothing of the scores or probabilities reaches memory.

Parallel over batch x heads on OpenMP's threads once the work is worth waking them for (the
products' `PARALLEL_BATCH_MIN_MNK`)."""
from __future__ import annotations

import numpy as np

from graphkernel.backends.c.c_gemm import PARALLEL_BATCH_MIN_MNK
from graphkernel.backends.c.c_loops import Buffer, KernelSource
from graphkernel.backends.c.c_text import index_kernel_options
from graphkernel.graph_kernel.attention import ROWS, AttentionBlock, Operand, static_shape

_C_TYPES = {np.dtype(np.float32): ("float", "f"), np.dtype(np.float64): ("double", "")}


def _batch_offset(op: Operand, batch: tuple[int, ...], var: str) -> str:
    """The C expression of the element offset of batch x head `var` in `op`'s buffer."""
    terms, inner = [str(op.offset)], 1
    for axis in reversed(range(len(batch))):
        stride = op.strides[axis]
        if stride and batch[axis] > 1:
            terms.append(f"(({var} / {inner}) % {batch[axis]}) * {stride}")
        inner *= batch[axis]
    return " + ".join(terms)


def _mask_strides(block: AttentionBlock) -> tuple[tuple[int, ...], int, int]:
    """The mask's element strides broadcast to the scores' shape: (batch axes, rows, keys)."""
    assert block.mask is not None
    full = static_shape(block.scores)
    shape = (1,) * (len(full) - block.mask.tensor_type.rank) + static_shape(block.mask)
    strides, acc = [], 1
    for dim in reversed(shape):
        strides.append(acc if dim != 1 else 0)
        acc *= dim
    strides.reverse()
    return tuple(strides[:-2]), strides[-2], strides[-1]


def _pair(op: Operand, transposed: bool) -> tuple[int, int]:
    """(row stride, column stride) of `op`'s matrices as the product reads them."""
    return (op.strides[-1], op.strides[-2]) if transposed else (op.strides[-2], op.strides[-1])


def _pack_kt(keys: int, d: int, lanes: int, element: str) -> list[str]:
    """The C that packs K^T (d x keys, dense) from `element` (K's (j, e) element): blocks of
    `lanes` keys, each with a constant inner bound (the last one the remainder)."""
    whole, rest = keys // lanes * lanes, keys % lanes
    blocks = ([f"    for (int64_t j0 = 0; j0 < {whole}; j0 += {lanes}) {{"] if whole else []) + \
        ([f"    {{ const int64_t j0 = {whole};"] if rest else [])
    return [line for head, width in zip(blocks, [lanes] * bool(whole) + [rest] * bool(rest))
            for line in (head,
                         f"      for (int64_t e = 0; e < {d}; ++e)",
                         f"        for (int64_t j = j0; j < j0 + {width}; ++j) "
                         f"kt[e * {keys} + j] = {element};",
                         "    }")]


def emit_attention_kernel(block: AttentionBlock, name: str) -> KernelSource:
    """The C of an attention block; argv: q, k, v, the mask if any, the addends of q, k and v
    that have one (AttentionBlock.reads), then the context's buffer."""
    dtype = block.scores.tensor_type.dtype
    t, f = _C_TYPES[dtype]
    lanes = 64 // dtype.itemsize
    nb, rows, keys, d, dv = block.sizes
    batch = static_shape(block.scores)[:-2]
    tq, tk, tv = block.transpose
    q_s, q_d = _pair(block.q, tq)
    k_t, k_d = _pair(block.k, tk)
    v_t, v_j = _pair(block.v, tv)
    qa, ka, va = block.q.addend, block.k.addend, block.v.addend
    # each addend's argv position and its name in the C
    arg = 4 if block.mask is not None else 3
    add_args: dict[str, int] = {}
    for label, op in (("qa", qa), ("ka", ka), ("va", va)):
        if op is not None:
            add_args[label] = arg
            arg += 1
    out_arg = arg

    def plus(label: str, op: Operand | None, transposed: bool, row: str, col: str) -> str:
        """` + label_h[...]`: the addend's element at (row, col) of the head, or nothing."""
        if op is None:
            return ""
        rs, cs = _pair(op, transposed)
        return f" + {label}h[{row} * {rs} + {col} * {cs}]"
    o_s, o_j = block.out.strides[-2:]
    scale = "" if block.scale is None else \
        f" {'/' if block.divides else '*'} ({np.array(block.scale, dtype).item()!r}{f})"
    mask_op: Operand | None = None
    mask_term, m_s = "", 0
    if block.mask is not None:
        m_batch, m_s, m_t = _mask_strides(block)
        mask_op = Operand(block.mask, 0, m_batch + (m_s, m_t))
        mask_term = f" + mrow[j * {m_t}]"
    vec = f"{name}_v"
    tile = f"{name}_tile"
    mnk = nb * rows * keys * (d + dv)
    v_dense = v_j == 1 and va is None  # V's rows read in place; else packed
    v_ld = v_t if v_dense else dv
    out_direct = o_j == 1
    lines = [
        f"/* {name}: {block.scores.name}, {block.softmax.name}, {block.context.name} as one "
        f"kernel: {nb} x (S {rows}, T {keys}, D {d}, Dv {dv}) {dtype.name} */",
        *index_kernel_options("O3", "fp-contract=fast"),
        f"typedef {t} {vec} __attribute__((vector_size(64)));",
        # C(rows x 16*vecs... ) = A(rows x k) B(k x vecs lanes), A(i, e) = a[i * ra + e * da]
        f"static inline __attribute__((always_inline)) void {tile}(",
        f"    const int rows, const int vecs, const {t} *a, int64_t ra, int64_t da,",
        f"    const {t} *b, int64_t ldb, {t} *c, int64_t ldc, int64_t k) {{",
        f"  {vec} acc[{ROWS}][2];",
        "  for (int r = 0; r < rows; ++r)",
        f"    for (int w = 0; w < vecs; ++w) acc[r][w] = ({vec}){{0}};",
        "  for (int64_t e = 0; e < k; ++e) {",
        f"    {vec} row[2];",
        f"    for (int w = 0; w < vecs; ++w) memcpy(&row[w], b + e * ldb + {lanes} * w, "
        f"sizeof({vec}));",
        "    for (int r = 0; r < rows; ++r) {",
        f"      const {t} x = a[r * ra + e * da];",
        "      for (int w = 0; w < vecs; ++w) acc[r][w] += x * row[w];",
        "    }",
        "  }",
        "  for (int r = 0; r < rows; ++r)",
        f"    for (int w = 0; w < vecs; ++w) memcpy(c + r * ldc + {lanes} * w, &acc[r][w], "
        f"sizeof({vec}));",
        "}",
        f"/* C(rows x n) = A(rows x k) B(k x n), B and C rows dense; rows <= {ROWS}. */",
        f"static void {name}_product(int rows, int64_t n, int64_t k, const {t} *a, int64_t ra,",
        f"    int64_t da, const {t} *b, int64_t ldb, {t} *c, int64_t ldc) {{",
        f"  const int64_t n2 = n / {2 * lanes} * {2 * lanes}, n1 = n / {lanes} * {lanes};",
        # constant tile sizes at each call, so that the accumulators stay in registers
        f"  if (rows == {ROWS}) {{",
        f"    for (int64_t j = 0; j < n2; j += {2 * lanes})",
        f"      {tile}({ROWS}, 2, a, ra, da, b + j, ldb, c + j, ldc, k);",
        "    if (n1 > n2)",
        f"      {tile}({ROWS}, 1, a, ra, da, b + n2, ldb, c + n2, ldc, k);",
        "  } else {",
        "    for (int r = 0; r < rows; ++r) {",
        f"      for (int64_t j = 0; j < n2; j += {2 * lanes})",
        f"        {tile}(1, 2, a + r * ra, ra, da, b + j, ldb, c + r * ldc + j, ldc, k);",
        "      if (n1 > n2)",
        f"        {tile}(1, 1, a + r * ra, ra, da, b + n2, ldb, c + r * ldc + n2, ldc, k);",
        "    }",
        "  }",
        "  for (int r = 0; r < rows; ++r)  /* columns past the last whole vector */",
        "    for (int64_t j = n1; j < n; ++j) {",
        f"      {t} sum = 0;",
        "      for (int64_t e = 0; e < k; ++e) sum += a[r * ra + e * da] * b[e * ldb + j];",
        "      c[r * ldc + j] = sum;",
        "    }",
        "}",
        "#if defined(__GNUC__) && !defined(__clang__)",
        "#pragma GCC pop_options",
        "#endif",
        f"void {name}(void *const *args) {{",
        f"  const {t} *restrict q = (const {t} *)args[0];",
        f"  const {t} *restrict k = (const {t} *)args[1];",
        f"  const {t} *restrict v = (const {t} *)args[2];",
        *([f"  const {t} *restrict mask = (const {t} *)args[3];"] if block.mask is not None
          else []),
        *[f"  const {t} *restrict {label} = (const {t} *)args[{at}];"
          for label, at in add_args.items()],
        f"  {t} *restrict out = ({t} *)args[{out_arg}];",
        f"  #pragma omp parallel for schedule(static) if ({mnk} >= {PARALLEL_BATCH_MIN_MNK})",
        f"  for (int64_t n = 0; n < {nb}; ++n) {{",
        f"    {t} kt[{d * keys}], scores[{ROWS * keys}];",
        *([] if out_direct else [f"    {t} ctx[{ROWS * dv}];"]),
        f"    const {t} *qh = q + ({_batch_offset(block.q, batch, 'n')});",
        f"    const {t} *kh = k + ({_batch_offset(block.k, batch, 'n')});",
        f"    const {t} *vh = v + ({_batch_offset(block.v, batch, 'n')});",
        f"    {t} *oh = out + ({_batch_offset(block.out, batch, 'n')});",
        *[f"    const {t} *{label}h = {label} + ({_batch_offset(op, batch, 'n')});"
          for label, op in (("qa", qa), ("ka", ka), ("va", va)) if op is not None],
        f"    const {t} *vr = vh;" if v_dense else f"    {t} vp[{keys * dv}], *vr = vp;",
        *([f"    {t} qp[{ROWS * d}];"] if qa is not None else []),
        # K^T (D x T) packed dense, `lanes` keys at a time (their rows stay in L1 across e;
        # one e at a time over all keys read a strided K 1.2x slower in the encoder's step),
        # V (T x Dv) row by row; an addend is added here, once per element, as its fused
        # group did (one rounding)
        *_pack_kt(keys, d, lanes, f"kh[j * {k_t} + e * {k_d}]{plus('ka', ka, tk, 'j', 'e')}"),
        *([] if v_dense else [
            f"    for (int64_t j = 0; j < {keys}; ++j)",
            f"      for (int64_t e = 0; e < {dv}; ++e) vp[j * {dv} + e] = "
            f"vh[j * {v_t} + e * {v_j}]{plus('va', va, tv, 'j', 'e')};"]),
        f"    for (int64_t s0 = 0; s0 < {rows}; s0 += {ROWS}) {{",
        f"      const int nr = {rows} - s0 < {ROWS} ? (int)({rows} - s0) : {ROWS};",
        *(["      for (int r = 0; r < nr; ++r)",
           f"        for (int64_t e = 0; e < {d}; ++e) qp[r * {d} + e] = "
           f"qh[(s0 + r) * {q_s} + e * {q_d}]{plus('qa', qa, tq, '(s0 + r)', 'e')};",
           f"      {name}_product(nr, {keys}, {d}, qp, {d}, 1, kt, {keys}, scores, {keys});"]
          if qa is not None else
          [f"      {name}_product(nr, {keys}, {d}, qh + s0 * {q_s}, {q_s}, {q_d}, kt, {keys}, "
           f"scores, {keys});"]),
        "      for (int r = 0; r < nr; ++r) {",
        f"        {t} *srow = scores + r * {keys};",
        *([f"        const {t} *mrow = mask + ({_batch_offset(mask_op, batch, 'n')})"
           f" + (s0 + r) * {m_s};"] if mask_op is not None else []),
        # Three passes over the row in L1, each vectorised by its simd reduction: scale, mask
        # and max; exp and sum; normalise. The max skips NaNs (a NaN check keeps the loop
        # scalar); a NaN score makes its row's sum NaN, so the whole row is NaN, as with the
        # generated kernels' NaN-propagating max (ops.py Maximum).
        f"        {t} top = -__builtin_inf{f}(), total = 0;",
        "        #pragma omp simd reduction(max:top)",
        f"        for (int64_t j = 0; j < {keys}; ++j) {{",
        f"          const {t} x = srow[j]{scale}{mask_term};",
        "          srow[j] = x;",
        "          top = x > top ? x : top;",
        "        }",
        "        #pragma omp simd reduction(+:total)",
        f"        for (int64_t j = 0; j < {keys}; ++j) {{",
        f"          const {t} e = gkm_exp{f}(srow[j] - top);",
        "          srow[j] = e;",
        "          total += e;",
        "        }",
        # e * (1 / sum), as the expanded softmax computes it
        f"        const {t} inverse = 1 / total;",
        f"        for (int64_t j = 0; j < {keys}; ++j) srow[j] = srow[j] * inverse;",
        "      }",
        (f"      {name}_product(nr, {dv}, {keys}, scores, {keys}, 1, vr, {v_ld}, "
         f"oh + s0 * {o_s}, {o_s});") if out_direct else
        (f"      {name}_product(nr, {dv}, {keys}, scores, {keys}, 1, vr, {v_ld}, ctx, {dv});"),
        *([] if out_direct else [
            "      for (int r = 0; r < nr; ++r)",
            f"        for (int64_t e = 0; e < {dv}; ++e) "
            f"oh[(s0 + r) * {o_s} + e * {o_j}] = ctx[r * {dv} + e];"]),
        "    }",
        "  }",
        "}",
    ]
    buffers = [Buffer(value, static_shape(value), False, 0) for value in block.reads]
    buffers.append(Buffer(block.out.value, static_shape(block.out.value), True, 0))
    return KernelSource(name, "\n".join(lines) + "\n", buffers)
