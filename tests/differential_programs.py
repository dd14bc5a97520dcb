"""The program language of the differential test (tests/test_differential.py, whose docstring
describes it): the op lists, the interpreter that runs a program as a cell or op by op on the
numpy references, type inference, the Hypothesis strategy that draws random programs, and
their input data."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from hypothesis import strategies as st

from graphkernel import nn
from graphkernel.errors import GraphKernelError
from graphkernel.frontend import context
from graphkernel.frontend.tensor import Parameter, Tensor
from graphkernel.ir import types as T
from graphkernel.ir.opset import _check_dtypes, get_op
from graphkernel.ir.types import TensorType, TupleType
from graphkernel.ops import operations as P

DTYPES = [T.float16, T.float32, T.float64, T.int32, T.int64, T.bool_]
INPUT_DTYPES = [T.float32, T.float32, T.float64, T.float16, T.int32, T.int64, T.bool_]
MAX_ELEMENTS = 8192
# One program in eight starts from a long row (or column), mostly float16: rows of more than
# ROW_BLOCK (backends/c/c_reduce.py) elements sum in blocks, and float16 data around LONG_OFFSET
# sums past float16's 65504 within a row.
LONG_SHAPES = [(2, 70000), (1, 70000), (3, 4100), (4100, 3), (1100, 2, 3)]
LONG_DTYPES = [T.float16, T.float16, T.float32]
LONG_OFFSET = 30.0

UNARY = ["Neg", "Abs", "Sign", "Sqrt", "Rsqrt", "Reciprocal", "Exp", "Log", "Tanh", "Erf",
         "Floor", "Round", "LogicalNot"]
BINARY = ["Add", "Sub", "Mul", "RealDiv", "Maximum", "Minimum", "Pow", "Equal", "NotEqual", "Less",
          "LessEqual", "Greater", "GreaterEqual", "LogicalAnd", "LogicalOr"]
REDUCE = ["ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceMean"]
SHAPE = ["Reshape", "Transpose", "ExpandDims", "Squeeze", "BroadcastTo", "Tile"]
COMPOSITE_UNARY = ["GeLU", "FastGeLU", "Sigmoid", "SiLU", "ReLU", "ReLU6", "HSwish", "Softplus",
                   "Square"]
TRANSCENDENTAL = {"Exp", "Log", "Tanh", "Erf", "Pow", "Rsqrt", "GeLU", "FastGeLU", "Sigmoid",
                  "SiLU", "Softplus", "Softmax", "LogSoftmax", "LayerNorm", "HSwish"}


@dataclass(frozen=True)
class Lit:
    """A Python scalar operand (plain ints in a program are value indices)."""

    value: Any

    def __repr__(self) -> str:
        return f"Lit({self.value!r})"


# Ops whose result depends on the order of a sum or product (C and numpy order them differently).
REORDERED = {"ReduceSum", "ReduceProd", "ReduceMean", "MatMul", "BatchMatMul", "Softmax",
             "LogSoftmax", "LayerNorm"}
SCALARS = [Lit(v) for v in (0.0, -0.0, 1.0, -1.0, 0.5, 2.0, 3.0, -2.5, 1e-3, math.inf, -math.inf,
                            math.nan, 0, 1, 2, -1, 7, True, False)]


# ---------------------------------------------------------------------------------------------
# Running a program

Program = list[tuple[Any, ...]]


def _call(instr: tuple[Any, ...], vals: list[Any], weights: dict[Any, Any]) -> Any:
    kind = instr[0]
    if kind == "param":  # ("param", shape, dtype, seed): a Parameter of the cell
        return weights[instr]
    if kind == "op":
        _, name, operands, call_args, init = instr
        args = [o.value if isinstance(o, Lit) else vals[o] if isinstance(o, int) else o
                for o in operands]
        if name == "AddN":
            return P.AddN()(args)
        return getattr(P, name)(**init)(*args, *call_args)
    if kind == "gk":
        program, operands = instr[1], instr[2]
        outs = instr[3] if len(instr) > 3 else None
        return ProgramKernel(program, outs)(*[vals[o] for o in operands])
    if kind == "get":
        return vals[instr[1]][instr[2]]
    raise AssertionError(instr)


def _interpret(program: Program, inputs: tuple[Any, ...], outputs: list[int] | None,
               weights: dict[Any, Any] | None = None) -> Any:
    vals = list(inputs)
    for instr in program:
        vals.append(_call(instr, vals, weights or {}))
    picked = [vals[i] for i in (outputs if outputs is not None else [len(vals) - 1])]
    return tuple(picked) if len(picked) > 1 else picked[0]


class ProgramKernel(nn.GraphKernel):
    """A user composite whose construct is a generated sub-program; it returns the values
    `outs` (indices into its own values, inputs first), by default its last value."""

    def __init__(self, program: Program, outs: list[int] | None = None) -> None:
        super().__init__()
        self.program = program
        self.outs = outs

    def construct(self, *xs: Any) -> Any:
        return _interpret(self.program, xs, self.outs)


class ProgramCell(nn.Cell):
    def __init__(self, program: Program, outputs: list[int]) -> None:
        super().__init__()
        self.program = program
        self.outputs = outputs
        self.weights = {instr: Parameter(_const_array(instr[3], instr[1], instr[2]), f"w{i}")
                        for i, instr in enumerate(program) if instr[0] == "param"}

    def construct(self, *xs: Any) -> Any:
        return _interpret(self.program, xs, self.outputs, self.weights)


def reference(program: Program, outputs: list[int], arrays: list[np.ndarray]
              ) -> tuple[list[np.ndarray], float]:
    """The outputs in PYNATIVE mode, and the largest finite magnitude of any value computed."""
    context.set_context(mode=context.PYNATIVE_MODE)
    try:
        vals: list[Any] = [Tensor(a.copy()) for a in arrays]
        weights = {instr: Tensor(_const_array(instr[3], instr[1], instr[2]))
                   for instr in program if instr[0] == "param"}
        for instr in program:
            vals.append(_call(instr, vals, weights))
    finally:
        context.set_context(mode=context.GRAPH_MODE)
    scale = 1.0
    for v in vals:
        for t in (v if isinstance(v, tuple) else (v,)):
            a = t.asnumpy()
            if a.dtype.kind == "f" and a.size:
                finite = np.abs(a[np.isfinite(a)].astype(np.float64))
                if finite.size:
                    scale = max(scale, float(finite.max()))
    return [np.array(vals[i].asnumpy()) for i in outputs], scale


# ---------------------------------------------------------------------------------------------
# Type inference for the generator (the op table's own rules)

Ty = tuple[tuple[int, ...], np.dtype]


def _operand_array(o: Any, types: list[Any]) -> Any:
    if isinstance(o, Lit):
        return o.value
    if isinstance(o, int):
        shape, dtype = types[o]
        return np.broadcast_to(np.zeros((), dtype), shape)
    return o


def infer(instr: tuple[Any, ...], types: list[Any]) -> Any:
    """The result type of an instruction (a Ty or a tuple of Ty); raises GraphKernelError."""
    from graphkernel.frontend.tensor import _normalise_args
    kind = instr[0]
    if kind == "get":
        return types[instr[1]][instr[2]]
    if kind == "param":
        return (instr[1], instr[2])
    if kind == "gk":
        program, operands = instr[1], instr[2]
        sub = [types[o] for o in operands]
        for inner in program:
            sub.append(infer(inner, sub))
        outs = [sub[i] for i in (instr[3] if len(instr) > 3 else [-1])]
        if not all(is_tensor(t) for t in outs):
            raise GraphKernelError("composite must return tensors")
        return outs[0] if len(outs) == 1 else tuple(outs)
    _, name, operands, call_args, init = instr
    op = get_op(name)
    args = [_operand_array(o, types) for o in operands]
    arrays = _normalise_args(op, args)
    tts = tuple(TensorType(tuple(a.shape), a.dtype) for a in arrays)
    _check_dtypes(op.name, tts, op.accepts)
    attrs = {**op.attr_defaults, **init, **dict(zip([n for n, _ in op.call_attrs], call_args))}
    out = op.infer(tts, attrs)
    if isinstance(out, TupleType):
        return tuple((t.shape, t.dtype) for t in out.items)
    return (out.shape, out.dtype)


def is_tensor(t: Any) -> bool:
    return len(t) == 2 and isinstance(t[1], np.dtype)


def _size(shape: tuple[int, ...]) -> int:
    return int(np.prod(shape, dtype=np.int64))


# ---------------------------------------------------------------------------------------------
# The generator

@st.composite
def shapes(draw: Any, max_rank: int = 3) -> tuple[int, ...]:
    rank = draw(st.integers(0, max_rank))
    dims = [draw(st.sampled_from([1, 1, 2, 3, 4, 5, 0])) if draw(st.booleans())
            else draw(st.sampled_from([1, 2, 3, 4, 6])) for _ in range(rank)]
    if dims and draw(st.integers(0, 9)) == 0:
        # a wide axis: more than one block of the column-reduction lanes (c_emitter)
        dims[draw(st.integers(0, rank - 1))] = draw(st.sampled_from([513, 1030]))
    return tuple(dims)


def _broadcast_partner(draw: Any, shape: tuple[int, ...]) -> tuple[int, ...]:
    """A shape that broadcasts with `shape`: drop leading dims, set some dims to 1."""
    drop = draw(st.integers(0, len(shape)))
    out = [1 if draw(st.integers(0, 3)) == 0 else d for d in shape[drop:]]
    if draw(st.integers(0, 5)) == 0 and len(out) < 4:
        out = [draw(st.sampled_from([1, 2]))] + out
    return tuple(out)


def _axis(draw: Any, rank: int) -> Any:
    if rank == 0:
        return draw(st.sampled_from([(), None]))
    choice = draw(st.integers(0, 4))
    if choice == 0:
        return None
    if choice == 1:
        return ()
    if choice == 2:
        return draw(st.integers(-rank, rank - 1))
    axes = draw(st.lists(st.integers(0, rank - 1), min_size=1, max_size=rank, unique=True))
    return tuple(a - rank if draw(st.booleans()) else a for a in axes)


def _factor(draw: Any, shape: tuple[int, ...]) -> tuple[int, ...]:
    """A new shape with the same number of elements."""
    n = _size(shape)
    if n == 0:
        dims = list(shape) or [0]
        draw(st.randoms()).shuffle(dims)
        return tuple(dims)
    dims = []
    rest = n
    for f in (2, 3, 5, 7):
        while rest % f == 0:
            dims.append(f)
            rest //= f
    if rest > 1:
        dims.append(rest)
    draw(st.randoms()).shuffle(dims)
    out: list[int] = []
    for d in dims:
        if out and draw(st.booleans()):
            out[-1] *= d
        else:
            out.append(d)
    while draw(st.integers(0, 3)) == 0 and len(out) < 4:
        out.insert(draw(st.integers(0, len(out))), 1)
    if out and draw(st.integers(0, 3)) == 0:
        out[draw(st.integers(0, len(out) - 1))] = -1
    return tuple(out)


def _sanitize_for_int_cast(types: list[Any], src: int, prog: Program) -> int:
    """Select(x == x, clamp(x, -1000, 1000), 0): NaN- and range-free before a float->int Cast."""
    steps = [("op", "Maximum", [src, Lit(-1000.0)], [], {}),
             ("op", "Minimum", [len(types), Lit(1000.0)], [], {}),
             ("op", "Equal", [src, src], [], {}),
             ("op", "Select", [len(types) + 2, len(types) + 1, Lit(0.0)], [], {})]
    for instr in steps:
        types.append(infer(instr, types))
        prog.append(instr)
    return len(types) - 1


def _draw_instr(draw: Any, types: list[Any], prog: Program, allow_gk: bool) -> tuple | None:
    """One instruction over the tensor values in `types`, or None if the draw was invalid."""
    tensors = [i for i, t in enumerate(types) if is_tensor(t)]
    x = draw(st.sampled_from(tensors[-4:] if draw(st.booleans()) else tensors))
    shape, dtype = types[x]
    family = draw(st.sampled_from(["unary", "binary", "binary", "reduce", "shape", "select",
                                   "cast", "composite", "gk", "param", "matmul"] if allow_gk else
                                  ["unary", "binary", "binary", "reduce", "shape", "select",
                                   "cast", "composite", "matmul"]))

    def other() -> Any:
        how = draw(st.integers(0, 3))
        if how == 0:
            return draw(st.sampled_from(SCALARS))
        same = [i for i in tensors if types[i][0] == shape]
        candidates = [i for i in tensors if i != x] or tensors
        if how == 1 and same:
            return draw(st.sampled_from(same))
        if how == 2:
            return draw(st.sampled_from(candidates))
        # a constant array of a broadcasting shape
        pshape = _broadcast_partner(draw, shape)
        pdtype = draw(st.sampled_from(DTYPES))
        return _const_array(draw(st.integers(0, 2**31)), pshape, pdtype)

    if family == "unary":
        return ("op", draw(st.sampled_from(UNARY)), [x], [], {})
    if family == "param":
        # a weight of the cell (a graph input bound at call time) next to x
        pshape = _broadcast_partner(draw, shape)
        param = ("param", pshape, draw(st.sampled_from(DTYPES)), draw(st.integers(0, 2**31)))
        types.append(infer(param, types))
        prog.append(param)
        return ("op", draw(st.sampled_from(BINARY)), [x, len(types) - 1], [], {})
    if family == "matmul":
        if len(shape) < 2:
            return None
        ta, tb = draw(st.booleans()), draw(st.booleans())
        k = shape[-2] if ta else shape[-1]
        n = draw(st.sampled_from([1, 2, 3, 5]))
        bshape = (n, k) if tb else (k, n)
        if len(shape) > 2 and draw(st.booleans()):
            bshape = shape[:-2] + bshape
        b = _const_array(draw(st.integers(0, 2**31)), bshape, dtype)
        name = "BatchMatMul" if len(shape) > 2 else "MatMul"
        return ("op", name, [x, b], [], {"transpose_a": ta, "transpose_b": tb})
    if family == "binary":
        y = other()
        args = [x, y] if draw(st.booleans()) else [y, x]
        return ("op", draw(st.sampled_from(BINARY)), args, [], {})
    if family == "select":
        cond = [i for i in tensors if types[i][1] == T.bool_]
        c = draw(st.sampled_from(cond)) if cond and draw(st.booleans()) else \
            draw(st.sampled_from([Lit(True), Lit(False)])) if draw(st.integers(0, 4)) == 0 else None
        if c is None:
            cmp = ("op", draw(st.sampled_from(["Less", "Greater", "Equal"])), [x, other()], [], {})
            types.append(infer(cmp, types))
            prog.append(cmp)
            c = len(types) - 1
        return ("op", "Select", [c, x, other()], [], {})
    if family == "cast":
        target = draw(st.sampled_from(DTYPES))
        if T.is_float(dtype) and not T.is_float(target) and target != T.bool_:
            x = _sanitize_for_int_cast(types, x, prog)
        return ("op", "Cast", [x], [target], {})
    if family == "reduce":
        name = draw(st.sampled_from(REDUCE))
        return ("op", name, [x], [_axis(draw, len(shape))], {"keep_dims": draw(st.booleans())})
    if family == "shape":
        name = draw(st.sampled_from(SHAPE))
        rank = len(shape)
        if name == "Reshape":
            return ("op", name, [x], [_factor(draw, shape)], {})
        if name == "Transpose":
            perm = list(range(rank))
            draw(st.randoms()).shuffle(perm)
            return ("op", name, [x], [tuple(perm)], {})
        if name == "ExpandDims":
            return ("op", name, [x], [draw(st.integers(-rank - 1, rank))], {})
        if name == "Squeeze":
            ones = [i for i, d in enumerate(shape) if d == 1]
            axis = () if not ones or draw(st.booleans()) else \
                tuple(draw(st.lists(st.sampled_from(ones), min_size=1, unique=True)))
            return ("op", name, [x], [], {"axis": axis})
        if name == "BroadcastTo":
            target = [d if d != 1 else draw(st.sampled_from([1, 2, 3])) for d in shape]
            if len(target) < 4 and draw(st.booleans()):
                target.insert(0, draw(st.sampled_from([1, 2, 3])))
            target = [-1 if i >= len(target) - rank and draw(st.integers(0, 3)) == 0 else d
                      for i, d in enumerate(target)]
            return ("op", name, [x], [], {"shape": tuple(target)})
        mult = [draw(st.sampled_from([1, 1, 2, 3])) for _ in range(rank + draw(st.integers(0, 1)))]
        return ("op", name, [x], [tuple(mult)], {})
    if family == "composite":
        name = draw(st.sampled_from(COMPOSITE_UNARY + ["Softmax", "LogSoftmax", "LayerNorm",
                                                       "SquaredDifference", "AddN", "BiasAdd"]))
        if name in COMPOSITE_UNARY:
            init = {"approximate": draw(st.sampled_from(["tanh", "none"]))} if name == "GeLU" \
                else {}
            return ("op", name, [x], [], init)
        if name in ("Softmax", "LogSoftmax"):
            axis = draw(st.integers(-len(shape), len(shape) - 1)) if shape else -1
            if shape and draw(st.integers(0, 3)) == 0:
                axis = tuple(sorted({axis % len(shape), draw(st.integers(0, len(shape) - 1))}))
            return ("op", name, [x], [], {"axis": axis})
        if name == "SquaredDifference":
            return ("op", name, [x, other()], [], {})
        if name == "AddN":
            return ("op", name, [x] + [other() for _ in range(draw(st.integers(0, 2)))], [], {})
        if name == "BiasAdd":
            channel = shape[1 if len(shape) > 2 else -1] if len(shape) >= 2 else 1
            bias = _const_array(draw(st.integers(0, 2**31)), (channel,), dtype)
            return ("op", name, [x, bias], [], {})
        rank = max(len(shape), 1)
        norm = draw(st.integers(-rank, rank - 1))
        params = draw(st.integers(-rank, rank - 1))
        pshape = shape[params % rank:] if shape else ()
        seed = draw(st.integers(0, 2**31))
        gamma = _const_array(seed, pshape, dtype)
        beta = _const_array(seed + 1, pshape, dtype)
        ln = ("op", "LayerNorm", [x, gamma, beta], [],
              {"begin_norm_axis": norm, "begin_params_axis": params,
               "epsilon": draw(st.sampled_from([1e-7, 1e-5]))})
        types.append(infer(ln, types))
        prog.append(ln)
        return ("get", len(types) - 1, draw(st.integers(0, 2)))
    # A user GraphKernel over one to three values.
    operands = draw(st.lists(st.sampled_from(tensors), min_size=1, max_size=3, unique=True))
    sub_types = [types[o] for o in operands]
    sub: Program = []
    for _ in range(draw(st.integers(1, 6))):
        if len(sub) < 4:
            _append(draw, sub_types, sub, allow_gk=False)
    if not sub or not is_tensor(sub_types[-1]):
        return None
    values = [i for i, t in enumerate(sub_types) if is_tensor(t)]
    if len(values) > 1 and draw(st.booleans()):
        # several outputs (one may be an input passed through), then pick one of them
        outs = [values[-1]] + draw(st.lists(st.sampled_from(values), min_size=1, max_size=2))
        gk = ("gk", sub, operands, outs)
        types.append(infer(gk, types))
        prog.append(gk)
        return ("get", len(types) - 1, draw(st.integers(0, len(outs) - 1)))
    return ("gk", sub, operands)


def _append(draw: Any, types: list[Any], prog: Program, allow_gk: bool) -> None:
    """Append one valid instruction (and any helpers it needs), or nothing."""
    tmark, pmark = len(types), len(prog)
    try:
        instr = _draw_instr(draw, types, prog, allow_gk)
        if instr is None:
            raise GraphKernelError("no instruction")
        out = infer(instr, types)
        outs = (out,) if is_tensor(out) else out
        # nothing larger than 8192 elements or than the largest value so far (a long row)
        limit = max([MAX_ELEMENTS] + [_size(t[0]) for t in types if is_tensor(t)])
        if any(_size(s) > limit for s, _ in outs):
            raise GraphKernelError("too big")
    except GraphKernelError:
        del prog[pmark:]
        del types[tmark:]
        return
    types.append(out)
    prog.append(instr)


def _const_array(seed: int, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    return make_data(np.random.default_rng(seed), shape, dtype, special=0.05)


@st.composite
def programs(draw: Any) -> tuple[list[Ty], Program, list[int]]:
    n_inputs = draw(st.integers(1, 3))
    long = draw(st.integers(0, 7)) == 0
    base = draw(st.sampled_from(LONG_SHAPES)) if long else draw(shapes())
    input_types: list[Ty] = []
    for i in range(n_inputs):
        shape = base if i == 0 else draw(st.sampled_from(
            [base, _broadcast_partner(draw, base), draw(shapes())]))
        dtypes = LONG_DTYPES if long and i == 0 else INPUT_DTYPES
        input_types.append((shape, draw(st.sampled_from(dtypes))))
    types: list[Any] = list(input_types)
    prog: Program = []
    if long:  # start with a reduction over the long input: what long rows are for
        name = draw(st.sampled_from(["ReduceSum", "ReduceMean", "ReduceMax", "Softmax",
                                     "LogSoftmax"]))
        first = ("op", name, [0], [_axis(draw, len(base))], {"keep_dims": draw(st.booleans())}) \
            if name.startswith("Reduce") else \
            ("op", name, [0], [], {"axis": draw(st.integers(-len(base), len(base) - 1))})
        types.append(infer(first, types))
        prog.append(first)
    target = draw(st.integers(1, 7))
    for _ in range(3 * target):
        if len(prog) >= target:
            break
        _append(draw, types, prog, allow_gk=True)
    tensors = [i for i in range(n_inputs, len(types)) if is_tensor(types[i]) and
               prog[i - n_inputs][0] != "param"]
    if not tensors:
        prog.append(("op", "Neg" if types[0][1] != T.bool_ else "LogicalNot", [0], [], {}))
        types.append(infer(prog[-1], types))
        tensors = [len(types) - 1]
    extra = draw(st.lists(st.sampled_from(tensors + list(range(n_inputs))), max_size=2))
    outputs = [tensors[-1]] + extra  # repeats and graph inputs as outputs are allowed
    return input_types, prog, outputs


# ---------------------------------------------------------------------------------------------
# Data

def _offset(shape: tuple[int, ...], dtype: np.dtype) -> float:
    return LONG_OFFSET if dtype == T.float16 and _size(shape) > MAX_ELEMENTS else 0.0


def _input_data(rng: np.random.Generator, shape: tuple[int, ...], dtype: np.dtype,
                spread: float) -> np.ndarray:
    """A graph input's data; long rows get no special values (one NaN would hide the sum)."""
    long = _size(shape) > MAX_ELEMENTS
    return make_data(rng, shape, dtype, special=0.0 if long else 0.15, spread=spread,
                     offset=_offset(shape, dtype))


def make_data(rng: np.random.Generator, shape: tuple[int, ...], dtype: np.dtype,
              special: float = 0.15, spread: float = 2.0, offset: float = 0.0) -> np.ndarray:
    n = _size(shape)
    if dtype == T.bool_:
        return np.asarray(rng.random(n).reshape(shape) < 0.5)
    if T.is_int(dtype):
        info = np.iinfo(dtype)
        out = rng.integers(-6, 7, n).astype(dtype)
        extremes = np.array([info.min, info.max, info.min + 1, 0, -1], dtype)
        mask = rng.random(n) < special / 3
        out[mask] = rng.choice(extremes, mask.sum())
        return out.reshape(shape)
    info = np.finfo(dtype)
    out = (offset + rng.standard_normal(n) * spread).astype(dtype)
    specials = np.array([np.nan, np.inf, -np.inf, -0.0, 0.0, info.smallest_subnormal,
                         -info.smallest_subnormal, info.smallest_normal / 4, 1.0, -1.0], dtype)
    mask = rng.random(n) < special
    out[mask] = rng.choice(specials, mask.sum())
    return out.reshape(shape)
