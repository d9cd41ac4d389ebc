"""How the files beside this script were made (TensorFlow 2.21, Keras 3; not a Kiln dependency;
run it in this folder): a Keras GRU(4, return_sequences=True) over [1, 5, 3] with random biases,
converted by the TFLite converter unrolled (``unroll=True``: per step FULLY_CONNECTED, SPLIT, ...)
and as a WHILE loop (``unroll=False``), float32, with the layer's weights (kernel,
recurrent_kernel, bias); then more WHILE loops (below). TensorFlow 2.21's int8 converter crashes
on WHILE loops, so these are float files (Kiln's ``ptq`` quantises the unrolled graphs)."""
import os

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

T, I, H = 5, 3, 4
keras.utils.set_random_seed(0)
rng = np.random.default_rng(0)
for unroll in (True, False):
    inp = keras.Input((T, I), batch_size=1)
    gru = keras.layers.GRU(H, return_sequences=True, unroll=unroll)
    m = keras.Model(inp, gru(inp))
    k, rk, b = gru.get_weights()
    gru.set_weights([k, rk, (rng.standard_normal(b.shape) * 0.3).astype(np.float32)])
    name = f"keras_gru_{'unrolled' if unroll else 'while'}"
    np.savez(f"{name}_weights.npz", **dict(zip(("kernel", "recurrent_kernel", "bias"), gru.get_weights())))
    with open(f"{name}.tflite", "wb") as f:
        f.write(tf.lite.TFLiteConverter.from_keras_model(m).convert())
    if unroll:          # int8 (full integer, int8 input and output), calibrated on 32 random sequences
        conv = tf.lite.TFLiteConverter.from_keras_model(m)
        conv.optimizations = [tf.lite.Optimize.DEFAULT]
        conv.representative_dataset = lambda: ([np.random.default_rng(k).standard_normal((1, T, I)).astype(np.float32)]
                                               for k in range(32))
        conv.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
        conv.inference_input_type = conv.inference_output_type = tf.int8
        with open(f"{name}_int8.tflite", "wb") as f:
            f.write(conv.convert())

# more WHILE loops the converter writes: a SimpleRNN over a batch of 2 (last step only), a GRU
# feeding a SimpleRNN feeding a Dense (two loops), a tf.while_loop with maximum_iterations and a
# counter stepping by 2
inp = keras.Input((6, 3), batch_size=2)
m = keras.Model(inp, keras.layers.SimpleRNN(5)(inp))
with open("simplernn_batch2_while.tflite", "wb") as f:
    f.write(tf.lite.TFLiteConverter.from_keras_model(m).convert())
inp = keras.Input((6, 3), batch_size=1)
y = keras.layers.SimpleRNN(3)(keras.layers.GRU(4, return_sequences=True)(inp))
m = keras.Model(inp, keras.layers.Dense(2)(y))
with open("stacked_rnn_while.tflite", "wb") as f:
    f.write(tf.lite.TFLiteConverter.from_keras_model(m).convert())


@tf.function(input_signature=[tf.TensorSpec((1, 4), tf.float32)])
def loop(x):
    def body(i, a):
        return i + 2, a * 0.9 + tf.nn.tanh(a)
    return tf.while_loop(lambda i, a: i < 7, body, [tf.constant(0), x], maximum_iterations=10)[1]


with open("tf_while_loop.tflite", "wb") as f:
    f.write(tf.lite.TFLiteConverter.from_concrete_functions([loop.get_concrete_function()], loop).convert())

# a bidirectional GRU, an LSTM returning its states (a WHILE: the converter fuses only the plain
# LSTM), a GRU over a batch of 3 with relu and hard_sigmoid activations
inp = keras.Input((6, 3), batch_size=1)
m = keras.Model(inp, keras.layers.Bidirectional(keras.layers.GRU(4, return_sequences=True))(inp))
with open("bigru_while.tflite", "wb") as f:
    f.write(tf.lite.TFLiteConverter.from_keras_model(m).convert())
inp = keras.Input((6, 3), batch_size=1)
m = keras.Model(inp, keras.layers.LSTM(4, return_state=True)(inp))
with open("lstm_states_while.tflite", "wb") as f:
    f.write(tf.lite.TFLiteConverter.from_keras_model(m).convert())
inp = keras.Input((7, 2), batch_size=3)
m = keras.Model(inp, keras.layers.GRU(5, activation="relu", recurrent_activation="hard_sigmoid")(inp))
with open("gru_batch3_relu_while.tflite", "wb") as f:
    f.write(tf.lite.TFLiteConverter.from_keras_model(m).convert())
