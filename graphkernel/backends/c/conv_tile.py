"""The register tile of a convolution's channel-vector units (c_conv_units.conv_units), a schedule
choice tuned per kernel (backends/c/tuning.py `Knobs`).

A unit keeps `vectors` channel vectors (VL output channels each) x `pixels` output pixels of
accumulators in vector registers while it walks the taps: per tap one weight load per channel
vector and one broadcast per pixel feed vectors x pixels multiply-adds. More channel vectors
reuse each broadcast more, more pixels each weight vector more; both are bounded by the
register file. It applies to the 512-bit code (AVX-512: 32 vector registers); the 256-bit code
(AVX2, 16 registers) keeps one channel vector x 8 pixels.

The untuned default is a rule on the register file, not a measured constant: two channel
vectors (each broadcast feeds two multiply-adds, so the loads stay under the multiply-adds) and
as many pixels as then fit (`fit_pixels`), with RESERVED_REGISTERS left for the compiler's
temporaries. A tile that does not fit would spill accumulators to the stack every tap.
On Zen 5 a 3 x 8 tile took 1.03x the rule's 2 x 12 (ResNet-18 b1); on the Zen 4 host before
it 4 x 7 took 1.09x and 1 x 26 1.75x: the rule keeps two channel vectors, but for a pointwise
convolution read in place with long rows (`rule_vectors`)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

VECTOR_REGISTERS = 32  # AVX-512's zmm0-31
# One spare: 2 x 14, whose tap loop holds 28 accumulators, two weight vectors and the broadcast
# pixel (31 registers; gcc 12's code for ResNet-18's 3x3s keeps it free of spills). Rows of
# 56, 28 and 14 then split into whole blocks of 14 where 13 left blocks of 12 and 8, 10 and 8,
# 7 and 7. Zen 5, two threads, whole calls alternated against three spare (2 x 13): ResNet-18
# b1 0.989x (its 28x28 and 14x14 3x3s 0.93-0.97x, 56x56 0.98-0.99x), b8 0.994x, ResNet-50 b8
# 0.986x, b1 0.994x, MobileNetV2 b8 0.991x. Three spare had taken 4 blocks of 12-13 pixels for
# 7x7 images where four spare (2 x 12) took 5 of 9-10 (ResNet-18 b1 steps 0.983x).
RESERVED_REGISTERS = 1
# A 1x1 unit's weights per chunk of taps (c_conv_units.tap_chunk): calibration sets a third of
# the L1 data cache (calibration.TAP_CHUNK_SHARE_OF_L1D); this where the cache size is unknown.
TAP_CHUNK_BYTES = 16 << 10
MAX_TAP_CHUNK_BYTES = 1 << 32
DEFAULT_VECTORS = 2
MAX_VECTORS = 4


# A stride-1 1x1 convolution reads its input in place, and each of its units walks all of it:
# units of four channel vectors halve that traffic. Zen 5, two threads, ResNet-50's kernels
# within whole calls (alternated, one process; bit-identical results): output rows of 56 and
# 28 pixels took 0.60-0.97x the two-vector time at batch 8 (256->64 at 56x56 0.64-0.68x) and
# 0.51-0.95x at batch 1 (where two threads shared an image's units); rows of 14 and 7 took
# 1.08-1.15x (an image's input stays in L2 from one unit to the next, and a row of 14 fills
# four-vector tiles in blocks of 5, 5 and 4), so they keep two; so do few taps, where a
# unit's stores weigh as much as its multiply-adds (MobileNetV2's 32->192 at 28x28, batch 8,
# 1.01-1.03x).
WIDE_POINTWISE_VECTORS = 4
WIDE_POINTWISE_MIN_ROW = 28
WIDE_POINTWISE_MIN_TAPS = 64


def rule_vectors(reads_in_place: bool, channel_vectors: int, row: int, taps: int) -> int:
    """The rule's channel vectors a unit for a convolution that reads its input in place (a
    stride-1 1x1) or not, of `channel_vectors` output channel vectors a group, output rows of
    `row` pixels and `taps` taps (input channels a group)."""
    if reads_in_place and channel_vectors % WIDE_POINTWISE_VECTORS == 0 and \
            row >= WIDE_POINTWISE_MIN_ROW and taps >= WIDE_POINTWISE_MIN_TAPS:
        return WIDE_POINTWISE_VECTORS
    return DEFAULT_VECTORS


def fit_pixels(vectors: int) -> int:
    """The most pixels a unit of `vectors` channel vectors keeps in registers: accumulators,
    a weight vector per channel vector and the broadcast pixel, RESERVED_REGISTERS spare."""
    return (VECTOR_REGISTERS - RESERVED_REGISTERS - vectors - 1) // vectors


MAX_PIXELS = fit_pixels(1)


def check_conv_tile(vectors: object, pixels: object) -> str | None:
    """Why (`vectors`, `pixels`) (None: the rule's) is not a tile a kernel may take, or None."""
    if vectors is not None and (type(vectors) is not int or not 1 <= vectors <= MAX_VECTORS):
        return f"conv_channel_vectors is {vectors!r:.40}; it is None or an int from 1 to " \
               f"{MAX_VECTORS}"
    if pixels is not None and (type(pixels) is not int or not 1 <= pixels <= MAX_PIXELS):
        return f"conv_pixels is {pixels!r:.40}; it is None or an int from 1 to {MAX_PIXELS}"
    v = DEFAULT_VECTORS if vectors is None else vectors
    if pixels is not None and pixels > fit_pixels(v):
        return f"conv_pixels {pixels} with {v} channel vectors does not fit " \
               f"{VECTOR_REGISTERS} vector registers (at most {fit_pixels(v)})"
    return None


@dataclass(frozen=True)
class ConvTile:
    """A unit's register tile: `vectors` channel vectors x `pixels` pixels (None: the rule's),
    and `chunk_bytes`, the most bytes of its weights a 1x1 unit walks over its pixels at a time
    (c_conv_units.tap_chunk; 0: all its taps at once)."""

    vectors: int | None = None
    pixels: int | None = None
    chunk_bytes: int = TAP_CHUNK_BYTES

    def __post_init__(self) -> None:
        problem = check_conv_tile(self.vectors, self.pixels) or \
            check_tap_chunk_bytes(self.chunk_bytes)
        assert problem is None, problem  # CConfig and the tuning records check first

    def resolved(self) -> tuple[int, int]:
        v = DEFAULT_VECTORS if self.vectors is None else self.vectors
        return v, fit_pixels(v) if self.pixels is None else self.pixels

    def for_convolution(self, reads_in_place: bool, channel_vectors: int, row: int,
                        taps: int) -> ConvTile:
        """This tile with the rule's channel vectors taken for one convolution
        (`rule_vectors`); chosen vectors stay, and so does the rule's two where chosen pixels
        would not fit the wider unit's registers."""
        if self.vectors is not None:
            return self
        vectors = rule_vectors(reads_in_place, channel_vectors, row, taps)
        if vectors == DEFAULT_VECTORS or \
                (self.pixels is not None and self.pixels > fit_pixels(vectors)):
            return self
        return dataclasses.replace(self, vectors=vectors)

    def partial(self, vectors: int) -> int:
        """Pixels of a unit of fewer channel vectors (a group's last): the tile's own. Filling
        its spare registers with more pixels made MobileNetV2's 32->16 1x1 at 112x112 (one
        channel vector, 24 pixels a block) 3.3x slower."""
        return self.resolved()[1]


def check_tap_chunk_bytes(value: object) -> str | None:
    """Why `value` is not a unit's weight bytes per chunk of taps a kernel may take, or None."""
    if type(value) is not int or not 0 <= value <= MAX_TAP_CHUNK_BYTES:
        return f"conv_tap_chunk_bytes is {value!r:.40}; it is an int from 0 (never chunked) " \
               f"to {MAX_TAP_CHUNK_BYTES}"
    return None


def check_store_epilogue(value: object) -> str | None:
    """Why `value` is not a conv block's epilogue placement a kernel may take, or None: None
    (c_conv_block.store_epilogue_rule decides), 0 (a second pass over each unit's output) or
    1 (in the units' stores, on the accumulators)."""
    if value is not None and (type(value) is not int or value not in (0, 1)):
        return f"conv_store_epilogue is {value!r:.40}; it is None, 0 or 1"
    return None


RULE_TILE = ConvTile()  # the rule's tile, the untuned default
CONV_TILE = ("conv_channel_vectors", "conv_pixels")  # CConfig's (and Knobs') fields for it
