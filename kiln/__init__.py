"""Kiln: ahead-of-time neural network toolchain, from a workstation to Cortex-M boards and GPUs.

Public API (see README.md):
    kiln.trace(fn_or_module, *example_inputs) -> Graph
    kiln.grad / vjp / jvp / hvp / check_grads / checkpoint      (autodiff)
    kiln.run(graph, *inputs)                                     (NumPy reference executor)
    kiln.save(graph, path) / kiln.load(path)
    kiln.nn (Module API and layers), kiln.F (NumPy-like ops; also kiln.exp, kiln.where, ...)
    kiln.step_compiler(name)                                     (compiled training steps for kiln.training)
    kiln.from_torch(module, example_inputs) / kiln.load_model(path: .pt2 .onnx .tflite .json)
    kiln.eager()                                                 (run ops on arrays, no tracing)
"""
from kiln.common.version import __version__  # noqa: E402,F401

from kiln.frontend import (Graph, KilnError, TensorType, QParams, load, run, save, trace,  # noqa: E402,F401
                           set_limits, limits)
from kiln.frontend import functional as F  # noqa: E402
from kiln.frontend import load_model  # noqa: E402,F401
from kiln.frontend.functional import eager  # noqa: E402,F401
from kiln.frontend.torch_import import from_torch  # noqa: E402,F401
from kiln.frontend.functional import (add, sub, mul, div, neg, exp, log, sqrt, tanh, sigmoid, relu,  # noqa: E402,F401
                                      relu6, maximum, minimum, pow, where, equal, not_equal, less,
                                      less_equal, greater, greater_equal, matmul, dense, conv2d,
                                      avg_pool2d, max_pool2d, sum, mean, max, reshape, transpose,
                                      concat, pad, broadcast_to, softmax, log_softmax, cast, constant)
from kiln.autodiff import check_grads, checkpoint, grad, hvp, jvp, vjp  # noqa: E402,F401
from kiln import nn  # noqa: E402,F401
from kiln.training_backends import step_compiler  # noqa: E402,F401
