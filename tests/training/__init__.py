"""Tests of the training recipes and their parts (training)."""
