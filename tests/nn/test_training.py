"""A small CNN learns scikit-learn's bundled digits (8x8 images, no download) with vkml.nn and vkml.optim.

A test of learning, not of speed: it asserts held-out accuracy and that the training loop compiles
its programs in the first steps and only replays them afterwards (same structure every step).
"""

import numpy as np
import pytest

import vkml
from vkml import nn, optim

sklearn_datasets = pytest.importorskip("sklearn.datasets")
model_selection = pytest.importorskip("sklearn.model_selection")

BATCH = 64
EPOCHS = 10


def digits_split():
    d = sklearn_datasets.load_digits()
    x = (d.images / 16.0).astype(np.float32)[:, None]       # (1797, 1, 8, 8), values in [0, 1]
    y = d.target.astype(np.int64)
    return model_selection.train_test_split(x, y, test_size=0.25, random_state=0, stratify=y)


def cnn():
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),    # 16 x 4 x 4
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),   # 32 x 2 x 2
        nn.Flatten(), nn.Linear(128, 10))


def test_cnn_reaches_95_percent_on_held_out_digits():
    x_train, x_test, y_train, y_test = digits_split()
    nn.manual_seed(0)
    model = cnn()
    opt = optim.Adam(model.parameters(), lr=1e-2)
    order = np.random.default_rng(0)
    compiles_after = []
    first_loss = last_loss = None
    for epoch in range(EPOCHS):
        perm = order.permutation(len(x_train))
        # Only full minibatches: a last, smaller one would be a new structure (one more compile).
        for start in range(0, len(perm) - BATCH + 1, BATCH):
            idx = perm[start:start + BATCH]
            opt.zero_grad()
            loss = nn.cross_entropy(model(vkml.tensor(x_train[idx])), y_train[idx])
            loss.backward()
            opt.step()
            last_loss = loss.item()
            first_loss = last_loss if first_loss is None else first_loss
            compiles_after.append(vkml.stats().compiles)
    steps = len(compiles_after)
    # The backward program and the update program compile in step 1; every later step replays them.
    assert compiles_after[0] <= 2
    assert compiles_after[-1] == compiles_after[1] == compiles_after[0]
    stats = vkml.stats()
    assert stats.submissions == 2 * steps            # backward + the optimiser's update, each step
    assert stats.cache_hits >= steps - 1             # every backward after the first is a replay
    assert stats.traces <= 1 and stats.derivations == 1

    model.eval()
    with vkml.no_grad():
        pred = vkml.argmax(model(vkml.tensor(x_test)), axis=1).numpy()
    accuracy = float(np.mean(pred == y_test))
    print(f"digits CNN: {steps} steps, loss {first_loss:.3f} -> {last_loss:.3f}, "
          f"held-out accuracy {accuracy:.4f} on {len(y_test)} images")
    assert accuracy >= 0.95
