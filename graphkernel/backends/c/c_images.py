"""The loop over a window kernel's images, shared by convolutions (c_window.py), their blocks
(c_conv_block.py) and pools (c_pool.py): on OpenMP threads when the call is large enough, and
the batch size read from the kernel's arguments when it is dynamic; and, for a batch of one,
one image's channel-vector units shared over the threads (`channel_image`)."""
from __future__ import annotations

from graphkernel.backends.c.shape_args import kernel_symbols, read_sizes
from graphkernel.ir.graph import Node


def batch_after(node: Node, first: int) -> tuple[str, list[str]]:
    """The batch size's C expression and the lines that read it from args[first]."""
    n = node.inputs[0].shape[0]
    return str(n), read_sizes(kernel_symbols((n,)), first)


def image_loop(call: str, batch: str, per_image: int, threshold: int,
            scratch: list[str], free: list[str]) -> list[str]:
    """The loop over images: on threads (each with its own scratch) above `threshold`
    multiply-adds, else on the calling thread (an OpenMP `if` clause still enters the runtime).
    `call` may read `gk_par`: true when one image alone reaches `threshold` on the calling
    thread, so that the image's own work can go to threads (a batch of one)."""
    body = ["    for (int64_t n = 0; n < nb; ++n) " + call]
    lines = [f"  const int64_t nb = {batch};",
             f"  if (nb > 1 && nb * (int64_t){per_image} >= (int64_t){threshold}) {{",
             "    #pragma omp parallel",
             "    {",
             "      const int gk_par = 0;",
             "      (void)gk_par;"]
    lines += ["  " + s for s in scratch]
    lines += ["      #pragma omp for schedule(static)", "  " + body[0]]
    lines += ["  " + s for s in free]
    lines += ["    }", "  } else {",
              f"    const int gk_par = (int64_t){per_image} >= (int64_t){threshold};",
              "    (void)gk_par;"]
    lines += scratch + body + free + ["  }"]
    return lines


def channel_image(name: str, fill: str | None, unit: str, channels: int, groups: int,
                  og: int, epilogue: str | None, stored: str | None = None) -> list[str]:
    """The body of an image function of the channel path: the zero-bordered fill (`fill`,
    input channel blocks 0 to `channels`; None: none), then the image's channel-vector units,
    each followed by `epilogue` over the channels and rows it wrote (None: no epilogue).

    On the calling thread, or (`par`, a batch of one) in ONE parallel region: the fill shared
    out, a barrier, then the units, whose epilogue runs in the same work item on the tile
    just written. At batch 1 a fill, the units and the epilogue as three parallel regions cost
    three wake-ups of the team and three barriers per convolution, about 160 for ResNet-50's
    call; the epilogue then also read the whole output back.

    Each unit is split into pieces of its row steps so that the work items (units x pieces)
    are a multiple of the threads. By units alone, a split of NU units over T threads leaves
    ceil(NU / T) / (NU / T) - 1 of the time idle (3 threads, 64 channels: two units, a third
    of the team idle). The fewest pieces that balance (T / gcd(NU, T), at most the row steps)
    keep each unit's weights in one thread's cache for the longest run; a piece costs one more
    pass over the unit's weights (taps x channel vectors), against rows x taps multiply-adds.

    `stored`: the units apply the epilogue as they store (c_conv_units.StoreEpilogue), these
    the further arguments of their call; `epilogue` then does not run after them."""
    item = [f"{unit}(xs, wt, on, gi, u, piece, pieces{stored or ''});"]
    if epilogue is not None and stored is None:
        item += [
            f"{{ const int64_t c0 = gi * {og}LL + u * {name}_UV * {name}_VL;",
            f"  const int64_t c1 = c0 + {name}_UV * {name}_VL < (gi + 1) * {og}LL ? "
            f"c0 + {name}_UV * {name}_VL : (gi + 1) * {og}LL;",
            f"  const int64_t s0 = {name}_RS * piece / pieces, "
            f"s1 = {name}_RS * (piece + 1) / pieces;",
            f"  if (s0 < s1) {epilogue}(on, n, args, pre, c0, c1, s0 * {name}_RP, "
            f"s1 * {name}_RP); }}"]
    fill_par = [] if fill is None else [
        "      #pragma omp for schedule(static)",
        f"      for (int64_t ci = 0; ci < {channels}; ++ci) {fill}(xn, xp, ci);"]
    fill_one = [] if fill is None else [
        f"    for (int64_t ci = 0; ci < {channels}; ++ci) {fill}(xn, xp, ci);"]
    return [
        "  if (par) {",
        "    #pragma omp parallel",
        "    {",
        "      /* the fewest pieces that give every thread the same number of items */",
        "      const int64_t team = omp_get_num_threads();",
        f"      int64_t a = {name}_NU, b = team;",
        "      while (b) { const int64_t t = a % b; a = b; b = t; }",
        f"      const int64_t pieces = team / a < {name}_RS ? team / a : {name}_RS;",
        *fill_par,
        f"      for (int64_t gi = 0; gi < {groups}; ++gi) {{",
        "        #pragma omp for schedule(static) nowait",
        f"        for (int64_t it = 0; it < {name}_NU * pieces; ++it) {{",
        "          const int64_t u = it / pieces, piece = it % pieces;",
        *["          " + x for x in item],
        "        }",
        "      }",
        "    }",
        "  } else {",
        *fill_one,
        "    const int64_t pieces = 1, piece = 0;",
        f"    for (int64_t gi = 0; gi < {groups}; ++gi)",
        f"      for (int64_t u = 0; u < {name}_NU; ++u) {{",
        *["        " + x for x in item],
        "      }",
        "  }"]
