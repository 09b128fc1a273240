"""Upstream pull requests from the series: groups, claims, duplicates, their text."""
