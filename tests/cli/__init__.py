"""Tests of the `stylevar` command."""
