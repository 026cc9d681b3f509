"""Embedded data files of :mod:`models` (read with :func:`models.load_dataset`)."""
