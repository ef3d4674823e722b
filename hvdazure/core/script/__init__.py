"""A training script as a program: its modes (fit, test, predict, export) and its model exported from a
checkpoint. Finding a script's trainer class is core/trainer_classes.py's (it needs the Trainer; this package
is what the Trainer calls)."""
