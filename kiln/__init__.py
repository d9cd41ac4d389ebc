"""Kiln: ahead-of-time neural network toolchain, from a workstation to Cortex-M boards and GPUs.

Public API (see README.md):
    kiln.trace(fn_or_module, *example_inputs) -> Graph
    kiln.grad / vjp / jvp / hvp / check_grads / checkpoint      (autodiff)
    kiln.run(graph, *inputs)                                     (NumPy reference executor)
    kiln.save(graph, path) / kiln.load(path)
    kiln.nn (Module API and layers), kiln.F (NumPy-like ops; also kiln.exp, kiln.where, ...)
    kiln.step_compiler(name)                                     (compiled training steps for kiln.training)
    kiln.from_torch(module, example_inputs) / kiln.load_model(path: .pt2 .onnx .tflite .json)
    kiln.export_onnx(graph, path)                                (float graph -> .onnx)
    kiln.eager()                                                 (run ops on arrays, no tracing)
"""
from kiln import nn  # noqa: E402,F401
from kiln.autodiff import check_grads, checkpoint, grad, hvp, jvp, vjp  # noqa: E402,F401
from kiln.common.version import __version__  # noqa: E402,F401
from kiln.frontend import (  # noqa: E402,F401
                           Graph,
                           KilnError,
                           QParams,
                           TensorType,
                           limits,
                           load,
                           load_model,  # noqa: E402,F401
                           run,
                           save,
                           set_limits,
                           trace,
)
from kiln.frontend import functional as F  # noqa: E402
from kiln.frontend.functional import (  # noqa: E402,F401
                           add,
                           avg_pool2d,
                           broadcast_to,
                           cast,
                           concat,
                           constant,
                           conv2d,
                           dense,
                           div,
                           eager,  # noqa: E402,F401
                           equal,
                           exp,
                           greater,
                           greater_equal,
                           less,
                           less_equal,
                           log,
                           log_softmax,
                           matmul,
                           max,
                           max_pool2d,
                           maximum,
                           mean,
                           minimum,
                           mul,
                           neg,
                           not_equal,
                           pad,
                           pow,
                           relu,
                           relu6,
                           reshape,
                           sigmoid,
                           softmax,
                           sqrt,
                           sub,
                           sum,
                           tanh,
                           transpose,
                           where,
)
from kiln.frontend.onnx_export import export_onnx  # noqa: E402,F401
from kiln.frontend.torch_import import from_torch  # noqa: E402,F401
from kiln.training_backends import step_compiler  # noqa: E402,F401
