"""Tests of stylevar.models."""
