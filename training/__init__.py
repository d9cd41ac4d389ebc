"""Training on the host: losses as graph nodes, NumPy optimisers, LR schedules, data loading,
atomic checkpoints, the model zoo and ``fit``, the training loop. See docs/training.md."""
from . import losses, zoo
from .checkpoint import CheckpointError
from .data import ArrayDataset, DataError, DataLoader, GaussianNoise, RandomShift, digits, load_npz, synthetic
from .demo import train_digits
from .loop import FitResult, TrainConfig, evaluate, fit
from .monitor import TrainingDiverged, clip_by_global_norm, global_norm
from .optim import SGD, Adam, AdamW, Optimizer, make_optimizer
from .schedule import Schedule
from .step import EvalGraph, StepGraph

__all__ = [n for n in dir() if not n.startswith("_")]
