"""Tests of stylevar.metrics."""
