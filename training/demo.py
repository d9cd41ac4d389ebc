"""The digits demo's training recipe, shared by ``kiln demo``, the benchmark and the slow test."""
from __future__ import annotations

from kiln.frontend.module import manual_seed

from . import zoo
from .data import digits
from .loop import FitResult, TrainConfig, fit

# reaches >= 97% test accuracy on the fixed digits split (see docs/training.md for measurements)
# one BLAS thread: the matrices are tiny, and more threads only contend
DIGITS_RECIPE = TrainConfig(epochs=25, batch_size=32, lr=3e-3, optimizer="adam", schedule="cosine",
                            label_smoothing=0.1, augment="shift:1", seed=0, threads=1)


def train_digits(seed=0, out=None, quiet=True, resume=False, force=False, **overrides) -> FitResult:
    """Train the ``digits-cnn`` zoo model on the 8x8 digits with the demo recipe. Returns the
    :class:`FitResult`: ``.module`` (trained, eval mode), ``.graph`` (eval graph, input
    [1, 8, 8, 1], ready for quantisation), ``.metrics`` (``test_acc``, ``test_loss``, ``steps``,
    ``seconds``...). ``force``: replace a run already in ``out``."""
    manual_seed(seed)
    entry = zoo.get("digits-cnn")
    train, test = digits()
    return fit(entry.module, train, test, input_shape=entry.input_shape, config=DIGITS_RECIPE, out=out,
               resume=resume, force=force, quiet=quiet, model_name="digits-cnn", seed=seed, loss=entry.loss, **overrides)
