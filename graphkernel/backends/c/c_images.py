"""The loop over a window kernel's images, shared by convolutions (c_window.py), their blocks
(c_conv_block.py) and pools (c_pool.py): on OpenMP threads when the call is large enough, and
the batch size read from the kernel's arguments when it is dynamic."""
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
