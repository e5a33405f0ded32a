"""Graph-building scripts written against Mirage's Python API (`mi` is `mirage` or `mucc`):
the hand-written µGraphs that graph 0 of the corpus files gated_mlp.json, rmsnorm_bs1.json and
lora.json hold."""


def gated_mlp_mirage_script(mi):
    """Mirage's hand-written gated-MLP µGraph (what gated_mlp.json's graph 0 holds)."""
    graph = mi.new_kernel_graph()
    X = graph.new_input(dims=(8, 4096), dtype=mi.float16)
    W1 = graph.new_input(dims=(4096, 4096), dtype=mi.float16)
    W2 = graph.new_input(dims=(4096, 4096), dtype=mi.float16)
    tb = mi.new_threadblock_graph(grid_dim=(128, 1, 1), block_dim=(128, 1, 1), forloop_range=64,
                                  reduction_dimx=64)
    tX = tb.new_input(dtensor=X, input_map=(-1, -1, -1), forloop_dim=1)
    tW1 = tb.new_input(dtensor=W1, input_map=(1, -1, -1), forloop_dim=0)
    tW2 = tb.new_input(dtensor=W2, input_map=(1, -1, -1), forloop_dim=0)
    tM1 = tb.matmul(tX, tW1)
    tM2 = tb.matmul(tX, tW2)
    tA1 = tb.forloop_accum(tM1)
    tA2 = tb.forloop_accum(tM2)
    tS = tb.silu(tA1)
    tb.new_output(stensor=tA2, output_map=(1, -1, -1))
    tb.new_output(stensor=tS, output_map=(1, -1, -1))
    O = graph.customized([X, W1, W2], tb)
    graph.mark_output(graph.mul(O[0], O[1]))
    return graph


def rmsnorm_mirage_script(mi):
    graph = mi.new_kernel_graph()
    X = graph.new_input(dims=(2, 4096), dtype=mi.float16)
    W = graph.new_input(dims=(4096, 6144), dtype=mi.float16)
    tb = mi.new_threadblock_graph(grid_dim=(256, 1, 1), block_dim=(128, 1, 1), forloop_range=32,
                                  reduction_dimx=64)
    tX = tb.new_input(dtensor=X, input_map=(-1, -1, -1), forloop_dim=1)
    tW = tb.new_input(dtensor=W, input_map=(1, -1, -1), forloop_dim=0)
    tR = tb.forloop_accum(tX, "rms")
    tM = tb.matmul(tX, tW)
    tA = tb.forloop_accum(tM)
    tb.new_output(stensor=tb.div(tA, tR), output_map=(1, -1, -1))
    O = graph.customized([X, W], tb)
    graph.mark_output(O[0])
    return graph


def lora_mirage_script(mi):
    graph = mi.new_kernel_graph()
    X = graph.new_input(dims=(16, 256), dtype=mi.float16)
    W = graph.new_input(dims=(256, 4096), dtype=mi.float16)
    A = graph.new_input(dims=(256, 16), dtype=mi.float16)
    B = graph.new_input(dims=(16, 4096), dtype=mi.float16)
    tb = mi.new_threadblock_graph((64, 1, 1), (128, 1, 1), 1, 64)
    tX = tb.new_input(X, (-1, -1, -1), -1)
    tW = tb.new_input(W, (1, -1, -1), -1)
    tA = tb.new_input(A, (-1, -1, -1), -1)
    tB = tb.new_input(B, (1, -1, -1), -1)
    tC = tb.matmul(tX, tW)
    tD = tb.matmul(tX, tA)
    tE = tb.matmul(tD, tB)
    tb.new_output(tb.forloop_accum(tb.add(tE, tC)), (1, -1, -1))
    graph.mark_output(graph.customized([X, W, A, B], tb)[0])
    return graph
