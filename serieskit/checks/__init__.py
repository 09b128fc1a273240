"""Checking the series: the tree's own lint, the layering check, docs, the tests."""
