"""Benchmarks: each prints a table, compares with a baseline measured in the same run, and
writes its figures with the exact command into a section of a doc under docs/."""
