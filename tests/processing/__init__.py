"""Tests of stylevar.processing."""
