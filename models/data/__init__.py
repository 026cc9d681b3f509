"""Embedded data files of `models` (read with `models.load_dataset`)."""
