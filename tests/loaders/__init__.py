"""Tests of stylevar.loaders."""
