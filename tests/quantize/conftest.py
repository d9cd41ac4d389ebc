import pytest


@pytest.fixture(scope="session")
def digits_model():
    """A briefly trained digits CNN (float graph) and the (train, test) datasets."""
    from kiln.training import digits, train_digits
    r = train_digits(seed=0, epochs=4)
    return r.graph, digits()
