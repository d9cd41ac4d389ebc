"""C lowering of the float ``lstm``: the op's TE compute, every stage kept (no inlining). The
int8 and int16 LSTMs (TensorFlow Lite Micro's ``EvalLstm``) are ``backends/ops_recurrent_int16.py``.
"""
from __future__ import annotations

from .lower import lower_rule, lower_te


def _keep_stages(sch, out_block):
    return None


@lower_rule("lstm")
def lower_lstm(k, node, xs):
    # every stage stays a loop nest of its own: inlining the per-step states into their consumers
    # (the default schedule) would recompute the whole recurrence in each later step
    k.schedule(_keep_stages)
    return lower_te(k, node, xs)         # float: the op's TE compute; quantised: ops_recurrent_int16.py
