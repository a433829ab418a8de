"""Tests of the README's blocks and the package structure."""
