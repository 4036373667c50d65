"""Figures people look at: pictures of predictions during training (`callbacks`; the
tasks draw them with `vitdense.core.draw`) and the ViT paper's analyses of a model (`analysis`, `figures`,
`python -m vitdense.viz`). Importing this package loads neither matplotlib nor a task."""
