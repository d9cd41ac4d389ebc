"""How the files beside this script were made (TensorFlow 2.21, Keras 3; not a Kiln dependency):
a Keras GRU(4, return_sequences=True) over [1, 5, 3] with random biases, converted by the TFLite
converter unrolled (``unroll=True``: per step FULLY_CONNECTED, SPLIT, ...) and as a WHILE loop
(``unroll=False``), float32, with the layer's weights (kernel, recurrent_kernel, bias)."""
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
