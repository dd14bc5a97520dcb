"""`from graphkernel.common import dtype as mstype`: MindSpore's dtype names, as the numpy dtypes
graphkernel computes in. Names MindSpore has but graphkernel does not compute in (int8, uint8,
bfloat16, complex64, ...) are absent, so a port that needs them fails at the import line."""
from graphkernel.ir.types import bool_, float16, float32, float64, int32, int64

float_ = float32
double = float64
half = float16
single = float32
int_ = int64
pytype_to_dtype = {bool: bool_, int: int64, float: float32}
number_type = (float16, float32, float64, int32, int64)
float_type = (float16, float32, float64)
int_type = (int32, int64)

__all__ = ["bool_", "float16", "float32", "float64", "int32", "int64", "float_", "double",
           "half", "single", "int_", "pytype_to_dtype", "number_type", "float_type", "int_type"]
