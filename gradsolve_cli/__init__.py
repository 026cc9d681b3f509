"""The ``gradsolve`` console command (placeholder; filled in below)."""
