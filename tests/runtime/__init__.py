"""Tests of stylevar.runtime."""
