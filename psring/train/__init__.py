"""The shared computer-vision trainer: models, data and the training loop every strategy runs."""
