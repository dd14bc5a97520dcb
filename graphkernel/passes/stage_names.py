"""The names of the compile stages, in one place. Each name is also the dump's file name
(`<name>.ir`, `<name>.dot`), numbered as in MindSpore so each dump maps to one pass."""

TRACE = "0_trace"
FOLD_CONSTANTS = "1_fold_constants"
CSE = "2_cse"
DEAD_CODE = "3_dead_code"
VALIDATE = "6_validate"  # the initial graph: the same with fusion on or off
EXPAND = "hwopt_1_graph_kernel_expand"
BASIC_FUSION = "hwopt_2_basic_op_fusion"
COMPOSITE_FUSION = "hwopt_3_composite_op_fusion"
SIMPLIFY = "hwopt_4_graph_kernel_simplify"
PARALLEL_FUSION = "hwopt_5_parallel_fusion"  # independent groups launched as one kernel
END = "hwopt_d_end"  # the fused graph, each composite's loop nest planned
LOWER = "hwopt_e_lower"  # the same graph, each node's kernel kind chosen (graph_kernel/lower.py)

INITIAL, FINAL = VALIDATE, LOWER  # FINAL: the graph that runs, each kernel chosen

# The backend stages graph_kernel_flags' --enable_pass / --disable_pass switch, in order.
SWITCHABLE = (EXPAND, BASIC_FUSION, COMPOSITE_FUSION, SIMPLIFY, PARALLEL_FUSION)
