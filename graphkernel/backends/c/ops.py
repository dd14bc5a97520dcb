"""The C backend's op table: op name -> the C expression that computes it (tinygrad's
`code_for_op`), and each reduction kind's combine step and OpenMP operator. The IR declares what
an op computes (ir/opset.py); only this table says how C spells it, and the emitters
(c_emitter.py, c_reduce.py, c_conv_block.py) read it."""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from graphkernel.ir import types as T
from graphkernel.ir.graph import Constant, Value
from graphkernel.ir.opset import Reduction, ReductionKind


@dataclass(frozen=True)
class CExpression:
    """An op's C expression: `{0}`, `{1}` are operands (already in the operand compute type),
    `{f}` is "f" for float math and "" for double."""

    template: str
    # The template for float operands when it differs (Abs: fabs keeps abs(-0.0) == +0.0).
    float_template: str | None = None
    # (operand index, template): the template when that operand is a number (a scalar constant,
    # not NaN), where the result is spelled more cheaply (Maximum with 0: one comparison).
    number_templates: tuple[tuple[int, str], ...] = ()

    def for_operands(self, floating: bool, numbers: Sequence[bool] = ()) -> str:
        """The template for operands of a float dtype (`floating`) or not; `numbers[i]`: operand
        i is a number (a scalar constant that is not NaN)."""
        for i, template in self.number_templates:
            if i < len(numbers) and numbers[i]:
                return template
        if floating and self.float_template is not None:
            return self.float_template
        return self.template


def is_number(value: Value) -> bool:
    """Whether operand `value` is a number: a scalar constant, not NaN."""
    return isinstance(value, Constant) and value.is_scalar and not (
        np.issubdtype(value.value.dtype, np.inexact) and bool(np.isnan(value.value)))


# Integer division. C's `/` and `%` truncate, trap on a zero divisor and on INT_MIN / -1; numpy
# gives 0 for both (and INT_MIN // -1 wraps to INT_MIN), and so do these templates.
# Floats follow numpy's npy_divmod step by step (fmod, then correct the sign, then floor and
# round to the nearer integer), so results match numpy bit for bit.
_INT_FLOOR_DIV = ("(({1} == 0) ? 0 : (({1} == -1) ? -{0} : ({0} / {1} - "
                  "((({0} % {1}) != 0) & (({0} < 0) != ({1} < 0))))))")
# numpy's quotient before snapping: (a - fmod(a, b)) / b, one less when fmod's sign differs
# from b's. The compiler computes the repeated subexpressions once.
_M = "fmod{f}({0}, {1})"
_Q = f"((({{0}} - {_M}) / {{1}}) - (({_M} != 0) & (({{1}} < 0) != ({_M} < 0))))"
_FLOAT_FLOOR_DIV = (f"(({{1}} == 0) ? ({{0}} / {{1}}) : (({_Q} == 0) ? "
                    f"copysign{{f}}(0, {{0}} / {{1}}) : ((({_Q} - floor{{f}}({_Q})) > 0.5) ? "
                    f"floor{{f}}({_Q}) + 1 : floor{{f}}({_Q}))))")
_INT_FLOOR_MOD = ("((({1} == 0) | ({1} == -1)) ? 0 : ((({0} % {1}) != 0) & "
                  "((({0} % {1}) < 0) != ({1} < 0))) ? ({0} % {1}) + {1} : ({0} % {1}))")
_FLOAT_FLOOR_MOD = ("((fmod{f}({0}, {1}) != 0) ? (((({1} < 0) != (fmod{f}({0}, {1}) < 0))) ? "
                    "fmod{f}({0}, {1}) + {1} : fmod{f}({0}, {1})) : copysign{f}(0, {1}))")
_INT_MOD = "((({1} == 0) | ({1} == -1)) ? 0 : ({0} % {1}))"

_E = CExpression
_SAME = _E("{0}")  # the value unchanged: a relabelled shape, a copy, a cast (done by the caller)

CODE_FOR_OP: dict[str, CExpression] = {
    "ZerosLike": _E("0"),
    "OnesLike": _E("1"),
    "Add": _E("({0} + {1})"),
    "Sub": _E("({0} - {1})"),
    "Mul": _E("({0} * {1})"),
    "RealDiv": _E("({0} / {1})"),
    "Neg": _E("(-{0})"),
    # NaN-propagating max/min, like numpy (C's fmax drops NaN). Bitwise `|`, `&` rather than
    # `||`, `&&` throughout: short-circuit operators are control flow, which stops vectorisation.
    # Against a number c (not NaN) one comparison gives numpy's result, NaN, ties and signed
    # zeros included: maximum(a, c) is c on a tie and a when a is NaN, which (c >= a) ? c : a
    # is; gcc then makes a compare and a blend where the general form takes two compares and a
    # mask OR (ReLU6 after MobileNetV2's convolutions: 2-4% of its call).
    "Maximum": _E("((({0} > {1}) | ({0} != {0})) ? {0} : {1})",
                  number_templates=((1, "(({1} >= {0}) ? {1} : {0})"),
                                    (0, "(({0} > {1}) ? {0} : {1})"))),
    "Minimum": _E("((({0} < {1}) | ({0} != {0})) ? {0} : {1})",
                  number_templates=((1, "(({1} <= {0}) ? {1} : {0})"),
                                    (0, "(({0} < {1}) ? {0} : {1})"))),
    "Pow": _E("pow{f}({0}, {1})"),
    "Sqrt": _E("sqrt{f}({0})"),
    "Rsqrt": _E("(1 / sqrt{f}({0}))"),
    "Reciprocal": _E("(1 / {0})"),
    # gkm_expf, gkm_tanhf, gkm_erff: graphkernel's own inlined float exp, tanh and erf (c_text.py,
    # at most 1.04-1.05 ulp); gkm_exp, gkm_tanh, gkm_erf are libm's (libmvec's) double ones.
    "Exp": _E("gkm_exp{f}({0})"),
    "Log": _E("log{f}({0})"),
    "Tanh": _E("gkm_tanh{f}({0})"),
    "Erf": _E("gkm_erf{f}({0})"),
    # fabs for floats keeps abs(-0.0) == +0.0. Integers negate through unsigned arithmetic: gcc
    # folds the plain `x < 0 ? -x : x` into an abs it assumes non-negative even under -fwrapv
    # (sign(abs(INT32_MIN)) came out 1; numpy wraps to INT32_MIN, sign -1).
    "Abs": _E("(({0} < 0) ? (__typeof__({0}))(0ull - (unsigned long long){0}) : {0})",
              "fabs{f}({0})"),
    "Floor": _E("floor{f}({0})"),
    "Round": _E("rint{f}({0})"),
    # sign(+-0.0) is +0.0 as in numpy; NaN stays NaN ({0} != {0}).
    "Sign": _E("(({0} > 0) ? 1 : (({0} < 0) ? -1 : (({0} != {0}) ? {0} : 0)))"),
    "Equal": _E("({0} == {1})"),
    "NotEqual": _E("({0} != {1})"),
    "Less": _E("({0} < {1})"),
    "LessEqual": _E("({0} <= {1})"),
    "Greater": _E("({0} > {1})"),
    "GreaterEqual": _E("({0} >= {1})"),
    "LogicalAnd": _E("({0} & {1})"),
    "LogicalOr": _E("({0} | {1})"),
    "LogicalNot": _E("(!{0})"),
    "Select": _E("({0} ? {1} : {2})"),
    "Cast": _SAME,
    "Sin": _E("sin{f}({0})"),
    "Cos": _E("cos{f}({0})"),
    "Erfc": _E("erfc{f}({0})"),
    "Expm1": _E("expm1{f}({0})"),
    "Log1p": _E("log1p{f}({0})"),
    # Softsign x / (1 + |x|): one elementwise op in MindSpore, one expression here.
    "Softsign": _E("({0} / (1 + fabs{f}({0})))"),
    "Identity": _SAME,
    "StopGradient": _SAME,
    # Classification: integers and bools are always finite, never NaN or Inf.
    "IsNan": _E("((bool)0)", "({0} != {0})"),
    "IsInf": _E("((bool)0)", "(({0} == INFINITY) | ({0} == -INFINITY))"),
    # x - x is 0 for every finite x and NaN for NaN and +-Inf; no branch, so it vectorises.
    "IsFinite": _E("((bool)1)", "(({0} - {0}) == 0)"),
    "FloorDiv": _E(_INT_FLOOR_DIV, _FLOAT_FLOOR_DIV),
    "FloorMod": _E(_INT_FLOOR_MOD, _FLOAT_FLOOR_MOD),
    # MindSpore's Mod truncates like C's fmod: the result takes the dividend's sign.
    "Mod": _E(_INT_MOD, "fmod{f}({0}, {1})"),
    # Views inside a group read their input's element.
    "Reshape": _SAME,
    "ExpandDims": _SAME,
    "Squeeze": _SAME,
    "BroadcastTo": _SAME,
}


def code_for_op(op: str) -> CExpression | None:
    """The C expression computing `op` per element, None when C has none for it."""
    return CODE_FOR_OP.get(op)


# Pow to 2 or 3 as products. libmvec's vector powf costs ~10 ns an element, some 50
# multiplies (GPT-2's tanh GELU cubes its input: 11 of a block's 44 ms); ONNX Runtime
# multiplies too. x * x is pow's correctly rounded result; x * x * x rounds twice (within
# 2 ulp of the exact cube), and signs, zeros, infinities and NaN come out as pow's.
_POWERS_BY_PRODUCTS = {2.0: "({0} * {0})", 3.0: "(({0} * {0}) * {0})"}


def power_by_products(exponent: float) -> CExpression | None:
    """Pow's expression for this constant exponent when it is a few products, else None."""
    template = _POWERS_BY_PRODUCTS.get(float(exponent))
    return None if template is None else _E(template)


@dataclass(frozen=True)
class CReduction:
    """How C folds one reduction kind: one combine step and OpenMP's operator."""

    combine: str  # C expression over `{acc}` and `{v}`
    omp_operator: str  # the OpenMP `reduction(op: ...)` operator: +, *, max, min, &, |


C_REDUCTIONS: dict[ReductionKind, CReduction] = {
    ReductionKind.SUM: CReduction("{acc} + {v}", "+"),
    ReductionKind.PRODUCT: CReduction("{acc} * {v}", "*"),
    ReductionKind.MAX: CReduction("{acc} > {v} ? {acc} : {v}", "max"),
    ReductionKind.MIN: CReduction("{acc} < {v} ? {acc} : {v}", "min"),
    ReductionKind.ALL: CReduction("({acc} & {v})", "&"),
    ReductionKind.ANY: CReduction("({acc} | {v})", "|"),
}


def c_identity(reduction: Reduction, dtype: np.dtype) -> str:
    """The reduction's identity as a C literal of `dtype`: +-infinity is the integer limit for
    an integer dtype."""
    value = reduction.identity
    if math.isinf(value):
        if T.is_float(dtype):
            return "-INFINITY" if value < 0 else "INFINITY"
        bits = "INT64" if dtype == T.int64 else "INT32"
        return f"{bits}_MIN" if value < 0 else f"{bits}_MAX"
    if value != int(value):
        raise ValueError(f"a reduction identity {value} is not a whole number")
    return str(int(value))
