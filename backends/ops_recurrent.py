"""C lowering of the float ``lstm``: the op's TE compute, every stage kept (no inlining). The
int8 and int16 LSTMs (TensorFlow Lite Micro's ``EvalLstm``) are ``backends/ops_recurrent_int16.py``.

A stateful LSTM's sequence node and its cell twin (``frontend/lstm_state.py``: the final cell
state, the next c0) are one group (``passes.fuse``); its kernel writes both, the recurrence
computed once: the twin's output is the last step's cell stage (``k.also_writes``).
"""
from __future__ import annotations

from kiln.frontend.lstm_state import is_cell_twin
from kiln.frontend.ops.recurrent import lstm_te_gather, lstm_te_states

from .lower import lower_rule, lower_te


def _keep_stages(sch, out_block):
    return None


def cell_twin(k, node):
    """The name of the node of ``node``'s group that returns its final cell state (to be written
    by the same kernel), or None."""
    nodes = {m.name: m for m in getattr(k.group, "nodes", ())}
    return next((v for v in k.also_wanted() if v in nodes and is_cell_twin(node, nodes[v])), None)


@lower_rule("lstm")
def lower_lstm(k, node, xs):
    # every stage stays a loop nest of its own: inlining the per-step states into their consumers
    # (the default schedule) would recompute the whole recurrence in each later step
    k.schedule(_keep_stages)
    twin = cell_twin(k, node)
    if twin is None:
        return lower_te(k, node, xs)     # float: the op's TE compute; quantised: ops_recurrent_int16.py

    def both(T, xs, a, out):
        hs, c = lstm_te_states(T, xs, a)
        k.also_writes(twin, c)
        return lstm_te_gather(T, hs, a, out.shape)
    return lower_te(k, node, xs, te_fn=both)
