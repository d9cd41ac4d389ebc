"""A model's inference graph or training step with seeded random inputs: what the float64 checks
of the server targets compile and run (``kiln verify --float64``, benchmarks/cuda_sim_zoo.py)."""
from __future__ import annotations

import os

import numpy as np

from kiln.frontend.errors import UsageError
from kiln.frontend.loader import load_model
from kiln.frontend.module import manual_seed
from kiln.frontend.trace import trace
from kiln.frontend.types import TensorType
from kiln.samples import random_inputs
from kiln.training import zoo
from kiln.training.step import StepGraph


def case(model, batch=None, train=False, seed=0, loss=None):
    """(graph, inputs) of ``model`` (a zoo name, a .py model file or a model file; see
    zoo.resolve; a .tflite for inference only): its inference graph at ``batch`` in eval mode, or
    its training step (StepGraph: forward, ``loss`` or the model's own, backward) at ``batch``,
    with standard-normal inputs (and labels, or targets) drawn from ``seed``. The model's initial
    parameters come from the same seed. ``batch`` default: 1 for inference (a model file: its
    own), 64 for a training step."""
    if not train and os.path.splitext(os.fspath(model))[1].lower() in (".tflite",) + zoo.MODEL_FILES:
        return _file_case(model, batch, seed)
    batch = batch or (64 if train else 1)
    manual_seed(seed)
    zm, name = zoo.resolve(model)
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((batch,) + tuple(zm.input_shape[1:])).astype(np.float32)
    if not train:
        zm.module.eval()
        return trace(zm.module, TensorType(x.shape), name=f"{name.replace('.', '_')}_b{batch}"), [x]
    sg = StepGraph(zm.module, loss or zm.loss, zm.input_shape[1:], batch)
    y = rng.integers(0, zm.num_classes or 2, batch) if sg.target_input == "labels" else None
    if sg.target_input not in (None, "labels"):
        y = rng.standard_normal(sg.graph.types[sg.target_input].shape).astype(np.float32)
    feeds = sg.feeds(x, y, 1)
    return sg.graph, [feeds[k] for k in sg.graph.inputs]


def _file_case(path, batch, seed):
    """A model file's graph as saved, with one seeded random sample (kiln.samples.random_inputs)."""
    g = load_model(path)
    have = g.types[g.inputs[0]].shape[0] if g.inputs and g.types[g.inputs[0]].shape else None
    if batch not in (None, have):
        raise UsageError(f"{path} is saved at batch {have}: its inference graph runs at that batch (drop --batch)")
    return g, list(random_inputs(g, 1, seed)[0])
