"""Tests of stylevar.baselines."""
