"""Populations: `fit_population` (FOCE-I and Laplace, all subjects one ensemble), its
likelihood-profile intervals and its diagnostics (VPC, DV-PRED, CWRES, NONMEM-style
table)."""
