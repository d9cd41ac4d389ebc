"""Small .tflite models with WHILE loops (built with tests/frontend/tflite_multi.py) for the
static-unrolling tests: a counter loop, an accumulating loop, an RNN-style loop that GATHERs the
time step with the counter (float or int8, weights passed through the loop as converters do),
nested loops and loops the importer must refuse."""
import numpy as np

from tests.frontend.tflite_multi import Subgraph, build

RNG = np.random.default_rng(0)


def _i32(sg, name, v):
    return sg.tensor(name, (), "int32", data=np.asarray(v, np.int32))


def _less_cond(name, limit, var_specs):
    """cond(i, ...) = i < limit (var_specs: the loop variables' (shape, dtype, scale, zp))."""
    sg = Subgraph(name)
    vs = [sg.tensor(f"v{j}", s, d, scale=sc, zero_point=zp) for j, (s, d, sc, zp) in enumerate(var_specs)]
    c = sg.tensor("c", (), "bool")
    sg.op("LESS", [vs[0], _i32(sg, "limit", limit)], [c])
    sg.inputs, sg.outputs = vs, [c]
    return sg


def _inc(sg, i):
    i1 = sg.tensor("i1", (), "int32")
    sg.op("ADD", [i, _i32(sg, "one", 1)], [i1], "AddOptions")
    return i1


def counter_model(trips=5, start=0):
    """y = x * 1.5 ** trips, with a counter from ``start`` to ``trips``."""
    specs = [((), "int32", None, 0), ((1, 4), "float32", None, 0)]
    main = Subgraph("main")
    x = main.tensor("x", (1, 4))
    i0, io, y = _i32(main, "i0", start), main.tensor("i_out", (), "int32"), main.tensor("y", (1, 4))
    main.op("WHILE", [i0, x], [io, y], "WhileOptions", CondSubgraphIndex=1, BodySubgraphIndex=2)
    main.inputs, main.outputs = [x], [y]
    body = Subgraph("body")
    i, a = body.tensor("i", (), "int32"), body.tensor("a", (1, 4))
    a1 = body.tensor("a1", (1, 4))
    body.op("MUL", [a, body.tensor("k", (1,), data=np.asarray([1.5], np.float32))], [a1], "MulOptions")
    body.inputs, body.outputs = [i, a], [_inc(body, i), a1]
    return build([main, _less_cond("cond", trips, specs), body])


def accumulate_model(trips=3, n=4):
    """acc = sum over iterations of FC(x, W) (W and x carried through the loop unchanged)."""
    w = RNG.standard_normal((n, n)).astype(np.float32)
    specs = [((), "int32", None, 0), ((1, n), "float32", None, 0), ((1, n), "float32", None, 0),
             ((n, n), "float32", None, 0)]
    main = Subgraph("main")
    x = main.tensor("x", (1, n))
    ins = [_i32(main, "i0", 0), main.tensor("acc0", (1, n), data=np.zeros((1, n), np.float32)), x,
           main.tensor("w", (n, n), data=w)]
    outs = [main.tensor("i_out", (), "int32"), main.tensor("acc", (1, n)), main.tensor("x_out", (1, n)),
            main.tensor("w_out", (n, n))]
    main.op("WHILE", ins, outs, "WhileOptions", CondSubgraphIndex=1, BodySubgraphIndex=2)
    main.inputs, main.outputs = [x], [outs[1]]
    body = Subgraph("body")
    vs = [body.tensor(f"v{j}", s, d) for j, (s, d, _, _) in enumerate(specs)]
    p, acc1 = body.tensor("p", (1, n)), body.tensor("acc1", (1, n))
    body.op("FULLY_CONNECTED", [vs[2], vs[3], -1], [p], "FullyConnectedOptions")
    body.op("ADD", [vs[1], p], [acc1], "AddOptions")
    body.inputs, body.outputs = vs, [_inc(body, vs[0]), acc1, vs[2], vs[3]]
    return build([main, _less_cond("cond", trips, specs), body])


class Q:
    """Quantisation of the int8 RNN's tensors (None: float)."""
    x, h, pre, s = (0.05, 3), (1 / 128, 0), (0.06, -2), (0.09, 1)


def _qt(sg, name, shape, q, int8, data=None):
    if not int8:
        return sg.tensor(name, shape, data=None if data is None else np.asarray(data, np.float32))
    return sg.tensor(name, shape, "int8", data=data, scale=q[0], zero_point=q[1])


def _rnn_weights(i, h, int8):
    wx = RNG.standard_normal((h, i)).astype(np.float32) * 0.5
    wh = RNG.standard_normal((h, h)).astype(np.float32) * 0.5
    if not int8:
        return wx, wh, None, None
    return (np.clip(np.round(wx / 0.02), -127, 127).astype(np.int8), np.clip(np.round(wh / 0.02), -127, 127)
            .astype(np.int8), RNG.integers(-300, 300, h).astype(np.int32), RNG.integers(-300, 300, h).astype(np.int32))


def _rnn_step(sg, x, t, hprev, wx, wh, bx, bh, i, h, int8, tag=""):
    """h' = tanh(FC(x[t], Wx) + FC(h, Wh)) on tensors of ``sg``."""
    xt = _qt(sg, f"xt{tag}", (1, i), Q.x, int8)
    sg.op("GATHER", [x, t], [xt], "GatherOptions", Axis=0)
    a, b = _qt(sg, f"a{tag}", (1, h), Q.pre, int8), _qt(sg, f"b{tag}", (1, h), Q.pre, int8)
    sg.op("FULLY_CONNECTED", [xt, wx, -1 if bx is None else bx], [a], "FullyConnectedOptions")
    sg.op("FULLY_CONNECTED", [hprev, wh, -1 if bh is None else bh], [b], "FullyConnectedOptions")
    s, hn = _qt(sg, f"s{tag}", (1, h), Q.s, int8), _qt(sg, f"h{tag}", (1, h), Q.h, int8)
    sg.op("ADD", [a, b], [s], "AddOptions")
    sg.op("TANH", [s], [hn])
    return hn


def _weight_tensors(sg, i, h, int8, ws):
    wx, wh, bx, bh = ws
    if not int8:
        return [sg.tensor("wx", (h, i), data=wx), sg.tensor("wh", (h, h), data=wh)]
    return [sg.tensor("wx", (h, i), "int8", data=wx, scale=0.02), sg.tensor("wh", (h, h), "int8", data=wh, scale=0.02),
            sg.tensor("bx", (h,), "int32", data=bx, scale=Q.x[0] * 0.02),
            sg.tensor("bh", (h,), "int32", data=bh, scale=Q.h[0] * 0.02)]


def _var_specs(t, i, h, int8):
    f = "int8" if int8 else "float32"
    s = [((), "int32", None, 0), ((t, 1, i), f) + (Q.x if int8 else (None, 0)), ((1, h), f) + (Q.h if int8 else (None, 0)),
         ((h, i), f, 0.02 if int8 else None, 0), ((h, h), f, 0.02 if int8 else None, 0)]
    if int8:
        s += [((h,), "int32", Q.x[0] * 0.02, 0), ((h,), "int32", Q.h[0] * 0.02, 0)]
    return s


def _bind(sg, specs):
    return [sg.tensor(f"v{j}", s, d, scale=sc, zero_point=zp) for j, (s, d, sc, zp) in enumerate(specs)]


def rnn_model(t=5, i=3, h=4, int8=False, nested=0):
    """A simple RNN over x [t, 1, i] -> the last h [1, h]: a WHILE over the time steps whose body
    GATHERs step ``i`` (weights passed through the loop). ``nested`` > 0: each time step runs an
    inner WHILE of ``nested`` iterations of the cell on the same input."""
    ws = _rnn_weights(i, h, int8)
    specs = _var_specs(t, i, h, int8)
    main = Subgraph("main")
    x = _qt(main, "x", (t, 1, i), Q.x, int8)
    h0 = _qt(main, "h0", (1, h), Q.h, int8, data=np.zeros((1, h), np.int8 if int8 else np.float32))
    ins = [_i32(main, "i0", 0), x, h0] + _weight_tensors(main, i, h, int8, ws)
    outs = [main.tensor(f"o{j}", s, d, scale=sc, zero_point=zp) for j, (s, d, sc, zp) in enumerate(specs)]
    main.op("WHILE", ins, outs, "WhileOptions", CondSubgraphIndex=1, BodySubgraphIndex=2)
    main.inputs, main.outputs = [x], [outs[2]]
    body = Subgraph("body")
    vs = _bind(body, specs)
    wts = vs[3:]
    bx, bh = (wts[2], wts[3]) if int8 else (None, None)
    if not nested:
        hn = _rnn_step(body, vs[1], vs[0], vs[2], wts[0], wts[1], bx, bh, i, h, int8)
    else:       # inner loop: (j, x, h, weights..., t) -> h stepped ``nested`` times on x[t]
        inner_specs = [specs[0]] + specs[1:] + [specs[0]]
        inner_outs = _bind(body, inner_specs)
        body.op("WHILE", [_i32(body, "j0", 0)] + vs[1:] + [vs[0]], inner_outs, "WhileOptions",
                CondSubgraphIndex=3, BodySubgraphIndex=4)
        hn = inner_outs[2]
    body.inputs, body.outputs = vs, [_inc(body, vs[0])] + vs[1:2] + [hn] + vs[3:]
    sgs = [main, _less_cond("cond", t, specs), body]
    if nested:
        inner = Subgraph("inner_body")
        ivs = _bind(inner, inner_specs)
        iw = ivs[3:-1]
        ibx, ibh = (iw[2], iw[3]) if int8 else (None, None)
        hn = _rnn_step(inner, ivs[1], ivs[-1], ivs[2], iw[0], iw[1], ibx, ibh, i, h, int8, "_in")
        inner.inputs, inner.outputs = ivs, [_inc(inner, ivs[0])] + ivs[1:2] + [hn] + ivs[3:]
        sgs += [_less_cond("inner_cond", nested, inner_specs), inner]
    return build(sgs)


def data_dependent_model():
    """while sum(a) < 100: a = a * 2 (a trip count that depends on the input)."""
    main = Subgraph("main")
    x, y = main.tensor("x", (1, 4)), main.tensor("y", (1, 4))
    main.op("WHILE", [x], [y], "WhileOptions", CondSubgraphIndex=1, BodySubgraphIndex=2)
    main.inputs, main.outputs = [x], [y]
    cond = Subgraph("cond")
    a, s, c = cond.tensor("a", (1, 4)), cond.tensor("s", ()), cond.tensor("c", (), "bool")
    cond.op("SUM", [a, cond.tensor("ax", (2,), "int32", data=np.asarray([0, 1], np.int32))], [s], "ReducerOptions")
    cond.op("LESS", [s, cond.tensor("lim", (), data=np.asarray(100, np.float32))], [c])
    cond.inputs, cond.outputs = [a], [c]
    body = Subgraph("body")
    b, b2 = body.tensor("b", (1, 4)), body.tensor("b2", (1, 4))
    body.op("MUL", [b, body.tensor("two", (1,), data=np.asarray([2.0], np.float32))], [b2], "MulOptions")
    body.inputs, body.outputs = [b], [b2]
    return build([main, cond, body])


def malformed_model(kind):
    """A counter loop with one thing wrong: ``cond_index`` (out of range), ``body_outputs`` (the
    body returns one output for two loop variables), ``cond_type`` (the cond returns a float),
    ``var_type`` (the body changes a loop variable's shape)."""
    specs = [((), "int32", None, 0), ((1, 4), "float32", None, 0)]
    main = Subgraph("main")
    x = main.tensor("x", (1, 4))
    i0, io, y = _i32(main, "i0", 0), main.tensor("i_out", (), "int32"), main.tensor("y", (1, 4))
    main.op("WHILE", [i0, x], [io, y], "WhileOptions", CondSubgraphIndex=7 if kind == "cond_index" else 1,
            BodySubgraphIndex=2)
    main.inputs, main.outputs = [x], [y]
    cond = _less_cond("cond", 3, specs)
    if kind == "cond_type":
        cond = Subgraph("cond")
        vs = [cond.tensor(f"v{j}", s, d) for j, (s, d, _, _) in enumerate(specs)]
        cond.inputs, cond.outputs = vs, [vs[1]]
    body = Subgraph("body")
    i, a = body.tensor("i", (), "int32"), body.tensor("a", (1, 4))
    a1 = body.tensor("a1", (1,) if kind == "var_type" else (1, 4))
    if kind == "var_type":
        body.op("SUM", [a, body.tensor("ax", (1,), "int32", data=np.asarray([1], np.int32))], [a1], "ReducerOptions")
    else:
        body.op("MUL", [a, body.tensor("k", (1,), data=np.asarray([1.5], np.float32))], [a1], "MulOptions")
    body.inputs = [i, a]
    body.outputs = [_inc(body, i)] if kind == "body_outputs" else [_inc(body, i), a1]
    return build([main, cond, body])


def counter_chain_model(t=5, i=3, bad_index=False):
    """acc = sum over steps s of x[order[s]] * float(s), the step's index read from an int32 table
    (GATHER of a [t, 1] table, SQUEEZE) and the cond ``float(s) < t - 0.5`` (CAST): a counter chain
    of CAST, int32 GATHER and SQUEEZE, folded at import like ADD and LESS. ``bad_index``: the
    table has t - 1 rows (the last step's counter is out of its range)."""
    order = np.asarray([[(3 * s + 1) % t] for s in range(t - 1 if bad_index else t)], np.int32)
    specs = [((), "int32", None, 0), ((t, 1, i), "float32", None, 0), ((1, i), "float32", None, 0)]
    main = Subgraph("main")
    x = main.tensor("x", (t, 1, i))
    ins = [_i32(main, "i0", 0), x, main.tensor("acc0", (1, i), data=np.zeros((1, i), np.float32))]
    outs = [main.tensor(f"o{j}", s, d) for j, (s, d, _, _) in enumerate(specs)]
    main.op("WHILE", ins, outs, "WhileOptions", CondSubgraphIndex=1, BodySubgraphIndex=2)
    main.inputs, main.outputs = [x], [outs[2]]
    cond = Subgraph("cond")
    cv = _bind(cond, specs)
    f, c = cond.tensor("f", ()), cond.tensor("c", (), "bool")
    cond.op("CAST", [cv[0]], [f])
    cond.op("LESS", [f, cond.tensor("lim", (), data=np.asarray(t - 0.5, np.float32))], [c])
    cond.inputs, cond.outputs = cv, [c]
    body = Subgraph("body")
    vs = _bind(body, specs)
    g1, j = body.tensor("g1", (1,), "int32"), body.tensor("j", (), "int32")
    body.op("GATHER", [body.tensor("order", order.shape, "int32", data=order), vs[0]], [g1], "GatherOptions", Axis=0)
    body.op("SQUEEZE", [g1], [j])
    xt, w, p, a1 = body.tensor("xt", (1, i)), body.tensor("w", ()), body.tensor("p", (1, i)), body.tensor("a1", (1, i))
    body.op("GATHER", [vs[1], j], [xt], "GatherOptions", Axis=0)
    body.op("CAST", [vs[0]], [w])
    body.op("MUL", [xt, w], [p], "MulOptions")
    body.op("ADD", [vs[2], p], [a1], "AddOptions")
    body.inputs, body.outputs = vs, [_inc(body, vs[0]), vs[1], a1]
    return build([main, cond, body])
