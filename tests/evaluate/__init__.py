"""Tests of stylevar.evaluate."""
