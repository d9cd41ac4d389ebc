"""Public data API: ``kiln.data.digits()`` and friends (implemented in kiln.training.data)."""
from kiln.training.data import (  # noqa: F401
                                ArrayDataset,
                                DataError,
                                DataLoader,
                                GaussianNoise,
                                RandomShift,
                                digits,
                                load_npz,
                                parse_augment,
                                synthetic,
)

__all__ = ["ArrayDataset", "DataError", "DataLoader", "GaussianNoise", "RandomShift", "digits", "load_npz",
           "parse_augment", "synthetic"]
